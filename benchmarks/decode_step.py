"""The fp16/bf16 decode step against its roofline: launches, time per layer, and what each fusion buys.

For each model shape (random weights, no hub) and dtype, and each fusion variant of
`PagedDecoder.forward` (`DecodeFusions`, switched on one at a time), this script:

- captures the decode step as a device graph per batch size (as `ModelRunner` does) over a paged KV
  cache filled with random values at the given context length, and times graph replays (device
  events, median of rounds): the device time of one step, host excluded;
- profiles a few replays (torch profiler): kernels per step, busy kernel time, the idle time
  between kernels, and the time by kernel family;
- states the floor: every weight read once (the input embedding aside) plus the K/V of every
  sequence at its context, over the copy bandwidth measured in the same run;
- optionally times the eager 512-token prefill (TTFT of one prompt, device time) and a mixed step
  (a prefill chunk plus decode tokens in one varlen batch) against the two run apart;
- optionally compares the skinny Triton GEMM with cuBLAS/hipBLASLt (`F.linear`) on every linear
  shape of the model at small M, with weights rotated so nothing is served from L2.

With `--quantizations gptq-4bit,gptq-4bit-act-order` the decoder's linears are 4-bit GPTQ-format
layers (RTN weights, as `optimum-amdx benchmark` makes them), and `--act-order-hoist on,off` builds the
engine with and without the act-order gathers moved into their producers (`paged_model.HOIST_ACT_ORDER`).

Prints tables and writes JSON (`--out`). Reuses `optimum_amdx.benchmark` (model build, ceilings,
roofline, timing) rather than private copies. Over 400 lines on purpose: one script holds every
measurement of the issue, so one device call runs them all from the same build.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
from typing import Any, Iterator

import torch

from bench_w4a16 import knob_on_routes, parse_knob  # noqa: E402 - this folder is on sys.path when run as a script
from optimum_amdx.benchmark.backends import _tensor_bytes, apply_quantization, build_torch_model, resolve_source
from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth, measure_matmul_flops
from optimum_amdx.benchmark.roofline import ModelGeometry, kv_cache_bytes
from optimum_amdx.benchmark.timing import call_seconds, graph_ms
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels.runtime import PDL_KERNELS, set_pdl
from optimum_amdx.modeling.cache import PagedKVCache
from optimum_amdx.modeling import paged_model
from optimum_amdx.modeling.paged_model import BatchInputs, DecodeFusions, PagedDecoder
from optimum_amdx.modeling.runner import ModelRunner

def _variant(**kw: Any) -> DecodeFusions:
    base = dict(rope_cache=True, silu_mul=True, skinny_gemm=False, decode_splits=None, act_gemm=False,
                norm_gemm=False, fused_reduce=False)
    base.update(kw)
    return DecodeFusions(**base)


VARIANTS: dict[str, DecodeFusions] = {
    "unfused": _variant(rope_cache=False, silu_mul=False, decode_splits=0),
    "+rope_cache": _variant(silu_mul=False, decode_splits=0),
    "+silu_mul": _variant(decode_splits=0),
    "+attn_splits": _variant(),
    "+skinny_gemm": _variant(skinny_gemm=True),
    "+fused_reduce": _variant(skinny_gemm=True, fused_reduce=True),
    "+act_gemm": _variant(skinny_gemm=True, act_gemm=True),
    "+norm_gemm": _variant(skinny_gemm=True, norm_gemm=True),
    "-accumulate": _variant(skinny_gemm=True, accumulate=False),  # the shipped set less W4A16 accumulators
    "-paired": _variant(skinny_gemm=True, paired=False),  # less the one-row W4A16 inputs in pair order
}

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEVICE = "cuda"


def kernel_family(name: str) -> str:
    """Group a device kernel name into the families the tables report."""
    n = name.lower()
    rules = (
        ("gather_cols", "w4a16 x gather"), ("w4a16_xpack", "w4a16 x gather"), ("w4a16", "gemm (w4a16)"),
        ("_split_reduce", "attention split reduce"), ("unified_attention", "attention"),
        ("skinny_gemm", "gemm (triton skinny)"), ("splitkreduce", "gemm split-K reduce"),
        ("gemv", "gemm (blas)"), ("gemm", "gemm (blas)"), ("nvjet", "gemm (blas)"), ("cutlass", "gemm (blas)"),
        ("xmma", "gemm (blas)"), ("cijk", "gemm (blas)"),
        ("rms_norm", "rmsnorm"), ("rope_cache", "rotary+cache"), ("rotary", "rotary"),
        ("reshape_and_cache", "cache write"), ("silu_mul", "silu*up"),
        ("silu", "torch elementwise"), ("mul", "torch elementwise"), ("elementwise", "torch elementwise"),
        ("index", "gather/index"), ("embedding", "gather/index"), ("gather_rows", "gather/index"),
    )
    for key, fam in rules:
        if key in n:
            return fam
    return "other"


def profile_kernels(fn, reps: int = 5) -> dict[str, Any]:
    """Kernels per call, busy and idle device time per call, and busy time by kernel family."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and "memcpy" not in e.name.lower()
               and "memset" not in e.name.lower()]
    if not kernels:
        return {"kernels_per_call": 0}
    kernels.sort(key=lambda e: e.time_range.start)
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    # idle = gaps between consecutive kernels of one call (gaps above 50 us are between calls)
    gaps = [b.time_range.start - a.time_range.end for a, b in zip(kernels, kernels[1:])]
    idle = sum(g for g in gaps if 0 < g < 50)
    by_family: dict[str, list[float]] = {}
    for e in kernels:
        by_family.setdefault(kernel_family(e.name), []).append(e.time_range.elapsed_us())
    out = {
        "kernels_per_call": len(kernels) / reps,
        "busy_us": busy / reps,
        "idle_us": idle / reps,
        "families": {k: {"count": len(v) / reps, "us": sum(v) / reps} for k, v in
                     sorted(by_family.items(), key=lambda kv: -sum(kv[1]))},
    }
    if len(kernels) % reps == 0:  # every call ran the same kernels: their mean times by position in the call
        per = len(kernels) // reps
        out["sequence"] = [[kernel_family(kernels[i].name), kernels[i].name[:60],
                            sum(kernels[r * per + i].time_range.elapsed_us() for r in range(reps)) / reps]
                           for i in range(per)]
    return out


class StepBench:
    """One model in one dtype: a paged cache filled with random K/V and helpers to time steps."""

    def __init__(self, shape: str, dtype: torch.dtype, max_batch: int, context: int, max_model_len: int,
                 block_size: int, seed: int, quantization: str = "none", hoist_act_order: bool = True) -> None:
        source = resolve_source(shape)
        self.config = source.config
        self.model, _ = apply_quantization(build_torch_model(source, dtype, DEVICE, seed), quantization, DEVICE)
        previous = paged_model.HOIST_ACT_ORDER
        paged_model.HOIST_ACT_ORDER = hoist_act_order
        try:
            self.decoder = PagedDecoder(self.model, max_model_len)
        finally:
            paged_model.HOIST_ACT_ORDER = previous
        self.geom = ModelGeometry.from_config(self.config)
        self.block_size = block_size
        self.context = context
        self.blocks_per_seq = -(-max_model_len // block_size)
        num_blocks = max_batch * self.blocks_per_seq + 1
        self.max_batch = max_batch
        self.cache = PagedKVCache(self.decoder.cache_layout(block_size), num_blocks, torch.device(DEVICE))
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        for t in self.cache.k + self.cache.v:
            t.normal_(0.0, 1.0, generator=gen)
        emb = self.model.get_input_embeddings().weight
        total, emb_bytes, _, _ = _tensor_bytes(self.model)  # parameters and buffers (GPTQ weights are buffers)
        self.weight_bytes = total - emb_bytes
        self.elem = emb.element_size()
        self.gen = torch.Generator().manual_seed(seed)

    def floor_s(self, batch: int, context: int, bandwidth: float) -> float:
        kv = kv_cache_bytes(self.geom, batch, context, self.elem)
        return (self.weight_bytes + kv) / bandwidth

    def runner(self, fusions: DecodeFusions, buckets: list[int]) -> ModelRunner:
        self.decoder.fusions = fusions
        runner = ModelRunner(self.decoder, self.cache, max(buckets), use_graphs=False)
        runner.buckets = sorted(buckets)
        runner.use_graphs = True
        runner._capture_all()
        if not runner.use_graphs:
            raise RuntimeError(f"graph capture failed: {runner.graph_error}")
        return runner

    def load_decode(self, runner: ModelRunner, batch: int) -> Any:
        """Fill the bucket's static inputs: `batch` sequences at `self.context` cached tokens."""
        g = runner.graphs[batch]
        bs, ctx, width = self.block_size, self.context, g.max_blocks
        tables = [[s * self.blocks_per_seq + j for j in range(self.blocks_per_seq)] for s in range(batch)]
        tokens = torch.randint(3, self.config.vocab_size, (batch,), generator=self.gen).tolist()
        slots = [t[ctx // bs] * bs + ctx % bs for t in tables]
        i64 = torch.tensor(tokens + [ctx] * batch + slots, dtype=torch.int64)
        flat = [b for t in tables for b in t + [0] * (width - len(t))]
        i32 = torch.tensor([ctx + 1] * batch + flat, dtype=torch.int32)
        g.i64.view(-1).copy_(i64)
        g.i32.copy_(i32)
        return g

    def prefill_inputs(self, prompt: int, decode_rows: int = 0) -> BatchInputs:
        """One sequence's `prompt`-token prefill, plus `decode_rows` sequences decoding one token each."""
        if 1 + decode_rows > self.max_batch:
            raise ValueError(f"a step of {1 + decode_rows} sequences needs a cache built for that many "
                             f"(this one holds {self.max_batch})")
        bs = self.block_size
        ids = torch.randint(3, self.config.vocab_size, (prompt + decode_rows,), generator=self.gen)
        pos = list(range(prompt)) + [self.context] * decode_rows
        tables = [[s * self.blocks_per_seq + j for j in range(self.blocks_per_seq)] for s in range(1 + decode_rows)]
        slots = [tables[0][p // bs] * bs + p % bs for p in range(prompt)]
        slots += [tables[1 + s][self.context // bs] * bs + self.context % bs for s in range(decode_rows)]
        lens = [prompt] + [self.context + 1] * decode_rows
        qsl = [0, prompt] + [prompt + s + 1 for s in range(decode_rows)]
        dev = DEVICE
        return BatchInputs(
            input_ids=ids.to(dev), positions=torch.tensor(pos, device=dev), slot_mapping=torch.tensor(slots, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            logits_indices=torch.tensor([prompt - 1] + [prompt + s for s in range(decode_rows)], device=dev),
            max_query_len=prompt, max_seq_len=max(lens),
        )


def linear_shapes(config) -> dict[str, tuple[int, int]]:
    """(N, K) of every distinct matmul of a decode step (q/k/v and gate/up fused, as the decoder runs them)."""
    h, i = config.hidden_size, config.intermediate_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or h // heads
    return {"qkv": ((heads + 2 * kv) * d, h), "o_proj": (h, heads * d), "gate_up": (2 * i, h),
            "down_proj": (h, i), "lm_head": (config.vocab_size, h)}


def _sweep_configs(m: int, n: int, k: int, sms: int) -> list[dict[str, Any]]:
    out = []
    if m == 1:
        for bn in (4, 8, 16, 32):
            for bk, warps, stages in ((256, 4, 4), (512, 4, 3), (512, 4, 4), (512, 8, 3), (1024, 8, 3), (256, 2, 3)):
                # a K that no tile divides (Llama-2-7B's down projection: 11008) also tries the masked tail
                if bn * bk <= 16384 and (k % bk == 0 or k >= 8 * bk) and -(-n // bn) >= sms:
                    out.append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages,
                                "USE_DOT": False})
        for bn in (16, 32):
            out.append({"BLOCK_N": bn, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "USE_DOT": True})
    else:
        for bn in (16, 32, 64):
            for bk, warps, stages in ((256, 4, 4), (128, 4, 6), (512, 4, 3), (256, 8, 4)):
                if k % bk == 0 and -(-n // bn) >= sms // 2:
                    out.append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages,
                                "USE_DOT": True})
    return out


def gemm_sweep(config, dtype: torch.dtype, ms: list[int], bandwidth: float, sweep: bool, install: bool) -> list[dict]:
    """skinny_gemm vs F.linear per linear shape and M, each timed inside a captured graph with weights
    rotated over >= 512 MB so L2 is cold. With `sweep`, extra configs are tried; with `install`, the
    fastest config of each shape becomes the kernel's override for the rest of the run."""
    from optimum_amdx.kernels import _skinny_gemm_triton as sk
    from optimum_amdx.kernels.runtime import arch_family, device_arch

    family = arch_family(device_arch(0))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, (n, k) in linear_shapes(config).items():
        nbytes = n * k * torch.tensor([], dtype=dtype).element_size()
        copies = max(2, -(-(512 << 20) // nbytes))
        ws = [torch.randn(n, k, device="cuda", dtype=dtype) * 0.02 for _ in range(copies)]
        calls_n = max(copies, 8)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=dtype)

            def calls(fn):
                return [lambda w=ws[i % copies]: fn(x, w) for i in range(calls_n)]

            ref = torch.nn.functional.linear(x.float(), ws[0].float())
            tuned = sk.tuned_config(family, m, n, k, sms)
            got = sk.skinny_gemm_triton(x, ws[0], None, family, tuned).float()
            err = ((got - ref).norm() / ref.norm()).item()
            t_blas = graph_ms(calls(lambda a, w: torch.nn.functional.linear(a, w))) / 1e3
            t_tuned = graph_ms(calls(lambda a, w: sk.skinny_gemm_triton(a, w, None, family, tuned))) / 1e3
            row = {"layer": name, "n": n, "k": k, "m": m, "blas_us": t_blas * 1e6, "skinny_us": t_tuned * 1e6,
                   "skinny_config": dict(tuned), "rel_err": err, "floor_us": nbytes / bandwidth * 1e6}
            best = (t_tuned, tuned)
            if sweep:
                for cfg in _sweep_configs(m, n, k, sms):
                    try:
                        t = graph_ms(calls(lambda a, w, c=cfg: sk.skinny_gemm_triton(a, w, None, family, c)),
                                     reps=9) / 1e3
                    except Exception as exc:  # an over-sized config (shared memory) is skipped, and said
                        print(f"    config {cfg} failed: {type(exc).__name__}", flush=True)
                        continue
                    if t < best[0]:
                        best = (t, cfg)
                if install:
                    sk.set_override(family, n, k, m, best[1])
            row["best_us"], row["best_config"] = best[0] * 1e6, dict(best[1])
            row["best_vs_blas"] = row["best_us"] / row["blas_us"]
            rows.append(row)
            print(f"  gemm {name:9s} m={m:2d} n={n:6d} k={k:5d}: blas {row['blas_us']:7.1f} us, tuned "
                  f"{row['skinny_us']:7.1f} us, best {row['best_us']:7.1f} us ({row['best_vs_blas']:.3f}x blas) "
                  f"{row['best_config']}, floor {row['floor_us']:.1f} us, err {err:.1e}", flush=True)
        del ws
        torch.cuda.empty_cache()
    return rows


@contextlib.contextmanager
def pdl_rows(kernels: tuple[str, ...]) -> Iterator[None]:
    """`runtime.PDL_MAX_ROWS` with `kernels` up to `runtime.PDL_CHAIN_ROWS` rows and every other kernel at one row
    (``--pdl rows:...``; ``rows:`` alone is the one-row policy of rounds 10-27), restored on exit."""
    from optimum_amdx.kernels import runtime

    saved = dict(runtime.PDL_MAX_ROWS)
    runtime.PDL_MAX_ROWS.update({k: runtime.PDL_CHAIN_ROWS if k in kernels else 1 for k in PDL_KERNELS})
    try:
        yield
    finally:
        runtime.PDL_MAX_ROWS.update(saved)


def run_shape(args, shape: str, dtype_name: str, bandwidth: float, matmul: float, quantization: str = "none",
              hoist: bool = True) -> dict[str, Any]:
    dtype = _DTYPES[dtype_name]
    seqs = max(args.batch_sizes + ([1 + args.mixed_decode] if args.prefill else []))  # the mixed step's too
    bench = StepBench(shape, dtype, seqs, args.context, args.max_model_len, args.block_size, args.seed,
                      quantization, hoist)
    layers = bench.geom.num_layers
    run_label = dtype_name
    if quantization != "none":
        run_label += f",{quantization},hoist={'on' if hoist else 'off'}"
    out: dict[str, Any] = {"shape": shape, "dtype": run_label, "quantization": quantization, "hoist_act_order": hoist,
                           "weight_bytes": bench.weight_bytes, "layers": layers, "context": args.context,
                           "decode": {}, "prefill": {}}
    variants = [v for v in args.variants]
    if args.gemm_ms:
        out["gemm"] = gemm_sweep(bench.config, dtype, args.gemm_ms, bandwidth, args.sweep, args.install)
    knob_key, knob_values = args.w4a16_knob if quantization != "none" else ("", [None])
    combos = ((v, o, p) for p in args.pdl for o in knob_values for v in variants)
    for vname, knob, pdl in combos:
        base = VARIANTS[vname]
        splits_list = args.attn_splits if vname == variants[-1] else [None]
        for splits in splits_list:
            fusions = base if splits is None else DecodeFusions(**{**base.__dict__, "decode_splits": splits})
            set_pdl(pdl != "off", tuple(filter(None, pdl.partition("no:")[2].split("+"))))
            with contextlib.ExitStack() as stack:  # the knob and PDL are read when graphs are captured
                if knob is not None:
                    stack.enter_context(knob_on_routes(knob_key, knob))
                if pdl.startswith("rows:"):
                    stack.enter_context(pdl_rows(tuple(filter(None, pdl[5:].split("+")))))
                runner = bench.runner(fusions, args.batch_sizes)
            label = vname if splits is None else f"{vname},splits={splits}"
            if knob is not None:
                label += f",{knob_key}={knob}"
            if len(args.pdl) > 1:
                label += f",pdl={pdl}"
            for b in args.batch_sizes:
                g = bench.load_decode(runner, b)
                t = call_seconds(g.graph.replay, DEVICE, reps=5, warmup=1, calls_per_mark=20)
                floor = bench.floor_s(b, args.context + 1, bandwidth)
                row = {"step_ms": t * 1e3, "floor_ms": floor * 1e3, "pct_floor": 100 * floor / t,
                       "per_layer_us": t * 1e6 / layers}
                if args.profile and (splits is None or b == 1):
                    row.update(profile_kernels(g.graph.replay))
                out["decode"].setdefault(label, {})[str(b)] = row
                fam = row.get("families", {})
                print(f"{shape} {out['dtype']} {label:24s} b={b:3d}: step {row['step_ms']:.3f} ms, floor "
                      f"{row['floor_ms']:.3f} ms ({row['pct_floor']:.1f}%), kernels {row.get('kernels_per_call', '-')}, "
                      f"idle {row.get('idle_us', 0):.0f} us | "
                      + ", ".join(f"{k} {v['count']:.0f}x {v['us']:.0f}us" for k, v in fam.items()), flush=True)
            del runner
            gc.collect()
            torch.cuda.empty_cache()
        if args.prefill:
            bench.decoder.fusions = fusions
            for label, rows in (("prefill", 0), (f"mixed+{args.mixed_decode}", args.mixed_decode)):
                inputs = bench.prefill_inputs(args.prompt, rows)
                t = call_seconds(lambda: bench.decoder.forward(inputs, bench.cache), DEVICE, reps=3, warmup=1,
                                 calls_per_mark=5)
                row = {"ms": t * 1e3}
                if rows == 0:  # logits for the last prompt row only: lm_head counts once
                    head = bench.config.vocab_size * bench.config.hidden_size
                    flops = 2.0 * (bench.weight_bytes / bench.elem - head) * args.prompt + 2.0 * head
                    flops += 4.0 * layers * bench.geom.num_heads * bench.geom.head_dim * args.prompt ** 2 / 2
                    floor = max(flops / matmul, bench.weight_bytes / bandwidth)
                    row.update(floor_ms=floor * 1e3, pct_floor=100 * floor / t)
                    if args.profile:
                        row.update(profile_kernels(lambda: bench.decoder.forward(inputs, bench.cache), reps=3))
                out["prefill"].setdefault(vname, {})[label] = row
                print(f"{shape} {out['dtype']} {vname:24s} {label}: {row['ms']:.2f} ms"
                      + (f", floor {row['floor_ms']:.2f} ms ({row['pct_floor']:.1f}%)" if "floor_ms" in row else ""),
                      flush=True)
    del bench
    gc.collect()
    torch.cuda.empty_cache()
    return out


def print_summary(results: dict[str, Any]) -> None:
    print(f"\n## decode step, {results['device']} (copy {results['copy_TBps']:.2f} TB/s, matmul "
          f"{results['matmul_TFps']:.0f} TF/s), context {results['context']}")
    print("| shape | dtype | variant | batch | step ms | floor ms | % floor | kernels/step | idle us | us/layer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results["runs"]:
        for label, per_b in r["decode"].items():
            for b, row in per_b.items():
                print(f"| {r['shape']} | {r['dtype']} | {label} | {b} | {row['step_ms']:.3f} | {row['floor_ms']:.3f} | "
                      f"{row['pct_floor']:.1f} | {row.get('kernels_per_call', '-')} | {row.get('idle_us', 0):.0f} | "
                      f"{row['per_layer_us']:.1f} |")
        for vname, rows in r["prefill"].items():
            for label, row in rows.items():
                print(f"| {r['shape']} | {r['dtype']} | {vname} | {label} | {row['ms']:.2f} | "
                      f"{row.get('floor_ms', 0):.2f} | {row.get('pct_floor', 0):.1f} | {row.get('kernels_per_call', '-')} "
                      f"| {row.get('idle_us', 0):.0f} | - |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="llama-3-8b")
    p.add_argument("--dtypes", default="fp16")
    p.add_argument("--quantizations", default="none", help="comma list of none, gptq-4bit, gptq-4bit-act-order")
    p.add_argument("--act-order-hoist", default="on", help="comma list of on, off (GPTQ runs only)")
    p.add_argument("--batch-sizes", default="1,16,64")
    p.add_argument("--context", type=int, default=512, help="cached tokens per sequence before the timed step")
    p.add_argument("--max-model-len", type=int, default=576, help="graph bound (the harness uses prompt + new tokens)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--attn-splits", default="", help="also time the last variant with these forced decode splits")
    p.add_argument("--skinny-max-m", type=int, default=None, help="override the family table (e.g. 16 to try it)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--prefill", action="store_true", help="also time a --prompt prefill and a mixed step")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--mixed-decode", type=int, default=16)
    p.add_argument("--gemm-ms", default="", help="M values for the skinny-vs-BLAS sweep ('' = skip)")
    p.add_argument("--sweep", action="store_true", help="try extra skinny configs in the GEMM sweep")
    p.add_argument("--install", action="store_true", help="use each shape's sweep winner in the decode steps")
    p.add_argument("--w4a16-knob", default="", help="KEY=V1,V2: time GPTQ steps under each value of an integer "
                   "knob of the one-row and pipelined W4A16 configs (e.g. num_warps=4,8)")
    p.add_argument("--pdl", default="on", help="comma list of on, off, no:KERNEL[+KERNEL] (on, less those of "
                   "runtime.PDL_KERNELS), rows:[KERNEL[+KERNEL]] (on, those kernels up to runtime.PDL_CHAIN_ROWS rows "
                   "and every other at one row): programmatic dependent launch (NVIDIA sm_90+) for the graphs of each "
                   "run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any model build; --out replaces only a result we wrote
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    args.pdl = [v for v in args.pdl.split(",") if v]
    for v in args.pdl:
        named = v.partition(":")[2].split("+") if ":" in v else []
        if not (v in ("on", "off") or v.startswith(("no:", "rows:"))) or set(filter(None, named)) - set(PDL_KERNELS):
            raise SystemExit(f"--pdl takes on, off, no:KERNEL[+KERNEL] or rows:[KERNEL[+KERNEL]] with kernels of "
                             f"{PDL_KERNELS}; got {v!r}")
    args.w4a16_knob = parse_knob(args.w4a16_knob) if args.w4a16_knob else ("", [None])
    args.attn_splits = [None] + [int(x) for x in args.attn_splits.split(",") if x]
    args.gemm_ms = [int(x) for x in args.gemm_ms.split(",") if x]
    if not torch.cuda.is_available():
        raise SystemExit("decode_step.py measures a GPU; none is visible.")
    if args.skinny_max_m is not None:
        from optimum_amdx.kernels import _skinny_gemm_triton as sk
        from optimum_amdx.kernels.runtime import arch_family, device_arch

        sk._FAMILY_MAX_M[arch_family(device_arch(0))] = args.skinny_max_m
    bandwidth = measure_copy_bandwidth("cuda")
    matmul = measure_matmul_flops("cuda")
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "copy_TBps": bandwidth / 1e12,
                               "matmul_TFps": matmul / 1e12, "context": args.context, "torch": torch.__version__,
                               "skinny_max_m_override": args.skinny_max_m, "runs": []}
    print(f"{results['device']}: copy {bandwidth / 1e12:.2f} TB/s, matmul {matmul / 1e12:.0f} TF/s", flush=True)
    hoists = [{"on": True, "off": False}[h] for h in args.act_order_hoist.split(",")]
    combos = [(q, h) for q in args.quantizations.split(",") for h in (hoists if q != "none" else [True])]
    for shape in args.shapes.split(","):
        for dt, (quant, hoist) in ((dt, c) for dt in args.dtypes.split(",") for c in combos):
            try:
                results["runs"].append(run_shape(args, shape, dt, bandwidth, matmul, quant, hoist))
            except Exception:  # keep what the other shapes measured; the traceback says what broke
                import traceback

                traceback.print_exc()
                gc.collect()
                torch.cuda.empty_cache()
            if args.out:
                write_json(args.out, results)
    print_summary(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
