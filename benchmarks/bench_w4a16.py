"""W4A16 GPTQ matmul on a GPU against the measured ceilings and torch's fp16 matmul.

One run measures:
  * copy bandwidth (bytes read + written per second of a large device copy) and the fp16 matmul rate;
  * decode (M = 1, and M = 16) for K x N = 4096x4096, 4096x11008, 11008x4096, group 128, with and
    without act-order: bytes the kernel must read (packed weights, scales, perm, activations) per
    second as % of copy bandwidth (target >= 85%). Calls are replayed from a CUDA/HIP graph over
    enough weight copies that they cannot sit in L2;
  * prefill (M = 2048): time against torch's fp16 matmul on the dequantized weight (target >= 0.8x);
  * with --sweep, a grid of tile configs for both paths, to choose the shipped defaults;
  * with --quick (under a minute on an H200): only the default M=1 / M=16 / M=2048 rows, the dequant
    kernel alone, and a small GEMV config sweep (tile width, warps, programs per SM, ticket vs
    fp32-atomic reduction) on 4096x11008 and 11008x4096.
Prints a table and writes JSON (--out). Usage: python benchmarks/bench_w4a16.py --quick --out w4a16.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from typing import Any, Callable, Optional

import torch

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth, measure_matmul_flops
from optimum_amdx.kernels._w4a16_triton import (
    GEMM_CONFIGS,
    GEMV_CONFIGS,
    _family_config,
    dequantize_dense,
    w4a16_triton,
)
from optimum_amdx.kernels.runtime import device_arch
from optimum_amdx.kernels.w4a16 import W4A16Weight, pack_gptq_int32, prepare_gptq_weight

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]
L2_DEFEAT_BYTES = 400 << 20


def events_ms(fn: Callable[[], Any], reps: int = 25, warmup: int = 3) -> float:
    """Median device-event milliseconds of one call of `fn`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def graphed_ms(calls: list[Callable[[], Any]], reps: int = 20) -> float:
    """Median milliseconds per call when all `calls` are replayed from one captured graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    return events_ms(graph.replay, reps=reps) / len(calls)




def random_gptq(k: int, n: int, group: int, act_order: bool, seed: int) -> W4A16Weight:
    """A random symmetric 4-bit GPTQ layer (v1 format) prepared for the kernels, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(0, 16, (k, n), device="cuda", generator=g, dtype=torch.int32)
    n_groups = k // group
    scales = (torch.rand(n_groups, n, device="cuda", generator=g) * 0.02 + 0.001).half()
    qzeros = pack_gptq_int32(torch.full((n_groups, n), 7, device="cuda", dtype=torch.int32), 4, dim=1)
    if act_order:
        perm = torch.randperm(k, device="cuda", generator=g)
        g_idx = torch.empty(k, dtype=torch.int32, device="cuda")
        g_idx[perm] = (torch.arange(k, device="cuda") // group).to(torch.int32)
    else:
        g_idx = (torch.arange(k, device="cuda") // group).to(torch.int32)
    return prepare_gptq_weight(pack_gptq_int32(q, 4, dim=0), qzeros, scales, g_idx, group_size=group)


def bytes_read(w: W4A16Weight, m: int) -> int:
    """Bytes a W4A16 call must move: packed weights, scales, zeros, perm, activations and output."""
    total = w.qweight.numel() * 4 + w.scales.numel() * 2
    total += w.zeros.numel() * 2 if w.zeros is not None else 0
    total += w.perm.numel() * 4 if w.perm is not None else 0
    return total + m * (w.in_features + w.out_features) * 2


def decode_case(k: int, n: int, m: int, act_order: bool, copy_bw: float,
                config: Optional[dict[str, Any]] = None, baseline: bool = True) -> dict[str, Any]:
    """M-row W4A16 over enough weight copies to exceed L2, replayed from a graph."""
    w0 = random_gptq(k, n, 128, act_order, seed=k + n + int(act_order))
    copies = max(2, L2_DEFEAT_BYTES // (w0.qweight.numel() * 4))
    ws = [w0] + [W4A16Weight(w0.qweight.clone(), w0.scales.clone(), w0.zeros, w0.perm, k, n, w0.group_size, 4, True)
                 for _ in range(copies - 1)]
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    calls = [lambda w=w: w4a16_triton(x, w, config=config) for w in ws]
    ms = graphed_ms(calls)
    nbytes = bytes_read(w0, m)
    torch_ms = float("nan")
    if baseline:
        fp16_ws = [torch.randn(k, n, device="cuda", dtype=torch.float16)
                   for _ in range(max(2, L2_DEFEAT_BYTES // (k * n * 2)))]
        torch_ms = graphed_ms([lambda w=w: x @ w for w in fp16_ws])
        del fp16_ws
    return {"path": "gemv", "M": m, "K": k, "N": n, "act_order": act_order, "ms": ms,
            "GB_s": nbytes / (ms * 1e-3) / 1e9, "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw,
            "torch_fp16_ms": torch_ms, "speedup_vs_fp16": torch_ms / ms, "config": config or "default"}


def prefill_case(k: int, n: int, m: int, act_order: bool, mm_rate: float,
                 config: Optional[dict[str, Any]] = None, route: Optional[str] = None) -> dict[str, Any]:
    """M-row W4A16 (default dispatch, or a forced route) vs torch fp16 matmul on the dequantized weight."""
    w = random_gptq(k, n, 128, act_order, seed=k * 3 + n + int(act_order))
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    fp16_w = w.dequantize().half()
    ms = events_ms(lambda: w4a16_triton(x, w, config=config, route=route))
    torch_ms = events_ms(lambda: x @ fp16_w)
    flops = 2 * m * k * n
    return {"path": route or "gemm", "M": m, "K": k, "N": n, "act_order": act_order, "ms": ms, "torch_fp16_ms": torch_ms,
            "ratio_vs_torch": torch_ms / ms, "TFLOP_s": flops / (ms * 1e-3) / 1e12,
            "pct_matmul_rate": 100 * flops / (ms * 1e-3) / mm_rate, "config": config or "default"}


def dequant_case(k: int, n: int, copy_bw: float) -> dict[str, Any]:
    """The dequant kernel alone (the M >= 256 route's first half): packed read + fp16 write vs copy."""
    w = random_gptq(k, n, 128, False, seed=k + 2 * n)
    ms = events_ms(lambda: dequantize_dense(w, torch.float16))
    nbytes = bytes_read(w, 0) + k * n * 2
    return {"path": "deq", "M": 0, "K": k, "N": n, "act_order": False, "ms": ms,
            "GB_s": nbytes / (ms * 1e-3) / 1e9, "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw,
            "torch_fp16_ms": float("nan"), "speedup_vs_fp16": float("nan"), "config": "default"}


def _gemv_cfg(bn: int, warps: int, ppc: int, atomic: bool, bk: int = 128) -> dict[str, Any]:
    return {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": 2, "programs_per_cu": ppc,
            "ATOMIC": atomic}


def _try_decode(rows: list[dict[str, Any]], k: int, n: int, m: int, copy_bw: float, cfg: dict[str, Any]) -> None:
    try:
        r = decode_case(k, n, m, False, copy_bw, cfg, baseline=False)
        r["path"] = "gemv" if m == 1 else "gemv16"
        rows.append(r)
    except Exception as exc:  # a config that does not compile is recorded, not fatal
        rows.append({"path": "gemv", "M": m, "K": k, "N": n, "config": cfg, "error": str(exc)[:200]})


def quick_sweep(copy_bw: float) -> list[dict[str, Any]]:
    """The GEMV knobs that the static analysis could not settle: tile width (x reuse vs occupancy),
    programs per SM (atomics vs loads in flight), and the split-K reduction (ticket vs fp32 atomics)."""
    rows: list[dict[str, Any]] = []
    for bn, warps, ppc, atomic in ((256, 4, 4, False), (256, 4, 2, False), (256, 4, 8, False), (256, 4, 16, False),
                                   (128, 4, 4, False), (512, 8, 4, False), (256, 8, 4, False),
                                   (256, 4, 4, True), (256, 4, 8, True), (128, 4, 8, True)):
        for k, n in ((4096, 11008), (11008, 4096)):
            _try_decode(rows, k, n, 1, copy_bw, _gemv_cfg(bn, warps, ppc, atomic))
    for bn, warps, ppc, atomic in ((256, 4, 4, False), (128, 4, 4, False), (128, 4, 8, False), (64, 4, 8, False),
                                   (128, 4, 8, True)):
        _try_decode(rows, 4096, 11008, 16, copy_bw, _gemv_cfg(bn, warps, ppc, atomic))
    return rows


def sweep(copy_bw: float, mm_rate: float) -> list[dict[str, Any]]:
    """A grid over the tile knobs of both paths, and the GEMM-vs-dequant crossover in M."""
    rows = []
    for bn, warps, ppc, atomic in itertools.product((128, 256, 512), (4, 8), (2, 4, 8, 16), (False, True)):
        for k, n in ((4096, 11008), (11008, 4096)):
            _try_decode(rows, k, n, 1, copy_bw, _gemv_cfg(bn, warps, ppc, atomic))
    for bn, warps, ppc, atomic in itertools.product((64, 128, 256), (4, 8), (4, 8), (False, True)):
        _try_decode(rows, 4096, 11008, 16, copy_bw, _gemv_cfg(bn, warps, ppc, atomic))
    for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
                                      (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)):
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": warps, "num_stages": stages}
        for m in (64, 2048):
            try:
                rows.append(prefill_case(4096, 11008, m, False, mm_rate, cfg, route="gemm"))
            except Exception as exc:
                rows.append({"path": "gemm", "K": 4096, "N": 11008, "config": cfg, "error": str(exc)[:200]})
    for m in (32, 64, 128, 256, 512):
        for route in ("gemm", "dequant"):
            r = prefill_case(4096, 11008, m, False, mm_rate, route=route)
            r["path"] = f"{route}-M{m}"
            rows.append(r)
    return rows


def _print_sweep(rows: list[dict[str, Any]]) -> None:
    print("sweep (best first per path/shape; config = BLOCK_N,BLOCK_K,warps,stages,programs_per_cu,ATOMIC):")
    ok = [r for r in rows if "error" not in r]
    for r in sorted(ok, key=lambda r: (r["path"], r["K"], r.get("M", 0), -r.get("pct_copy_bw", r.get("ratio_vs_torch", 0)))):
        score = f"{r['pct_copy_bw']:.1f}%copy" if "pct_copy_bw" in r else f"{r['ratio_vs_torch']:.2f}x"
        cfg = r["config"] if isinstance(r["config"], str) else ",".join(f"{v}" for v in r["config"].values())
        print(f"  {r['path']:7} M{r.get('M')} {r['K']}x{r['N']} {score:>10} {r['ms'] * 1e3:7.1f}us {cfg}")
    for r in rows:
        if "error" in r:
            print(f"  error {r['path']} {r['config']}: {r['error'][:120]}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write results as JSON here")
    parser.add_argument("--sweep", action="store_true", help="also run the full config sweep")
    parser.add_argument("--quick", action="store_true",
                        help="default M=1/16/2048 rows, the dequant kernel and a small GEMV sweep (< 1 min on H200)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_w4a16 needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    arch = device_arch()
    copy_bw, mm_rate = measure_copy_bandwidth("cuda"), measure_matmul_flops("cuda", torch.float16)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "arch": arch, "copy_GB_s": copy_bw / 1e9, "matmul_TFLOP_s": mm_rate / 1e12,
        "gemv_config": _family_config(GEMV_CONFIGS, arch), "gemm_config": _family_config(GEMM_CONFIGS, arch),
        "rows": [],
    }
    acts = (False,) if args.quick else (False, True)
    for (k, n), act in itertools.product(SHAPES, acts):
        result["rows"].append(decode_case(k, n, 1, act, copy_bw))
    if args.quick:
        result["rows"].append(decode_case(4096, 11008, 1, True, copy_bw))
    for k, n in SHAPES:
        result["rows"].append(decode_case(k, n, 16, False, copy_bw))
    if args.quick:
        result["rows"].append(decode_case(4096, 11008, 4, False, copy_bw))
    for (k, n), act in itertools.product(SHAPES, acts):
        result["rows"].append(prefill_case(k, n, 2048, act, mm_rate))
    for k, n in SHAPES:
        result["rows"].append(dequant_case(k, n, copy_bw))
    if not args.quick:
        for k, n in SHAPES:
            result["rows"].append(prefill_case(k, n, 2048, False, mm_rate, route="gemm"))
    if args.quick:
        result["sweep"] = quick_sweep(copy_bw)
    elif args.sweep:
        result["sweep"] = sweep(copy_bw, mm_rate)
    print(f"device {result['device']} ({arch}); copy {copy_bw / 1e9:.0f} GB/s; fp16 matmul {mm_rate / 1e12:.0f} TFLOP/s")
    print(f"gemv default {result['gemv_config']}")
    if "sweep" in result:
        _print_sweep(result["sweep"])
    print(f"{'path':5} {'M':>5} {'K':>6} {'N':>6} {'act':>4} {'us':>8} {'GB/s':>7} {'%copy':>6} {'vs fp16':>8}")
    for r in result["rows"]:
        if r["path"] in ("gemv", "deq"):
            print(f"{r['path']:5} {r['M']:>5} {r['K']:>6} {r['N']:>6} {str(r['act_order'])[0]:>4} {r['ms'] * 1e3:8.1f} "
                  f"{r['GB_s']:7.0f} {r['pct_copy_bw']:6.1f} {r['speedup_vs_fp16']:7.2f}x")
        else:
            print(f"{r['path'][:5]:5} {r['M']:>5} {r['K']:>6} {r['N']:>6} {str(r['act_order'])[0]:>4} {r['ms'] * 1e3:8.1f} "
                  f"{r['TFLOP_s']:6.0f}TF {r['pct_matmul_rate']:5.1f}% {r['ratio_vs_torch']:7.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
