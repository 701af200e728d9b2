"""Generation benchmark: AMDModelForCausalLM vs transformers' generate on a random-weight model.

(A little over 400 lines: one script whose parts, the floors, both runtimes' measurements and the table,
change together; it is not imported by the package.)

Builds a named shape (default Llama-2-7B) with random fp16 (or bf16) weights on the GPU (no download) and
measures, in one run:
  - ceilings: copy bandwidth (bytes read + written / s) and the matmul rate of the dtype;
  - batch 1: TTFT for a 2048-token prompt, TPOT and tokens/s for a 128-token prompt;
  - throughput at batch 8/32/64: prompts of 128-512 tokens, 128-256 new tokens each (seeded);
  - transformers' generate on the same model: dynamic cache (eager) and static cache + torch.compile.
Roofline for batch-1 decode = copy bandwidth / bytes one step reads: every weight for a dense model; for
a mixture of experts every weight but the experts, plus the routed experts only (top-k per layer at
batch 1; at batch b the expected number of distinct experts hit, E * (1 - (1 - k/E)**b), under uniform
routing). `--layers N` keeps the first N decoder layers (said in the output: a smaller model, same layers).
Throughput counts the new tokens the requests asked for; transformers generates every row of a
padded batch up to the longest request, which is its real cost for that workload ("raw" also shown).

    python benchmarks/generate.py --out results.json
    python benchmarks/generate.py --shape qwen3-30b-a3b --dtype bf16 --layers 24 --out moe.json
    python benchmarks/generate.py --shape qwen3-30b-a3b --smoke     # tiny config on CPU: checks the script
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
from typing import Any, Callable

import torch

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth, measure_matmul_flops
from optimum_amdx.io import result_path_or_exit, write_json


class TimingStreamer:
    """TextStreamer-compatible put()/end() that timestamps each token (put receives host tensors)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def ttft_tpot(self, start: float) -> tuple[float, float]:
        tokens = self.times[1:]  # first put is the prompt
        ttft = tokens[0] - start
        tpot = (tokens[-1] - tokens[0]) / max(1, len(tokens) - 1)
        return ttft, tpot




def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lengths]


def make_new_tokens(n: int, lo: int, hi: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


def moe_shape(config) -> tuple[int, int, int] | None:
    """(experts, top-k, bytes-per-element-free parameter count of one expert) of a sparse-MoE config, else None."""
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if not experts:
        return None
    inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    return int(experts), int(config.num_experts_per_tok), 3 * config.hidden_size * inter


def step_weight_bytes(config, weight_bytes: int, element_size: int, rows: int) -> float:
    """Weight bytes one decode step of `rows` sequences must read: all of them for a dense model; for a MoE
    all but the experts, plus the experts the step routes to (expected distinct count, uniform routing)."""
    moe = moe_shape(config)
    if moe is None:
        return float(weight_bytes)
    experts, top_k, expert_params = moe
    layers = config.num_hidden_layers
    all_experts = layers * experts * expert_params * element_size
    hit = experts * (1 - (1 - top_k / experts) ** rows)
    return weight_bytes - all_experts + layers * hit * expert_params * element_size


def active_params(config, params: int) -> int:
    """Parameters one token multiplies by (a MoE's routed experts only): the prefill FLOP count."""
    moe = moe_shape(config)
    if moe is None:
        return params
    experts, top_k, expert_params = moe
    return params - config.num_hidden_layers * (experts - top_k) * expert_params


def workload_floor(prompts: list[list[int]], news: list[int], config, params: int, weight_bytes: int,
                   copy_bw: float, matmul_flops: float, element_size: int = 2) -> float:
    """Seconds a perfect engine needs for this workload: prefill FLOPs at the matmul rate, then every
    decode step reads the weights it needs once (`step_weight_bytes`) plus the K/V of every still-running
    sequence at copy bandwidth."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * element_size
    seconds = 2 * active_params(config, params) * sum(map(len, prompts)) / matmul_flops
    for step in range(1, max(news)):
        active = [len(p) + step for p, n in zip(prompts, news) if n > step]
        step_bytes = step_weight_bytes(config, weight_bytes, element_size, len(active))
        seconds += (step_bytes + kv_per_token * sum(active)) / copy_bw
    return seconds


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def left_pad(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def hf_run(model, prompts, new_tokens: int, cache=None, streamer=None) -> None:
    ids, mask = left_pad(prompts, model.device)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        if cache is not None:
            cache.reset()
            kwargs["past_key_values"] = cache
        model.generate(ids, attention_mask=mask, streamer=streamer, **kwargs)


def _transformers_b1(model, args, p1, long, hf: dict, save: Callable[[], None]) -> None:
    """transformers at batch 1: TTFT (sdpa, eager), TPOT eager and with the static cache (auto-compiled)."""
    from transformers import StaticCache

    hf_run(model, long, 1)
    ttft = [timed(lambda: hf_run(model, long, 1))[0] for _ in range(3)]
    hf["sdpa_eager_ttft_s"] = statistics.median(ttft)
    hf_run(model, p1, 8)
    s = TimingStreamer()
    t0 = time.perf_counter()
    hf_run(model, p1, args.decode_tokens, streamer=s)
    hf["eager_b1_tpot_s"] = s.ttft_tpot(t0)[1]
    print(f"  transformers eager b1: TPOT {1e3 * hf['eager_b1_tpot_s']:.2f} ms", flush=True)
    save()
    if not args.skip_compile:
        cache = StaticCache(config=model.config, max_cache_len=args.decode_prompt + args.decode_tokens)
        tc, _ = timed(lambda: hf_run(model, p1, args.decode_tokens, cache=cache))
        hf_run(model, p1, args.decode_tokens, cache=cache)
        s = TimingStreamer()
        t0 = time.perf_counter()
        hf_run(model, p1, args.decode_tokens, cache=cache, streamer=s)
        hf["static_compile_b1_tpot_s"] = s.ttft_tpot(t0)[1]
        hf["static_compile_b1_first_call_s"] = tc
        print(f"  transformers static+compile b1: TPOT {1e3 * hf['static_compile_b1_tpot_s']:.2f} ms "
              f"(first call {tc:.0f} s)", flush=True)
        del cache
    save()


def bench_transformers(model, args, batch_prompts, batch_news, results: dict, save: Callable[[], None]) -> None:
    from transformers import StaticCache

    vocab = model.config.vocab_size
    p1 = make_prompts(1, args.decode_prompt, args.decode_prompt, vocab, 1)
    long = make_prompts(1, args.ttft_len, args.ttft_len, vocab, 2)
    hf = results.setdefault("transformers", {})
    try:
        model.set_attn_implementation("sdpa")
    except ValueError:  # Gemma 2 (soft-capping) has no SDPA path in transformers: it keeps eager attention
        pass
    hf["attn_implementation"] = model.config._attn_implementation
    hf["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    if not args.hf_batches_only:
        _transformers_b1(model, args, p1, long, hf, save)
    for b in args.hf_batch_sizes:
        prompts, news = batch_prompts[b], batch_news[b]
        useful = sum(news)
        if not args.skip_eager_batches:
            t, _ = timed(lambda: hf_run(model, prompts, max(news)))
            hf[f"eager_b{b}_s"] = t
            hf[f"eager_b{b}_tok_s"] = useful / t
            hf[f"eager_b{b}_raw_tok_s"] = b * max(news) / t
            print(f"  transformers eager b{b}: {useful / t:.0f} tok/s", flush=True)
        if not args.skip_compile:
            cache = StaticCache(config=model.config, max_cache_len=max(map(len, prompts)) + max(news))
            tc, _ = timed(lambda: hf_run(model, prompts, max(news), cache=cache))
            t, _ = timed(lambda: hf_run(model, prompts, max(news), cache=cache))
            hf[f"static_compile_b{b}_s"] = t
            hf[f"static_compile_b{b}_tok_s"] = useful / t
            hf[f"static_compile_b{b}_raw_tok_s"] = b * max(news) / t
            hf[f"static_compile_b{b}_first_call_s"] = tc
            print(f"  transformers static+compile b{b}: {useful / t:.0f} tok/s (first call {tc:.0f} s)", flush=True)
            del cache
        save()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _replay_time(graph, n: int = 50) -> float:
    """GPU time in seconds of one captured batch-1 decode step (median of `n` replays of the last
    step's inputs; the slot it rewrites belongs to a finished sequence)."""
    from optimum_amdx.benchmark.timing import device_ms

    return device_ms(graph.graph.replay, reps=n, warmup=1) / 1e3


def _profile_replay(graph, n: int = 10) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            graph.graph.replay()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60), flush=True)


def bench_ours(model, args, batch_prompts, batch_news, results: dict) -> None:
    from optimum_amdx.modeling import AMDModelForCausalLM, SamplingParams

    vocab = model.config.vocab_size
    t_build = time.perf_counter()
    am = AMDModelForCausalLM(model, max_num_seqs=max(args.batch_sizes), memory_fraction=args.memory_fraction,
                             max_model_len=args.max_model_len, block_size=args.block_size,
                             max_num_batched_tokens=args.max_num_batched_tokens)
    engine = am.engine
    ours = results.setdefault("amdx", {})
    ours["engine_build_s"] = time.perf_counter() - t_build
    ours["kv_blocks"] = engine.num_blocks
    ours["graphs"] = engine.uses_graphs
    ours["graph_error"] = engine.runner.graph_error
    p1 = make_prompts(1, args.decode_prompt, args.decode_prompt, vocab, 1)
    long = make_prompts(1, args.ttft_len, args.ttft_len, vocab, 2)
    greedy = dict(do_sample=False, eos_token_id=None)
    am.generate(long, max_new_tokens=1, **greedy)
    ttft = [timed(lambda: am.generate(long, max_new_tokens=1, **greedy))[0] for _ in range(3)]
    ours["ttft_s"] = statistics.median(ttft)
    am.generate(p1, max_new_tokens=8, **greedy)
    tpots = []
    for _ in range(3):
        s = TimingStreamer()
        t0 = time.perf_counter()
        am.generate(torch.tensor(p1), max_new_tokens=args.decode_tokens, streamer=s, **greedy)
        tpots.append(s.ttft_tpot(t0)[1])
    ours["b1_tpot_s"] = statistics.median(tpots)
    print(f"  amdx b1: TPOT {1e3 * ours['b1_tpot_s']:.2f} ms, TTFT {1e3 * ours['ttft_s']:.1f} ms", flush=True)
    if engine.uses_graphs:
        ours["b1_graph_replay_s"] = _replay_time(engine.runner.graphs[1])
        if args.profile:
            _profile_replay(engine.runner.graphs[1])
    for b in args.batch_sizes:
        prompts, news = batch_prompts[b], batch_news[b]
        params = [SamplingParams(max_new_tokens=n) for n in news]
        engine.generate(prompts, params)  # warm-up: Triton specializations of this batch's shapes
        t, outs = timed(lambda: engine.generate(prompts, params))
        assert [len(o) for o in outs] == news
        assert engine.num_free_blocks == engine.num_blocks
        ours[f"b{b}_s"] = t
        ours[f"b{b}_tok_s"] = sum(news) / t
        floor = workload_floor(prompts, news, model.config, results["params"], results["weight_bytes"],
                               results["copy_bw_Bps"], results["matmul_flops"], results["element_size"])
        results.setdefault("floor", {})[f"b{b}_tok_s"] = sum(news) / floor
        print(f"  amdx b{b}: {sum(news) / t:.0f} tok/s", flush=True)
    ours["preemptions"] = engine.scheduler.num_preemptions
    print_table(results, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--batch-sizes", default="8,32,64")
    parser.add_argument("--hf-batch-sizes", default="64", help="batches also run through transformers ('' = none)")
    parser.add_argument("--prompt-range", default="128,512")
    parser.add_argument("--new-range", default="128,256")
    parser.add_argument("--ttft-len", type=int, default=2048)
    parser.add_argument("--decode-prompt", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096)
    parser.add_argument("--memory-fraction", type=float, default=0.85)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--skip-compile", action="store_true", help="skip transformers static cache + compile")
    parser.add_argument("--hf-batches-only", action="store_true", help="skip transformers' batch-1 measurements")
    parser.add_argument("--skip-eager-batches", action="store_true",
                        help="run transformers' batches with the static cache only (not also eager)")
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--layers", type=int, default=None, help="keep only this many decoder layers (say so)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny config of the shape on CPU (float32, few tokens, no compile): checks the script")
    parser.add_argument("--profile", action="store_true", help="print a kernel profile of the batch-1 decode graph")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any model build; --out replaces only a result we wrote
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    args.hf_batch_sizes = [int(b) for b in args.hf_batch_sizes.split(",") if b]
    p_lo, p_hi = map(int, args.prompt_range.split(","))
    n_lo, n_hi = map(int, args.new_range.split(","))
    from transformers import AutoModelForCausalLM

    from optimum_amdx.models.shapes import parameter_count, shape_config

    overrides: dict[str, Any] = {}
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    if args.smoke:
        overrides = {k: v for k, v in SMOKE_OVERRIDES.items()}
        dtype, args.skip_compile, args.ttft_len, args.decode_prompt, args.decode_tokens = torch.float32, True, 24, 8, 6
        p_lo, p_hi, n_lo, n_hi = 4, 12, 3, 6
        args.batch_sizes, args.hf_batch_sizes, args.max_model_len = [2, 3], [3], 64
        device = torch.device("cpu")
        results: dict[str, Any] = {"device": "cpu (smoke)", "copy_bw_Bps": 1e10, "matmul_flops": 1e11}
    elif not torch.cuda.is_available():
        print("benchmarks/generate.py needs a GPU (or --smoke).", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
        results = {"device": torch.cuda.get_device_name(0)}
        results["copy_bw_Bps"] = measure_copy_bandwidth(str(device))
        results["matmul_flops"] = measure_matmul_flops(str(device), dtype)
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    results.update({"shape": args.shape, "dtype": str(dtype).replace("torch.", ""), "layers_override": args.layers,
                    "torch": torch.__version__, "hip": torch.version.hip})
    config = shape_config(args.shape, **{k: v for k, v in overrides.items() if k in _config_keys(args.shape)})
    if getattr(config, "layer_types", None) is not None and args.layers:
        config.layer_types = config.layer_types[: args.layers]
    results["num_hidden_layers"] = config.num_hidden_layers
    torch.manual_seed(0)
    t_init = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    _sync()
    results["init_s"] = time.perf_counter() - t_init
    model.eval()
    model.generation_config.eos_token_id = None
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    results["params"] = parameter_count(config)
    results["weight_bytes"] = weight_bytes
    element_size = results["element_size"] = next(model.parameters()).element_size()
    results["b1_step_bytes"] = step_weight_bytes(config, weight_bytes, element_size, 1)
    results["roofline_b1_tok_s"] = results["copy_bw_Bps"] / results["b1_step_bytes"]
    results["ttft_floor_s"] = 2 * active_params(config, results["params"]) * args.ttft_len / results["matmul_flops"]
    vocab = config.vocab_size
    batch_prompts = {b: make_prompts(b, p_lo, p_hi, vocab, 100 + b) for b in set(args.batch_sizes + args.hf_batch_sizes)}
    batch_news = {b: make_new_tokens(b, n_lo, n_hi, 100 + b) for b in batch_prompts}
    print(f"{results['device']}: copy {results['copy_bw_Bps'] / 1e12:.2f} TB/s, matmul "
          f"{results['matmul_flops'] / 1e12:.0f} TF/s, {config.num_hidden_layers} layers, weights "
          f"{weight_bytes / 1e9:.2f} GB ({results['b1_step_bytes'] / 1e9:.2f} GB read per batch-1 step), roofline "
          f"{results['roofline_b1_tok_s']:.0f} tok/s, init {results['init_s']:.0f} s", flush=True)
    save = functools.partial(_save, results, args.out)
    bench_ours(model, args, batch_prompts, batch_news, results)
    save()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if not args.skip_transformers:
        bench_transformers(model, args, batch_prompts, batch_news, results, save)
    save()
    print_table(results, args)
    return 0


SMOKE_OVERRIDES: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=512, num_experts=8, num_local_experts=8, num_experts_per_tok=2,
    query_pre_attn_scalar=16, sliding_window=16, max_position_embeddings=512,
)
"""A tiny config of any shape for `--smoke` (keys the shape's model type does not know are left out)."""


def _config_keys(shape: str) -> set[str]:
    from optimum_amdx.models.shapes import SHAPES

    known = set(SHAPES[shape.strip().lower()]) | {"num_hidden_layers", "head_dim", "moe_intermediate_size"}
    moe = {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size"}
    return {k for k in known if k not in moe or k in SHAPES[shape.strip().lower()]}


def _save(results: dict, path: str | None) -> None:
    if path:
        write_json(path, results, indent=2)


def print_table(r: dict, args) -> None:
    ours, hf = r.get("amdx", {}), r.get("transformers", {})
    roof = r["roofline_b1_tok_s"]
    rows = [("metric", "amdx", "transformers eager", "transformers static+compile", "floor")]
    floor = r.get("floor", {})

    def tok(x):
        return f"{x:.0f}" if x else "-"

    rows.append(("b1 decode tok/s", f"{1 / ours['b1_tpot_s']:.0f} ({100 / ours['b1_tpot_s'] / roof:.0f}% roof)",
                 tok(1 / hf["eager_b1_tpot_s"]) if "eager_b1_tpot_s" in hf else "-",
                 tok(1 / hf["static_compile_b1_tpot_s"]) if "static_compile_b1_tpot_s" in hf else "-", tok(roof)))
    rows.append(("b1 TPOT ms", f"{1e3 * ours['b1_tpot_s']:.2f}",
                 f"{1e3 * hf['eager_b1_tpot_s']:.2f}" if "eager_b1_tpot_s" in hf else "-",
                 f"{1e3 * hf['static_compile_b1_tpot_s']:.2f}" if "static_compile_b1_tpot_s" in hf else "-",
                 f"{1e3 / roof:.2f}"))
    rows.append((f"TTFT({args.ttft_len}) ms", f"{1e3 * ours['ttft_s']:.1f}",
                 f"{1e3 * hf['sdpa_eager_ttft_s']:.1f} ({hf.get('attn_implementation', 'sdpa')})" if "sdpa_eager_ttft_s" in hf else "-", "-",
                 f"{1e3 * r['ttft_floor_s']:.1f}"))
    for b in args.batch_sizes:
        rows.append((f"b{b} tok/s", tok(ours.get(f"b{b}_tok_s")), tok(hf.get(f"eager_b{b}_tok_s")),
                     tok(hf.get(f"static_compile_b{b}_tok_s")), tok(floor.get(f"b{b}_tok_s"))))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    print(f"\n{r['device']} | {r['shape']} {r.get('dtype', 'float16')}, {r.get('num_hidden_layers')} layers | "
          f"roofline {roof:.0f} tok/s (copy {r['copy_bw_Bps'] / 1e12:.2f} TB/s / "
          f"{r.get('b1_step_bytes', r['weight_bytes']) / 1e9:.2f} GB read per step, {r['weight_bytes'] / 1e9:.2f} GB "
          f"weights) | "
          f"TTFT floor {1e3 * r['ttft_floor_s']:.1f} ms | graphs={ours.get('graphs')} blocks={ours.get('kv_blocks')} | "
          f"b1 graph replay {1e3 * ours.get('b1_graph_replay_s', float('nan')):.2f} ms")
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    sys.exit(main())
