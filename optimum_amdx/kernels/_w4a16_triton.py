"""Triton kernels behind `optimum_amdx.kernels.w4a16` (4-bit GPTQ weights, fp16/bf16 activations).

All read the `W4A16Weight` layout: int32 ``[N, KW]``, column ``n``'s packed K words back to back
(word ``r``, nibble ``j`` is input row ``8r + j``). Three routes:

- ``gemv`` (up to 16 rows; decode, bandwidth-bound): `_w4a16_gemv_kernel` streams
  ``[BLOCK_N, BLOCK_K / 8]`` tiles of words; each thread loads 4 consecutive words of a column
  (16 bytes, 32 weights) and a warp reads whole 128-byte runs of a few columns. Nibble plane ``j``
  of word ``r`` is input row ``8r + j``, so each plane meets its own strided slice of x with plain
  elementwise math into a 2D float32 accumulator (no reshape, no layout conversion, no per-tile
  cross-thread reduction; one reduction along K at the end, mostly inside a thread, the rest
  warp shuffles). One row uses FMAs; 2..16 rows use ``tl.dot`` per nibble plane, so every
  dequantized weight serves all rows. Split-K spreads a layer over many small programs (a few
  K tiles each) so enough loads are in flight. Partial sums are combined with float32 atomics,
  either (``ATOMIC=True``) straight into a zeroed float32 output that the host casts, or
  (``ATOMIC=False``) into a persistent float32 workspace where the last program of a column
  tile (atomic ticket) writes the output and clears the workspace: one launch, graph-safe.
- ``gemm`` (17 rows up to `dequant_min_m`): `_w4a16_gemm_kernel` dequantizes a ``[BLOCK_N, BLOCK_K]``
  tile into registers and feeds ``tl.dot`` with it transposed (MFMA on CDNA, WMMA on RDNA3,
  tensor cores on NVIDIA).
- ``dequant`` (from `dequant_min_m` rows): `_w4a16_dequant_kernel` writes the dense weight once as
  a linear-layer ``[N, K]`` matrix (each packed word becomes 8 consecutive halves: one 16-byte
  store) and the BLAS matmul (hipBLASLt / cuBLAS, ``x @ W^T`` as in ``nn.Linear``) does the rest.

Dequantization without int-to-float conversions. The GEMV takes five shifted copies of each word
(shared by its 8 nibbles) so that nibble ``j`` sits at bits 16..19 (even ``j``) or 12..15 (odd) of
one of them; one and-or with the bits of 1.0 makes the float ``1 + q * 2**-e`` exactly (e = 7 or 11).
With one row, that times ``x * 2**e`` is ``x * 2**e + q * x`` (one FMA), and the ``x * 2**e`` sums
are taken off once per word, not per weight; with 2..16 rows, ``(q - z) * s`` is one FMA with the
per-column constant ``-(s * 2**e + z * s)`` (exact: small integers times an fp16 scale). The GEMM
and dequant kernels OR the nibble into the mantissa of 2**23 and subtract 2**23. Act-order
weights were sorted by group at repack time; the GEMV reads activation column ``perm[k]`` for
sorted row ``k``; the GEMM and dequant routes get x with permuted columns (one gather per call).
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

ONE_BITS = 0x3F800000  # bits of float32 1.0, passed to the GEMV at run time (see `_nibble_biased`): held in a register, the and-or is one LOP3 on sm_90 (an instruction takes one immediate)


@triton.jit
def _group_params(s_ptr, z_ptr, rows, r_mask, offs_n, n_mask, k0, N, K,
                  GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, HAS_ZEROS: tl.constexpr):
    """Scales and zeros for a ``[BLOCK_N, BLOCK_K / 8]`` tile of words: one column vector
    ``[BLOCK_N, 1]`` when the tile lies in one group, else ``[BLOCK_N, BLOCK_K / 8]`` (8 input
    rows share a word, and groups are multiples of 16 rows). Zero for a tile wholly past K (a
    split's ragged tail), whose group does not exist."""
    if GROUP_SIZE == 0 or GROUP_SIZE % BLOCK_K == 0:
        if GROUP_SIZE == 0:
            g = 0
        else:
            g = k0 // GROUP_SIZE
        mask = n_mask & (k0 < K)
        s = tl.load(s_ptr + g * N + offs_n, mask=mask, other=0.0).to(tl.float32)[:, None]
        if HAS_ZEROS:
            z = tl.load(z_ptr + g * N + offs_n, mask=mask, other=0.0).to(tl.float32)[:, None]
        else:
            z = 8.0
    else:
        g = (rows * 8) // GROUP_SIZE
        mask = n_mask[:, None] & r_mask[None, :]
        s = tl.load(s_ptr + g[None, :] * N + offs_n[:, None], mask=mask, other=0.0).to(tl.float32)
        if HAS_ZEROS:
            z = tl.load(z_ptr + g[None, :] * N + offs_n[:, None], mask=mask, other=0.0).to(tl.float32)
        else:
            z = 8.0
    return s, z


@triton.jit
def _nibble_biased(packed, w_l16, w_l8, w_r8, w_r16, one_bits, J: tl.constexpr):
    """``1 + q * 2**-7`` (J even) or ``1 + q * 2**-11`` (J odd) for nibble J, exactly: one of five
    shifted copies of the word (shared by its 8 nibbles) holds the nibble at bits 16..19 or 12..15,
    and one and-or with the bits of 1.0 puts it into the mantissa. The caller multiplies by
    ``x * 2**7`` or ``x * 2**11`` and subtracts the sum of those once per word: the nibble sits high
    enough in the mantissa that ``(1 + q * 2**-e) * x * 2**e`` keeps ``q * x`` to about 2**-13 of
    ``x`` (the error of a float32 product of that size), and no per-weight subtraction is needed."""
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
        bits = (src & 0xF0000) | one_bits
    else:
        bits = (src & 0xF000) | one_bits
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_om, stride_qn, tiles_per_split, split_k, one_bits,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    ATOMIC: tl.constexpr = False, EVEN: tl.constexpr = False,
):
    # EVEN: N is a multiple of BLOCK_N, K of BLOCK_K, and the K tiles split evenly, so no load needs
    # a mask (on AMD every masked scalar load of x costs a compare and an exec-mask branch).
    # Tile [BLOCK_N, R] of words, R = BLOCK_K / 8, contiguous along R (16-byte loads per thread).
    R: tl.constexpr = BLOCK_K // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN:
        n_mask = tl.full([BLOCK_N], 1, tl.int1)
    else:
        n_mask = offs_n < N
    offs_r = tl.arange(0, R)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    k_words = tl.cdiv(K, 8)
    w_ptrs = qw_ptr + offs_n[:, None] * stride_qn + offs_r[None, :]
    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, R], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    t0 = pid_k * tiles_per_split
    for t in range(t0, t0 + tiles_per_split):
        rows = t * R + offs_r
        if EVEN:
            r_mask = tl.full([R], 1, tl.int1)
            packed = tl.load(w_ptrs + t * R)
        else:
            r_mask = rows < k_words
            packed = tl.load(w_ptrs + t * R, mask=n_mask[:, None] & r_mask[None, :], other=0)
        s, z = _group_params(s_ptr, z_ptr, rows, r_mask, offs_n, n_mask, t * BLOCK_K, N, K, GROUP_SIZE, BLOCK_K,
                             HAS_ZEROS)
        w_l16 = packed << 16
        w_l8 = packed << 8
        w_r8 = packed >> 8
        w_r16 = packed >> 16
        if BLOCK_M == 1:
            part = tl.zeros([BLOCK_N, R], dtype=tl.float32)
            xsum = tl.zeros([R], dtype=tl.float32)
            ones = tl.zeros([R], dtype=tl.float32)
        else:
            # (q - z) * s = (1 + q * 2**-e) * (s * 2**e) - (s * 2**e + z * s): one FMA per weight
            s_even = s * 128.0
            s_odd = s * 2048.0
            c_even = -(s_even + z * s)
            c_odd = -(s_odd + z * s)
        for j in tl.static_range(8):
            kj = rows * 8 + j
            if EVEN:
                k_mask = tl.full([R], 1, tl.int1)
            else:
                k_mask = kj < K
            if HAS_PERM:
                col = tl.load(perm_ptr + kj, mask=k_mask, other=0)
            else:
                col = kj
            if BLOCK_M == 1:
                xj = tl.load(x_ptr + col, mask=k_mask, other=0.0).to(tl.float32)
                xsum += xj
                # (1 + q * 2**-e) * x * 2**e = x * 2**e + q * x; the x * 2**e sum is taken off per word
                if j % 2 == 0:
                    xs = xj * 128.0
                else:
                    xs = xj * 2048.0
                ones += xs
                part += _nibble_biased(packed, w_l16, w_l8, w_r8, w_r16, one_bits, j) * xs[None, :]
            else:
                nib = _nibble_biased(packed, w_l16, w_l8, w_r8, w_r16, one_bits, j)
                if j % 2 == 0:
                    wj = nib * s_even + c_even
                else:
                    wj = nib * s_odd + c_odd
                xj = tl.load(x_ptr + offs_m[:, None] * stride_xm + col[None, :],
                             mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                acc = tl.dot(xj, tl.trans(wj.to(xj.dtype)), acc)
        if BLOCK_M == 1:
            acc2 += s * (part - (ones[None, :] + z * xsum[None, :]))
    if BLOCK_M == 1:
        acc = tl.sum(acc2, axis=1)[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if not SPLIT or ATOMIC:
        if HAS_BIAS:
            if pid_k == 0:
                acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if not SPLIT:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            tl.atomic_add(out_ptrs, acc, mask=out_mask, sem="relaxed")
    else:
        ws_ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.atomic_add(ws_ptrs, acc, mask=out_mask, sem="relaxed")
        # every thread's partial sums must be issued before this program takes its ticket
        tl.debug_barrier()
        ticket = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if ticket == split_k - 1:
            ws_bits = ws_ptrs.to(tl.pointer_type(tl.int32))
            old = tl.atomic_xchg(ws_bits, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32), mask=out_mask, sem="acq_rel")
            total = old.to(tl.float32, bitcast=True)
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.debug_barrier()
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="acq_rel")


@triton.jit
def _w4a16_dequant_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr, N, K, stride_qn,
    GROUP_SIZE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ZEROS: tl.constexpr,
):
    """Dequantize to a dense ``[N, K]`` linear weight in the sorted row order: word ``r`` of a
    column becomes its 8 consecutive values (one 16-byte store of halves)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    r_mask = rows < tl.cdiv(K, 8)
    packed = tl.load(qw_ptr + offs_n[:, None] * stride_qn + rows[None, :], mask=n_mask[:, None] & r_mask[None, :],
                     other=0)
    # a block of BLOCK_R words is BLOCK_R * 8 rows: inside one group when that divides the group
    s, z = _group_params(s_ptr, z_ptr, rows, r_mask, offs_n, n_mask, tl.program_id(0) * BLOCK_R * 8, N, K,
                         GROUP_SIZE, BLOCK_R * 8, HAS_ZEROS)
    shifts = tl.arange(0, 8) * 4
    q = (packed[:, :, None] >> shifts[None, None, :]) & 0xF
    qf = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    if HAS_ZEROS:
        w = (qf - z[:, :, None]) * s[:, :, None]
    else:
        w = (qf - 8.0) * s[:, :, None]
    w = tl.reshape(w, [BLOCK_N, BLOCK_R * 8])
    offs_k = tl.program_id(0) * BLOCK_R * 8 + tl.arange(0, BLOCK_R * 8)
    tl.store(w_ptr + offs_n.to(tl.int64)[:, None] * K + offs_k[None, :], w.to(w_ptr.dtype.element_ty),
             mask=n_mask[:, None] & (offs_k < K)[None, :])


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_qn,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    # Act-order weights get x with its columns already permuted (one gather of M x K values by
    # the caller): gathering inside every [BLOCK_M, BLOCK_K] tile measured 8-15x slower on H200.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    shifts = tl.arange(0, 8) * 4
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        xt = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                     mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        r_mask = rows < tl.cdiv(K, 8)
        packed = tl.load(qw_ptr + offs_n[:, None] * stride_qn + rows[None, :], mask=n_mask[:, None] & r_mask[None, :],
                         other=0)
        s, z = _group_params(s_ptr, z_ptr, rows, r_mask, offs_n, n_mask, k0, N, K, GROUP_SIZE, BLOCK_K, HAS_ZEROS)
        q = (packed[:, :, None] >> shifts[None, None, :]) & 0xF
        q = tl.reshape(q, [BLOCK_N, BLOCK_K])
        qf = (q | 0x4B000000).to(tl.float32, bitcast=True)
        wt = ((qf - (z + 8388608.0)) * s).to(xt.dtype)
        acc = tl.dot(xt, tl.trans(wt), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


# ---------------------------------------------------------------- configs (keyed by arch family)

GEMV_CONFIGS: dict[str, dict[str, Any]] = {
    # BLOCK_N columns x BLOCK_K rows per tile ([BLOCK_N, BLOCK_K / 8] words, 16 KB at 256 x 128;
    # BLOCK_K is cut to the group size, see `gemv_block_k`); BLOCK_N_DOT: the tile width for 2..16
    # rows (default BLOCK_N). sm_90 SASS (ptxas, 4 warps) per weight in the K loop: M=1 at 256 columns
    # 3.6 instructions (1 LOP3, 1.25 FFMA, 0.5 SHF, the rest x and addressing; act-order 4.2),
    # M=16 at 128 columns 4.9 (1 LOP3, 1 FFMA, 0.5 F2FP, shared-memory staging for tl.dot; 256
    # columns: 4.4 but 255 registers). Split-K aims at programs_per_cu programs per CU/SM, each over
    # whole K tiles. ATOMIC: partial sums straight into a zeroed float32 output (+ a cast) instead
    # of the one-launch ticket reduction. waves_per_eu stays 0: Triton passes it to LLVM as "N, N",
    # which caps occupancy at N, and this bandwidth-bound loop wants every wave the registers allow.
    # CDNA keeps 128 columns: 71 VGPRs, 7 waves per SIMD on gfx942 (256 columns: 141 VGPRs, 3 waves).
    "cdna2": {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2, "waves_per_eu": 0, "programs_per_cu": 8,
              "ATOMIC": False},
    "cdna3": {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2, "waves_per_eu": 0, "programs_per_cu": 8,
              "ATOMIC": False},
    "cdna4": {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2, "waves_per_eu": 0, "programs_per_cu": 8,
              "ATOMIC": False},
    "rdna3": {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 2, "waves_per_eu": 0, "programs_per_cu": 8,
              "ATOMIC": False},
    "hopper": {"BLOCK_N": 256, "BLOCK_N_DOT": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2,
               "programs_per_cu": 8, "ATOMIC": False},
    "default": {"BLOCK_N": 256, "BLOCK_N_DOT": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2,
                "programs_per_cu": 8, "ATOMIC": False},
}
GEMM_CONFIGS: dict[str, dict[str, Any]] = {
    "cdna2": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 2,
              "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2},
    "cdna3": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 2,
              "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2},
    "cdna4": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 2,
              "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 1},
    "rdna3": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 2,
              "waves_per_eu": 0},
    # H200 sweep (first kernel version) at M=2048: 256x128 was 7% faster than 128x128 but spills on
    # sm_90 and wastes half its rows below 256, the only sizes this route now serves.
    "hopper": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "default": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 2},
}
INTERPRET_GEMV = {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 1, "num_stages": 1, "programs_per_cu": 1, "ATOMIC": False}
INTERPRET_GEMM = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 1, "num_stages": 1}
_LAUNCH_KEYS = ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack")


def _family_config(table: dict[str, dict[str, Any]], arch: str) -> dict[str, Any]:
    return dict(table.get(arch_family(arch), table["default"]))


def launch_options(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Compiler options of a config: the AMD knobs only where the target is AMD."""
    amd = arch.startswith("gfx")
    return {k: cfg[k] for k in _LAUNCH_KEYS if k in cfg and (amd or k in ("num_warps", "num_stages"))}


SMALL_M_GEMM: dict[str, dict[str, Any]] = {
    # gfx1100 (wave32): 4 warps leave each wave 256 VGPRs of a 32x64 tile and spill 236 bytes; 8 do not.
    "rdna3": {"BLOCK_M": 32, "num_warps": 8},
    "default": {"BLOCK_M": 32, "num_warps": 4},
}
"""Tile for 17..64 rows: a 128/256-row tile would leave most of each matrix instruction idle."""


def gemm_config(arch: str, m: int) -> dict[str, Any]:
    """The arch's GEMM config, with the small-M tile below 65 rows."""
    cfg = _family_config(GEMM_CONFIGS, arch)
    if m <= 64:
        cfg.update(_family_config(SMALL_M_GEMM, arch))
        cfg["num_stages"] = min(cfg["num_stages"], 3)
    return cfg


def _tile_k(block_k: int, group_size: int, k: int) -> int:
    """The largest power-of-two K tile <= block_k that keeps each tile inside one group."""
    if group_size >= k:
        return block_k
    bk = block_k
    while bk > 16 and group_size % bk != 0:
        bk //= 2
    return bk


def gemv_block_k(block_k: int, group_size: int, k: int, block_m: int) -> int:
    """The GEMV's K tile: inside one group (one scale per column and tile, no per-word gather
    whose layout conversion costs shared-memory traffic every tile), except that 2..16 rows need
    at least 128 (``tl.dot`` over ``BLOCK_K / 8 >= 16`` words) and gather per word below that."""
    bk = _tile_k(block_k, group_size, k)
    return bk if block_m == 1 else max(bk, 128)


def _group_arg(w: "W4A16Weight") -> int:
    return 0 if w.group_size >= w.in_features else w.group_size


_WORKSPACES: dict[tuple[Any, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, n: int, n_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed float32 [16, N] partial sums and int32 tickets per column tile, kept per device and N.

    The kernel leaves both zeroed, so they are allocated once (before any graph capture that
    replays the layer) and reused; calls on one device run in stream order.
    """
    key = (device, n)
    ws = _WORKSPACES.get(key)
    if ws is None or ws[1].numel() < n_tiles:
        ws = (torch.zeros(16, n, dtype=torch.float32, device=device),
              torch.zeros(max(n_tiles, 1), dtype=torch.int32, device=device))
        _WORKSPACES[key] = ws
    return ws


def _num_cus(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split(k_tiles: int, n_tiles: int, cfg: dict[str, Any], device: torch.device) -> tuple[int, int]:
    """(programs along K, K tiles per program). Without an explicit SPLIT_K: the fewest tiles per
    program that divides the K tiles (no masked tail) and still gives programs_per_cu programs per
    CU/SM; one tile per program when even that is too few."""
    if cfg.get("SPLIT_K"):
        per = triton.cdiv(k_tiles, cfg["SPLIT_K"])
        return triton.cdiv(k_tiles, per), per
    want = cfg["programs_per_cu"] * _num_cus(device)
    for per in range(k_tiles, 0, -1):
        if k_tiles % per == 0 and n_tiles * (k_tiles // per) >= want:
            return k_tiles // per, per
    return k_tiles, 1


def w4a16_triton(x: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor] = None,
                 config: Optional[dict[str, Any]] = None, route: Optional[str] = None) -> torch.Tensor:
    """Run the W4A16 kernels. Up to 16 rows: the split-K GEMV. Above: the tiled Triton GEMM, or from
    `dequant_min_m` rows on (per arch) dequantize once into a dense weight and call the BLAS matmul.
    `config` / `route` ("gemv", "gemm", "dequant") override the per-arch choice (for the benchmark sweep)."""
    k, n = w.in_features, w.out_features
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    arch = "cpu" if interpret_mode() else device_arch(x.device.index or 0)
    if route is None:
        route = "gemv" if m <= 16 else ("dequant" if m >= dequant_min_m(arch) else "gemm")
    if route == "dequant":
        return _dequant_matmul(x2, w, bias, arch).reshape(*x.shape[:-1], n)
    gs = _group_arg(w)
    z = w.zeros if w.zeros is not None else w.scales
    b = bias if bias is not None else w.scales
    if route == "gemv":
        if m > 16:
            raise ValueError("the GEMV route takes at most 16 rows")
        cfg = dict(config or (INTERPRET_GEMV if arch == "cpu" else _family_config(GEMV_CONFIGS, arch)))
        block_m = 1 if m == 1 else 16
        bk = gemv_block_k(cfg["BLOCK_K"], w.group_size, k, block_m)
        bn = cfg["BLOCK_N"] if block_m == 1 else cfg.get("BLOCK_N_DOT", cfg["BLOCK_N"])
        n_tiles, k_tiles = triton.cdiv(n, bn), triton.cdiv(k, bk)
        split, per = _split(k_tiles, n_tiles, cfg, x.device)
        even = k % bk == 0 and k_tiles % split == 0 and n % bn == 0
        atomic = bool(cfg.get("ATOMIC")) and split > 1
        dst = torch.zeros(m, n, dtype=torch.float32, device=x.device) if atomic else out
        ws, cnt = _workspace(x.device, n, n_tiles) if split > 1 and not atomic else (out, out)
        _w4a16_gemv_kernel[(n_tiles, split)](
            x2, w.qweight, w.scales, z, w.perm if w.perm is not None else w.qweight, b, dst, ws, cnt,
            m, n, k, x2.stride(0), dst.stride(0), w.qweight.stride(0), per, split, ONE_BITS,
            GROUP_SIZE=gs, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split > 1, HAS_ZEROS=w.zeros is not None,
            HAS_PERM=w.perm is not None, HAS_BIAS=bias is not None, ATOMIC=atomic, EVEN=even,
            **launch_options(cfg, arch),
        )
        if atomic:
            out.copy_(dst)
    else:
        cfg = dict(config or (INTERPRET_GEMM if arch == "cpu" else gemm_config(arch, m)))
        bk = _tile_k(cfg["BLOCK_K"], w.group_size, k)
        if w.perm is not None:
            x2 = x2.index_select(1, w.perm)
        grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
        _w4a16_gemm_kernel[grid](
            x2, w.qweight, w.scales, z, b, out,
            m, n, k, x2.stride(0), out.stride(0), w.qweight.stride(0),
            GROUP_SIZE=gs, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=bk, GROUP_M=cfg["GROUP_M"],
            HAS_ZEROS=w.zeros is not None, HAS_BIAS=bias is not None, **launch_options(cfg, arch),
        )
    return out.reshape(*x.shape[:-1], n)


DEQUANT_MIN_M: dict[str, int] = {"cdna2": 256, "cdna3": 256, "cdna4": 256, "rdna3": 256, "hopper": 256,
                                 "default": 256, "cpu": 1 << 62}
"""Rows from which dequantize-then-BLAS beats the fused GEMM (the dense weight is written and read
once per call, which the BLAS amortizes over many rows). Never in the interpreter."""
DEQUANT_CONFIG = {"BLOCK_R": 16, "BLOCK_N": 64, "num_warps": 4}
"""16 words (128 rows: one scale per column for groups of 128) x 64 columns: 4 KB read, 16 KB
(fp16) written per program, in 16-byte stores."""


def dequant_min_m(arch: str) -> int:
    return DEQUANT_MIN_M.get(arch_family(arch), DEQUANT_MIN_M["default"])


def dequantize_dense(w: "W4A16Weight", dtype: torch.dtype, arch: Optional[str] = None) -> torch.Tensor:
    """The dense linear-layer weight ``[N, K]`` (``W`` transposed) in `dtype`, rows of K in the
    SORTED order of the repacked weight (act-order: column ``k`` is original input ``w.perm[k]``)."""
    k, n = w.in_features, w.out_features
    arch = arch or ("cpu" if interpret_mode() else device_arch(w.qweight.device.index or 0))
    cfg = dict(DEQUANT_CONFIG) if arch != "cpu" else {"BLOCK_R": 4, "BLOCK_N": 16, "num_warps": 1}
    dense = torch.empty(n, k, dtype=dtype, device=w.qweight.device)
    grid = (triton.cdiv(triton.cdiv(k, 8), cfg["BLOCK_R"]), triton.cdiv(n, cfg["BLOCK_N"]))
    _w4a16_dequant_kernel[grid](
        w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales, dense, n, k, w.qweight.stride(0),
        GROUP_SIZE=_group_arg(w), BLOCK_R=cfg["BLOCK_R"], BLOCK_N=cfg["BLOCK_N"],
        HAS_ZEROS=w.zeros is not None, num_warps=cfg["num_warps"],
    )
    return dense


def _dequant_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], arch: str) -> torch.Tensor:
    dense = dequantize_dense(w, x2.dtype, arch)
    if w.perm is not None:
        x2 = x2.index_select(1, w.perm)
    return torch.nn.functional.linear(x2, dense, bias.to(x2.dtype) if bias is not None else None)


# ---------------------------------------------------------------- AMD compile specs

_COMMON_SIG = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "perm_ptr": "*i32",
               "bias_ptr": "*fp16", "out_ptr": "*fp16"}


_CDNA = ("gfx90a", "gfx942", "gfx950")
_RDNA3 = ("gfx1100",)


def _gemv_spec(block_m: int, split: int, zeros: bool, perm: bool, archs: tuple[str, ...],
               group: int = 128) -> CompileSpec:
    sig = dict(_COMMON_SIG, ws_ptr="*fp32", cnt_ptr="*i32", M="i32", N="i32", K="i32", stride_xm="i32",
               stride_om="i32", stride_qn="i32", tiles_per_split="i32", split_k="i32",
               one_bits="i32")
    names = ("GROUP_SIZE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT", "HAS_ZEROS", "HAS_PERM", "HAS_BIAS", "ATOMIC",
             "EVEN")
    sig.update({c: "constexpr" for c in names})

    def options(arch: str) -> dict[str, Any]:
        return launch_options(_family_config(GEMV_CONFIGS, arch), arch)

    cfg0 = _family_config(GEMV_CONFIGS, archs[-1])
    tag = ("asym" if zeros else "sym") + (",act-order" if perm else "") + (",rdna3" if archs == _RDNA3 else "")
    return CompileSpec(
        name=f"w4a16_gemv[m{block_m},g{group},split{split},{tag}]",
        kernel=_w4a16_gemv_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": group, "BLOCK_M": block_m,
                    "BLOCK_N": cfg0["BLOCK_N"] if block_m == 1 else cfg0.get("BLOCK_N_DOT", cfg0["BLOCK_N"]),
                    "BLOCK_K": gemv_block_k(cfg0["BLOCK_K"], group, 1 << 30, block_m), "SPLIT": split > 1, "HAS_ZEROS": zeros, "HAS_PERM": perm,
                    "HAS_BIAS": False, "ATOMIC": cfg0["ATOMIC"] and split > 1, "EVEN": True},
        options=options,
        hot=True,
        uses_dot=block_m > 1,
        archs=archs,
        divisible_by_16=("N", "K", "stride_xm", "stride_om", "stride_qn"),
    )


def _gemm_spec(zeros: bool, group: int, archs: tuple[str, ...], small_m: bool = False) -> CompileSpec:
    sig = {k: v for k, v in _COMMON_SIG.items() if k != "perm_ptr"}
    sig.update(M="i32", N="i32", K="i32", stride_xm="i32", stride_om="i32", stride_qn="i32")
    names = ("GROUP_SIZE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "HAS_ZEROS", "HAS_BIAS")
    sig.update({c: "constexpr" for c in names})

    rows = 64 if small_m else 1 << 20

    def options(arch: str) -> dict[str, Any]:
        return launch_options(gemm_config(arch, rows), arch)

    cfg0 = gemm_config(archs[-1], rows)
    tag = ("asym" if zeros else "sym") + (",m<=64" if small_m else "") + (",rdna3" if archs == _RDNA3 else "")
    return CompileSpec(
        name=f"w4a16_gemm[g{group},{tag}]",
        kernel=_w4a16_gemm_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": group, "BLOCK_M": cfg0["BLOCK_M"], "BLOCK_N": cfg0["BLOCK_N"],
                    "BLOCK_K": _tile_k(cfg0["BLOCK_K"], group, 1 << 30), "GROUP_M": cfg0["GROUP_M"],
                    "HAS_ZEROS": zeros, "HAS_BIAS": False},
        options=options,
        hot=True,
        uses_dot=True,
        archs=archs,
        divisible_by_16=("N", "K", "stride_xm", "stride_om", "stride_qn"),
    )


def _dequant_spec(archs: tuple[str, ...]) -> CompileSpec:
    sig = {"qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "w_ptr": "*fp16", "N": "i32", "K": "i32",
           "stride_qn": "i32"}
    sig.update({c: "constexpr" for c in ("GROUP_SIZE", "BLOCK_R", "BLOCK_N", "HAS_ZEROS")})
    return CompileSpec(
        name="w4a16_dequant[g128,asym" + (",rdna3]" if archs == _RDNA3 else "]"),
        kernel=_w4a16_dequant_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": 128, "BLOCK_R": DEQUANT_CONFIG["BLOCK_R"], "BLOCK_N": DEQUANT_CONFIG["BLOCK_N"],
                    "HAS_ZEROS": True},
        options=lambda arch: {"num_warps": DEQUANT_CONFIG["num_warps"], "num_stages": 1},
        hot=True,
        uses_dot=False,
        archs=archs,
        divisible_by_16=("N", "K", "stride_qn"),
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [
    spec
    for archs in (_CDNA, _RDNA3)
    for spec in (
        _gemv_spec(1, 1, False, False, archs),
        _gemv_spec(1, 8, True, True, archs),
        _gemv_spec(1, 4, True, False, archs, group=32),
        _gemv_spec(16, 4, True, False, archs),
        _dequant_spec(archs),
        _gemm_spec(False, 128, archs),
        _gemm_spec(True, 128, archs),
        _gemm_spec(True, 32, archs),
        _gemm_spec(True, 128, archs, small_m=True),
    )
]
