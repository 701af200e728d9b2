"""Prototype (issue 13, goal 1 and batch-1 decode): one-row W4A16 calls whose programs load a batch of weight tiles
before any math, few programs per SM, and let the next launch start at once (PDL).

Round 29 (RESULTS.md, section round29, 1) measured a read-only kernel over a one-row call's bytes in the same
harness: with programs of 32-64 KB, one per SM, that let the next launch start at their start, a chain of such
reads runs at 97-103 % of copy on an H200, 4096x4096 included; the shipped one-row kernel reads 28-56 % on the
7B-8B shapes. The shipped kernel fills every resident slot with short programs that hold one tile ahead, so the next
call's programs cannot start loading until this call's leave. This form gives each program one column block's run of
T tiles (T = KT / S), loads them BATCH at a time ([BATCH, 128, 16] words in registers, the next batch loaded before
the current one's math), waits for the previous kernel only after its first batch is on its way, and flushes as the
shipped kernel does (`_flush_row`: float32 partial sums and a ticket, or a plain store when S = 1).

fp16, one scale group per tile (g128), prepared activation pairs (the decode step's paired input), NVIDIA (the
packed PTX loop `_dot32`). Each cell is timed as every W4A16 figure is (graph replays over L2-cold weight copies):
the shipped call on the same paired input beside this form at each (S, BATCH, warps), with and without PDL.
With --accumulate, the decode step's form: the sums added into a float32 accumulator (no flush), on the Llama-3-8B
q/k/v, o and down shapes, PDL on, against the shipped accumulating call on the same paired input.
Usage: python benchmarks/proto_w4a16_batch_rows.py [--accumulate] [out.json]
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
import triton
import triton.language as tl

from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels._pdl import gdc_launch_dependents, gdc_wait
from optimum_amdx.kernels._w4a16_triton import _bias_pairs, _dot32, _flush_row, _leave_block, _workspace, stream_matmul
from optimum_amdx.kernels.runtime import device_arch
from optimum_amdx.kernels.w4a16 import pair_order

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_w4a16 import _clone, random_gptq  # noqa: E402


@triton.jit
def _batch_consts(s_ptr, z_ptr, xp_ptr, units, valid, nb, offs_loc, offs_r, KT, N, BLOCK_N: tl.constexpr,
                  HAS_ZEROS: tl.constexpr):
    """x pairs [B, 1, 16], bias pairs and float32 scales [B, BLOCK_N, 1] of a batch of tiles of column block nb
    (one scale group per tile: group = K tile); tiles past the program's run get scale 0."""
    kts = units - nb * KT
    xb = xp_ptr + kts[:, None, None] * 64 + offs_r[None, None, :]
    x0 = tl.load(xb)
    x1 = tl.load(xb + 16)
    x2 = tl.load(xb + 32)
    x3 = tl.load(xb + 48)
    cols = nb * BLOCK_N + offs_loc
    s = tl.load(s_ptr + kts[:, None] * N + cols[None, :]).to(tl.float32)
    s = tl.where(valid[:, None], s, 0.0)
    if HAS_ZEROS:
        z = tl.load(z_ptr + kts[:, None] * N + cols[None, :]).to(tl.float32)
    else:
        z = tl.full(s.shape, 8.0, tl.float32)
    zl, zh = _bias_pairs(z, z)
    return x0, x1, x2, x3, zl[:, :, None], zh[:, :, None], s[:, :, None]


@triton.jit
def _words_at(units, tile_offs, TILE_WORDS: tl.constexpr):
    """Word offsets [B, BLOCK_N, 16] of the tiles `units`, each row of 16 words one contiguous 64-byte run (the hint
    lets the compiler load them 16 bytes at a time)."""
    offs = units[:, None, None] * TILE_WORDS + tile_offs
    return tl.max_contiguous(tl.multiple_of(offs, [1, 1, 16]), [1, 1, 16])


@triton.jit
def _batch_row_kernel(qw_ptr, s_ptr, z_ptr, xp_ptr, out_ptr, ws_ptr, cnt_ptr, N, KT, NB, n_units,
                      BLOCK_N: tl.constexpr, BATCH: tl.constexpr, HAS_ZEROS: tl.constexpr, PDL: tl.constexpr,
                      ACCUM: tl.constexpr = False):
    TILE_WORDS: tl.constexpr = BLOCK_N * 16
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    u0 = pid * n_units // n_prog
    u1 = (pid + 1) * n_units // n_prog
    nb = u0 // KT
    offs_loc = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, 16)
    offs_b = tl.arange(0, BATCH)
    tile_offs = offs_loc[None, :, None] * 16 + offs_r[None, None, :]
    if PDL:
        gdc_launch_dependents()
    units = tl.minimum(u0 + offs_b, u1 - 1)
    cur = tl.load(qw_ptr + _words_at(units, tile_offs, TILE_WORDS))
    if PDL:
        gdc_wait()
    acc3 = tl.zeros([BATCH, BLOCK_N, 16], dtype=tl.float32)
    for ub in range(u0, u1, BATCH):
        un = tl.minimum(ub + BATCH + offs_b, u1 - 1)
        nxt = tl.load(qw_ptr + _words_at(un, tile_offs, TILE_WORDS))
        units = tl.minimum(ub + offs_b, u1 - 1)
        x0, x1, x2, x3, zl, zh, s = _batch_consts(s_ptr, z_ptr, xp_ptr, units, (ub + offs_b) < u1, nb, offs_loc,
                                                  offs_r, KT, N, BLOCK_N, HAS_ZEROS)
        if ub < 0:  # never taken: keeps ptxas from sinking the next batch's loads below this batch's math
            tl.store(cnt_ptr + ub, 0)
        acc3 = _dot32(acc3, cur, x0, x1, x2, x3, zl, zh, zl, zh, s, s, s, s, 1)
        cur = nxt
    if ACCUM:  # the decode step's form: the sums go into the caller's float32 accumulator (`ws_ptr`), no flush
        offs_n = nb * BLOCK_N + offs_loc
        _leave_block(tl.sum(tl.sum(acc3, axis=0), axis=1), out_ptr, ws_ptr + offs_n, offs_n < N, ws_ptr, offs_n, N,
                     nb, u0, u1, n_prog, n_units, KT, cnt_ptr, 1, False, True)
    else:
        _flush_row(tl.sum(acc3, axis=0), nb, u0, u1, n_prog, n_units, KT, NB, N, 0, offs_loc, out_ptr, ws_ptr,
                   cnt_ptr, ws_ptr, 0, BLOCK_N, False)


def batch_rows(xp: torch.Tensor, w, out: torch.Tensor, splits: int, batch: int, warps: int, pdl: bool,
               acc: torch.Tensor | None = None) -> None:
    """out[0] = x @ W for the paired one-row input `xp` (int32 words), `splits` programs per column block; with
    `acc` (float32 [1, N]) the sums are added into it instead (no flush, as the decode step's accumulating calls)."""
    kt, nb = w.k_tiles, w.n_blocks
    ws, cnt = _workspace(xp.device, w.out_features, nb)
    if acc is not None:
        ws = acc
    extra = {"launch_pdl": True} if pdl else {}
    _batch_row_kernel[(nb * splits,)](w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales, xp, out, ws,
                                      cnt, w.out_features, kt, nb, kt * nb, BLOCK_N=128, BATCH=batch,
                                      HAS_ZEROS=w.zeros is not None, PDL=pdl, ACCUM=acc is not None, num_warps=warps,
                                      **extra)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="write the cells as JSON here")
    ap.add_argument("--accumulate", action="store_true", help="the decode step's form: sums added into a float32 "
                    "accumulator (no flush), on q/k/v, o and down of Llama-3-8B, PDL on")
    args = ap.parse_args()
    if args.out:
        result_path_or_exit(args.out, "out")  # before measuring: it replaces only a result we wrote
    torch.manual_seed(0)
    arch = device_arch()
    shapes = [(4096, 6144), (4096, 4096), (14336, 4096)] if args.accumulate else [(4096, 4096), (4096, 14336),
                                                                                   (14336, 4096)]
    rows = []
    for k, n in shapes:
        w0, _ = random_gptq(k, n, 128, False, seed=k + n)
        ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        xp = x[:, pair_order(k, x.device)].contiguous().view(torch.int32)
        out = torch.empty(1, n, device="cuda", dtype=torch.float16)
        acc = torch.zeros(1, n, device="cuda", dtype=torch.float32) if args.accumulate else None
        ref = torch.empty_like(out)
        stream_matmul(xp.view(torch.float16), w0, None, ref, arch, paired=True)
        if args.accumulate:  # the accumulator is never zeroed between timed calls (the same for both forms)
            shipped = graph_ms([lambda w=w: stream_matmul(xp.view(torch.float16), w, None, acc, arch, accumulate=True,
                                                          paired=True) for w in ws]) * 1e3
        else:
            shipped = graph_ms([lambda w=w: stream_matmul(xp.view(torch.float16), w, None, out, arch, paired=True)
                                for w in ws]) * 1e3
        row = {"K": k, "N": n, "accumulate": args.accumulate, "shipped_paired_us": shipped, "cells": []}
        kt = w0.k_tiles
        grid = itertools.product([d for d in (1, 2, 4, 8, 16) if kt % d == 0], (2, 4, 8), (4, 8),
                                 (True,) if args.accumulate else (True, False))
        for s, batch, warps, pdl in grid:
            if batch > kt // s or (args.accumulate and batch == 8 and warps == 4):
                continue
            try:
                if acc is not None:
                    acc.zero_()
                batch_rows(xp, w0, out, s, batch, warps, pdl, acc)
                torch.cuda.synchronize()
                got = acc if acc is not None else out
                err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                t = graph_ms([lambda w=w: batch_rows(xp, w, out, s, batch, warps, pdl, acc) for w in ws]) * 1e3
            except Exception as e:  # a config that does not compile (registers) is recorded, not fatal
                row["cells"].append({"S": s, "BATCH": batch, "warps": warps, "pdl": pdl,
                                     "error": (str(e).splitlines() or [type(e).__name__])[0][:120]})
                continue
            row["cells"].append({"S": s, "BATCH": batch, "warps": warps, "pdl": pdl, "us": t, "rel_err": err})
        ok = [c for c in row["cells"] if "us" in c]
        best = {p: min((c for c in ok if c["pdl"] == p), key=lambda c: c["us"], default=None) for p in (True, False)}
        print(f"{k}x{n}{' accumulating' if args.accumulate else ''}: shipped (paired) {shipped:.1f} us; " + "; ".join(
            f"{'PDL' if p else 'plain'} best {c['us']:.1f} us (S={c['S']} B={c['BATCH']} w={c['warps']}, "
            f"{kt // c['S']} tiles a program, {w0.n_blocks * c['S']} programs, err {c['rel_err']:.1e})"
            for p, c in best.items() if c), flush=True)
        for c in sorted(ok, key=lambda c: c["us"])[:6]:
            print("   ", c, flush=True)
        errs = [c for c in row["cells"] if "error" in c]
        if errs:
            print(f"    {len(errs)} configs failed, first: {errs[0]}", flush=True)
        rows.append(row)
    if args.out:
        write_json(args.out, {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
