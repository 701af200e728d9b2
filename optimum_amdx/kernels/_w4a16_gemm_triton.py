"""Fused W4A16 GEMM for 2 .. a few hundred rows: the 4-bit weight is dequantized in registers inside
the K loop and fed straight to ``tl.dot``; no dense weight is ever written.

(Over 400 lines because the kernel, its per-arch configs, the split-K workspace and its AMD compile
specs belong together: a config change must be seen beside the kernel and the spec that checks it.)

It reads the same tile-major `W4A16Weight` layout as the stream kernel (`_w4a16_triton.py`; the layout
is unchanged): tile ``(nb, kt)`` = 128 columns x 128 input rows = 128 x 16 int32 words, one contiguous
8 KB run, column ``c`` owning 16 consecutive words, nibble ``j`` of word ``r`` = input row
``kt * 128 + j * 16 + r``. A program owns ``BLOCK_N`` (32, 64 or 128) consecutive columns of one tile
column, i.e. a contiguous ``BLOCK_N * 64``-byte slice of every K tile, and ``BLOCK_M`` rows of x.

The product is computed transposed, ``out^T [BLOCK_N, BLOCK_M] += W_tile^T [BLOCK_N, 128] @ x^T
[128, BLOCK_M]``: the dequantized weight is the 128-row left operand (the one wgmma on Hopper and
MFMA on AMD can take from registers) and the activations the right one. The eight nibble planes of a
tile are dequantized separately ([BLOCK_N, 16] each) and joined into one [BLOCK_N, 128] operand.
``NATURAL`` permutes the join so operand position = row of the tile (x^T is then a contiguous,
vectorized load; without it position ``p = r * 8 + t`` holds plane ``bitrev3(t)``, row ``r``, and x
is gathered in that order: 64 scalar loads per thread per tile at 64 x 64, sm_90 SASS). ``X_PREP``
gathers x (act-order permutation, padding) once per call in the front instead of in the loop (the
default for act-order weights; `gather_x`).
``PREFETCH`` loads the weight words of the next (1) or next-but-one (2) K tile into registers while
this one is computed: ptxas sinks such loads to the end of the iteration, so only depth 2 keeps a
whole iteration between a load and its use. Triton's own pipeliner (``num_stages`` > 1) is not used:
it stages the packed words through shared memory and reads them back with scalar loads.

Grid: (M blocks, N blocks, K splits), M blocks fastest so the programs that share a weight slice run
together (one HBM read, the other M blocks hit L2). When the M x N blocks do not fill the GPU, K is
split: each split atomically adds its float32 partial sums into a persistent workspace, and the last
split of an output tile (a ticket per tile) adds the bias, writes the output and clears the workspace
and the ticket, so one launch does it all and CUDA/HIP graphs can replay it.

Dequantization: the same exact trick as the stream kernel (kept here so the two kernels can change
independently): a shifted copy of the word puts nibble ``j`` at bits 16..19 (even j) or 12..15 (odd)
and one and-or with the bits of 2**7 (even) or 2**11 (odd) makes the float32 ``2**e + q``; then
``(q - z) * s`` is one FMA with the per-column constant ``(2**e + z) * s``, and one conversion to
the activation dtype. sm_90 SASS: about 5 thread instructions per weight in the loop (1 LOP3, 1 FFMA,
0.5 F2FP, the rest addresses, moves and the shared-memory round trip of the operand).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import triton
import triton.language as tl

from ._w4a16_triton import _chunks as chunks, _x_tile as _stream_x_tile  # scale groups per K tile; x gather
from .compile_spec import CompileSpec
from .runtime import arch_family, compute_units
from .w4a16 import activation_order

if TYPE_CHECKING:
    from .w4a16 import W4A16Weight

TILE = 128
"""Columns and input rows of one tile of the repacked layout (`w4a16.TILE_N` / `TILE_K`)."""
TILE_WORDS = tl.constexpr(TILE * TILE // 8)
"""int32 words of one such tile at 4 bits (2048): the stride from one K tile of a column tile's words to the next."""
E7_BITS = 0x43000000  # bits of float32 2**7


@triton.jit
def _plane(src, e7_bits, s, c, J: tl.constexpr):
    """Dequantized ``(q - z) * s`` of nibble plane J, float32, from the right shifted copy `src`."""
    if J % 2 == 0:
        bits = (src & 0xF0000) | e7_bits
    else:
        bits = (src & 0xF000) | (e7_bits + 0x2000000)
    return bits.to(tl.float32, bitcast=True) * s - c


@triton.jit
def _group_sc(s_ptr, z_ptr, row, offs_n, N, K, GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr,
              EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Scale and the two plane constants ``(2**7 + z) * s`` / ``(2**11 + z) * s`` ([BLOCK_N, 1], float32)
    of the group holding sorted input row `row` (clamped to K - 1 for padded rows)."""
    if GROUP_SIZE == 0:
        g = 0
    elif EVEN_K:
        g = row // GROUP_SIZE
    else:
        g = tl.minimum(row, K - 1) // GROUP_SIZE
    ptrs = g * N + offs_n
    if EVEN_N:
        s = tl.load(s_ptr + ptrs).to(tl.float32)
    else:
        s = tl.load(s_ptr + ptrs, mask=offs_n < N, other=0.0).to(tl.float32)
    if HAS_ZEROS:
        if EVEN_N:
            z = tl.load(z_ptr + ptrs).to(tl.float32)
        else:
            z = tl.load(z_ptr + ptrs, mask=offs_n < N, other=0.0).to(tl.float32)
    else:
        z = tl.full(s.shape, 8.0, tl.float32)
    return s[:, None], ((z + 128.0) * s)[:, None], ((z + 2048.0) * s)[:, None]


@triton.jit
def _x_tile(x_ptr, perm_ptr, k0, rows_p, offs_p, offs_m, m_mask, stride_xm, K, HAS_PERM: tl.constexpr,
            EVEN_K: tl.constexpr, X_PREP: tl.constexpr):
    """Activations x^T [128, BLOCK_M] of K tile starting at sorted row k0, in the joined operand's order."""
    if X_PREP:  # the front wrote x already permuted into (tile, position) order: contiguous, no K mask
        x_t = tl.load(x_ptr + offs_m[None, :] * stride_xm + (k0 + offs_p)[:, None], mask=m_mask[None, :], other=0.0)
    else:  # the stream kernel's gather (act-order permutation, ragged K)
        x_t = _stream_x_tile(x_ptr, perm_ptr, k0 + rows_p, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K)
    return x_t


@triton.jit
def _dequant_tile(packed, s_ptr, z_ptr, k0, offs_n, N, K, e7_bits, x_ptr, BLOCK_N: tl.constexpr,
                  GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr,
                  EVEN_N: tl.constexpr, NATURAL: tl.constexpr):
    """The weight operand ``W_tile^T`` [BLOCK_N, 128] of K tile k0 in x's dtype, from its packed words
    [BLOCK_N, 16]: each of the 8 nibble planes ``(q - z) * s`` with its group's constants (CHUNKS: scale
    groups per tile), joined in row order (NATURAL) or in the bit-reversed plane order. Shared by the
    fused GEMM and the pipelined GEMM (`_w4a16_pipelined_triton`)."""
    dt = x_ptr.dtype.element_ty
    w_l16 = packed << 16
    w_l8 = packed << 8
    w_r8 = packed >> 8
    w_r16 = packed >> 16
    s0, ce0, co0 = _group_sc(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
    if CHUNKS == 1:
        s1, ce1, co1 = s0, ce0, co0
        s2, ce2, co2 = s0, ce0, co0
        s3, ce3, co3 = s0, ce0, co0
        s4, ce4, co4 = s0, ce0, co0
        s5, ce5, co5 = s0, ce0, co0
        s6, ce6, co6 = s0, ce0, co0
        s7, ce7, co7 = s0, ce0, co0
    else:  # plane j holds rows k0 + 16j ..: its own group when a tile holds several
        s1, ce1, co1 = _group_sc(s_ptr, z_ptr, k0 + 16, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        s2, ce2, co2 = _group_sc(s_ptr, z_ptr, k0 + 32, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        s3, ce3, co3 = _group_sc(s_ptr, z_ptr, k0 + 48, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        s4, ce4, co4 = _group_sc(s_ptr, z_ptr, k0 + 64, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        s5, ce5, co5 = _group_sc(s_ptr, z_ptr, k0 + 80, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        s6, ce6, co6 = _group_sc(s_ptr, z_ptr, k0 + 96, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        s7, ce7, co7 = _group_sc(s_ptr, z_ptr, k0 + 112, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
    w0 = _plane(w_l16, e7_bits, s0, ce0, 0).to(dt)
    w1 = _plane(w_l8, e7_bits, s1, co1, 1).to(dt)
    w2 = _plane(w_l8, e7_bits, s2, ce2, 2).to(dt)
    w3 = _plane(packed, e7_bits, s3, co3, 3).to(dt)
    w4 = _plane(packed, e7_bits, s4, ce4, 4).to(dt)
    w5 = _plane(w_r8, e7_bits, s5, co5, 5).to(dt)
    w6 = _plane(w_r8, e7_bits, s6, ce6, 6).to(dt)
    w7 = _plane(w_r16, e7_bits, s7, co7, 7).to(dt)
    # [BLOCK_N, 16, 2, 2, 2]: index (a, b, c) of the joins is plane a + 2b + 4c
    wt = tl.join(tl.join(tl.join(w0, w1), tl.join(w2, w3)), tl.join(tl.join(w4, w5), tl.join(w6, w7)))
    if NATURAL:  # [BLOCK_N, c, b, a, r]: position = plane * 16 + r = the tile's row, x needs no reorder
        wt = tl.reshape(tl.permute(wt, (0, 4, 3, 2, 1)), [BLOCK_N, 128])
    else:
        wt = tl.reshape(wt, [BLOCK_N, 128])
    return wt


@triton.jit
def _write_tile(acc, out_ptr, ws_ptr, cnt, n_splits, bias_ptr, offs_m, offs_n, m_mask, N, stride_om,
                SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                ACCUM: tl.constexpr = False):
    """Store the float32 tile ``acc`` = out^T [BLOCK_N, BLOCK_M] (+ bias). With SPLIT > 1 (`n_splits`
    programs share the tile along K), add it into the float32 workspace instead; the split that takes
    the last ticket at `cnt` writes the sum and clears the workspace and the ticket (one graph-safe
    launch). Shared with `_w4a16_pipelined_triton`. ACCUM: `ws_ptr` is the caller's zeroed float32
    ``[M, N]`` accumulator and the result: the tile is stored (one split) or added (several) there, with
    no ticket and no output store (`w4a16.w4a16_accumulate`; no bias)."""
    out_mask = (offs_n < N)[:, None] & m_mask[None, :]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    if ACCUM:
        ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
        if SPLIT == 1:
            tl.store(ws_ptrs, acc, mask=out_mask)
        else:
            tl.atomic_add(ws_ptrs, acc, mask=out_mask, sem="relaxed")
    elif SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.atomic_add(ws_ptrs, acc, mask=out_mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial sums are issued before the ticket is taken
        ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
        if ticket == n_splits - 1:
            old = tl.atomic_xchg(ws_ptrs.to(tl.pointer_type(tl.int32)), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32),
                                 mask=out_mask, sem="relaxed")  # the ticket's acquire orders it
            total = old.to(tl.float32, bitcast=True)
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(cnt, 0, sem="relaxed")  # the launch's end orders it before the next one


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, KT, stride_xm, stride_om, tiles_per_split, e7_bits,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, X_PREP: tl.constexpr, NATURAL: tl.constexpr = False,
    PREFETCH: tl.constexpr = 0,
):
    # CHUNKS: scale groups per K tile (1 when a group spans whole tiles, 128 // group, or 8: one per plane)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    n0 = pid_n * BLOCK_N
    nb = n0 // 128
    offs_loc = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, 16)
    offs_n = n0 + offs_loc
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    # words of this program's slice of a tile: column (n0 % 128) + c owns words 16c .. 16c + 15
    w_offs = (nb * KT * TILE_WORDS + (n0 % 128) * 16) + offs_loc[:, None] * 16 + offs_r[None, :]
    # joined operand position p = r * 8 + t holds plane bitrev3(t), row r
    offs_p = tl.arange(0, 128)
    t = offs_p % 8
    if NATURAL:
        rows_p = offs_p
    else:
        rows_p = ((t & 1) * 4 + (t & 2) + (t >> 2)) * 16 + offs_p // 8
    kt0 = pid_k * tiles_per_split
    kt1 = tl.minimum(KT, kt0 + tiles_per_split)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if PREFETCH > 0:
        packed = tl.load(qw_ptr + w_offs + kt0 * TILE_WORDS)
        x_t = _x_tile(x_ptr, perm_ptr, kt0 * 128, rows_p, offs_p, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K, X_PREP)
    if PREFETCH > 1:
        packed_n = tl.load(qw_ptr + w_offs + tl.minimum(kt0 + 1, kt1 - 1) * TILE_WORDS)
    for kt in range(kt0, kt1):
        k0 = kt * 128
        if PREFETCH > 0:  # the next tiles' words (and the next activations) in flight while this one is computed
            kn = tl.minimum(kt + 1, kt1 - 1)
            if PREFETCH > 1:  # two tiles ahead: even if the compiler sinks the load to the end of the iteration,
                # a whole iteration passes before its words are used
                packed_nn = tl.load(qw_ptr + w_offs + tl.minimum(kt + 2, kt1 - 1) * TILE_WORDS)
            else:
                packed_n = tl.load(qw_ptr + w_offs + kn * TILE_WORDS)
            x_n = _x_tile(x_ptr, perm_ptr, kn * 128, rows_p, offs_p, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K,
                          X_PREP)
        else:
            packed = tl.load(qw_ptr + w_offs + kt * TILE_WORDS)
            x_t = _x_tile(x_ptr, perm_ptr, k0, rows_p, offs_p, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K, X_PREP)
        wt = _dequant_tile(packed, s_ptr, z_ptr, k0, offs_n, N, K, e7_bits, x_ptr, BLOCK_N, GROUP_SIZE, CHUNKS,
                           HAS_ZEROS, EVEN_K, EVEN_N, NATURAL)
        acc = tl.dot(wt, x_t, acc)
        if PREFETCH > 0:
            packed = packed_n
            x_t = x_n
        if PREFETCH > 1:
            packed_n = packed_nn
    _write_tile(acc, out_ptr, ws_ptr, cnt_ptr + pid_n * tl.num_programs(0) + pid_m, tl.num_programs(2), bias_ptr,
                offs_m, offs_n, m_mask, N, stride_om, SPLIT, HAS_BIAS, BLOCK_N, BLOCK_M)


# ---------------------------------------------------------------- configs (keyed by arch family)

GEMM_CONFIGS: dict[str, dict[int, dict[str, Any]]] = {
    # rows class (largest M it serves) -> tile and launch options. "waves": the split-K target, in
    # programs per CU/SM: K is split until (M blocks x N blocks x splits) reaches waves x CUs.
    # NATURAL: the joined weight operand in row order (x loads contiguous); PREFETCH: weight tiles
    # loaded that many K tiles ahead into registers; SMALL: overrides for a weight under
    # `w4a16.SMALL_WEIGHT` elements. num_stages 1: Triton's pipeliner would stage the packed words
    # through shared memory and read them back with scalar loads (sm_90 SASS: 172 LDS per tile).
    # Hopper: from the H100 sweep (benchmarks/RESULTS.md, section w4gemm).
    "hopper": {16: {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 2, "NATURAL": True,
                    "PREFETCH": 2, "SMALL": {"num_warps": 8, "PREFETCH": 1}},
               32: {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 2, "NATURAL": True,
                    "PREFETCH": 1, "SMALL": {"num_warps": 8}},
               64: {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 2, "NATURAL": True,
                    "PREFETCH": 2, "SMALL": {"num_warps": 8, "PREFETCH": 0}},
               1 << 30: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 1,
                         "NATURAL": True, "PREFETCH": 0, "SMALL": {"BLOCK_M": 64, "PREFETCH": 2}}},
    # CDNA (wave64, 64 KiB LDS on gfx90a/gfx942): the joined weight tile goes through LDS for the MFMA
    # operand layout, so the x stage plus the weight tile must stay within 64 KiB
    "cdna": {16: {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 2,
                  "matrix_instr_nonkdim": 16, "kpack": 1, "NATURAL": True, "PREFETCH": 1},
             64: {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 2,
                  "matrix_instr_nonkdim": 16, "kpack": 1, "NATURAL": True, "PREFETCH": 1},
             1 << 30: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1, "waves": 1,
                       "matrix_instr_nonkdim": 16, "kpack": 1, "NATURAL": True, "PREFETCH": 1}},
    # RDNA3 (wave32): narrower tiles keep the dequantized operand out of scratch
    "rdna3": {32: {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves": 2, "NATURAL": True},
              1 << 30: {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1, "waves": 1, "NATURAL": True}},
    "cpu": {16: {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 1, "num_stages": 1, "waves": 2},
            1 << 30: {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 1, "num_stages": 1, "waves": 1}},
}
GEMM_CONFIGS["default"] = GEMM_CONFIGS["hopper"]
_FAMILY_ALIAS = {"cdna2": "cdna", "cdna3": "cdna", "cdna4": "cdna"}
_AMD_KEYS = ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack")
_NVIDIA_KEYS = ("num_warps", "num_stages", "maxnreg")


def family(arch: str) -> str:
    """The config family of an arch ("hopper", "cdna", "rdna3", "cpu"; "default" otherwise)."""
    fam = arch_family(arch)
    fam = _FAMILY_ALIAS.get(fam, fam)
    return fam if fam in GEMM_CONFIGS else "default"


SMALL_WEIGHT = 1 << 25
"""Same value as `w4a16.SMALL_WEIGHT` (this module does not import the front; a test checks)."""


def gemm_config(arch: str, m: int, weight_elems: Optional[int] = None) -> dict[str, Any]:
    """The arch family's config for `m` rows (the smallest rows class that holds m), with its
    SMALL overrides for a weight of fewer than `SMALL_WEIGHT` elements."""
    table = GEMM_CONFIGS[family(arch)]
    cfg = dict(next((table[r] for r in sorted(table) if m <= r), table[max(table)]))
    small = cfg.pop("SMALL", None)
    if small and weight_elems is not None and weight_elems < SMALL_WEIGHT:
        cfg.update(small)
    return cfg


def launch_options(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Compiler options of a config: the AMD knobs only where the target is AMD."""
    keys = _AMD_KEYS if arch.startswith("gfx") else _NVIDIA_KEYS
    return {k: cfg[k] for k in keys if k in cfg}


def split_k(m_blocks: int, n_blocks: int, k_tiles: int, cfg: dict[str, Any], cus: int) -> tuple[int, int]:
    """(splits, K tiles per split): split K until the grid reaches ``waves`` programs per CU/SM, at
    least ``min_k_tiles`` (default 2) K tiles per split; a config may force ``SPLIT``. Every split is
    non-empty. The split count is the nearest to the target, or with ``within_waves`` the most that
    stay within it (the pipelined GEMM: on an H100, 2 splits of 344 tiles at 16 rows, the nearest to
    4 programs per SM, were 16 % slower than none; RESULTS.md section w4pipe)."""
    tiles = max(1, m_blocks * n_blocks)
    target = cfg.get("waves", 1) * cus / tiles
    want = cfg.get("SPLIT") or max(1, int(target) if cfg.get("within_waves") else round(target))
    want = max(1, min(want, k_tiles // cfg.get("min_k_tiles", 2) if cfg.get("SPLIT") is None else k_tiles))
    per = -(-k_tiles // want)
    return -(-k_tiles // per), per


_WORKSPACES: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
"""Persistent zeroed (float32 partial sums [rows, N], int32 tickets) per (device, N, rows class).
Never replaced once made: a captured graph keeps using the buffers it saw."""


def _workspace(device: torch.device, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = max(16, 1 << (m - 1).bit_length())
    key = (device, n, rows)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = (torch.zeros(rows, n, dtype=torch.float32, device=device),
              torch.zeros(triton.cdiv(rows, 16) * triton.cdiv(n, 32), dtype=torch.int32, device=device))
        _WORKSPACES[key] = ws
    return ws


def x_index(w: "W4A16Weight", natural: bool) -> torch.Tensor:
    """int32 [KT * 128]: for each position of each K tile (the kernel's joined order), the column of x it meets;
    the weight's own copy (`W4A16Weight.x_order`, made with it wherever x is gathered), else made now for a
    config that gathers a plain weight's x (`X_PREP`)."""
    idx = (w.x_order or {}).get(natural)
    return idx if idx is not None else activation_order(w, natural)


@triton.jit
def _gather_cols_kernel(x_ptr, idx_ptr, out_ptr, K, n_cols, stride_xm, stride_om, BLOCK: tl.constexpr):
    """``out[m, j] = x[m, idx[j]]``, 0 where ``idx[j] == K`` (a padded row of the layout)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < n_cols
    src = tl.load(idx_ptr + cols, mask=cmask, other=0)
    v = tl.load(x_ptr + row * stride_xm + src, mask=cmask & (src < K), other=0.0)
    tl.store(out_ptr + row * stride_om + cols, v, mask=cmask)


GATHER_BLOCK = 1024
"""Columns per program of `_gather_cols_kernel` (4 warps)."""


@triton.jit
def _gather_whole_rows_kernel(x_ptr, idx_ptr, out_ptr, K, n_cols, stride_xm, stride_om, ROW: tl.constexpr,
                              CHUNK: tl.constexpr):
    """`_gather_cols_kernel`'s ``out[m, j] = x[m, idx[j]]`` for CHUNK columns of row m, read the other way: the program
    loads row m whole (ROW >= K columns, coalesced) and gathers on chip (`tl.gather`, through shared memory). The
    column kernel's 2-byte loads from scattered addresses cost one L1 wavefront each (an act-order permutation
    scatters them over the whole row)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, ROW)
    v = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0)
    cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    cmask = cols < n_cols
    src = tl.load(idx_ptr + cols, mask=cmask, other=0)
    got = tl.gather(v, tl.minimum(src, K - 1), 0)
    tl.store(out_ptr + row * stride_om + cols, tl.where(src < K, got, 0.0), mask=cmask)


GATHER_ROW_MAX = 16384
"""The longest row (power of two >= K) `gather_x` reads whole: 32 KiB of fp16 in shared memory, half of CDNA's LDS."""


def gather_form(m: int, k: int) -> Optional[tuple[int, int, int]]:
    """(ROW, CHUNK, num_warps) of `_gather_whole_rows_kernel` for `m` rows of `k` columns, or None for
    `_gather_cols_kernel` (a row longer than `GATHER_ROW_MAX`). Each program gathers CHUNK columns of a row it reads
    whole: whole rows from 64 rows, a quarter row (at least 1024 columns) from 16, else 1024 columns, so that a few
    rows still spread over the GPU (a row's re-reads hit L2); 16 warps for rows of 8192 or more, else 8. H100,
    act-order K = 4096 / 11008 / 14336 (RESULTS.md round25): 1.50-6.96x the column kernel from 256 rows (14336 at 256
    rows 20.5 -> 7.0 us; at 2048 rows within 1.12-1.20x of x's read and write at copy bandwidth), 1.05-1.81x at 1-64."""
    row = triton.next_power_of_2(max(k, 16))
    if row > GATHER_ROW_MAX:
        return None
    chunk = row if m >= 64 else max(1024, row // 4) if m >= 16 else 1024
    return row, min(chunk, row), 16 if row >= 8192 else 8


def gather_x(x2: torch.Tensor, w: "W4A16Weight", natural: bool,
             form: Optional[tuple[int, int, int]] | str = "auto") -> torch.Tensor:
    """x2 ``[M, K]`` (unit stride along K) gathered into the kernel's (tile, position) order
    (`x_index`; zeros for padded rows) in one launch: torch's pad + index_select took two to three
    launches, about 6 us at 16-64 rows on 4096 columns (H200 profile, RESULTS.md round9). `form`: the row
    kernel's (ROW, CHUNK, num_warps), None for the column kernel, "auto" for `gather_form`'s choice."""
    idx = x_index(w, natural)
    m, n_cols = x2.shape[0], idx.numel()
    out = torch.empty(m, n_cols, dtype=x2.dtype, device=x2.device)
    if form == "auto":
        form = gather_form(m, w.in_features)
    if form is None:
        _gather_cols_kernel[(m, triton.cdiv(n_cols, GATHER_BLOCK))](
            x2, idx, out, w.in_features, n_cols, x2.stride(0), out.stride(0), BLOCK=GATHER_BLOCK, num_warps=4)
    else:
        row, chunk, warps = form
        _gather_whole_rows_kernel[(m, triton.cdiv(n_cols, chunk))](
            x2, idx, out, w.in_features, n_cols, x2.stride(0), out.stride(0), ROW=row, CHUNK=chunk, num_warps=warps)
    return out


def gemm_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], arch: str,
                config: Optional[dict[str, Any]] = None) -> torch.Tensor:
    """``x2 @ W (+ bias)`` through the fused GEMM; x2 is ``[M, K]`` with unit stride along K."""
    m = x2.shape[0]
    k, n = w.in_features, w.out_features
    cfg = dict(config or gemm_config(arch, m, k * n))
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if TILE % block_n:
        raise ValueError(f"BLOCK_N={block_n} must divide the layout's {TILE}-column tile")
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    kt = w.k_tiles
    m_blocks, n_blocks = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    splits, per = split_k(m_blocks, n_blocks, kt, cfg, compute_units(x2.device))
    # act-order: x gathered once per call (one launch) rather than per tile and row in the loop (H200,
    # 64 rows on 4096x4096: about 45 us more per call in the loop; RESULTS.md section round9)
    x_prep = bool(cfg.get("X_PREP", w.perm is not None))
    natural = bool(cfg.get("NATURAL", False))
    x_src = gather_x(x2, w, natural) if x_prep else x2
    ws, cnt = _workspace(x2.device, n, m) if splits > 1 else (out, out)
    gs = 0 if w.group_size >= k else w.group_size
    _w4a16_gemm_kernel[(m_blocks, n_blocks, splits)](
        x_src, w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales,
        w.perm if w.perm is not None else w.qweight, bias if bias is not None else w.scales, out, ws, cnt,
        m, n, k, kt, x_src.stride(0), out.stride(0), per, E7_BITS,
        GROUP_SIZE=gs, CHUNKS=chunks(gs), BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=splits,
        HAS_ZEROS=w.zeros is not None, HAS_PERM=w.perm is not None and not x_prep, HAS_BIAS=bias is not None,
        EVEN_K=k % TILE == 0, EVEN_N=n % block_n == 0, X_PREP=x_prep, NATURAL=natural,
        PREFETCH=int(cfg.get("PREFETCH", 0)), **launch_options(cfg, arch),
    )
    return out


# ---------------------------------------------------------------- AMD compile specs

_CDNA = ("gfx90a", "gfx942", "gfx950")
_RDNA3 = ("gfx1100",)


def _spec(rows: int, group: int, zeros: bool, perm: bool, split: bool, archs: tuple[str, ...]) -> CompileSpec:
    sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "perm_ptr": "*i32",
           "bias_ptr": "*fp16", "out_ptr": "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "K": "i32", "KT": "i32", "stride_xm": "i32", "stride_om": "i32", "tiles_per_split": "i32",
           "e7_bits": "i32"}
    names = ("GROUP_SIZE", "CHUNKS", "BLOCK_M", "BLOCK_N", "SPLIT", "HAS_ZEROS", "HAS_PERM", "HAS_BIAS", "EVEN_K",
             "EVEN_N", "X_PREP", "NATURAL", "PREFETCH")
    sig.update({c: "constexpr" for c in names})
    cfg0 = gemm_config(archs[-1], rows)
    tag = ("asym" if zeros else "sym") + (",act-order" if perm else "") + (",split" if split else "")
    tag += ",rdna3" if archs == _RDNA3 else ""
    return CompileSpec(
        name=f"w4a16_gemm[m{rows}:{cfg0['BLOCK_M']}x{cfg0['BLOCK_N']},g{group},{tag}]",
        kernel=_w4a16_gemm_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": group, "CHUNKS": chunks(group), "BLOCK_M": cfg0["BLOCK_M"],
                    "BLOCK_N": cfg0["BLOCK_N"], "SPLIT": 4 if split else 1, "HAS_ZEROS": zeros, "HAS_PERM": False,
                    "HAS_BIAS": False, "EVEN_K": True, "EVEN_N": True, "X_PREP": perm,  # act-order: x gathered once
                    "NATURAL": bool(cfg0.get("NATURAL", False)), "PREFETCH": int(cfg0.get("PREFETCH", 0))},
        options=lambda arch: launch_options(gemm_config(arch, rows), arch),
        hot=True,
        uses_dot=True,
        archs=archs,
        divisible_by_16=("N", "K", "stride_xm", "stride_om"),
    )


_GATHER_SPEC = CompileSpec(
    name="w4a16_gather_x[fp16]",
    kernel=_gather_cols_kernel,
    signature={"x_ptr": "*fp16", "idx_ptr": "*i32", "out_ptr": "*fp16", "K": "i32", "n_cols": "i32",
               "stride_xm": "i32", "stride_om": "i32", "BLOCK": "constexpr"},
    constexprs={"BLOCK": GATHER_BLOCK},
    options=lambda arch: {"num_warps": 4, "num_stages": 1},
    hot=True,
    uses_dot=False,
    divisible_by_16=("K", "n_cols", "stride_xm", "stride_om"),
)

def _gather_rows_spec(row: int, chunk: int, warps: int) -> CompileSpec:
    """The row gather in one of `gather_form`'s forms."""
    return CompileSpec(
        name=f"w4a16_gather_x[fp16,row{row}/{chunk},w{warps}]",
        kernel=_gather_whole_rows_kernel,
        signature={"x_ptr": "*fp16", "idx_ptr": "*i32", "out_ptr": "*fp16", "K": "i32", "n_cols": "i32",
                   "stride_xm": "i32", "stride_om": "i32", "ROW": "constexpr", "CHUNK": "constexpr"},
        constexprs={"ROW": row, "CHUNK": chunk},
        options=lambda arch: {"num_warps": warps, "num_stages": 1},
        hot=True,
        uses_dot=False,
        divisible_by_16=("K", "n_cols", "stride_xm", "stride_om"),
    )


_GATHER_ROWS_SPECS = [_gather_rows_spec(*form) for form in ((4096, 4096, 8), (4096, 1024, 8), (16384, 16384, 16),
                                                            (16384, 4096, 16), (16384, 1024, 16))]
"""The row gather in `gather_form`'s forms for rows of 4096 and 16384 columns."""

AMD_COMPILE_SPECS: list[CompileSpec] = [
    spec
    for archs in (_CDNA, _RDNA3)
    for rows in sorted(GEMM_CONFIGS["cdna" if archs == _CDNA else "rdna3"])
    for spec in (_spec(min(rows, 4096), 128, False, False, True, archs),
                 _spec(min(rows, 4096), 32, True, True, False, archs))
] + [_GATHER_SPEC, *_GATHER_ROWS_SPECS]
