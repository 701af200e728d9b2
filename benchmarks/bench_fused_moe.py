"""Fused-MoE op vs transformers' per-expert loop, at Mixtral-8x7B and Qwen3-30B-A3B layer shapes (random weights).

For each shape and token count: median time of `fused_moe` (Triton grouped GEMMs), of the PyTorch
per-expert loop (`fused_moe_reference`, transformers' "eager" experts: the same math and rounding) and of
transformers' own default experts module (`experts_implementation="grouped_mm"`, torch's grouped GEMM)
on the same weights, the bytes of expert weights the step must read (experts hit at least once) and the
time that takes at the measured copy bandwidth (the decode roofline), and the matmul floor for large
token counts. The weights of a shape are made once, on the device.

    python benchmarks/bench_fused_moe.py --out fused_moe.json
    python benchmarks/bench_fused_moe.py --smoke          # tiny shapes on CPU (interpreter off): checks the script
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from optimum_amdx.benchmark.timing import call_seconds
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels.fused_moe import fused_moe, fused_moe_reference, route_topk

SHAPES = {  # hidden, expert intermediate, experts, top-k
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
}
SMOKE = {"tiny": (64, 48, 4, 2)}


def make_weights(shape: tuple[int, int, int, int], dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random stacked expert weights [E, 2I, H] and [E, H, I], drawn on the device (seeded)."""
    hidden, inter, experts, _ = shape
    g = torch.Generator(device=device).manual_seed(0)
    w1 = torch.randn(experts, 2 * inter, hidden, generator=g, device=device, dtype=dtype).mul_(hidden ** -0.5)
    w2 = torch.randn(experts, hidden, inter, generator=g, device=device, dtype=dtype).mul_(inter ** -0.5)
    return w1, w2


def transformers_experts(w1: torch.Tensor, w2: torch.Tensor, implementation: str):
    """transformers' stacked-experts module (Qwen3-MoE's; Mixtral's has the same layout and math) over these
    weights, with the given `experts_implementation` ("grouped_mm" is transformers' default)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    experts, two_inter, hidden = w1.shape
    cfg = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=two_inter // 2, num_experts=experts, hidden_act="silu")
    cfg._experts_implementation = implementation
    with torch.device("meta"):
        module = Qwen3MoeExperts(cfg)
    module.gate_up_proj = torch.nn.Parameter(w1, requires_grad=False)
    module.down_proj = torch.nn.Parameter(w2, requires_grad=False)
    return module


def bench_shape(name: str, shape: tuple[int, int, int, int], weights_: tuple[torch.Tensor, torch.Tensor], tokens: int,
                device: str, repeats: int, copy_bw: float | None, flops: float | None) -> dict[str, Any]:
    hidden, inter, experts, top_k = shape
    w1, w2 = weights_
    dtype = w1.dtype
    g = torch.Generator(device="cpu").manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    weights, ids = route_topk(torch.randn(tokens, experts, generator=g).to(device), top_k, True)
    out = fused_moe(x, w1, w2, weights, ids)
    ref = fused_moe_reference(x, w1, w2, weights, ids)
    err = (out.float() - ref.float()).abs().max().item()
    fused_s = call_seconds(lambda: fused_moe(x, w1, w2, weights, ids), device, repeats)
    loop_s = call_seconds(lambda: fused_moe_reference(x, w1, w2, weights, ids), device, repeats)
    hit = int(torch.unique(ids).numel())
    weight_bytes = hit * 3 * hidden * inter * x.element_size()
    row = {"shape": name, "tokens": tokens, "dtype": str(dtype).replace("torch.", ""), "experts_hit": hit,
           "fused_ms": fused_s * 1e3, "loop_ms": loop_s * 1e3, "speedup": loop_s / fused_s, "max_abs_err": err,
           "weight_bytes": weight_bytes}
    if device.startswith("cuda"):
        _graph_rows(row, x, w1, w2, experts, top_k, tokens, repeats)
    try:
        hf = transformers_experts(w1, w2, "grouped_mm")
        hf_w = weights.to(dtype)  # transformers' routers hand the experts weights in the activation dtype
        with torch.no_grad():
            row["hf_grouped_mm_err"] = (hf(x, ids, hf_w).float() - ref.float()).abs().max().item()
            row["hf_grouped_mm_ms"] = call_seconds(lambda: hf(x, ids, hf_w), device, repeats) * 1e3
    except Exception as exc:  # an older transformers or torch without grouped_mm: report, keep the rest
        row["hf_grouped_mm_error"] = f"{type(exc).__name__}: {exc}"
    if copy_bw:
        row["bw_floor_ms"] = weight_bytes / copy_bw * 1e3
        row["pct_of_bw_floor"] = 100 * row["bw_floor_ms"] / row["fused_ms"]
    if flops:
        row["flop_floor_ms"] = 2 * tokens * top_k * 3 * hidden * inter / flops * 1e3
    return row


GRAPH_ROUTINGS = 8


def _graph_rows(row: dict[str, Any], x, w1, w2, experts: int, top_k: int, tokens: int, repeats: int) -> None:
    """Time per call inside one captured graph (no host in the loop: what a decode step pays), over
    `GRAPH_ROUTINGS` different routings so the experts read differ from call to call (L2 cannot serve them)."""
    from optimum_amdx.benchmark.timing import graph_ms

    g = torch.Generator(device="cpu").manual_seed(1000 + tokens)
    routes = [route_topk(torch.randn(tokens, experts, generator=g).to(x.device), top_k, True)
              for _ in range(GRAPH_ROUTINGS)]
    methods = ["auto", "grouped"] + (["small"] if tokens <= 64 else [])
    for method in methods:
        calls = [lambda w=w, i=i: fused_moe(x, w1, w2, w, i, method=method) for w, i in routes]
        row[f"graph_{method}_ms"] = graph_ms(calls, reps=repeats)
    try:
        hf = transformers_experts(w1, w2, "grouped_mm")
        with torch.no_grad():
            calls = [lambda w=w, i=i: hf(x, i, w.to(x.dtype)) for w, i in routes]
            row["graph_hf_grouped_mm_ms"] = graph_ms(calls, reps=repeats)
    except Exception as exc:  # not capturable on this torch/transformers: say so
        row["graph_hf_grouped_mm_error"] = f"{type(exc).__name__}: {exc}"


SWEEP = [  # grouped GEMM tiles for the prefill sweep: BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
    (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 32, 4, 4),
    (64, 256, 64, 8, 3), (128, 256, 64, 8, 3),
]


def sweep(shapes: dict, tokens: list[int], dtype: torch.dtype, repeats: int) -> list[dict[str, Any]]:
    """The grouped path's time for each tile config of `SWEEP` (device events, host included)."""
    from optimum_amdx.kernels._fused_moe_triton import fused_moe_triton

    rows = []
    for name, shape in shapes.items():
        w1, w2 = make_weights(shape, dtype, "cuda")
        for t in tokens:
            g = torch.Generator(device="cpu").manual_seed(t)
            x = torch.randn(t, shape[0], generator=g).to("cuda", dtype)
            weights, ids = route_topk(torch.randn(t, shape[2], generator=g).cuda(), shape[3], True)
            ref = fused_moe_reference(x, w1, w2, weights, ids).float()
            for bm, bn, bk, warps, stages in SWEEP:
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}
                try:
                    err = (fused_moe_triton(x, w1, w2, weights, ids, "nvidia", cfg).float() - ref).abs().max().item()
                    ms = call_seconds(lambda: fused_moe_triton(x, w1, w2, weights, ids, "nvidia", cfg), "cuda",
                                      repeats) * 1e3
                except Exception as exc:  # e.g. out of shared memory: skip the config
                    rows.append({"shape": name, "tokens": t, "cfg": cfg, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                rows.append({"shape": name, "tokens": t, "cfg": cfg, "ms": ms, "max_abs_err": err})
                print(f"sweep {name:<14} {t:>5} {bm:>4} {bn:>4} {bk:>3} w{warps} s{stages}: {ms:8.3f} ms "
                      f"err {err:.2e}", flush=True)
        del w1, w2
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,16,64,512,2048")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
    parser.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, to check the script runs")
    parser.add_argument("--sweep", default="", help="also time the grouped path's tile configs at these token counts")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    tokens = [int(t) for t in args.tokens.split(",") if t]
    if args.smoke:
        device, dtype, shapes, copy_bw, flops = "cpu", torch.float32, SMOKE, None, None
        tokens, args.repeats = [1, 7], 2
    else:
        if not torch.cuda.is_available():
            print("benchmarks/bench_fused_moe.py needs a GPU (or --smoke).", file=sys.stderr)
            return 2
        from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth, measure_matmul_flops

        device = "cuda"
        shapes = {s: SHAPES[s] for s in args.shapes.split(",") if s}
        dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
        copy_bw = measure_copy_bandwidth(device)
        flops = measure_matmul_flops(device, dtype)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    rows = []
    for s, shape in shapes.items():
        w = make_weights(shape, dtype, device)
        for t in tokens:
            rows.append(bench_shape(s, shape, w, t, device, args.repeats, copy_bw, flops))
            print(rows[-1], flush=True)
        del w
    graph_cols = ("graph_auto_ms", "graph_small_ms", "graph_grouped_ms", "graph_hf_grouped_mm_ms")
    if any(c in r for r in rows for c in graph_cols):
        print("\ninside one captured graph (ms per call, 8 routings rotated):")
        print(f"{'shape':<14} {'tokens':>6} {'auto':>8} {'small':>8} {'grouped':>8} {'hf gmm':>8} {'bw floor':>9} {'% bw':>5}")
        for r in rows:
            cells = [f"{r[c]:>8.3f}" if c in r else f"{'-':>8}" for c in graph_cols]
            pct = f"{100 * r['bw_floor_ms'] / r['graph_auto_ms']:.0f}%" if "bw_floor_ms" in r else "-"
            print(f"{r['shape']:<14} {r['tokens']:>6} {' '.join(cells)} {r.get('bw_floor_ms', float('nan')):>9.3f} {pct:>5}")
    swept = sweep(shapes, [int(t) for t in args.sweep.split(",") if t], dtype, args.repeats) if args.sweep and not args.smoke else []
    print(f"device: {name}, {dtype}, copy {copy_bw or 0:.3e} B/s, matmul {flops or 0:.3e} FLOP/s")
    print(f"{'shape':<14} {'tokens':>6} {'hit':>4} {'fused ms':>9} {'loop ms':>9} {'hf gmm ms':>9} {'vs loop':>8} "
          f"{'vs gmm':>7} {'bw floor':>9} {'% bw':>5} {'flop floor':>10} {'err':>9}")
    for r in rows:
        pct = f"{r['pct_of_bw_floor']:.0f}%" if "pct_of_bw_floor" in r else "-"
        gmm = r.get("hf_grouped_mm_ms")
        print(f"{r['shape']:<14} {r['tokens']:>6} {r['experts_hit']:>4} {r['fused_ms']:>9.3f} {r['loop_ms']:>9.3f} "
              f"{gmm if gmm is not None else float('nan'):>9.3f} {r['speedup']:>7.2f}x "
              f"{(gmm / r['fused_ms']) if gmm else float('nan'):>6.2f}x {r.get('bw_floor_ms', float('nan')):>9.3f} "
              f"{pct:>5} {r.get('flop_floor_ms', float('nan')):>10.3f} {r['max_abs_err']:>9.2e}")
    if args.out:
        write_json(args.out, {"device": name, "copy_bw_Bps": copy_bw, "matmul_flops": flops, "rows": rows,
                              "sweep": swept})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
