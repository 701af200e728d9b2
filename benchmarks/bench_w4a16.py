"""W4A16 GPTQ matmul on a GPU: the issue-13 table, our kernels beside torch fp16 and the peers.

One run measures, on the current GPU:
  * the ceilings: copy bandwidth (bytes read + written per second) and the fp16 matmul rate;
  * M = 1 on the seven Llama shapes, groups 128 and 32, with and without act-order: bytes a call
    must move (packed weights + scales + zeros + perm + x + out) per second, as % of copy bandwidth
    (goal >= 80 %), and the floor (those bytes at copy bandwidth);
  * M = 1 .. 2048 on three shapes (g128): ours, torch fp16 on the dequantized weight, GemLite
    (PyPI, Triton) and torch's int4 kernel (`_weight_int4pack_mm`, bf16 activations), side by side,
    with the ratios the goals name (M 2..16 vs our M = 1 time; vs fp16; vs the faster peer);
  * with --sweep, programs per SM for the stream kernel at M = 1 and 16;
  * with --read-floor, beside each M = 1 row the best a read-only kernel does over the same bytes in the same
    harness (`benchmark.read_floor`), plain and with PDL: the most any kernel could reach on that call.
Every time is the median of graph replays over enough weight copies that L2 cannot hold them.
Prints the tables and writes JSON (--out).
Usage: python benchmarks/bench_w4a16.py --out w4a16.json [--quick] [--sweep] [--no-peers]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
from typing import Any, Callable, Iterator, Optional

import torch

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth, measure_matmul_flops
from optimum_amdx.benchmark.read_floor import read_floor_ms
from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels.runtime import device_arch, pdl_enabled
from optimum_amdx.kernels.w4a16 import (W4A16Weight, dispatch_route, pack_gptq_int32, prepare_gptq_weight,
                                        w4a16_matmul)

LLAMA_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 11008), (11008, 4096), (8192, 28672), (28672, 8192)]
BATCH_SHAPES = [(4096, 14336), (14336, 4096), (4096, 4096)]
BATCH_MS = [1, 2, 4, 8, 16, 17, 32, 64, 128, 255, 256, 1024, 2048]


def random_gptq(k: int, n: int, group: int, act_order: bool, seed: int, asym: bool = False,
                device: str = "cuda") -> tuple[W4A16Weight, dict]:
    """A random 4-bit GPTQ layer (v1 format) prepared for the kernels, on `device` (the GPU; "cpu" for the
    interpreter), and its raw codes."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randint(0, 16, (k, n), device=device, generator=g, dtype=torch.int32)
    n_groups = k // group
    scales = (torch.rand(n_groups, n, device=device, generator=g) * 0.02 + 0.001).half()
    zeros = (torch.randint(5, 11, (n_groups, n), device=device, generator=g, dtype=torch.int32) if asym
             else torch.full((n_groups, n), 8, device=device, dtype=torch.int32))
    qzeros = pack_gptq_int32(zeros - 1, 4, dim=1)
    if act_order:
        perm = torch.randperm(k, device=device, generator=g)
        g_idx = torch.empty(k, dtype=torch.int32, device=device)
        g_idx[perm] = (torch.arange(k, device=device) // group).to(torch.int32)
    else:
        g_idx = (torch.arange(k, device=device) // group).to(torch.int32)
    w = prepare_gptq_weight(pack_gptq_int32(q, 4, dim=0), qzeros, scales, g_idx, group_size=group)
    return w, {"q": q, "scales": scales, "zeros": zeros, "group": group}


def _clone(w: W4A16Weight) -> W4A16Weight:
    return W4A16Weight(w.qweight.clone(), w.scales.clone(), None if w.zeros is None else w.zeros.clone(), w.perm,
                       w.in_features, w.out_features, w.group_size, 4, True)


def call_bytes(w: W4A16Weight, m: int) -> int:
    """Bytes a W4A16 call must move: packed weights, scales, zeros, perm, activations and output."""
    k, n = w.in_features, w.out_features
    total = k * n // 2 + w.scales.numel() * 2
    total += w.zeros.numel() * 2 if w.zeros is not None else 0
    total += w.perm.numel() * 4 if w.perm is not None else 0
    return total + m * (k + n) * 2


def ours_ms(w0: W4A16Weight, m: int, config: Optional[dict[str, Any]] = None, route: Optional[str] = None,
            dtype: torch.dtype = torch.float16) -> float:
    x = torch.randn(m, w0.in_features, device="cuda", dtype=dtype)
    ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
    return graph_ms([lambda w=w: w4a16_matmul(x, w, config=config, route=route) for w in ws])


CROSS_MS = [2, 16, 32, 48, 64, 128, 192, 255, 512]


def crossover(shapes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Every route at the row counts where the dispatcher switches (`w4a16.ROUTE_LIMITS`), with
    torch fp16 on the dense weight beside them: stream (up to 64 rows), fused GEMM, dequant + BLAS."""
    rows = []
    for k, n in shapes:
        w, _ = random_gptq(k, n, 128, False, seed=5 * k + n)
        for m in CROSS_MS:
            r = {"K": k, "N": n, "M": m, "stream_ms": ours_ms(w, m, route="stream") if m <= 64 else float("nan"),
                 "gemm_ms": ours_ms(w, m, route="gemm") if m > 1 else float("nan"),
                 "dequant_ms": ours_ms(w, m, route="dequant"), "fp16_ms": fp16_ms(k, n, m)}
            rows.append(r)
            print(f"  crossover {k}x{n} M={m}: stream {r['stream_ms'] * 1e3:.1f} us, gemm {r['gemm_ms'] * 1e3:.1f} us, "
                  f"dequant+BLAS {r['dequant_ms'] * 1e3:.1f} us, fp16 {r['fp16_ms'] * 1e3:.1f} us", flush=True)
    return rows


def _gemm_sweep_configs(m: int) -> list[dict[str, Any]]:
    """Tile width and warps x register prefetch depth (0, 1, 2 tiles ahead) with the operand in row
    order (NATURAL), one baseline in the bit-reversed plane order, and the split-K target (waves)."""
    if m <= 64:
        bm = max(16, m)
        cfgs = [{"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": 1, "NATURAL": True, "PREFETCH": pf,
                 "waves": 2} for bn, nw in ((64, 4), (128, 8), (64, 8), (128, 4)) for pf in (0, 1, 2)]
        cfgs.append({"BLOCK_M": bm, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 2})
        cfgs += [{"BLOCK_M": bm, "BLOCK_N": 128, "num_warps": 8, "num_stages": 1, "NATURAL": True, "PREFETCH": 2,
                  "waves": wv} for wv in (1, 4, 8)]
        # occupancy: more split-K programs per SM, and a register cap so more of them are resident
        cfgs += [dict({"BLOCK_M": bm, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "NATURAL": True, "PREFETCH": 2,
                       "waves": wv}, **({"maxnreg": r} if r else {}))
                 for wv in (2, 4, 6) for r in (0, 128, 96) if (wv, r) != (2, 0)]
        return cfgs
    return [{"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": 1, "NATURAL": True, "PREFETCH": pf,
             "waves": 1} for bm in (64, 128) for bn, nw in ((128, 8), (64, 4)) for pf in (0, 2)]


def gemm_sweep(copy_bw: float, ms: list[int]) -> list[dict[str, Any]]:
    """Tiles, warps, pipeline stages, x gathered once per call (X_PREP) and the split-K target of the
    fused GEMM, on two shapes (g128 sym; M=64 also act-order)."""
    rows = []
    for (k, n), m in itertools.product(((4096, 14336), (4096, 4096)), ms):
        w, _ = random_gptq(k, n, 128, False, seed=k + n)
        for cfg in _gemm_sweep_configs(m):
            try:
                t = ours_ms(w, m, cfg, route="gemm")
            except Exception as exc:  # noqa: BLE001 - a config that fails is recorded, not fatal
                rows.append({"K": k, "N": n, "M": m, "config": cfg, "error": str(exc)[:200]})
                print(f"  gemm-sweep {k}x{n} M={m} {cfg}: error {str(exc)[:120]}", flush=True)
                continue
            rows.append({"K": k, "N": n, "M": m, "config": cfg, "ms": t})
            print(f"  gemm-sweep {k}x{n} M={m} {cfg}: {t * 1e3:.1f} us", flush=True)
    return rows


def fp16_ms(k: int, n: int, m: int) -> float:
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(l2_cold_copies(k * n * 2))]
    ms = graph_ms([lambda w=w: torch.nn.functional.linear(x, w) for w in ws])
    del ws
    return ms


def gemlite_fn(raw: dict, k: int, n: int) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """GemLite's A16W4 layer on the same codes (its own packing), or None when GemLite is missing."""
    try:
        from gemlite.helper import A16Wn
    except Exception:  # noqa: BLE001 - a missing or broken peer is reported, not fatal
        return None
    g = raw["group"]
    w_q = raw["q"].t().contiguous().to(torch.uint8)  # [N, K]
    scales = raw["scales"].float().t().contiguous()  # [N, K / g]
    zeros = raw["zeros"].float().t().contiguous()
    layer = A16Wn(device="cuda:0", dtype=torch.float16).from_weights(w_q, scales.half(), zeros.half(), W_nbits=4,
                                                                     group_size=g)
    return layer


def int4pack_fn(raw: dict, k: int, n: int) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """torch's tinygemm int4 kernel on the same codes (bf16 activations), or None when missing."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm"):
        return None
    g = raw["group"]
    q = raw["q"].t().contiguous()  # [N, K]
    packed_u8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
    wp = torch.ops.aten._convert_weight_to_int4pack(packed_u8, 8)
    s = raw["scales"].float()  # [K/g, N]
    zero_off = (8 - raw["zeros"].float()) * s
    sz = torch.stack([s, zero_off], dim=-1).to(torch.bfloat16).contiguous()  # [K/g, N, 2]
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, wp, g, sz)


def peer_ms(make: Callable[..., Any], raw: dict, k: int, n: int, m: int, dtype: torch.dtype) -> float:
    """Median graph-replayed time of a peer over enough copies of its weights to defeat L2."""
    try:
        fns = [make(raw, k, n) for _ in range(l2_cold_copies(k * n // 2))]
        if fns[0] is None:
            return float("nan")
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        ms = graph_ms([lambda f=f: f(x) for f in fns])
        del fns
        return ms
    except Exception as exc:  # noqa: BLE001 - a peer failing on a shape is recorded, not fatal
        print(f"  peer {getattr(make, '__name__', make)} failed at M={m} {k}x{n}: {str(exc)[:160]}", flush=True)
        return float("nan")


def m1_table(copy_bw: float, shapes: list[tuple[int, int]], read_floor: bool = False,
             progress: Optional[Callable[[list[dict[str, Any]]], None]] = None) -> list[dict[str, Any]]:
    """The goal-1 table; with `read_floor`, each row also gets the best time a read-only kernel takes over the same
    bytes in the same harness, plain and with PDL where the GPU has it (`benchmark.read_floor`): the most any kernel
    could reach there. `progress` gets the rows so far after each one (the script saves them)."""
    rows = []
    for (k, n), group, act in itertools.product(shapes, (128, 32), (False, True)):
        w, _ = random_gptq(k, n, group, act, seed=k + n + group + int(act))
        ms = ours_ms(w, 1)
        nbytes = call_bytes(w, 1)
        rows.append({"K": k, "N": n, "group": group, "act_order": act, "ms": ms, "floor_ms": nbytes / copy_bw * 1e3,
                     "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw})
        line = (f"  M=1 {k:>5}x{n:<5} g{group:<3} act={int(act)} {ms * 1e3:7.1f} us  floor {rows[-1]['floor_ms'] * 1e3:6.1f} us"
                f"  {rows[-1]['pct_copy_bw']:5.1f}% of copy")
        if read_floor:
            for mode in ("plain", "pdl") if pdl_enabled(device_arch()) else ("plain",):
                rf = read_floor_ms(nbytes, pdl=mode == "pdl")
                rf["pct_copy_bw"] = 100 * nbytes / (rf["ms"] * 1e-3) / copy_bw
                rows[-1][f"read_floor_{mode}"] = rf
                line += f"  read {mode} {rf['ms'] * 1e3:5.1f} us ({rf['pct_copy_bw']:4.1f}%)"
        print(line, flush=True)
        if progress:
            progress(rows)
        del w
    return rows


def batch_table(copy_bw: float, mm_rate: float, shapes: list[tuple[int, int]], ms_list: list[int],
                peers: bool, progress: Optional[Callable[[list[dict[str, Any]]], None]] = None) -> list[dict[str, Any]]:
    """Ours (the dispatcher's route) beside torch fp16 and the peers, with the floor: max(bytes / copy
    bandwidth, FLOPs / fp16 matmul rate), both measured in this run. `progress` gets the rows so far after each."""
    rows = []
    for k, n in shapes:
        w, raw = random_gptq(k, n, 128, False, seed=3 * k + n)
        m1 = ours_ms(w, 1) if 1 not in ms_list else None  # the one-row time the goal-2 ratio divides by
        for m in ms_list:
            ours = ours_ms(w, m)
            m1 = ours if m == 1 else m1
            fp16 = fp16_ms(k, n, m)
            gl = peer_ms(gemlite_fn, raw, k, n, m, torch.float16) if peers and m <= 2048 else float("nan")
            tg = peer_ms(int4pack_fn, raw, k, n, m, torch.bfloat16) if peers and m <= 2048 else float("nan")
            best_peer = min((v for v in (gl, tg) if v == v), default=float("nan"))
            floor = max(call_bytes(w, m) / copy_bw, 2 * m * k * n / mm_rate) * 1e3  # ms
            r = {"K": k, "N": n, "M": m, "ours_ms": ours, "fp16_ms": fp16, "gemlite_ms": gl, "int4pack_ms": tg,
                 "floor_ms": floor, "route": dispatch_route(m, w, torch.float16, device_arch()),
                 "vs_fp16": fp16 / ours, "vs_best_peer": best_peer / ours, "vs_own_m1": ours / m1,
                 "pct_copy_bw": 100 * call_bytes(w, m) / (ours * 1e-3) / copy_bw}
            rows.append(r)
            print(f"  {k:>5}x{n:<5} M={m:<4} [{r['route']}] floor {floor * 1e3:6.1f}  ours {ours * 1e3:7.1f} us "
                  f"({r['pct_copy_bw']:5.1f}% copy, "
                  f"{r['vs_own_m1']:.2f}x own M=1)  fp16 {fp16 * 1e3:7.1f}  gemlite {gl * 1e3:7.1f}  int4pack "
                  f"{tg * 1e3:7.1f}  -> {r['vs_fp16']:.2f}x fp16, {r['vs_best_peer']:.2f}x best peer", flush=True)
            if progress:
                progress(rows)
        del w, raw
    return rows


def _sweep_configs(m: int) -> list[dict[str, Any]]:
    if m == 1:
        return [dict({"BLOCK_M": 1, "num_warps": w, "programs_per_cu": p}, **extra)
                for w, p, extra in ((4, 8, {}), (4, 8, {"maxnreg": 96}), (4, 8, {"maxnreg": 80}), (8, 8, {}),
                                    (8, 8, {"FENCE": True}), (4, 8, {"maxnreg": 96, "FENCE": True}))]
    bms = (16,) if m <= 16 else (32, 64) if m <= 64 else (64,)
    return [{"BLOCK_M": bm, "num_warps": w, "programs_per_cu": p, "JOIN": j}
            for bm in bms for w in (4, 8) for j in (True, False) for p in (2, 8)]


def sweep(copy_bw: float, ms: list[int]) -> list[dict[str, Any]]:
    """Warps, programs per SM (capped by residency), the prefetch fence (M = 1) and one joined dot
    per tile vs one dot per nibble plane (M > 1), on two shapes."""
    rows = []
    for (k, n), m in itertools.product(((4096, 14336), (4096, 4096), (8192, 28672)), ms):
        w, _ = random_gptq(k, n, 128, False, seed=k + n)
        for cfg in _sweep_configs(m):
            try:
                ms = ours_ms(w, m, cfg)
            except Exception as exc:  # noqa: BLE001 - a config that fails is recorded, not fatal
                rows.append({"K": k, "N": n, "M": m, "config": cfg, "error": str(exc)[:200]})
                print(f"  sweep {k}x{n} M={m} {cfg}: error {str(exc)[:120]}", flush=True)
                continue
            rows.append({"K": k, "N": n, "M": m, "config": cfg, "ms": ms,
                         "pct_copy_bw": 100 * call_bytes(w, m) / (ms * 1e-3) / copy_bw})
            print(f"  sweep {k}x{n} M={m} {cfg}: {ms * 1e3:.1f} us ({rows[-1]['pct_copy_bw']:.1f}%)", flush=True)
    return rows


DECODE_SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]
"""The Llama-3-8B decode step's fused W4A16 shapes (q/k/v, o, gate/up, down)."""


def parse_knob(spec: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2,...`` -> (KEY, [V1, V2, ...]); used by --knob-ab here and decode_step.py. Several knobs
    move together as ``K1+K2=a+b,c+d`` (each value names one integer per key)."""
    key, _, values = spec.partition("=")
    vals = values.split(",") if values else []
    n_keys = len(key.split("+"))

    def one_int_per_key(value: str) -> bool:
        parts = value.split("+")
        return len(parts) == n_keys and all(p.lstrip("-").isdigit() for p in parts)

    if not key or not vals or not all(one_int_per_key(v) for v in vals):
        raise SystemExit(f"expected KEY=V1,V2,... or K1+K2=V1+W1,V2+W2 (integers), got {spec!r}")
    return key, vals


def parse_configs(spec: str) -> list[tuple[str, dict[str, int]]]:
    """``"K=V:K=V;K=V"`` -> named config overrides (";" between configs, ":" between keys; integer values);
    used by bench_w4a16_prefill.py --pipelined and attention_decode_sweep.py --configs."""
    out = []
    for item in filter(None, spec.split(";")):
        pairs = [kv.split("=") for kv in item.split(":")]
        try:
            out.append((item, {key: int(v) for key, v in pairs}))
        except ValueError:
            raise SystemExit(f"expected K=V:K=V;... (integers), got {item!r}") from None
    return out


PIPELINED_ONLY_KNOBS = frozenset({"SCALE_AFTER", "PDL", "PDL_TRIGGER", "L2_AHEAD", "UNROLL"})
"""Knobs that only the pipelined GEMM's configs take (the other routes' kernels have no such parameter)."""


@contextlib.contextmanager
def knob_on_routes(key: str, value: str) -> Iterator[None]:
    """`key` = `value` (``K1+K2`` = ``a+b`` for several) in the shipped configs of the one-row and
    pipelined routes (what shipping the knob would do), restored on exit."""
    from optimum_amdx.kernels import _w4a16_pipelined_triton as kp
    from optimum_amdx.kernels import _w4a16_triton as kt

    pipelined = list(kp.PIPELINED_CONFIGS.values())
    tables = [kt.STREAM_CONFIGS[kt._family(device_arch())][1], *pipelined]
    saved = [dict(t) for t in tables]
    try:
        for t in tables:
            for k, v in zip(key.split("+"), str(value).split("+")):
                if k in PIPELINED_ONLY_KNOBS and not any(t is p for p in pipelined):
                    continue
                t[k] = int(v)
        yield
    finally:
        for t, old in zip(tables, saved):
            t.clear()
            t.update(old)


def knob_ab(copy_bw: float, key: str, values: list[str], ms: list[int], shapes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Each value of an integer knob on the dispatcher's own routes, side by side per shape and row count
    (g128 sym, plus act-order g32 asym on 4096x14336), so one run compares them."""
    rows = []
    cases = [(k, n, 128, False) for k, n in shapes] + [(4096, 14336, 32, True)]
    for k, n, group, act in cases:
        w, _ = random_gptq(k, n, group, act, seed=k + n + group, asym=act)
        for m in ms:
            r: dict[str, Any] = {"K": k, "N": n, "M": m, "group": group, "act_order": act,
                                 "route": dispatch_route(m, w, torch.float16, device_arch()), "us": {}}
            for v in values:
                with knob_on_routes(key, v):
                    r["us"][str(v)] = ours_ms(w, m) * 1e3
            base = r["us"][str(values[0])]
            r["pct_copy_bw"] = {v: 100 * call_bytes(w, m) / (t * 1e-6) / copy_bw for v, t in r["us"].items()}
            rows.append(r)
            print(f"  {key} {k:>5}x{n:<5} g{group} act={int(act)} M={m:<3} [{r['route']}] "
                  + "  ".join(f"{v}: {t:6.1f} us ({t / base:.3f}x, {r['pct_copy_bw'][v]:4.1f}%)"
                              for v, t in r["us"].items()), flush=True)
        del w
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write results as JSON here")
    parser.add_argument("--knob-ab", help="KEY=V1,V2,...: only time these values of an integer config knob on the "
                        "one-row and pipelined routes, decode shapes (e.g. num_warps=4,8)")
    parser.add_argument("--knob-ab-m", default="1,2,3,4,8,16,32,64", help="row counts --knob-ab covers")
    parser.add_argument("--quick", action="store_true", help="three M=1 shapes and a shorter M list")
    parser.add_argument("--sweep", action="store_true", help="also sweep programs per SM and warps")
    parser.add_argument("--no-peers", action="store_true", help="skip GemLite and torch int4")
    parser.add_argument("--skip-m1", action="store_true", help="skip the seven-shape M=1 table")
    parser.add_argument("--m1-only", action="store_true", help="only the seven-shape M=1 table")
    parser.add_argument("--read-floor", action="store_true", help="with the M=1 table: the best a read-only kernel "
                        "does over each call's bytes, plain and with PDL (what any kernel could reach there)")
    parser.add_argument("--sweep-only", action="store_true", help="only the config sweep")
    parser.add_argument("--crossover-only", action="store_true", help="only stream vs dequant at 16..255 rows")
    parser.add_argument("--sweep-m", default="1,16,32,64,128", help="row counts the sweep covers")
    parser.add_argument("--batch-ms", help="row counts of the batch table (comma separated)")
    parser.add_argument("--gemm-sweep-only", action="store_true", help="only the fused GEMM config sweep")
    parser.add_argument("--gemm-sweep-m", default="16,32,64,128,256,1024", help="row counts the GEMM sweep covers")
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_w4a16 needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    copy_bw, mm_rate = measure_copy_bandwidth("cuda"), measure_matmul_flops("cuda", torch.float16)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "arch": device_arch(), "torch": torch.__version__,
                              "copy_GB_s": copy_bw / 1e9, "matmul_TFLOP_s": mm_rate / 1e12}

    def save(**partial: Any) -> None:
        """The results so far (with `partial` sections in progress) to --out, whole: a run cut off keeps its rows."""
        if args.out:
            write_json(args.out, {**result, **partial})

    print(f"device {result['device']} ({result['arch']}); copy {copy_bw / 1e9:.0f} GB/s; fp16 matmul "
          f"{mm_rate / 1e12:.0f} TFLOP/s", flush=True)
    if args.knob_ab:
        key, values = parse_knob(args.knob_ab)
        result["knob_ab"] = knob_ab(copy_bw, key, values, [int(v) for v in args.knob_ab_m.split(",")], DECODE_SHAPES)
        save()
        return 0
    if args.gemm_sweep_only:
        result["gemm_sweep"] = gemm_sweep(copy_bw, [int(v) for v in args.gemm_sweep_m.split(",")])
        save()
        return 0
    if args.crossover_only:
        result["crossover"] = crossover(BATCH_SHAPES)
        save()
        return 0
    if args.sweep or args.sweep_only:
        result["sweep"] = sweep(copy_bw, [int(v) for v in args.sweep_m.split(",")])
        save()
        if args.sweep_only:
            return 0
    if not args.skip_m1:
        result["m1"] = m1_table(copy_bw, LLAMA_SHAPES[:3] if args.quick else LLAMA_SHAPES, args.read_floor,
                                progress=lambda rows: save(m1=rows))
    ms_list = [1, 4, 16, 32, 64, 128, 256, 2048] if args.quick else BATCH_MS
    if args.batch_ms:
        ms_list = [int(v) for v in args.batch_ms.split(",")]
    result["batch"] = [] if args.m1_only else batch_table(copy_bw, mm_rate, BATCH_SHAPES, ms_list, not args.no_peers,
                                                          progress=lambda rows: save(batch=rows))
    if result.get("m1"):
        print("\nM=1 (graph-replayed, L2-cold): % of copy bandwidth, goal >= 80")
        print(f"{'K x N':>13} | {'g128':>6} {'g128 act':>8} | {'g32':>6} {'g32 act':>8}")
    for k, n in LLAMA_SHAPES:
        cells = {(r["group"], r["act_order"]): r["pct_copy_bw"] for r in result.get("m1", []) if (r["K"], r["N"]) == (k, n)}
        if cells:
            print(f"{k:>6}x{n:<6} | {cells[(128, False)]:6.1f} {cells[(128, True)]:8.1f} | {cells[(32, False)]:6.1f} "
                  f"{cells[(32, True)]:8.1f}")
    if args.read_floor and result.get("m1"):
        print("\nM=1 read floor (a read-only kernel over the same bytes, best program size): % of copy, plain / PDL")
        print(f"{'K x N':>13} | {'g128':>11} {'g128 act':>11} | {'g32':>11} {'g32 act':>11}")
        for k, n in LLAMA_SHAPES:
            rs = {(r["group"], r["act_order"]): r for r in result["m1"] if (r["K"], r["N"]) == (k, n)}
            if rs:
                print(f"{k:>6}x{n:<6} | " + " ".join(
                    f"{rs[key]['read_floor_plain']['pct_copy_bw']:5.1f}/"
                    + (f"{rs[key]['read_floor_pdl']['pct_copy_bw']:<5.1f}" if "read_floor_pdl" in rs[key] else "  -  ")
                    for key in ((128, False), (128, True), (32, False), (32, True))))
    if result["batch"]:
        print("\nBatch sizes (g128, us; ratios > 1 mean ours is faster)")
        print(f"{'K x N':>12} {'M':>5} {'route':>7} | {'floor':>6} {'ours':>7} {'fp16':>7} {'GemLite':>7} {'int4mm':>7} | "
              f"{'xM1':>5} {'vs fp16':>7} {'vs peer':>7}")
    for r in result["batch"]:
        print(f"{r['K']:>5}x{r['N']:<6} {r['M']:>5} {r['route']:>7} | {r['floor_ms'] * 1e3:6.1f} {r['ours_ms'] * 1e3:7.1f} "
              f"{r['fp16_ms'] * 1e3:7.1f} "
              f"{r['gemlite_ms'] * 1e3:7.1f} {r['int4pack_ms'] * 1e3:7.1f} | {r['vs_own_m1']:5.2f} {r['vs_fp16']:7.2f} "
              f"{r['vs_best_peer']:7.2f}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
