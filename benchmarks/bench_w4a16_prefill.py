"""W4A16 prefill matmuls (hundreds of rows) on a GPU: dequant + BLAS against the fused GEMMs.

A prompt's projections are compute-bound in fp16, so a GPTQ prefill should cost what fp16 costs plus the
dequantization. The shipped route for many rows writes the dense fp16 weight (`_w4a16_triton.
dequant_matmul`) and lets the BLAS read it back; the fused GEMMs never write it. Per Llama shape and row
count, side by side in one run: torch fp16 on the dense weight (the reference), the dequant route, and
(`--fused`) the pipelined fused GEMM (its own config for the row count, and `--pipelined` overrides) and
the plain fused GEMM; `--routes` adds others by name (`w4a16_matmul`'s route=), `--act-order` takes act-order
weights, and `--dtype bf16` makes it all bf16. Times are medians of graph replays over enough weight copies that L2 cannot hold
them (`--eager`: launched from Python), each with its ratio to fp16; the per-layer sum says what a
512-token TTFT should move. Prints a table and writes JSON (--out).
Usage: python benchmarks/bench_w4a16_prefill.py --rows 512,1024,2048 --fused \
           --pipelined "HALF_DEQ=1;BLOCK_M=128:num_warps=4:HALF_DEQ=1" --out prefill.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import torch

from optimum_amdx.benchmark.timing import device_ms, graph_ms, l2_cold_copies
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels import _w4a16_triton as kt
from optimum_amdx.kernels.runtime import device_arch
from optimum_amdx.kernels.w4a16 import w4a16_matmul

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_w4a16 import _clone, parse_configs, random_gptq  # noqa: E402 - this folder is on sys.path when run as a script

LAYERS = {  # (K, N) of one decoder layer's projections, q/k/v and gate/up fused as the engine runs them
    "llama-3-8b": [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)],
    "llama-2-7b": [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096)],
}


def time_calls(calls: list[Callable[[], Any]], eager: bool) -> float:
    """Median ms of one call, cycling over `calls` (one per weight copy, so L2 starts cold)."""
    if eager:
        it = iter(range(1 << 30))
        return device_ms(lambda: calls[next(it) % len(calls)]())
    return graph_ms(calls)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="512", help="row counts (prompt tokens), comma-separated")
    p.add_argument("--shapes", default="llama-3-8b,llama-2-7b", help=f"layers of {sorted(LAYERS)}")
    p.add_argument("--fused", action="store_true", help="also the fused GEMM routes (no dense weight written)")
    p.add_argument("--pipelined", default="", help="overrides of the pipelined GEMM's config: K=V:K=V;K=V...")
    p.add_argument("--eager", action="store_true", help="launch from Python instead of replaying a graph")
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16",
                   help="activations (and the dense reference weight); the reference column is named after it")
    p.add_argument("--routes", default="",
                   help="more routes of w4a16_matmul to time, comma-separated (e.g. stream, the one-row kernel, which "
                        "takes up to 16 rows when forced)")
    p.add_argument("--group", type=int, default=128, help="scale group size (rows)")
    p.add_argument("--asym", action="store_true", help="asymmetric zeros (act-order weights always have them)")
    p.add_argument("--act-order", action="store_true",
                   help="act-order weights (asymmetric zeros: x gathered into the layout's row order)")
    p.add_argument("--out", help="write results as JSON here")
    args = p.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        raise SystemExit("bench_w4a16_prefill.py needs a GPU")
    rows_list = [int(v) for v in args.rows.split(",")]
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    ref_key = args.dtype
    arch = device_arch()
    print(f"device {torch.cuda.get_device_name()} ({arch}); {'eager' if args.eager else 'graph replay'}", flush=True)
    results: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        for k, n in LAYERS[shape]:
            w0, _ = random_gptq(k, n, args.group, args.act_order, seed=k + n, asym=args.act_order or args.asym)
            copies = l2_cold_copies(k * n * 2)
            ws = [w0] + [_clone(w0) for _ in range(copies - 1)]
            dense = [kt.dequantize_dense(w, dtype, arch) for w in ws]
            for m in rows_list:
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                ref = torch.nn.functional.linear(x, dense[0])
                r: dict[str, Any] = {"shape": shape, "K": k, "N": n, "M": m, "us": {}, "max_rel_err": {}}
                r["us"][ref_key] = 1e3 * time_calls([lambda d=d: torch.nn.functional.linear(x, d) for d in dense], args.eager)
                variants: list[tuple[str, Callable[[Any], torch.Tensor]]] = [
                    ("dequant", lambda w: w4a16_matmul(x, w, route="dequant"))]
                if args.fused:
                    from optimum_amdx.kernels import _w4a16_pipelined_triton as kp

                    base_cfg = kp.pipelined_config(m, k, n, kt._chunks(kt._group_arg(w0)), dtype == torch.float16)
                    variants.append(("pipelined", lambda w: w4a16_matmul(x, w, route="pipelined")))
                    for label, over in parse_configs(args.pipelined):
                        variants.append((f"pipelined[{label}]", lambda w, c={**base_cfg, **over}:
                                         w4a16_matmul(x, w, route="pipelined", config=c)))
                    variants.append(("gemm", lambda w: w4a16_matmul(x, w, route="gemm")))
                for route in [v for v in args.routes.split(",") if v]:
                    variants.append((route, lambda w, route=route: w4a16_matmul(x, w, route=route)))
                for name, fn in variants:
                    try:
                        err = (fn(w0).float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                        r["us"][name] = 1e3 * time_calls([lambda w=w, fn=fn: fn(w) for w in ws], args.eager)
                    except Exception as e:  # a config that does not build or run here: say so, go on
                        print(f"  {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                        r.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:500]
                        continue
                    r["max_rel_err"][name] = err
                base = r["us"][ref_key]
                print(f"{shape} {k:>5}x{n:<5} M={m:<5} " + "  ".join(
                    f"{v}: {t:7.1f} us ({t / base:.2f}x)" for v, t in r["us"].items()), flush=True)
                results.append(r)
            del ws, dense
            torch.cuda.empty_cache()
    print(f"\nper layer (sum of the four projections), us, and the ratio to {ref_key}:")
    for shape in args.shapes.split(","):
        for m in rows_list:
            rs = [r for r in results if r["shape"] == shape and r["M"] == m]
            tot = {v: sum(r["us"].get(v, float("nan")) for r in rs) for v in rs[0]["us"]}
            print(f"  {shape} M={m}: " + "  ".join(f"{v}: {t:7.1f} ({t / tot[ref_key]:.2f}x)" for v, t in tot.items()))
    if args.out:
        write_json(args.out, {"device": torch.cuda.get_device_name(), "arch": arch, "eager": args.eager,
                              "dtype": args.dtype, "act_order": args.act_order, "asym": args.act_order or args.asym,
                              "group": args.group,
                              "uuid": str(torch.cuda.get_device_properties(0).uuid), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
