"""Triton kernels behind `optimum_amdx.kernels.w4a16` (4-bit GPTQ weights, fp16/bf16 activations).

(Over 400 lines because the kernels, their per-arch configs and their AMD compile specs belong
together: a config change must be seen beside the kernel and the spec that checks it.)

Both kernels read the tile-major `W4A16Weight` layout: tile ``(nb, kt)`` = 128 columns x 128 input
rows = 128 x 16 int32 words, one contiguous 8 KB run; the tiles of a column block follow each
other along K; nibble ``j`` of word ``r`` is input row ``kt * 128 + j * 16 + r``.

- ``_w4a16_stream_kernel`` (1 to `STREAM_MAX_M` rows): a persistent, "stream-K" grid. The
  ``NB * KT`` tiles, ordered column block by column block, are cut into one contiguous,
  equal share per program, and the grid is sized to what the GPU holds at once, so there is no
  partial last wave and each program streams one contiguous run of memory. The next tile is
  loaded before the current one is computed (bytes in flight while the ALUs work). A program
  flushes its partial sums when it leaves a column block: a program that saw the whole block
  stores the output directly; otherwise float32 atomics go into a persistent workspace and the
  last contributor (a ticket per column block and M block) writes the output, adds the bias and
  clears the workspace: one launch, graph-safe.
  One row (``BLOCK_M == 1``) is FMA work: each nibble plane meets a 16-value vector of x. Two or
  more rows dequantize each weight once per tile into fp16 and use one ``tl.dot`` per tile, the
  weight as the 128-row operand and x (padded to 16 rows at least) as the narrow one.
- ``_w4a16_dequant_kernel`` (from `STREAM_MAX_M` rows on): writes the dense ``[N, K]`` weight
  once; the BLAS matmul (hipBLASLt / cuBLAS) does the rest.

Dequantization without int-to-float conversions: five shifted copies of each word (shared by its
8 nibbles) put nibble ``j`` at bits 16..19 (even ``j``) or 12..15 (odd) of one of them; one and-or
with the bits of 2**7 (even) or 2**11 (odd) makes the float ``2**e + q`` exactly. One row: the FMA
``part += (2**e + q) * x`` needs no per-weight scaling of x, and the ``2**e * x`` and ``z * x`` sums are
taken off once per group chunk from per-plane sums of x. Several rows: ``(q - z) * s`` is one FMA
with the per-column constant ``-(2**e + z) * s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import triton
import triton.language as tl

from .compile_spec import CompileSpec
from .runtime import arch_family, device_arch, interpret_mode

if TYPE_CHECKING:
    from .w4a16 import W4A16Weight

TILE_N = TILE_K = 128
"""The tile of the repacked layout (equal to `w4a16.TILE_N` / `TILE_K`; this module does not import
the front module, which imports it lazily, and a test checks they agree)."""
E7_BITS = 0x43000000  # bits of float32 128.0 (2**7), passed at run time: held in a register, the and-or is one LOP3 on sm_90
WS_ROWS = 64
"""Rows of the persistent float32 split-K workspace per N (at least `STREAM_MAX_M`; a forced stream
route over more rows runs in chunks of this many)."""


@triton.jit
def _nibble_biased(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, J: tl.constexpr):
    """``2**7 + q`` (J even) or ``2**11 + q`` (J odd) for nibble J, exactly: one of five shifted
    copies of the word holds the nibble at bits 16..19 or 12..15, and one and-or with the bits of
    2**7 (2**11 = those bits + 2**25) puts it into the low mantissa of that power of two. Times x,
    ``(2**e + q) * x`` keeps ``q * x`` to about 2**-13 of ``x`` (a float32 product of that size)."""
    if J == 0:
        src = w_l16
    elif J < 3:
        src = w_l8
    elif J < 5:
        src = packed
    elif J < 7:
        src = w_r8
    else:
        src = w_r16
    if J % 2 == 0:
        bits = (src & 0xF0000) | e7_bits
    else:
        bits = (src & 0xF000) | (e7_bits + 0x2000000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _scale_zero(s_ptr, z_ptr, g, offs_n, N, EVEN_N: tl.constexpr, HAS_ZEROS: tl.constexpr,
                COLUMN: tl.constexpr = False):
    """Scales and zero points ``[BLOCK_N, 1]`` (float32) of group row `g`; zero 8 when symmetric.
    COLUMN: load them as a column of the weight tile's own layout (the threads of a column read
    the same address) instead of a 1D vector expanded afterwards; in the one-row loop the 1D load
    cost a shared-memory layout conversion and a barrier every tile (sm_90 SASS), in the dot path
    the column load makes the compiler pick worse layouts for the whole tile (5x the shared stores)."""
    if COLUMN:
        ptrs = g * N + offs_n[:, None]
        nmask = (offs_n < N)[:, None]
    else:
        ptrs = g * N + offs_n
        nmask = offs_n < N
    if EVEN_N:
        s = tl.load(s_ptr + ptrs).to(tl.float32)
    else:
        s = tl.load(s_ptr + ptrs, mask=nmask, other=0.0).to(tl.float32)
    if HAS_ZEROS:
        if EVEN_N:
            z = tl.load(z_ptr + ptrs).to(tl.float32)
        else:
            z = tl.load(z_ptr + ptrs, mask=nmask, other=0.0).to(tl.float32)
    else:
        z = tl.full(s.shape, 8.0, tl.float32)
    if COLUMN:
        return s, z
    else:
        return s[:, None], z[:, None]


@triton.jit
def _group_of(row, K, GROUP_SIZE: tl.constexpr, EVEN_K: tl.constexpr):
    """The group of sorted input row `row` (clamped: padded rows past K use the last group)."""
    if GROUP_SIZE == 0:
        return 0
    elif EVEN_K:
        return row // GROUP_SIZE
    else:
        return tl.minimum(row, K - 1) // GROUP_SIZE


@triton.jit
def _x_vec(x_ptr, perm_ptr, rows, K, HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """Activations of sorted input rows `rows` (one row of x), float32; zero past K."""
    if EVEN_K:
        if HAS_PERM:
            cols = tl.load(perm_ptr + rows)
        else:
            cols = rows
        xv = tl.load(x_ptr + cols)
    else:
        kmask = rows < K
        if HAS_PERM:
            cols = tl.load(perm_ptr + rows, mask=kmask, other=0)
        else:
            cols = rows
        xv = tl.load(x_ptr + cols, mask=kmask, other=0.0)
    return xv.to(tl.float32)


@triton.jit
def _x_tile(x_ptr, perm_ptr, rows, offs_m, m_mask, stride_xm, K, HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """x^T for sorted input rows `rows` and the M block: ``[len(rows), BLOCK_M]`` in x's dtype."""
    if HAS_PERM:
        if EVEN_K:
            cols = tl.load(perm_ptr + rows)
        else:
            cols = tl.load(perm_ptr + rows, mask=rows < K, other=0)
    else:
        cols = rows
    x_ptrs = x_ptr + offs_m[None, :] * stride_xm + cols[:, None]
    if EVEN_K:
        return tl.load(x_ptrs, mask=m_mask[None, :], other=0.0)
    else:
        return tl.load(x_ptrs, mask=m_mask[None, :] & (rows < K)[:, None], other=0.0)


@triton.jit
def _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s, z, J: tl.constexpr):
    """Dequantized weights ``(q - z) * s`` of nibble plane J: one FMA on ``2**e + q`` with the
    per-column constant ``-(2**e + z) * s``."""
    nib = _nibble_biased(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, J)
    if J % 2 == 0:
        c = (z + 128.0) * s
    else:
        c = (z + 2048.0) * s
    return nib * s - c


@triton.jit
def _m1_plane(x_ptr, perm_ptr, packed, w_l16, w_l8, w_r8, w_r16, e7_bits, k0, offs_r, K, J: tl.constexpr,
              HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """One row, nibble plane J of a tile: x (16 values) and the products ``(2**e + q) * x``."""
    xj = _x_vec(x_ptr, perm_ptr, k0 + J * 16 + offs_r, K, HAS_PERM, EVEN_K)
    return xj, _nibble_biased(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, J) * xj[None, :]


@triton.jit
def _w4a16_stream_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, KT, NB, stride_xm, stride_om, n_units, e7_bits,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, FENCE: tl.constexpr = False,
    PIPELINE: tl.constexpr = False, STAGES: tl.constexpr = 1, JOIN: tl.constexpr = True,
):
    # Tile = [BLOCK_N, 16] words = [BLOCK_N columns, 128 rows]; unit u = column block u // KT, K tile u % KT.
    # CHUNKS: scale groups per K tile (1 when a group spans whole tiles, 128 // group, or 8: one per plane).
    R: tl.constexpr = 16
    PLANES: tl.constexpr = 8 // CHUNKS
    TILE_WORDS: tl.constexpr = BLOCK_N * 16
    pid = tl.program_id(0)
    pid_m = tl.program_id(1)
    n_prog = tl.num_programs(0)
    u0 = pid * n_units // n_prog
    u1 = (pid + 1) * n_units // n_prog
    offs_loc = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, R)
    tile_offs = offs_loc[:, None] * R + offs_r[None, :]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, R], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        # position p = r * 8 + t of the joined [BLOCK_N, 128] tile holds plane bitrev3(t), row r
        offs_p = tl.arange(0, 128)
        t = offs_p % 8
        rows_p = ((t & 1) * 4 + (t & 2) + (t >> 2)) * 16 + offs_p // 8
    if not PIPELINE:
        cur = tl.load(qw_ptr + u0 * TILE_WORDS + tile_offs)
    for u in tl.range(u0, u1, num_stages=STAGES):
        if PIPELINE:  # Triton's pipeliner keeps STAGES - 1 tiles in flight (async copies on sm_80+)
            cur = tl.load(qw_ptr + u * TILE_WORDS + tile_offs)
        else:
            # prefetch the next tile (the last iteration reloads its own, an L2 hit) before computing this one
            nxt = tl.load(qw_ptr + tl.minimum(u + 1, u1 - 1) * TILE_WORDS + tile_offs)
            if FENCE:  # keeps the compiler (ptxas) from sinking the prefetch below the compute of `cur`
                tl.debug_barrier()
        nb = u // KT
        kt = u - nb * KT
        k0 = kt * 128
        offs_n = nb * BLOCK_N + offs_loc
        w_l16 = cur << 16
        w_l8 = cur << 8
        w_r8 = cur >> 8
        w_r16 = cur >> 16
        if BLOCK_M == 1:
            for c in tl.static_range(CHUNKS):
                part = tl.zeros([BLOCK_N, R], dtype=tl.float32)
                x_even = tl.zeros([R], dtype=tl.float32)
                x_odd = tl.zeros([R], dtype=tl.float32)
                for jj in tl.static_range(PLANES):
                    xj, contrib = _m1_plane(x_ptr, perm_ptr, cur, w_l16, w_l8, w_r8, w_r16, e7_bits, k0, offs_r,
                                            K, c * PLANES + jj, HAS_PERM, EVEN_K)
                    if (c * PLANES + jj) % 2 == 0:
                        x_even += xj
                    else:
                        x_odd += xj
                    part += contrib
                s, z = _scale_zero(s_ptr, z_ptr, _group_of(k0 + c * PLANES * 16, K, GROUP_SIZE, EVEN_K), offs_n, N,
                                   EVEN_N, HAS_ZEROS, True)
                # part = sum (2**e + q) x; take off the 2**e x terms and z x, then scale
                bias_x = (x_even * 128.0 + x_odd * 2048.0)[None, :]
                acc2 += s * (part - (bias_x + z * (x_even + x_odd)[None, :]))
        else:
            s, z = _scale_zero(s_ptr, z_ptr, _group_of(k0, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
            if CHUNKS == 1:
                s1, z1, s2, z2, s3, z3 = s, z, s, z, s, z
                s4, z4, s5, z5, s6, z6, s7, z7 = s, z, s, z, s, z, s, z
            else:
                s1, z1 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 16, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
                s2, z2 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 32, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
                s3, z3 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 48, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
                s4, z4 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 64, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
                s5, z5 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 80, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
                s6, z6 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 96, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
                s7, z7 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 112, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
            dt = x_ptr.dtype.element_ty
            w0 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s, z, 0).to(dt)
            w1 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s1, z1, 1).to(dt)
            w2 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s2, z2, 2).to(dt)
            w3 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s3, z3, 3).to(dt)
            w4 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s4, z4, 4).to(dt)
            w5 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s5, z5, 5).to(dt)
            w6 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s6, z6, 6).to(dt)
            w7 = _plane_w(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s7, z7, 7).to(dt)
            if JOIN:
                # [BLOCK_N, R, 2, 2, 2]: index (a, b, c) of the joins is plane a + 2b + 4c
                wt = tl.join(tl.join(tl.join(w0, w1), tl.join(w2, w3)), tl.join(tl.join(w4, w5), tl.join(w6, w7)))
                wt = tl.reshape(wt, [BLOCK_N, 128])
                rows = k0 + rows_p
                acc = tl.dot(wt, _x_tile(x_ptr, perm_ptr, rows, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
            else:  # one dot per nibble plane (16 consecutive rows each)
                acc = tl.dot(w0, _x_tile(x_ptr, perm_ptr, k0 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
                acc = tl.dot(w1, _x_tile(x_ptr, perm_ptr, k0 + 16 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
                acc = tl.dot(w2, _x_tile(x_ptr, perm_ptr, k0 + 32 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
                acc = tl.dot(w3, _x_tile(x_ptr, perm_ptr, k0 + 48 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
                acc = tl.dot(w4, _x_tile(x_ptr, perm_ptr, k0 + 64 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
                acc = tl.dot(w5, _x_tile(x_ptr, perm_ptr, k0 + 80 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
                acc = tl.dot(w6, _x_tile(x_ptr, perm_ptr, k0 + 96 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
                acc = tl.dot(w7, _x_tile(x_ptr, perm_ptr, k0 + 112 + offs_r, offs_m, m_mask, stride_xm, K, HAS_PERM, EVEN_K), acc)
        if not PIPELINE:
            cur = nxt
        if (kt == KT - 1) | (u == u1 - 1):
            if BLOCK_M == 1:
                res = tl.sum(acc2, axis=1)[:, None]
            else:
                res = acc
            out_mask = (offs_n < N)[:, None] & m_mask[None, :]
            out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
            first = nb * KT
            if (u0 <= first) & (kt == KT - 1):
                if HAS_BIAS:
                    res += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
                tl.store(out_ptrs, res.to(out_ptr.dtype.element_ty), mask=out_mask)
            else:
                ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
                tl.atomic_add(ws_ptrs, res, mask=out_mask, sem="relaxed")
                # every thread's partial sums must be issued before this program takes its ticket
                tl.debug_barrier()
                p_first = ((first + 1) * n_prog - 1) // n_units
                p_last = ((first + KT) * n_prog - 1) // n_units
                cnt = cnt_ptr + pid_m * NB + nb
                ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
                if ticket == p_last - p_first:
                    old = tl.atomic_xchg(ws_ptrs.to(tl.pointer_type(tl.int32)),
                                         tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32), mask=out_mask, sem="acq_rel")
                    total = old.to(tl.float32, bitcast=True)
                    if HAS_BIAS:
                        total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
                    tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
                    tl.debug_barrier()
                    tl.atomic_xchg(cnt, 0, sem="acq_rel")
            if BLOCK_M == 1:
                acc2 = tl.zeros([BLOCK_N, R], dtype=tl.float32)
            else:
                acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)


@triton.jit
def _w4a16_dequant_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr, N, K, KT, e7_bits,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ZEROS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
):
    """Dequantize one tile into the dense ``[N, K]`` linear weight (sorted row order): each nibble
    plane is 16 consecutive rows of a column, stored as one 32-byte run per column."""
    u = tl.program_id(0)
    nb = u // KT
    kt = u - nb * KT
    offs_loc = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, 16)
    offs_n = nb * BLOCK_N + offs_loc
    packed = tl.load(qw_ptr + u * BLOCK_N * 16 + offs_loc[:, None] * 16 + offs_r[None, :])
    w_l16 = packed << 16
    w_l8 = packed << 8
    w_r8 = packed >> 8
    w_r16 = packed >> 16
    PLANES: tl.constexpr = 8 // CHUNKS
    dst = w_ptr + offs_n.to(tl.int64)[:, None] * K
    for j in tl.static_range(8):
        rows = kt * 128 + j * 16 + offs_r
        s, z = _scale_zero(s_ptr, z_ptr, _group_of(kt * 128 + (j // PLANES) * PLANES * 16, K, GROUP_SIZE, EVEN_K),
                           offs_n, N, EVEN_N, HAS_ZEROS)
        w = _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s, z, j)
        if EVEN_K and EVEN_N:
            tl.store(dst + rows[None, :], w.to(w_ptr.dtype.element_ty))
        else:
            tl.store(dst + rows[None, :], w.to(w_ptr.dtype.element_ty),
                     mask=(offs_n < N)[:, None] & (rows < K)[None, :])


# ---------------------------------------------------------------- configs (keyed by arch family)

STREAM_CONFIGS: dict[str, dict[int, dict[str, Any]]] = {
    # rows class (largest M it serves) -> BLOCK_M, warps, programs per CU/SM (the persistent grid:
    # all programs resident at once; capped at run time by the occupancy the compiled kernel's
    # registers and shared memory allow). H200 sweep (benchmarks/RESULTS.md): 8 warps beat 4 for
    # every dot tile; 32-row tiles beat 64 at 33..64 rows; one joined dot per tile beats one dot per
    # nibble plane by 1.3-2.5x. waves_per_eu stays 0 on AMD (Triton passes it to LLVM as "N, N",
    # which caps occupancy at N).
    "hopper": {1: {"BLOCK_M": 1, "num_warps": 4, "programs_per_cu": 8},
               16: {"BLOCK_M": 16, "num_warps": 8, "programs_per_cu": 8},
               64: {"BLOCK_M": 32, "num_warps": 8, "programs_per_cu": 8},
               255: {"BLOCK_M": 64, "num_warps": 8, "programs_per_cu": 8}},
    "cdna": {1: {"BLOCK_M": 1, "num_warps": 4, "programs_per_cu": 8},
             16: {"BLOCK_M": 16, "num_warps": 4, "programs_per_cu": 8, "matrix_instr_nonkdim": 16, "kpack": 1},
             64: {"BLOCK_M": 32, "num_warps": 4, "programs_per_cu": 8, "matrix_instr_nonkdim": 16, "kpack": 1},
             255: {"BLOCK_M": 64, "num_warps": 8, "programs_per_cu": 8, "matrix_instr_nonkdim": 16, "kpack": 1}},
    # 255: only when the route is forced (benchmarks); the dispatcher switches to dequant + BLAS earlier
    # gfx1100 (wave32): only 16-row dot tiles stay out of scratch (32 rows: 28 B, 64 rows: 524 B
    # per lane even with 8 warps), so more rows take several 16-row blocks
    "rdna3": {1: {"BLOCK_M": 1, "num_warps": 4, "programs_per_cu": 8},
              255: {"BLOCK_M": 16, "num_warps": 8, "programs_per_cu": 8}},
    "cpu": {1: {"BLOCK_M": 1, "num_warps": 1, "programs_per_cu": 3},
            16: {"BLOCK_M": 16, "num_warps": 1, "programs_per_cu": 3},
            255: {"BLOCK_M": 32, "num_warps": 1, "programs_per_cu": 3}},
}
STREAM_CONFIGS["default"] = STREAM_CONFIGS["hopper"]
_FAMILY_ALIAS = {"cdna2": "cdna", "cdna3": "cdna", "cdna4": "cdna"}
DEQUANT_CONFIG = {"num_warps": 4}
"""One 128 x 128 tile per program: 8 KB read, 32 KB (fp16) written in 32-byte runs."""
_LAUNCH_KEYS = ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack", "maxnreg")
_NVIDIA_KEYS = ("num_warps", "num_stages", "maxnreg")


def _family(arch: str) -> str:
    fam = arch_family(arch)
    fam = _FAMILY_ALIAS.get(fam, fam)
    return fam if fam in STREAM_CONFIGS else "default"


def stream_config(arch: str, m: int) -> dict[str, Any]:
    """The arch family's config for `m` rows (the smallest rows class that holds m)."""
    table = STREAM_CONFIGS[_family(arch)]
    for rows in sorted(table):
        if m <= rows:
            return dict(table[rows])
    return dict(table[max(table)])


def launch_options(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Compiler options of a config: the AMD knobs only where the target is AMD; one stage (the
    weight stream is prefetched by hand, and Triton's pipeliner must not add its own buffers)."""
    amd = arch.startswith("gfx")
    opts = {k: cfg[k] for k in _LAUNCH_KEYS
            if k in cfg and ((amd and k != "maxnreg") or (not amd and k in _NVIDIA_KEYS))}
    opts.setdefault("num_stages", 1)
    return opts


def _chunks(group_arg: int) -> int:
    """Scale groups per 128-row K tile: 1 when one group spans whole tiles, 128 // group for 16/32/64,
    else 8 (every 16-row plane looks its own group up; groups are multiples of 16 rows)."""
    if group_arg == 0 or group_arg % TILE_K == 0:
        return 1
    if TILE_K % group_arg == 0:
        return TILE_K // group_arg
    return 8


def _group_arg(w: "W4A16Weight") -> int:
    return 0 if w.group_size >= w.in_features else w.group_size


_WORKSPACES: dict[tuple[Any, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, n: int, n_cnt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed float32 [WS_ROWS, N] partial sums and int32 tickets, kept per device and N.

    The kernel leaves both zeroed, so they are allocated once at full size (before any graph
    capture that replays the layer) and reused; calls on one device run in stream order.
    """
    key = (device, n)
    ws = _WORKSPACES.get(key)
    if ws is None or ws[1].numel() < n_cnt:
        ws = (torch.zeros(WS_ROWS, n, dtype=torch.float32, device=device),
              torch.zeros(max(n_cnt, WS_ROWS * triton.cdiv(n, TILE_N)), dtype=torch.int32, device=device))
        _WORKSPACES[key] = ws
    return ws


def _num_cus(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


_RESIDENT: dict[tuple[Any, ...], int] = {}
"""Programs of one compiled specialization that fit on a CU/SM at once (from its registers and
shared memory, read after its first launch)."""


def _resident_programs(ck: Any, device: torch.device) -> Optional[int]:
    """How many programs of compiled kernel `ck` one CU/SM holds at once, or None if unknown."""
    try:
        regs, warps, smem = int(ck.n_regs), int(ck.metadata.num_warps), int(ck.metadata.shared)
    except (AttributeError, TypeError, ValueError):
        return None
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:  # per SIMD: 512 VGPRs per lane (CDNA), 4 SIMDs per CU, at most 8 waves per SIMD
        waves = min(8, 512 // max(8, -(-regs // 8) * 8))
        by_regs = waves * 4 // warps
    else:  # per SM: 64K registers allocated per warp in units of 256, at most 64 warps
        per_warp = -(-regs * 32 // 256) * 256
        by_regs = min(65536 // max(1, per_warp), 64) // warps
    smem_cap = getattr(props, "shared_memory_per_multiprocessor", 0) or 65536
    by_smem = smem_cap // smem if smem else by_regs
    return max(1, min(by_regs, by_smem))


def stream_grid(n_units: int, m_blocks: int, cfg: dict[str, Any], device: torch.device,
                key: Optional[tuple[Any, ...]] = None) -> int:
    """Programs along the tile stream: `programs` when the config names it, else as many as the
    CUs/SMs hold at once (at most programs_per_cu each, fewer when the compiled kernel's registers
    or shared memory allow fewer), shared by the M blocks; never more than there are tiles."""
    if cfg.get("programs"):
        return max(1, min(n_units, cfg["programs"]))
    per_cu = min(cfg["programs_per_cu"], _RESIDENT.get(key, cfg["programs_per_cu"]))
    return max(1, min(n_units, per_cu * _num_cus(device) // m_blocks))


def stream_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], out: torch.Tensor,
                  arch: str, config: Optional[dict[str, Any]] = None) -> None:
    """``out = x2 @ W (+ bias)`` for up to `WS_ROWS` rows through the stream-K kernel."""
    m = x2.shape[0]
    k, n = w.in_features, w.out_features
    cfg = dict(config or stream_config(arch, m))
    if m > 1 and cfg["BLOCK_M"] == 1:
        raise ValueError("BLOCK_M = 1 serves one row only")
    block_m = cfg["BLOCK_M"]
    kt, nb = w.k_tiles, w.n_blocks
    n_units = kt * nb
    m_blocks = triton.cdiv(m, block_m)
    if m_blocks * block_m > WS_ROWS:
        raise ValueError(f"the stream kernel takes at most {WS_ROWS} rows")
    gs = _group_arg(w)
    key = (x2.device, x2.dtype, cfg.get("num_warps"), cfg.get("maxnreg"), cfg.get("FENCE", False), cfg.get("PIPELINE", False),
           cfg.get("STAGES", 1), cfg.get("JOIN", True), block_m, gs, w.zeros is not None, w.perm is not None,
           bias is not None, k % TILE_K == 0, n % TILE_N == 0)
    grid = stream_grid(n_units, m_blocks, cfg, x2.device, key)
    ws, cnt = _workspace(x2.device, n, m_blocks * nb)
    ck = _w4a16_stream_kernel[(grid, m_blocks)](
        x2, w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales,
        w.perm if w.perm is not None else w.qweight, bias if bias is not None else w.scales, out, ws, cnt,
        m, n, k, kt, nb, x2.stride(0), out.stride(0), n_units, E7_BITS,
        GROUP_SIZE=gs, CHUNKS=_chunks(gs), BLOCK_M=block_m, BLOCK_N=TILE_N, HAS_ZEROS=w.zeros is not None,
        HAS_PERM=w.perm is not None, HAS_BIAS=bias is not None, EVEN_K=k % TILE_K == 0, EVEN_N=n % TILE_N == 0,
        FENCE=cfg.get("FENCE", False), PIPELINE=cfg.get("PIPELINE", False), STAGES=cfg.get("STAGES", 1),
        JOIN=cfg.get("JOIN", True), **launch_options(cfg, arch),
    )
    if key not in _RESIDENT and x2.is_cuda:
        resident = _resident_programs(ck, x2.device)
        if resident is not None:
            _RESIDENT[key] = resident


def dequantize_dense(w: "W4A16Weight", dtype: torch.dtype, arch: Optional[str] = None) -> torch.Tensor:
    """The dense linear-layer weight ``[N, K]`` (``W`` transposed) in `dtype`, rows of K in the
    SORTED order of the repacked weight (act-order: column ``k`` is original input ``w.perm[k]``)."""
    k, n = w.in_features, w.out_features
    arch = arch or ("cpu" if interpret_mode() else device_arch(w.qweight.device.index or 0))
    dense = torch.empty(n, k, dtype=dtype, device=w.qweight.device)
    gs = _group_arg(w)
    _w4a16_dequant_kernel[(w.k_tiles * w.n_blocks,)](
        w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales, dense, n, k, w.k_tiles, E7_BITS,
        GROUP_SIZE=gs, CHUNKS=_chunks(gs), BLOCK_N=TILE_N, HAS_ZEROS=w.zeros is not None,
        EVEN_K=k % TILE_K == 0, EVEN_N=n % TILE_N == 0, num_warps=DEQUANT_CONFIG["num_warps"] if arch != "cpu" else 1,
    )
    return dense


def dequant_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], arch: str) -> torch.Tensor:
    """Dequantize once into a dense weight, then the BLAS matmul (many rows: prefill)."""
    dense = dequantize_dense(w, x2.dtype, arch)
    if w.perm is not None:
        x2 = x2.index_select(1, w.perm)
    return torch.nn.functional.linear(x2, dense, bias.to(x2.dtype) if bias is not None else None)


# ---------------------------------------------------------------- AMD compile specs

_CDNA = ("gfx90a", "gfx942", "gfx950")
_RDNA3 = ("gfx1100",)


def _stream_spec(rows: int, group: int, zeros: bool, perm: bool, archs: tuple[str, ...]) -> CompileSpec:
    sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "perm_ptr": "*i32",
           "bias_ptr": "*fp16", "out_ptr": "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "K": "i32", "KT": "i32", "NB": "i32", "stride_xm": "i32", "stride_om": "i32", "n_units": "i32",
           "e7_bits": "i32"}
    names = ("GROUP_SIZE", "CHUNKS", "BLOCK_M", "BLOCK_N", "HAS_ZEROS", "HAS_PERM", "HAS_BIAS", "EVEN_K", "EVEN_N")
    sig.update({c: "constexpr" for c in names})
    cfg0 = stream_config(archs[-1], rows)
    tag = ("asym" if zeros else "sym") + (",act-order" if perm else "") + (",rdna3" if archs == _RDNA3 else "")
    return CompileSpec(
        name=f"w4a16_stream[m{rows}:{cfg0['BLOCK_M']},g{group},{tag}]",
        kernel=_w4a16_stream_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": group, "CHUNKS": _chunks(group), "BLOCK_M": cfg0["BLOCK_M"], "BLOCK_N": TILE_N,
                    "HAS_ZEROS": zeros, "HAS_PERM": perm, "HAS_BIAS": False, "EVEN_K": True, "EVEN_N": True},
        options=lambda arch: launch_options(stream_config(arch, rows), arch),
        hot=True,
        uses_dot=cfg0["BLOCK_M"] > 1,
        archs=archs,
        divisible_by_16=("N", "K", "stride_xm", "stride_om"),
    )


def _dequant_spec(archs: tuple[str, ...]) -> CompileSpec:
    sig = {"qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "w_ptr": "*fp16", "N": "i32", "K": "i32",
           "KT": "i32", "e7_bits": "i32"}
    sig.update({c: "constexpr" for c in ("GROUP_SIZE", "CHUNKS", "BLOCK_N", "HAS_ZEROS", "EVEN_K", "EVEN_N")})
    return CompileSpec(
        name="w4a16_dequant[g128,asym" + (",rdna3]" if archs == _RDNA3 else "]"),
        kernel=_w4a16_dequant_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": 128, "CHUNKS": 1, "BLOCK_N": TILE_N, "HAS_ZEROS": True, "EVEN_K": True,
                    "EVEN_N": True},
        options=lambda arch: {"num_warps": DEQUANT_CONFIG["num_warps"], "num_stages": 1},
        hot=True,
        uses_dot=False,
        archs=archs,
        divisible_by_16=("N", "K"),
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [
    spec
    for archs in (_CDNA, _RDNA3)
    for spec in (
        _stream_spec(1, 128, False, False, archs),
        _stream_spec(1, 128, True, True, archs),
        _stream_spec(1, 32, True, False, archs),
        _stream_spec(16, 128, True, False, archs),
        _stream_spec(16, 32, False, True, archs),
        _stream_spec(64, 128, True, False, archs),
        _stream_spec(255, 128, True, False, archs),
        _dequant_spec(archs),
    )
]
