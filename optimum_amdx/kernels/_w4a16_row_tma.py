"""The one-row W4A16 loop with its weight tiles streamed by TMA (NVIDIA sm_90+).

Why a kernel of its own: the one-row stream loop (`_w4a16_triton._w4a16_stream_kernel`, packed fp16 math)
is bound by memory latency, not bytes or instructions (RESULTS.md round11: Nsight Compute shows
long-scoreboard stalls first, and taking 16 instructions out of its 233 per tile changed nothing). Each
program holds the next 8 KB tile in registers while it computes the current one, and those registers cap
the SM at 4 programs of 8 warps: 32 KB in flight per SM. Doubling the programs (4 warps each, the
`wide_rule`) gained 7 % where there are tiles enough for them. Here the tiles come through shared memory:
a tensor descriptor load inside ``tl.range(num_stages=STAGES)`` becomes TMA copies that Triton's pipeliner
keeps ``STAGES - 1`` tiles ahead (the plain-load loop is not pipelined at all: its TTGIR has no
asynchronous copies), so more bytes are in flight per program without registers to hold them.

Everything else is the stream kernel's: the same share of tiles per program, the same packed math
(`_dot32`), activation pairs (`_xpair`, prepared by `_w4a16_xpack_kernel` for act-order or ragged K),
scales and zeros (`_group_consts`) and split-K flush (`_flush_row`). NVIDIA sm_90+ only (TMA and the
packed PTX); AMD and the interpreter never take it, so it has no AMD compile spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import triton
import triton.language as tl

from ._pdl import pdl_begin
from ._w4a16_triton import _dot32, _flush_row, _group_consts, _xpair

if TYPE_CHECKING:
    from .w4a16 import W4A16Weight


@triton.jit
def _w4a16_row_tma_kernel(
    x_ptr, w_desc, s_ptr, z_ptr, xp_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, N, K, KT, NB, n_units,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ZEROS: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, XPREP: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    # unit u = column block u // KT, K tile u % KT: rows u * BLOCK_N .. + BLOCK_N of the [units * BLOCK_N, 16] words
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    u0 = pid * n_units // n_prog
    u1 = (pid + 1) * n_units // n_prog
    offs_loc = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, 16)
    if PDL:  # launched before x's producer ended (`runtime.pdl_enabled`): wait before reading x
        pdl_begin()
    # One pipelined inner loop per column block the share touches (at most a few), its flush after it:
    # a barrier inside the pipelined loop (the flush has one) would stop Triton from pipelining it.
    for nb in range(u0 // KT, (u1 - 1) // KT + 1):
        offs_n = nb * BLOCK_N + offs_loc
        acc2 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
        for u in tl.range(tl.maximum(u0, nb * KT), tl.minimum(u1, nb * KT + KT), num_stages=STAGES):
            cur = w_desc.load([u * BLOCK_N, 0])
            kt = u - nb * KT
            k0 = kt * 128
            x0 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 0, XPREP)
            x1 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 1, XPREP)
            x2 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 2, XPREP)
            x3 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 3, XPREP)
            zl0, zh0, zl1, zh1, s0, s1, s2, s3 = _group_consts(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE, CHUNKS,
                                                               HAS_ZEROS, EVEN_K)
            acc2 = _dot32(acc2, cur, x0, x1, x2, x3, zl0, zh0, zl1, zh1, s0, s1, s2, s3, CHUNKS)
        _flush_row(acc2, nb, u0, u1, n_prog, n_units, KT, NB, N, 0, offs_loc, out_ptr, ws_ptr, cnt_ptr,
                   bias_ptr, 0, BLOCK_N, HAS_BIAS)


def tma_eligible(arch: str) -> bool:
    """TMA needs an NVIDIA sm_90 or newer target ("sm_90", "sm_100", ...)."""
    if not arch.startswith("sm_"):
        return False
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return bool(digits) and int(digits) >= 90


def row_tma_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], out: torch.Tensor,
                   xp: torch.Tensor, xprep: bool, cfg: dict[str, Any], pdl: bool) -> None:
    """``out = x2 @ W (+ bias)`` for one fp16 row (called by `_w4a16_triton.stream_matmul`, which prepared
    the activation pairs `xp` when `xprep`, picked the config and the PDL switch)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from . import _w4a16_triton as kt_mod

    k, n = w.in_features, w.out_features
    kt, nb = w.k_tiles, w.n_blocks
    n_units = kt * nb
    tile_n = kt_mod.TILE_N
    words = w.qweight.reshape(n_units * tile_n, 16)
    desc = TensorDescriptor(words, [n_units * tile_n, 16], [16, 1], [tile_n, 16])
    gs = kt_mod._group_arg(w)
    stages = int(cfg.get("TMA_STAGES", 3))
    key = ("tma", x2.device, cfg.get("num_warps"), stages, gs, w.zeros is not None, bias is not None,
           k % kt_mod.TILE_K == 0, xprep, pdl)
    grid = kt_mod.stream_grid(n_units, 1, cfg, x2.device, key)
    ws, cnt = kt_mod._workspace(x2.device, n, nb)
    ck = _w4a16_row_tma_kernel[(grid,)](
        x2, desc, w.scales, w.zeros if w.zeros is not None else w.scales, xp,
        bias if bias is not None else w.scales, out, ws, cnt, n, k, kt, nb, n_units,
        GROUP_SIZE=gs, CHUNKS=kt_mod._chunks(gs), BLOCK_N=tile_n, HAS_ZEROS=w.zeros is not None,
        HAS_BIAS=bias is not None, EVEN_K=k % kt_mod.TILE_K == 0, XPREP=xprep, STAGES=stages, PDL=pdl,
        launch_pdl=pdl, num_warps=cfg["num_warps"], num_stages=stages,
    )
    if key not in kt_mod._RESIDENT:
        resident = kt_mod._resident_programs(ck, x2.device)
        if resident is not None:
            kt_mod._RESIDENT[key] = resident
