"""Prototype (issue 13, goals 1 and 4): a one-row W4A16 call with no split-K flush, by column strips.

The shipped one-row kernel (`_w4a16_stream_kernel`, stream-K) gives every resident program an equal run of
128 x 128 tiles. Programs share column blocks, so a call ends with the split-K flush: float32 atomics, a fence, a
ticket and the last sharer's read-back. RESULTS.md round11 measured the flush at 1.30 us of an H100 call (the
launch 1.15, the rest 0.46): on 4096x4096 (6.0 us) that is a fifth of the call, and a pure read of the weight's
bytes takes 4.6 us.

This prototype gives each program a strip of CW columns of one column block and the whole of K, so no two
programs share an output and the sums meet only inside the program (one reduction through shared memory at the
end, then a plain store). A strip of CW columns is CW * 64 contiguous bytes of every tile of its column block.
Each loop step loads S tiles' strips at once (``[S, CW, 16]`` words) and the next step's before this one's math,
so bytes in flight per program = 2 * S * CW * 64. The math is the shipped packed loop's (`_dot32`, fp16x2 products
of (q - z) and x pairs, scaled per group in float32) on NVIDIA, or a float32 form elsewhere (the interpreter).
Scope of the prototype: one row, fp16, groups that span whole tiles (g128, g-1), no act-order, K a multiple of 128.

Prediction (H100): without the flush a call is about the pure read plus the math it hides, so 4096x4096
6.0 -> about 4.8 us, and the 14336-class weights about 1.3 us less (14.3 -> 13.0).

Outcome (RESULTS.md round26, section 4): at best a tie, up to 1.18x slower on tall weights; not kept. With
programmatic dependent launch the shipped call's flush is mostly off the chain's critical path, and strips hold
fewer bytes in flight per SM than the stream kernel's tiles.

Known defect: the packed math (`_dot32`) sums four words per asm instance under the first one's column scale, which
holds only where Triton gives each thread four consecutive words of one column. The g512 check case (CW 32, S 8,
4 warps) got another layout on the GPU and fails there; every timed config matched the shipped call.

Usage:
  python benchmarks/proto_w4a16_strips.py --check           (correctness; runs under TRITON_INTERPRET=1 too, with
                                                            Triton 3.7 or later: 3.6's interpreter rejects its loop)
  python benchmarks/proto_w4a16_strips.py --out F.json [--configs "CW,S,WARPS;..."]   (GPU: timings)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from optimum_amdx.io import result_path_or_exit, write_json  # noqa: E402
from optimum_amdx.kernels._pdl import pdl_begin  # noqa: E402
from optimum_amdx.kernels._w4a16_triton import _LDG_H_ASM, _bias_pairs, _dot32, _pair_h2  # noqa: E402
from optimum_amdx.kernels.runtime import interpret_mode  # noqa: E402
from optimum_amdx.kernels.w4a16 import W4A16Weight  # noqa: E402

from bench_w4a16 import _clone, call_bytes, random_gptq  # noqa: E402 - this folder is on sys.path

TILE_WORDS = 128 * 16


@triton.jit
def _strip_sz(s_ptr, z_ptr, g, cols, N, HAS_ZEROS: tl.constexpr, ASM: tl.constexpr):
    """Scales and zeros (float32) of group rows `g` ``[S, 1, 1]`` for columns `cols` ``[1, CW, 1]``; asm loads on
    NVIDIA keep the weight block's layout (see `_col_sz`)."""
    ptrs = g * N + tl.minimum(cols, N - 1)
    if ASM:
        s = tl.inline_asm_elementwise(_LDG_H_ASM, "=h,l", [s_ptr + ptrs], dtype=tl.float16, is_pure=True, pack=1)
    else:
        s = tl.load(s_ptr + ptrs)
    if HAS_ZEROS:
        if ASM:
            z = tl.inline_asm_elementwise(_LDG_H_ASM, "=h,l", [z_ptr + ptrs], dtype=tl.float16, is_pure=True,
                                          pack=1).to(tl.float32)
        else:
            z = tl.load(z_ptr + ptrs).to(tl.float32)
    else:
        z = tl.full(s.shape, 8.0, tl.float32)
    return s.to(tl.float32), z


@triton.jit
def _step_consts(x_ptr, s_ptr, z_ptr, kts, offs_r, cols, N, K, KT, GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr):
    """The packed math's operands of the step at tiles `kts` besides its words: x pairs, bias pairs, scales."""
    ok = kts < KT
    xrow = x_ptr + kts * 128 + offs_r
    g = (kts * 128) // GROUP_SIZE
    s, z = _strip_sz(s_ptr, z_ptr, tl.minimum(g, (K - 1) // GROUP_SIZE), cols, N, HAS_ZEROS, True)
    x0 = _pair_h2(tl.load(xrow, mask=ok, other=0.0), tl.load(xrow + 64, mask=ok, other=0.0))
    x1 = _pair_h2(tl.load(xrow + 16, mask=ok, other=0.0), tl.load(xrow + 80, mask=ok, other=0.0))
    x2 = _pair_h2(tl.load(xrow + 32, mask=ok, other=0.0), tl.load(xrow + 96, mask=ok, other=0.0))
    x3 = _pair_h2(tl.load(xrow + 48, mask=ok, other=0.0), tl.load(xrow + 112, mask=ok, other=0.0))
    zl, zh = _bias_pairs(z, z)
    return x0, x1, x2, x3, zl, zh, s


@triton.jit
def _strips_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, N, K, KT, GROUP_SIZE: tl.constexpr, CW: tl.constexpr,
                   S: tl.constexpr, HAS_ZEROS: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr,
                   FENCE: tl.constexpr = True, AHEAD: tl.constexpr = False):
    STRIPS: tl.constexpr = 128 // CW
    pid = tl.program_id(0)
    nb = pid // STRIPS
    c0 = (pid % STRIPS) * CW
    offs_s = tl.arange(0, S)[:, None, None]
    offs_c = tl.arange(0, CW)[None, :, None]
    offs_r = tl.arange(0, 16)[None, None, :]
    cols = nb * 128 + c0 + offs_c
    w_base = qw_ptr + nb.to(tl.int64) * KT * 2048 + offs_s * 2048 + (c0 + offs_c) * 16 + offs_r
    cur = tl.load(w_base, mask=offs_s < KT, other=0)
    if PDL:
        pdl_begin()
    acc = tl.zeros([S, CW, 16], dtype=tl.float32)
    if AHEAD:  # (ASM only) the next step's x pairs, scales and zeros are loaded with its words, a step ahead
        tl.static_assert(ASM, "the look-ahead form is the packed NVIDIA loop's")
        x0, x1, x2, x3, zl, zh, s = _step_consts(x_ptr, s_ptr, z_ptr, offs_s, offs_r, cols, N, K, KT, GROUP_SIZE,
                                                 HAS_ZEROS)
        for kt0 in range(0, KT, S):
            kts = kt0 + offs_s
            nxt = tl.load(w_base + (kt0 + S) * 2048, mask=kts + S < KT, other=0)
            y0, y1, y2, y3, yl, yh, t = _step_consts(x_ptr, s_ptr, z_ptr, kts + S, offs_r, cols, N, K, KT, GROUP_SIZE,
                                                     HAS_ZEROS)
            if FENCE:
                if kt0 < 0:
                    tl.store(out_ptr + kt0, 0.0)
            acc = _dot32(acc, cur, x0, x1, x2, x3, zl, zh, zl, zh, s, s, s, s, 1)
            cur = nxt
            x0, x1, x2, x3, zl, zh, s = y0, y1, y2, y3, yl, yh, t
        res = tl.sum(tl.sum(acc, axis=2), axis=0)
        offs_n = nb * 128 + c0 + tl.arange(0, CW)
        tl.store(out_ptr + offs_n, res.to(out_ptr.dtype.element_ty), mask=offs_n < N)
        return
    for kt0 in range(0, KT, S):
        kts = kt0 + offs_s
        nxt = tl.load(w_base + (kt0 + S) * 2048, mask=kts + S < KT, other=0)
        if FENCE:  # a branch never taken: ptxas schedules within a basic block and would sink `nxt` below the math
            if kt0 < 0:
                tl.store(out_ptr + kt0, 0.0)
        ok = kts < KT
        xrow = x_ptr + kts * 128 + offs_r
        g = (kts * 128) // GROUP_SIZE
        s, z = _strip_sz(s_ptr, z_ptr, tl.minimum(g, (K - 1) // GROUP_SIZE), cols, N, HAS_ZEROS, ASM)
        if ASM:
            x0 = _pair_h2(tl.load(xrow, mask=ok, other=0.0), tl.load(xrow + 64, mask=ok, other=0.0))
            x1 = _pair_h2(tl.load(xrow + 16, mask=ok, other=0.0), tl.load(xrow + 80, mask=ok, other=0.0))
            x2 = _pair_h2(tl.load(xrow + 32, mask=ok, other=0.0), tl.load(xrow + 96, mask=ok, other=0.0))
            x3 = _pair_h2(tl.load(xrow + 48, mask=ok, other=0.0), tl.load(xrow + 112, mask=ok, other=0.0))
            zl, zh = _bias_pairs(z, z)
            acc = _dot32(acc, cur, x0, x1, x2, x3, zl, zh, zl, zh, s, s, s, s, 1)
        else:
            part = tl.zeros([S, CW, 16], dtype=tl.float32)
            for j in tl.static_range(8):
                q = ((cur >> (4 * j)) & 15).to(tl.float32)
                xj = tl.load(xrow + 16 * j, mask=ok, other=0.0).to(tl.float32)
                part += (q - z) * xj
            acc += s * part
        cur = nxt
    res = tl.sum(tl.sum(acc, axis=2), axis=0)
    offs_n = nb * 128 + c0 + tl.arange(0, CW)
    tl.store(out_ptr + offs_n, res.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def strips_matmul(x: torch.Tensor, w: W4A16Weight, cw: int, s: int, warps: int, pdl: bool = False,
                  out: Optional[torch.Tensor] = None, ahead: bool = False) -> torch.Tensor:
    """``x @ W`` for one fp16 row by column strips (see the module docstring)."""
    k, n = w.in_features, w.out_features
    if x.shape != (1, k) or w.perm is not None or k % 128 or w.group_size % 128 or 128 % cw:
        raise ValueError("the prototype takes one row, no act-order, K a multiple of 128, groups of whole tiles")
    out = torch.empty(1, n, dtype=x.dtype, device=x.device) if out is None else out
    nb = triton.cdiv(n, 128)
    asm = x.is_cuda and torch.version.hip is None and not interpret_mode()
    _strips_kernel[(nb * (128 // cw),)](
        x, w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales, out, n, k, k // 128,
        GROUP_SIZE=min(w.group_size, k), CW=cw, S=s, HAS_ZEROS=w.zeros is not None, ASM=asm, PDL=pdl and asm,
        AHEAD=ahead and asm, num_warps=warps, num_stages=1, launch_pdl=pdl and asm)
    return out


CHECK_CASES = [  # K, N, group, asym, CW, S, warps
    (256, 128, 128, False, 32, 2, 4), (384, 200, 128, True, 16, 2, 4), (640, 256, 128, False, 64, 4, 4),
    (512, 384, 512, True, 32, 8, 4)]


def check(device: str) -> int:
    """Every case against the float64 product of the dequantized weight; returns the number of failures."""
    failures = 0
    for i, (k, n, group, asym, cw, s, warps) in enumerate(CHECK_CASES):
        w = random_gptq(k, n, group, False, seed=i, asym=asym, device=device)[0]
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(100 + i)).half().to(device)  # CPU draw: same x on any device
        ref = x.double().cpu() @ w.dequantize().double().cpu()
        got = strips_matmul(x, w, cw, s, warps).double().cpu()
        err = (got - ref).abs().max().item()
        tol = 2e-3 * ref.abs().max().item() + 1e-3
        ok = err <= tol
        failures += not ok
        print(f"check K={k} N={n} g{group} {'asym' if asym else 'sym'} CW={cw} S={s}: max err {err:.2e} "
              f"(tol {tol:.2e}) {'ok' if ok else 'FAIL'}", flush=True)
    return failures


SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 11008), (11008, 4096), (8192, 28672), (28672, 8192),
          (4096, 6144), (4096, 28672)]
CONFIGS = "16,8,8;16,4,8;32,4,8;32,8,16;16,16,16;64,4,16;64,4,8;16,4,4;32,4,4;32,8,8;128,2,8;64,2,8"
"""CW,S,WARPS configs whose sm_90 build keeps the loop free of shared-memory layout conversions (Triton 3.7.1)."""


def _name(config: tuple[int, ...], pdl: bool) -> str:
    """`strips_CW_S_WARPS`, ``a`` for the look-ahead form, ``_pdl`` with programmatic dependent launch."""
    return "strips_" + "_".join(str(v) for v in config[:3]) + ("a" if len(config) > 3 and config[3] else "") + (
        "_pdl" if pdl else "")


def timings(configs: list[tuple[int, ...]], shapes: list[tuple[int, int]], out_path: Optional[str],
            pdls: tuple[bool, ...] = (True,)) -> None:
    """The shipped one-row call (PDL as shipped, and off) against each strip config, graph-replayed, L2-cold."""
    from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth
    from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies
    from optimum_amdx.kernels import runtime
    from optimum_amdx.kernels.w4a16 import w4a16_matmul

    copy_bw = measure_copy_bandwidth("cuda")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "uuid": str(torch.cuda.get_device_properties(0).uuid),
                              "copy_GBps": copy_bw / 1e9, "rows": []}
    print(f"{result['device']} {result['uuid']}, copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    names = ["shipped", "shipped_pdl_off"] + [_name(c, p) for c in configs for p in pdls]
    print("| weight | " + " | ".join(names) + " |", flush=True)
    for k, n in shapes:
        w0 = random_gptq(k, n, 128, False, seed=k + n)[0]
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
        ref = w4a16_matmul(x, w0).float()
        row: dict[str, Any] = {"K": k, "N": n}
        row["shipped"] = graph_ms([lambda w=w: w4a16_matmul(x, w) for w in ws]) * 1e3
        saved = dict(runtime._PDL)
        runtime.set_pdl(False)
        try:
            row["shipped_pdl_off"] = graph_ms([lambda w=w: w4a16_matmul(x, w) for w in ws]) * 1e3
        finally:
            runtime._PDL.update(saved)
        for config in configs:
            cw, s, warps = config[:3]
            ahead = len(config) > 3 and bool(config[3])
            for pdl in pdls:
                got = strips_matmul(x, w0, cw, s, warps, pdl, ahead=ahead).float()
                err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
                name = _name(config, pdl)
                row[name] = graph_ms([lambda w=w: strips_matmul(x, w, cw, s, warps, pdl, ahead=ahead) for w in ws]) * 1e3
                row[name + "_relerr"] = err
        row["pct_copy"] = {name: 100 * call_bytes(w0, 1) / (row[name] * 1e-6) / copy_bw for name in names}
        result["rows"].append(row)
        right = [nm for nm in names[2:] if row[nm + "_relerr"] <= 1e-2] or names[2:]
        best = min(right, key=lambda nm: row[nm])
        print(f"| {k}x{n} | " + " | ".join(f"{row[nm]:.2f}" for nm in names) + f" | best {best} "
              f"{row[best]:.2f} us ({row['pct_copy'][best]:.1f} % of copy; shipped {row['pct_copy']['shipped']:.1f} %), "
              f"wrong (rel err > 1e-2): {[nm for nm in names[2:] if nm not in right] or 'none'} |", flush=True)
        if out_path:
            write_json(out_path, result)
        del ws


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="correctness only (CPU under TRITON_INTERPRET=1, or GPU)")
    parser.add_argument("--configs", default=CONFIGS, help="'CW,S,WARPS[,AHEAD];...' strip configs to time")
    parser.add_argument("--shapes", default=None, help="'KxN,...' (default: the Llama decode shapes)")
    parser.add_argument("--pdl", default="on", choices=["on", "off", "both"],
                        help="strip calls with programmatic dependent launch (as the shipped one-row call), without, or both")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.check or device == "cpu":
        return 1 if check(device) else 0
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";") if c]
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    failed = check(device)
    if failed:  # the timings still run: each config's own error against the shipped call is printed with it
        print(f"{failed} check case(s) failed: see each timed config's error below", flush=True)
    pdls = {"on": (True,), "off": (False,), "both": (False, True)}[args.pdl]
    timings(configs, shapes, args.out, pdls)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
