"""The pipelined fused W4A16 GEMM on NVIDIA: the tile loop of `_w4a16_gemm_triton` with the weight
words read by an inline-PTX load, so that Triton's software pipeliner stages only the activations.

Why a kernel of its own: in the fused GEMM the packed words are a plain ``tl.load``. Triton then fixes
their register layout for coalescing, converts the dequantized tile to the MMA operand layout through
shared memory, and, when asked to pipeline (``num_stages`` > 1), stages the words through shared memory
and reads them back with scalar loads (RESULTS.md, section w4gemm), so that kernel runs unpipelined,
with its activation tile loaded synchronously every K step. Here the words come from
``ld.global.nc`` in inline asm, which no compiler pass rewrites: Triton gives the load the layout the
dot operand needs (the dequantized tile feeds the MMA straight from registers: no shared-memory round
trip; on Hopper it is the register A operand of ``wgmma``) and pipelines the activation tile alone
(``cp.async``, ``num_stages`` buffers), with the MMA left asynchronous across the K steps. The sm_90
build of the 256x128 config: 254 registers, no spill, 8 HGMMA per K tile
(`tests/kernels/test_w4a16_pipelined.py` checks that structure on the CPU).

Where it wins (H100, RESULTS.md section w4pipe): the rows between the fused GEMM and dequant + BLAS
on wide outputs; the dispatcher's limits are `w4a16.ROUTE_LIMITS`. It reads the same tile-major
layout (`w4a16.W4A16Weight`) and dequantizes and writes its tiles with the fused GEMM's own helpers
(`_w4a16_gemm_triton._dequant_tile` / `_write_tile`: the exact ``2**e + q`` trick, split-K into a
persistent float32 workspace whose last split, by ticket, writes the tile, so one launch does it all
and graphs can replay it). For act-order or a K off the 128-row tiles the activations are gathered
once per call into the layout's row order (`_w4a16_gemm_triton.x_index`).

NVIDIA only (inline PTX); AMD keeps the fused GEMM, whose AMD compile specs cover the shared helpers,
and the interpreter runs this kernel with plain loads (tests only). No AMD compile spec here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import triton
import triton.language as tl

from ._w4a16_gemm_triton import E7_BITS, TILE, _dequant_tile, _workspace, _write_tile, split_k, x_index
from ._w4a16_triton import _chunks, _group_arg
from .runtime import compute_units

if TYPE_CHECKING:
    from .w4a16 import W4A16Weight


@triton.jit
def _ld_words(ptrs, PTX: tl.constexpr):
    """int32 words at `ptrs` through ``ld.global.nc`` (read-only path): opaque to the pipeliner, and
    free to take whatever register layout the consumer wants. ``PTX=False`` (the interpreter, which
    runs no asm) is a plain load: same values, so the CPU tests check everything else of the kernel."""
    if PTX:
        return tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        return tl.load(ptrs)


@triton.jit
def _w4a16_pipelined_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, KT, stride_xm, stride_om, tiles_per_split, e7_bits,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PTX_LOADS: tl.constexpr = True,
):
    # tiles in groups of GROUP_M row blocks sharing a column slice, row blocks fastest: the programs that
    # read one weight slice run together (one HBM read, the others hit L2)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    m_blocks = tl.cdiv(M, BLOCK_M)
    n_blocks = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * n_blocks
    first_m = (pid // width) * GROUP_M
    rows_in_group = tl.minimum(m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % rows_in_group
    pid_n = (pid % width) // rows_in_group
    n0 = pid_n * BLOCK_N
    offs_loc = tl.arange(0, BLOCK_N)
    offs_n = n0 + offs_loc
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    # column (n0 % 128) + c of tile column n0 // 128 owns words 16c .. 16c + 15 of each K tile
    w_offs = ((n0 // 128) * KT * 2048 + (n0 % 128) * 16) + offs_loc[:, None] * 16 + tl.arange(0, 16)[None, :]
    x_ptrs = x_ptr + offs_m[None, :] * stride_xm + tl.arange(0, 128)[:, None]  # x^T of one K tile, row order
    kt0 = pid_k * tiles_per_split
    kt1 = tl.minimum(KT, kt0 + tiles_per_split)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for kt in range(kt0, kt1):
        k0 = kt * 128
        packed = _ld_words(qw_ptr + w_offs + kt * 2048, PTX_LOADS)
        x_t = tl.load(x_ptrs + k0, mask=m_mask[None, :], other=0.0)
        wt = _dequant_tile(packed, s_ptr, z_ptr, k0, offs_n, N, K, e7_bits, x_ptr, BLOCK_N, GROUP_SIZE, CHUNKS,
                           HAS_ZEROS, EVEN_K, EVEN_N, True)
        acc = tl.dot(wt, x_t, acc)
    _write_tile(acc, out_ptr, ws_ptr, cnt_ptr + pid, SPLIT, bias_ptr, offs_m, offs_n, m_mask, N, stride_om, SPLIT,
                HAS_BIAS, BLOCK_N, BLOCK_M)


PIPELINED_CONFIGS: dict[str, dict[str, Any]] = {
    # tiles and launch options by the call's class (`pipelined_config`), from the H100 sweeps (RESULTS.md,
    # section w4pipe). K splits (`_w4a16_gemm_triton.split_k`, always ``within_waves`` here): the most that
    # keep (tiles x splits) within "waves" programs per SM, at least "min_k_tiles" K tiles per split.
    "rows16": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "min_k_tiles": 8},
    "rows32": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 2, "min_k_tiles": 8},
    "narrow32": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "min_k_tiles": 8},
    "rows128": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 2, "min_k_tiles": 16},
    "narrow_long_k": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "waves": 2,
                      "min_k_tiles": 16},
    "rows256": {"BLOCK_M": 256, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "waves": 1},
}
LONG_K = 8192
"""Input widths above this (14336, 11008) on a narrow output take 64 x 128 tiles split along K from 33
rows on: few column tiles, many K tiles to share out."""


def pipelined_config(m: int, k: int, narrow: bool, chunks: int = 1) -> dict[str, Any]:
    """The config for `m` rows of a `k`-input weight; `narrow`: an output under `w4a16.WIDE_N` columns;
    `chunks`: scale groups per 128-row tile. The 256x128 tile only serves one group per tile: with more,
    its sm_90 build spills (168 B with Triton 3.6.0, 1024 B with 3.9.0; none with 3.7.1), so those
    layouts keep 64x64 tiles, which do not."""
    if m <= 16:
        name = "rows16"
    elif m <= 32 and narrow and k <= LONG_K:  # few column tiles and a short K: split it further
        name = "narrow32"
    elif m <= 32 or (m <= 64 and narrow and k <= LONG_K):
        name = "rows32"
    elif narrow and k > LONG_K:
        name = "narrow_long_k"
    elif m <= 128 or chunks > 1:
        name = "rows128"
    else:
        name = "rows256"
    return dict(PIPELINED_CONFIGS[name])


def pipelined_eligible(arch: str, w: "W4A16Weight") -> bool:
    """Whether the dispatcher may send `w` here: an NVIDIA target (inline PTX) and a 4-bit kernel-ready
    weight. `arch` is "cpu" under the interpreter (`w4a16_matmul` sets it): the dispatcher never picks
    this kernel there, but a forced ``route="pipelined"`` runs it with plain loads (tests)."""
    return not arch.startswith("gfx") and arch != "cpu" and w.bits == 4 and w.kernel_ready


def pipelined_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], arch: str,
                     config: Optional[dict[str, Any]] = None, narrow: bool = False) -> torch.Tensor:
    """``x2 @ W (+ bias)`` through the pipelined fused GEMM; x2 is ``[M, K]`` with unit stride along K.
    `narrow` (an output under `w4a16.WIDE_N` columns) picks the config when `config` is None."""
    if not (pipelined_eligible(arch, w) or (arch == "cpu" and w.bits == 4 and w.kernel_ready)):
        raise ValueError("the pipelined W4A16 GEMM needs an NVIDIA GPU (or the interpreter) and a 4-bit "
                         "kernel-ready weight")
    m = x2.shape[0]
    k, n = w.in_features, w.out_features
    gs = _group_arg(w)
    cfg = dict(config or pipelined_config(m, k, narrow, _chunks(gs)))
    cfg.setdefault("within_waves", True)  # this kernel's split rule (see `split_k`)
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if TILE % block_n:
        raise ValueError(f"BLOCK_N={block_n} must divide the layout's {TILE}-column tile")
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    if w.perm is not None or k % TILE:  # x in the layout's row order, zero columns for the padded rows
        x_src = torch.nn.functional.pad(x2, (0, 1)).index_select(1, x_index(w, True))
    else:
        x_src = x2
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    splits, per = split_k(tiles, 1, w.k_tiles, cfg, compute_units(x2.device))
    # the fused GEMM's persistent workspace: its tickets (one per 16 x 32 tile) outnumber these tiles
    ws, cnt = _workspace(x2.device, n, m) if splits > 1 else (out, out)
    _w4a16_pipelined_kernel[(tiles, splits)](
        x_src, w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales,
        bias if bias is not None else w.scales, out, ws, cnt,
        m, n, k, w.k_tiles, x_src.stride(0), out.stride(0), per, E7_BITS,
        GROUP_SIZE=gs, CHUNKS=_chunks(gs), BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=cfg.get("GROUP_M", 8),
        SPLIT=splits, HAS_ZEROS=w.zeros is not None, HAS_BIAS=bias is not None,
        EVEN_K=k % TILE == 0, EVEN_N=n % block_n == 0, PTX_LOADS=arch != "cpu",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out
