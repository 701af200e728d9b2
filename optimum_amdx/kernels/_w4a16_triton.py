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
  flushes its partial sums when it leaves a column block (`_leave_block`): a program that saw the
  whole block stores the output directly; otherwise float32 atomics go into a persistent workspace
  and the last contributor (a ticket per column block and M block) writes the output, adds the
  bias and clears the workspace: one launch, graph-safe.
  One row (``BLOCK_M == 1``) is FMA work. On NVIDIA with fp16 activations it is the packed loop
  (`_dot32`: inline PTX, two nibbles per 32-bit op, exact ``q - z`` in fp16x2, fp16 products summed
  over at most 8 per half, float32 scale per group; the activation pairs it meets come from a
  one-launch prepare kernel for act-order / ragged K). On CDNA one row of fp16 without a permutation runs the
  same arithmetic without asm (``HALF_LOOP``: `_half_plane_fma`, Triton's int16 and fp16 operations, which the
  AMD compiler packs two to a register). Elsewhere (gfx1100, bf16, act-order on AMD, the interpreter, 16-row
  groups on NVIDIA) each nibble plane meets a 16-value vector of x in float32. Two or
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

from ._pairs import pair_source
from ._pdl import pdl_begin
from .compile_spec import CompileSpec
from .runtime import arch_family, compute_units, interpret_mode, kernel_arch, pdl_for

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
def _plane_scales(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr,
                  EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, HAS_ZEROS: tl.constexpr):
    """Scales and zeros (`_scale_zero`) of the 8 nibble planes of the K tile at row `k0`: one load when
    a scale group spans the tile (CHUNKS == 1), else one per plane (rows k0 + 16 j)."""
    s0, z0 = _scale_zero(s_ptr, z_ptr, _group_of(k0, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
    if CHUNKS == 1:
        return s0, z0, s0, z0, s0, z0, s0, z0, s0, z0, s0, z0, s0, z0, s0, z0
    else:
        s1, z1 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 16, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
        s2, z2 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 32, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
        s3, z3 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 48, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
        s4, z4 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 64, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
        s5, z5 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 80, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
        s6, z6 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 96, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
        s7, z7 = _scale_zero(s_ptr, z_ptr, _group_of(k0 + 112, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
        return s0, z0, s1, z1, s2, z2, s3, z3, s4, z4, s5, z5, s6, z6, s7, z7


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
def _tile_planes(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s_ptr, z_ptr, k0, offs_n, N, K, dt,
                 GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                 HAS_ZEROS: tl.constexpr):
    """The 8 dequantized nibble planes ``[BLOCK_N, 16]`` (in `dt`) of the tile `packed` at row `k0`: plane j
    holds rows k0 + 16 j .. k0 + 16 j + 15."""
    s0, z0, s1, z1, s2, z2, s3, z3, s4, z4, s5, z5, s6, z6, s7, z7 = _plane_scales(
        s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE, CHUNKS, EVEN_K, EVEN_N, HAS_ZEROS)
    return (_plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s0, z0, 0).to(dt),
            _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s1, z1, 1).to(dt),
            _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s2, z2, 2).to(dt),
            _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s3, z3, 3).to(dt),
            _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s4, z4, 4).to(dt),
            _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s5, z5, 5).to(dt),
            _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s6, z6, 6).to(dt),
            _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s7, z7, 7).to(dt))


@triton.jit
def _byte_halves(packed):
    """The portable planes' inputs: int16 copies of `packed` ([BLOCK_N, 16] int32) holding byte b in bits 0-7 for
    b = 0, 1, 2, 3 (its 16-bit half, shifted by 8 for odd b), that is planes 2b (bits 0-3) and 2b + 1 (bits 4-7)."""
    lo = packed.to(tl.int16)
    hi = (packed >> 16).to(tl.int16)
    return lo, lo >> 8, hi, hi >> 8


@triton.jit
def _plane_lo_q(h, zl):
    """fp16 q - z of the nibble in bits 0-3 of int16 `h`, exactly, without asm: or-ed with fp16 1024's bits it reads
    as 1024 + q, and `zl` = -(1024 + z) is added (the compilers pack two such int16 / fp16 operations per register)."""
    return ((h & 0x000F) | 0x6400).to(tl.float16, bitcast=True) + zl


@triton.jit
def _plane_hi_q(h, zh):
    """As `_plane_lo_q` for the nibble in bits 4-7: it reads as 1024 + 16q; times 1/16 plus `zh` = -(64 + z)."""
    return (((h & 0x00F0) | 0x6400).to(tl.float16, bitcast=True)) * 0.0625 + zh


@triton.jit
def _half_plane_fma(part, x_ptr, perm_ptr, bytes4, zl, zh, k0, offs_r, K, J: tl.constexpr, HAS_PERM: tl.constexpr,
                    EVEN_K: tl.constexpr):
    """One row without asm, nibble plane J of a tile: ``part + (q - z) * x`` in fp16 (`HALF_LOOP`). q - z is exact
    (`_plane_lo_q`, `_plane_hi_q` on the word's int16 byte halves `bytes4`, `_byte_halves`); the product and the sum
    round to fp16, as in the packed PTX loop, which sums at most 8 products per half before the float32 scale."""
    h = bytes4[J // 2]
    if J % 2 == 0:
        w = _plane_lo_q(h, zl)
    else:
        w = _plane_hi_q(h, zh)
    xj = _x_vec(x_ptr, perm_ptr, k0 + J * 16 + offs_r, K, HAS_PERM, EVEN_K).to(tl.float16)
    return part + w * xj[None, :]


@triton.jit
def _m1_plane(x_ptr, perm_ptr, packed, w_l16, w_l8, w_r8, w_r16, e7_bits, k0, offs_r, K, J: tl.constexpr,
              HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """One row, nibble plane J of a tile: x (16 values) and the products ``(2**e + q) * x``."""
    xj = _x_vec(x_ptr, perm_ptr, k0 + J * 16 + offs_r, K, HAS_PERM, EVEN_K)
    return xj, _nibble_biased(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, J) * xj[None, :]


# ---------------------------------------------------------------- packed fp16 one-row path (NVIDIA)
# Two nibbles per 32-bit op: nibbles j and j+4 of a word sit at bits 4j and 4j+16, so one LOP3 with
# the mask 0x000F000F (or 0x00F000F0) and the bits of fp16x2 (1024, 1024) makes the pair
# (1024 + q_j, 1024 + q_{j+4}) (or 1024 + 16 q); one HADD2 / HFMA2 with the column's (1024 + z) / (64 + z)
# makes (q - z) exactly, and one HFMA2 multiplies by the activation pair (x_j, x_{j+4}). A word (8
# weights) costs 1 shift + 4 LOP3 + 4 bias ops + 4 HFMA2 + the conversion of its fp16x2 sum to
# float32 (at most 4 products per half are summed in fp16 before that). The scale is applied in
# float32, once per word and group.

_DOT8_HEAD = """{
.reg .b32 w8, p0, p1, p2, p3, c16, a, b;
.reg .b16 lo, hi, lo2, hi2;
.reg .f32 fl, fh;
shr.u32 w8, $W, 8;
lop3.b32 p0, $W, 0x000f000f, 0x64006400, 0xea;
lop3.b32 p1, $W, 0x00f000f0, 0x64006400, 0xea;
lop3.b32 p2, w8, 0x000f000f, 0x64006400, 0xea;
lop3.b32 p3, w8, 0x00f000f0, 0x64006400, 0xea;
mov.b32 c16, 0x2c002c00;
"""


def _dot8_asm(n_acc: int, n_out: int) -> str:
    """PTX for one word: the sum over its 8 nibbles of (q - z) * x, as `n_out` float32 values (see
    `_dot8`); `$W` is the word, `$X0..3` the activation pairs, `$ZL*` / `$ZH*` the negated bias pairs."""
    n_args = 5 + 2 * n_acc
    names = {"W": n_out}
    for j in range(4):
        names[f"X{j}"] = n_out + 1 + j
    for a in range(n_acc):
        names[f"ZL{a}"] = n_out + 5 + 2 * a
        names[f"ZH{a}"] = n_out + 6 + 2 * a
    body = _DOT8_HEAD
    za, zb = "ZL0", "ZH0"  # planes 0|4 and 1|5
    zc, zd = ("ZL0", "ZH0") if n_acc == 1 else ("ZL1", "ZH1")  # planes 2|6 and 3|7
    body += f"add.f16x2 p0, p0, ${za};\nfma.rn.f16x2 p1, p1, c16, ${zb};\n"
    body += f"add.f16x2 p2, p2, ${zc};\nfma.rn.f16x2 p3, p3, c16, ${zd};\n"
    if n_acc == 1:
        body += "mul.f16x2 a, p0, $X0;\nfma.rn.f16x2 a, p1, $X1, a;\nfma.rn.f16x2 a, p2, $X2, a;\nfma.rn.f16x2 a, p3, $X3, a;\n"
        body += "mov.b32 {lo, hi}, a;\n"
        if n_out == 1:
            body += "cvt.f32.f16 fl, lo;\ncvt.f32.f16 fh, hi;\nadd.f32 $0, fl, fh;\n"
        else:
            body += "cvt.f32.f16 $0, lo;\ncvt.f32.f16 $1, hi;\n"
    else:
        body += "mul.f16x2 a, p0, $X0;\nfma.rn.f16x2 a, p1, $X1, a;\nmul.f16x2 b, p2, $X2;\nfma.rn.f16x2 b, p3, $X3, b;\n"
        body += "mov.b32 {lo, hi}, a;\nmov.b32 {lo2, hi2}, b;\n"
        body += "cvt.f32.f16 $0, lo;\ncvt.f32.f16 $1, lo2;\ncvt.f32.f16 $2, hi;\ncvt.f32.f16 $3, hi2;\n"
    body += "}"
    for name in sorted(names, key=len, reverse=True):
        body = body.replace("$" + name, "$" + str(names[name]))
    assert n_args == len(names)
    return body


_DOT8_ASM_1 = tl.constexpr(_dot8_asm(1, 1))
_DOT8_ASM_2 = tl.constexpr(_dot8_asm(1, 2))
_DOT8_ASM_4 = tl.constexpr(_dot8_asm(2, 4))
"""`_DOT8_ASM_<CHUNKS>`, by scale groups per 128-row tile: one group (one float32 out), two groups (planes 0-3
and 4-7: the pair's halves, two outs), four groups (planes 0-1, 2-3, 4-5, 6-7: two fp16x2 sums, four
outs in group order)."""


def _dot32_asm(chunks: int) -> str:
    """PTX for `_dot32`: four words (pack=4: input rows r..r+3 of one column, held by one thread),
    ``acc[e] += s_e * sum((q - z) * x)`` for the group slots e of the tile (`chunks` of them; the
    other accumulators pass through). Products are summed in fp16 over at most 8 per half (two
    words, or four words of two planes for four groups) before the float32 conversion: a sum
    overflows only past 65504, i.e. |x| above about 545 on all eight rows at once with |q - z| = 15."""
    n_zero = 2 if chunks == 4 else 1
    n_s = chunks
    ins = ["acc", "w", "x0", "x1", "x2", "x3"] + [f"z{a}{h}" for a in range(n_zero) for h in "lh"] + [f"s{e}" for e in range(n_s)]
    op = {name: [4 + 4 * i + e for e in range(4)] for i, name in enumerate(ins)}
    L = [".reg .b32 w8, p0, p1, p2, p3, c16, a, b;", ".reg .b16 lo, hi;", ".reg .f32 t0, t1, t2, t3, f;",
         "mov.b32 c16, 0x2c002c00;"]

    def word(e: int, first: bool) -> None:
        w = f"${op['w'][e]}"
        L.extend([f"shr.u32 w8, {w}, 8;",
                  f"lop3.b32 p0, {w}, 0x000f000f, 0x64006400, 0xea;",
                  f"lop3.b32 p1, {w}, 0x00f000f0, 0x64006400, 0xea;",
                  "lop3.b32 p2, w8, 0x000f000f, 0x64006400, 0xea;",
                  "lop3.b32 p3, w8, 0x00f000f0, 0x64006400, 0xea;"])
        zb = 1 if n_zero == 2 else 0
        L.extend([f"add.f16x2 p0, p0, ${op['z0l'][e]};", f"fma.rn.f16x2 p1, p1, c16, ${op['z0h'][e]};",
                  f"add.f16x2 p2, p2, ${op[f'z{zb}l'][e]};", f"fma.rn.f16x2 p3, p3, c16, ${op[f'z{zb}h'][e]};"])
        x = [f"${op[f'x{j}'][e]}" for j in range(4)]
        if chunks == 4:  # a: planes (0|4, 1|5) = groups 0|2; b: planes (2|6, 3|7) = groups 1|3
            L.append(f"mul.f16x2 a, p0, {x[0]};" if first else f"fma.rn.f16x2 a, p0, {x[0]}, a;")
            L.append(f"fma.rn.f16x2 a, p1, {x[1]}, a;")
            L.append(f"mul.f16x2 b, p2, {x[2]};" if first else f"fma.rn.f16x2 b, p2, {x[2]}, b;")
            L.append(f"fma.rn.f16x2 b, p3, {x[3]}, b;")
        else:
            L.append(f"mul.f16x2 a, p0, {x[0]};" if first else f"fma.rn.f16x2 a, p0, {x[0]}, a;")
            L.extend([f"fma.rn.f16x2 a, p{j}, {x[j]}, a;" for j in (1, 2, 3)])

    if chunks == 4:
        for e in range(4):
            word(e, e == 0)
        L.extend(["mov.b32 {lo, hi}, a;", "cvt.f32.f16 t0, lo;", "cvt.f32.f16 t2, hi;",
                  "mov.b32 {lo, hi}, b;", "cvt.f32.f16 t1, lo;", "cvt.f32.f16 t3, hi;"])
        for e in range(4):
            L.append(f"fma.rn.f32 ${e}, ${op[f's{e}'][0]}, t{e}, ${op['acc'][e]};")
    else:
        for run in range(2):
            word(2 * run, True)
            word(2 * run + 1, False)
            L.extend(["mov.b32 {lo, hi}, a;", f"cvt.f32.f16 t{2 * run}, lo;", f"cvt.f32.f16 t{2 * run + 1}, hi;"])
        if chunks == 1:
            L.extend(["add.f32 t0, t0, t1;", "add.f32 t2, t2, t3;", "add.f32 f, t0, t2;",
                      f"fma.rn.f32 $0, ${op['s0'][0]}, f, ${op['acc'][0]};"])
            rest = (1, 2, 3)
        else:  # lo halves: group slot 0, hi halves: slot 1
            L.extend(["add.f32 t0, t0, t2;", "add.f32 t1, t1, t3;",
                      f"fma.rn.f32 $0, ${op['s0'][0]}, t0, ${op['acc'][0]};",
                      f"fma.rn.f32 $1, ${op['s1'][0]}, t1, ${op['acc'][1]};"])
            rest = (2, 3)
        L.extend([f"mov.f32 ${e}, ${op['acc'][e]};" for e in rest])
    return "{\n" + "\n".join(L) + "\n}"


_DOT32_ASM_1 = tl.constexpr(_dot32_asm(1))
_DOT32_ASM_2 = tl.constexpr(_dot32_asm(2))
_DOT32_ASM_4 = tl.constexpr(_dot32_asm(4))
_DOT32_CON_1 = tl.constexpr("=f,=f,=f,=f," + ",".join(["f"] * 4 + ["r"] * 28 + ["f"] * 4))
_DOT32_CON_2 = tl.constexpr("=f,=f,=f,=f," + ",".join(["f"] * 4 + ["r"] * 28 + ["f"] * 8))
_DOT32_CON_4 = tl.constexpr("=f,=f,=f,=f," + ",".join(["f"] * 4 + ["r"] * 36 + ["f"] * 16))


@triton.jit
def _dot32(acc, w, x0, x1, x2, x3, zl0, zh0, zl1, zh1, s0, s1, s2, s3, CHUNKS: tl.constexpr):
    """`acc` (float32, the tile's layout) plus the scaled dot products of four words per instance
    (see `_dot32_asm`); scales are float32 ``[BLOCK_N, 1]`` per group slot."""
    if CHUNKS == 1:
        return tl.inline_asm_elementwise(_DOT32_ASM_1, _DOT32_CON_1,
                                         [acc, w, x0, x1, x2, x3, zl0, zh0, s0],
                                         dtype=tl.float32, is_pure=True, pack=4)
    elif CHUNKS == 2:
        return tl.inline_asm_elementwise(_DOT32_ASM_2, _DOT32_CON_2,
                                         [acc, w, x0, x1, x2, x3, zl0, zh0, s0, s1],
                                         dtype=tl.float32, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(_DOT32_ASM_4, _DOT32_CON_4,
                                         [acc, w, x0, x1, x2, x3, zl0, zh0, zl1, zh1, s0, s1, s2, s3],
                                         dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _pair_h2(lo, hi):
    """fp16 tensors -> int32 holding the fp16x2 pair (lo, hi). Plain integer ops, not inline asm: the
    compiler can see that the copies of a pair held for each column a thread owns are one value (with
    asm it built every pair once per column: 32 instead of 16 PRMT per tile in the one-row loop, sm_90)."""
    return (lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _dot8(w, x0, x1, x2, x3, zl0, zh0, zl1, zh1, CHUNKS: tl.constexpr):
    """Per word: sum over its 8 nibbles of ``(q - z) * x`` in float32, split by scale group (see
    `_DOT8_ASM_1`); x pairs and bias pairs are int32 fp16x2."""
    if CHUNKS == 1:
        return tl.inline_asm_elementwise(_DOT8_ASM_1, "=f,r,r,r,r,r,r,r", [w, x0, x1, x2, x3, zl0, zh0],
                                         dtype=tl.float32, is_pure=True, pack=1)
    elif CHUNKS == 2:
        return tl.inline_asm_elementwise(_DOT8_ASM_2, "=f,=f,r,r,r,r,r,r,r", [w, x0, x1, x2, x3, zl0, zh0],
                                         dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(_DOT8_ASM_4, "=f,=f,=f,=f,r,r,r,r,r,r,r,r,r",
                                         [w, x0, x1, x2, x3, zl0, zh0, zl1, zh1],
                                         dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)


_LDG_H_ASM = tl.constexpr("ld.global.nc.b16 $0, [$1];")


@triton.jit
def _col_sz(s_ptr, z_ptr, g, offs_n, N, HAS_ZEROS: tl.constexpr):
    """Scales and zeros ``[BLOCK_N, 1]`` (float32) of group row `g` for the packed loop, read by
    inline loads: a `tl.load` of a ``[BLOCK_N, 1]`` column gets its own coalesced layout, which the
    compiler then imposes on the loop's accumulator (a shared-memory round trip of the whole tile's
    partial sums every tile); an asm load keeps the weight tile's layout. Columns past N read column
    N - 1 (their weights are zero and their outputs are not stored)."""
    ptrs = g * N + tl.minimum(offs_n, N - 1)[:, None]
    s = tl.inline_asm_elementwise(_LDG_H_ASM, "=h,l", [s_ptr + ptrs], dtype=tl.float16, is_pure=True, pack=1)
    if HAS_ZEROS:
        z = tl.inline_asm_elementwise(_LDG_H_ASM, "=h,l", [z_ptr + ptrs], dtype=tl.float16, is_pure=True, pack=1)
        z = z.to(tl.float32)
    else:
        z = tl.full(s.shape, 8.0, tl.float32)
    return s.to(tl.float32), z


@triton.jit
def _bias_pairs(z_lo, z_hi):
    """Negated bias pairs for `_dot8`: (-(1024 + z_lo), -(1024 + z_hi)) and (-(64 + z_lo), -(64 + z_hi)),
    fp16x2 in int32 (exact: small integers)."""
    zl = _pair_h2((-1024.0 - z_lo).to(tl.float16), (-1024.0 - z_hi).to(tl.float16))
    zh = _pair_h2((-64.0 - z_lo).to(tl.float16), (-64.0 - z_hi).to(tl.float16))
    return zl, zh


@triton.jit
def _group_consts(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr,
                  HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr):
    """What the packed fp16 math of the K tile at row `k0` needs besides its words and activations: the
    negated bias pairs ``(zl0, zh0, zl1, zh1)`` and the float32 scales of its four group slots
    ``(s0, s1, s2, s3)``, all ``[BLOCK_N, 1]`` (`_col_sz`). One group per tile fills every slot with
    it; two put group a in slots 0 and 2, group b in 1 and 3; four are in group order (planes 0-1,
    2-3, 4-5, 6-7)."""
    if CHUNKS == 1:
        s0, z0 = _col_sz(s_ptr, z_ptr, _group_of(k0, K, GROUP_SIZE, EVEN_K), offs_n, N, HAS_ZEROS)
        zl0, zh0 = _bias_pairs(z0, z0)
        return zl0, zh0, zl0, zh0, s0, s0, s0, s0
    elif CHUNKS == 2:
        s0, za = _col_sz(s_ptr, z_ptr, _group_of(k0, K, GROUP_SIZE, EVEN_K), offs_n, N, HAS_ZEROS)
        s1, zb = _col_sz(s_ptr, z_ptr, _group_of(k0 + 64, K, GROUP_SIZE, EVEN_K), offs_n, N, HAS_ZEROS)
        zl0, zh0 = _bias_pairs(za, zb)
        return zl0, zh0, zl0, zh0, s0, s1, s0, s1
    else:
        s0, z0 = _col_sz(s_ptr, z_ptr, _group_of(k0, K, GROUP_SIZE, EVEN_K), offs_n, N, HAS_ZEROS)
        s1, z1 = _col_sz(s_ptr, z_ptr, _group_of(k0 + 32, K, GROUP_SIZE, EVEN_K), offs_n, N, HAS_ZEROS)
        s2, z2 = _col_sz(s_ptr, z_ptr, _group_of(k0 + 64, K, GROUP_SIZE, EVEN_K), offs_n, N, HAS_ZEROS)
        s3, z3 = _col_sz(s_ptr, z_ptr, _group_of(k0 + 96, K, GROUP_SIZE, EVEN_K), offs_n, N, HAS_ZEROS)
        zl0, zh0 = _bias_pairs(z0, z2)
        zl1, zh1 = _bias_pairs(z1, z3)
        return zl0, zh0, zl1, zh1, s0, s1, s2, s3


@triton.jit
def _xpair(x_ptr, xp_ptr, k0, kt, offs_r, J: tl.constexpr, XPREP: tl.constexpr):
    """Activation pairs (x[k0 + J*16 + r], x[k0 + (J+4)*16 + r]) as int32 fp16x2, ``[1, 16]``: from the
    prepared pairs (`_w4a16_xpack_kernel`) or packed here from x (no act-order, K a tile multiple)."""
    if XPREP:
        v = tl.load(xp_ptr + kt * 64 + J * 16 + offs_r)
    else:
        v = _pair_h2(tl.load(x_ptr + k0 + J * 16 + offs_r), tl.load(x_ptr + k0 + (J + 4) * 16 + offs_r))
    return v[None, :]


@triton.jit
def _xpairs_bf16(x_ptr, k0, offs_r):
    """One row of bf16 activations, K tile k0, as the packed loop's four fp16x2 pair vectors (`_xpair`'s order),
    times a power of two f that brings the tile's largest |x| into [128, 256), and 1 / f. bf16's 8 significant bits
    are exact in fp16 there, and the loop's fp16 sums of at most 8 products by |q - z| <= 15 stay under 30720, far
    from fp16's 65504, whatever the activations' range; the float32 scales take 1 / f (exact)."""
    a0 = tl.load(x_ptr + k0 + offs_r).to(tl.float32)
    a1 = tl.load(x_ptr + k0 + 16 + offs_r).to(tl.float32)
    a2 = tl.load(x_ptr + k0 + 32 + offs_r).to(tl.float32)
    a3 = tl.load(x_ptr + k0 + 48 + offs_r).to(tl.float32)
    a4 = tl.load(x_ptr + k0 + 64 + offs_r).to(tl.float32)
    a5 = tl.load(x_ptr + k0 + 80 + offs_r).to(tl.float32)
    a6 = tl.load(x_ptr + k0 + 96 + offs_r).to(tl.float32)
    a7 = tl.load(x_ptr + k0 + 112 + offs_r).to(tl.float32)
    m = tl.max(tl.maximum(tl.maximum(tl.maximum(tl.abs(a0), tl.abs(a1)), tl.maximum(tl.abs(a2), tl.abs(a3))),
                          tl.maximum(tl.maximum(tl.abs(a4), tl.abs(a5)), tl.maximum(tl.abs(a6), tl.abs(a7)))), axis=0)
    # |x| < 2**(e + 1) for m's biased exponent e + 127; f = 2**(7 - e), kept a normal float32 with a normal inverse
    fb = tl.minimum(tl.maximum(261 - ((m.to(tl.int32, bitcast=True) >> 23) & 0xFF), 1), 253)
    f = (fb << 23).to(tl.float32, bitcast=True)
    inv = ((254 - fb) << 23).to(tl.float32, bitcast=True)
    x0 = _pair_h2((a0 * f).to(tl.float16), (a4 * f).to(tl.float16))[None, :]
    x1 = _pair_h2((a1 * f).to(tl.float16), (a5 * f).to(tl.float16))[None, :]
    x2 = _pair_h2((a2 * f).to(tl.float16), (a6 * f).to(tl.float16))[None, :]
    x3 = _pair_h2((a3 * f).to(tl.float16), (a7 * f).to(tl.float16))[None, :]
    return x0, x1, x2, x3, inv


@triton.jit
def _w4a16_xpack_kernel(x_ptr, perm_ptr, xp_ptr, K, n_pairs, HAS_PERM: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr = False):
    """The one-row activations of a call, once: pair ``i`` = (kt, J, r) holds sorted rows
    ``kt*128 + J*16 + r`` and that + 64 (act-order: gathered through perm), zero past K, as fp16x2 bits.
    PDL: launched with programmatic dependent launch (as the stream kernel after it): the permutation (weight data)
    is read before the wait, x after it, so the chain of one-row calls keeps overlapping across this launch."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n_pairs
    row = pair_source(2 * i)  # the low half of word i: the W4A16 pair order (`_pairs`)
    lo_ok = mask & (row < K)
    hi_ok = mask & (row + 64 < K)
    if HAS_PERM:
        c_lo = tl.load(perm_ptr + row, mask=lo_ok, other=0)
        c_hi = tl.load(perm_ptr + row + 64, mask=hi_ok, other=0)
    else:
        c_lo = row
        c_hi = row + 64
    if PDL:
        pdl_begin()
    tl.store(xp_ptr + i, _pair_h2(tl.load(x_ptr + c_lo, mask=lo_ok, other=0.0),
                                  tl.load(x_ptr + c_hi, mask=hi_ok, other=0.0)), mask=mask)


@triton.jit
def _ld_col(ptrs):
    """fp16 column values as float32 (see `_col_sz`; pure, so the copies a thread holds share one load)."""
    return tl.inline_asm_elementwise(_LDG_H_ASM, "=h,l", [ptrs], dtype=tl.float16, is_pure=True, pack=1).to(tl.float32)


@triton.jit
def _tile_consts(s_ptr, z_ptr, xp_ptr, nb, kt, offs_loc, offs_r, K, N, BLOCK_N: tl.constexpr, GROUP_SIZE: tl.constexpr,
                 CHUNKS: tl.constexpr, HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr):
    """What the packed loop needs besides the weight words of tile (nb, kt): the four activation-pair
    vectors, the negated bias pairs and the float32 scales of its group slots (unused slots repeat).
    Per-column values are 1-D: carried through the loop as ``[BLOCK_N, 1]`` they would hold one
    register per replica of the tile layout (4x the registers)."""
    xb = xp_ptr + kt * 64 + offs_r
    x0 = tl.load(xb)[None, :]
    x1 = tl.load(xb + 16)[None, :]
    x2 = tl.load(xb + 32)[None, :]
    x3 = tl.load(xb + 48)[None, :]
    zl0, zh0, zl1, zh1, s0, s1, s2, s3 = _tile_scales(s_ptr, z_ptr, nb, kt, offs_loc, K, N, BLOCK_N, GROUP_SIZE, CHUNKS,
                                                      HAS_ZEROS, EVEN_K)
    return x0, x1, x2, x3, zl0, zh0, zl1, zh1, s0, s1, s2, s3


@triton.jit
def _tile_scales(s_ptr, z_ptr, nb, kt, offs_loc, K, N, BLOCK_N: tl.constexpr, GROUP_SIZE: tl.constexpr,
                 CHUNKS: tl.constexpr, HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr):
    """The negated bias pairs and float32 scales of tile (nb, kt)'s group slots, 1-D per column (`_tile_consts`)."""
    k0 = kt * 128
    cols = tl.minimum(nb * BLOCK_N + offs_loc, N - 1)
    g0 = _group_of(k0, K, GROUP_SIZE, EVEN_K)
    s0 = _ld_col(s_ptr + g0 * N + cols)
    if HAS_ZEROS:
        z0 = _ld_col(z_ptr + g0 * N + cols)
    else:
        z0 = tl.full(s0.shape, 8.0, tl.float32)
    if CHUNKS == 1:
        zl0, zh0 = _bias_pairs(z0, z0)
        return zl0, zh0, zl0, zh0, s0, s0, s0, s0
    elif CHUNKS == 2:
        g1 = _group_of(k0 + 64, K, GROUP_SIZE, EVEN_K)
        s1 = _ld_col(s_ptr + g1 * N + cols)
        if HAS_ZEROS:
            z1 = _ld_col(z_ptr + g1 * N + cols)
        else:
            z1 = z0
        zl0, zh0 = _bias_pairs(z0, z1)
        return zl0, zh0, zl0, zh0, s0, s1, s0, s1
    else:
        g1 = _group_of(k0 + 32, K, GROUP_SIZE, EVEN_K)
        g2 = _group_of(k0 + 64, K, GROUP_SIZE, EVEN_K)
        g3 = _group_of(k0 + 96, K, GROUP_SIZE, EVEN_K)
        s1 = _ld_col(s_ptr + g1 * N + cols)
        s2 = _ld_col(s_ptr + g2 * N + cols)
        s3 = _ld_col(s_ptr + g3 * N + cols)
        if HAS_ZEROS:
            z1 = _ld_col(z_ptr + g1 * N + cols)
            z2 = _ld_col(z_ptr + g2 * N + cols)
            z3 = _ld_col(z_ptr + g3 * N + cols)
        else:
            z1, z2, z3 = z0, z0, z0
        zl0, zh0 = _bias_pairs(z0, z2)
        zl1, zh1 = _bias_pairs(z1, z3)
        return zl0, zh0, zl1, zh1, s0, s1, s2, s3


@triton.jit
def _leave_block(res, out_ptrs, ws_ptrs, out_mask, bias_ptr, offs_n, N, nb, u0, u1, n_prog, n_units, KT, cnt,
                 BLOCK_M: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUM: tl.constexpr = False):
    """The partial sums `res` of column block nb (`KT` units) leave this program (every stream path).
    A program that saw the whole block stores the output. Otherwise the programs ``p_first..p_last``
    share it: each adds its sums into the float32 workspace and takes a ticket (acq_rel); the last
    to arrive reads and clears the workspace (relaxed: the ticket's acquire orders it), adds the
    bias, stores and resets the ticket (relaxed: the launch's end orders it before the next one).
    (An ordered flush, the holder of the block's last tile waiting on an acquire load while the
    other sharers post without awaiting a reply, measured no faster on an H200: RESULTS.md round9.)

    ACCUM: `ws_ptrs` point into the caller's zeroed float32 accumulator, which is the result: the sums are
    stored (whole block) or added (shared block) there and the program goes on; no ticket, no output
    store. The kernel that reads the accumulator next zeroes it (`stream_matmul`, ``accumulate``)."""
    first = nb * KT
    if ACCUM:
        if (u0 <= first) & (first + KT <= u1):
            tl.store(ws_ptrs, res, mask=out_mask)
        else:
            tl.atomic_add(ws_ptrs, res, mask=out_mask, sem="relaxed")
    elif (u0 <= first) & (first + KT <= u1):
        if HAS_BIAS:
            res += _bias_cols(bias_ptr, offs_n, N, BLOCK_M)
        tl.store(out_ptrs, res.to(out_ptrs.dtype.element_ty), mask=out_mask)
    else:
        tl.atomic_add(ws_ptrs, res, mask=out_mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial sums are issued before the ticket is taken
        p_first = ((first + 1) * n_prog - 1) // n_units
        p_last = ((first + KT) * n_prog - 1) // n_units
        ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
        if ticket == p_last - p_first:
            total = tl.atomic_xchg(ws_ptrs.to(tl.pointer_type(tl.int32)), tl.zeros(res.shape, dtype=tl.int32),
                                   mask=out_mask, sem="relaxed").to(tl.float32, bitcast=True)
            if HAS_BIAS:
                total += _bias_cols(bias_ptr, offs_n, N, BLOCK_M)
            tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(cnt, 0, sem="relaxed")


@triton.jit
def _flush_row(acc2, nb, u0, u1, n_prog, n_units, KT, NB, N, pid_m, offs_loc, out_ptr, ws_ptr, cnt_ptr, bias_ptr,
               stride_om, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr):
    """One row (row `pid_m` of the output, its tickets at ``cnt_ptr + pid_m * NB``): the partial sums
    of column block nb leave the program through `_leave_block`."""
    offs_n = nb * BLOCK_N + offs_loc
    _leave_block(tl.sum(acc2, axis=1), out_ptr + pid_m * stride_om + offs_n, ws_ptr + pid_m * N + offs_n, offs_n < N,
                 bias_ptr, offs_n, N, nb, u0, u1, n_prog, n_units, KT, cnt_ptr + pid_m * NB + nb, 1, HAS_BIAS)


@triton.jit
def _packed_row_stream(qw_ptr, s_ptr, z_ptr, xp_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, u0, u1, pid_m, n_prog,
                       n_units, N, K, KT, NB, stride_om, GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr,
                       BLOCK_N: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                       FENCE: tl.constexpr):
    """The one-row packed loop with everything of the next tile in flight during this one's math:
    its weight words, activation pairs, scales and zeros are loaded before the current tile is
    computed. FENCE=2 puts a branch that is never taken between the loads and the math: ptxas
    schedules within a basic block and otherwise sinks the loads below the math (sm_90 SASS)."""
    UNIT_WORDS: tl.constexpr = BLOCK_N * 16  # one unit's words (a BLOCK_N-column tile, not `gemm.TILE_WORDS`)
    offs_loc = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, 16)
    tile_offs = offs_loc[:, None] * 16 + offs_r[None, :]
    nb = u0 // KT
    kt = u0 - nb * KT
    cur = tl.load(qw_ptr + u0 * UNIT_WORDS + tile_offs)
    x0, x1, x2, x3, zl0, zh0, zl1, zh1, s0, s1, s2, s3 = _tile_consts(
        s_ptr, z_ptr, xp_ptr, nb, kt, offs_loc, offs_r, K, N, BLOCK_N, GROUP_SIZE, CHUNKS, HAS_ZEROS, EVEN_K)
    acc2 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    for u in range(u0, u1):
        un = tl.minimum(u + 1, u1 - 1)  # the last iteration reloads its own tile (L2 hits)
        nbn = un // KT
        ktn = un - nbn * KT
        nxt = tl.load(qw_ptr + un * UNIT_WORDS + tile_offs)
        y0, y1, y2, y3, yl0, yh0, yl1, yh1, t0, t1, t2, t3 = _tile_consts(
            s_ptr, z_ptr, xp_ptr, nbn, ktn, offs_loc, offs_r, K, N, BLOCK_N, GROUP_SIZE, CHUNKS, HAS_ZEROS, EVEN_K)
        if FENCE == 1:
            tl.debug_barrier()
        elif FENCE == 2:
            if un < 0:
                tl.store(cnt_ptr + un, 0)
        acc2 = _dot32(acc2, cur, x0, x1, x2, x3, zl0[:, None], zh0[:, None], zl1[:, None], zh1[:, None], s0[:, None],
                      s1[:, None], s2[:, None], s3[:, None], CHUNKS)
        if (kt == KT - 1) | (u == u1 - 1):
            _flush_row(acc2, nb, u0, u1, n_prog, n_units, KT, NB, N, pid_m, offs_loc, out_ptr, ws_ptr, cnt_ptr,
                       bias_ptr, stride_om, BLOCK_N, HAS_BIAS)
            acc2 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
        cur = nxt
        nb, kt = nbn, ktn
        x0, x1, x2, x3, zl0, zh0, zl1, zh1, s0, s1, s2, s3 = y0, y1, y2, y3, yl0, yh0, yl1, yh1, t0, t1, t2, t3


@triton.jit
def _bias_cols(bias_ptr, offs_n, N, BLOCK_M: tl.constexpr):
    """The bias of columns `offs_n` (float32): 1-D for one row, ``[BLOCK_N, 1]`` for an M block."""
    b = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    if BLOCK_M == 1:
        return b
    else:
        return b[:, None]


@triton.jit
def _w4a16_stream_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, xp_ptr,
    M, N, K, KT, NB, stride_xm, stride_om, n_units, e7_bits,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, FENCE: tl.constexpr = False,
    PIPELINE: tl.constexpr = False, STAGES: tl.constexpr = 1, JOIN: tl.constexpr = True,
    PACKED: tl.constexpr = False, XPREP: tl.constexpr = False, PACK4: tl.constexpr = True,
    LOOKAHEAD: tl.constexpr = False, PDL: tl.constexpr = False, ACCUM: tl.constexpr = False,
    HALF_LOOP: tl.constexpr = False, BF16_PAIRS: tl.constexpr = False, SCALES_AHEAD: tl.constexpr = False,
):
    # Tile = [BLOCK_N, 16] words = [BLOCK_N columns, 128 rows]; unit u = column block u // KT, K tile u % KT.
    # CHUNKS: scale groups per K tile (1 when a group spans whole tiles, 128 // group, or 8: one per plane).
    R: tl.constexpr = 16
    PLANES: tl.constexpr = 8 // CHUNKS
    UNIT_WORDS: tl.constexpr = BLOCK_N * 16
    pid = tl.program_id(0)
    pid_m = tl.program_id(1)
    n_prog = tl.num_programs(0)
    u0 = pid * n_units // n_prog
    u1 = (pid + 1) * n_units // n_prog
    if BLOCK_M == 1 and PACKED and LOOKAHEAD:
        tl.static_assert(not ACCUM, "the look-ahead loop flushes through tickets only")
        _packed_row_stream(qw_ptr, s_ptr, z_ptr, xp_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, u0, u1, pid_m, n_prog,
                           n_units, N, K, KT, NB, stride_om, GROUP_SIZE, CHUNKS, BLOCK_N, HAS_ZEROS, HAS_BIAS, EVEN_K, FENCE)
        return
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
        cur = tl.load(qw_ptr + u0 * UNIT_WORDS + tile_offs)
    if SCALES_AHEAD:  # the packed loop's scales and zeros a tile ahead with the words, the first tile's before the wait
        nb0 = u0 // KT
        cz0, cz1, cz2, cz3, cs0, cs1, cs2, cs3 = _tile_scales(s_ptr, z_ptr, nb0, u0 - nb0 * KT, offs_loc, K, N, BLOCK_N,
                                                              GROUP_SIZE, CHUNKS, HAS_ZEROS, EVEN_K)
    if PDL:  # launched before x's producer ended (`runtime.pdl_enabled`): the first tile is on its way; wait
        pdl_begin()
    for u in tl.range(u0, u1, num_stages=STAGES):
        if PIPELINE:  # Triton's pipeliner keeps STAGES - 1 tiles in flight (async copies on sm_80+)
            cur = tl.load(qw_ptr + u * UNIT_WORDS + tile_offs)
        else:
            # prefetch the next tile (the last iteration reloads its own, an L2 hit) before computing this one
            un = tl.minimum(u + 1, u1 - 1)
            nxt = tl.load(qw_ptr + un * UNIT_WORDS + tile_offs)
            if SCALES_AHEAD:
                nbn = un // KT
                nz0, nz1, nz2, nz3, ns0, ns1, ns2, ns3 = _tile_scales(s_ptr, z_ptr, nbn, un - nbn * KT, offs_loc, K, N,
                                                                      BLOCK_N, GROUP_SIZE, CHUNKS, HAS_ZEROS, EVEN_K)
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
        if BLOCK_M == 1 and PACKED:  # fp16 (or tile-scaled bf16) x, NVIDIA: two nibbles per op (see `_dot32_asm`)
            tl.static_assert(XPREP or (not HAS_PERM and EVEN_K), "act-order and ragged K read prepared x pairs")
            if BF16_PAIRS:
                tl.static_assert(not XPREP, "bf16 pairs are built in the loop")
                x0, x1, x2, x3, inv = _xpairs_bf16(x_ptr, k0, offs_r)
            else:
                x0 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 0, XPREP)
                x1 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 1, XPREP)
                x2 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 2, XPREP)
                x3 = _xpair(x_ptr, xp_ptr, k0, kt, offs_r, 3, XPREP)
            if SCALES_AHEAD:
                zl0, zh0, zl1, zh1 = cz0[:, None], cz1[:, None], cz2[:, None], cz3[:, None]
                s0, s1, s2, s3 = cs0[:, None], cs1[:, None], cs2[:, None], cs3[:, None]
            else:
                zl0, zh0, zl1, zh1, s0, s1, s2, s3 = _group_consts(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE, CHUNKS,
                                                                   HAS_ZEROS, EVEN_K)
            if BF16_PAIRS:  # the pairs were x * f: the scales take 1 / f
                s0, s1, s2, s3 = s0 * inv, s1 * inv, s2 * inv, s3 * inv
            if PACK4:
                acc2 = _dot32(acc2, cur, x0, x1, x2, x3, zl0, zh0, zl1, zh1, s0, s1, s2, s3, CHUNKS)
            elif CHUNKS == 1:
                acc2 += s0 * _dot8(cur, x0, x1, x2, x3, zl0, zh0, zl1, zh1, 1)
            elif CHUNKS == 2:
                oa, ob = _dot8(cur, x0, x1, x2, x3, zl0, zh0, zl1, zh1, 2)
                acc2 += s0 * oa + s1 * ob
            else:
                o0, o1, o2, o3 = _dot8(cur, x0, x1, x2, x3, zl0, zh0, zl1, zh1, 4)
                acc2 += s0 * o0 + s1 * o1 + s2 * o2 + s3 * o3
        elif BLOCK_M == 1 and HALF_LOOP:  # fp16 x without asm (AMD): the packed loop's arithmetic in Triton's fp16
            bytes4 = _byte_halves(cur)
            for c in tl.static_range(CHUNKS):
                s, z = _scale_zero(s_ptr, z_ptr, _group_of(k0 + c * PLANES * 16, K, GROUP_SIZE, EVEN_K), offs_n, N,
                                   EVEN_N, HAS_ZEROS, True)
                zl = (-1024.0 - z).to(tl.float16)
                zh = (-64.0 - z).to(tl.float16)
                part = tl.zeros([BLOCK_N, R], dtype=tl.float16)
                for jj in tl.static_range(PLANES):
                    part = _half_plane_fma(part, x_ptr, perm_ptr, bytes4, zl, zh, k0, offs_r, K, c * PLANES + jj,
                                           HAS_PERM, EVEN_K)
                acc2 += s * part.to(tl.float32)
        elif BLOCK_M == 1:
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
            w0, w1, w2, w3, w4, w5, w6, w7 = _tile_planes(cur, w_l16, w_l8, w_r8, w_r16, e7_bits, s_ptr, z_ptr, k0,
                                                          offs_n, N, K, x_ptr.dtype.element_ty, GROUP_SIZE, CHUNKS,
                                                          EVEN_K, EVEN_N, HAS_ZEROS)
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
            if SCALES_AHEAD:
                cz0, cz1, cz2, cz3, cs0, cs1, cs2, cs3 = nz0, nz1, nz2, nz3, ns0, ns1, ns2, ns3
        if (kt == KT - 1) | (u == u1 - 1):
            if BLOCK_M == 1:
                # 1-D output vectors: a [BLOCK_N, 1] store would pull its layout back into the
                # loop's accumulator (a shared-memory conversion every tile in the packed loop)
                res = tl.sum(acc2, axis=1)
                out_mask = offs_n < N
                out_ptrs = out_ptr + pid_m * stride_om + offs_n
                ws_ptrs = ws_ptr + pid_m * N + offs_n
            else:
                res = acc
                out_mask = (offs_n < N)[:, None] & m_mask[None, :]
                out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
                ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
            _leave_block(res, out_ptrs, ws_ptrs, out_mask, bias_ptr, offs_n, N, nb, u0, u1, n_prog, n_units, KT,
                         cnt_ptr + pid_m * NB + nb, BLOCK_M, HAS_BIAS, ACCUM)
            if BLOCK_M == 1:
                acc2 = tl.zeros([BLOCK_N, R], dtype=tl.float32)
            else:
                acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)


@triton.jit
def _w4a16_dequant_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr, N, K, KT, e7_bits,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ZEROS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, NATURAL: tl.constexpr = True,
):
    """Dequantize one tile into the dense ``[N, K]`` linear weight (sorted row order); each nibble plane
    is 16 consecutive rows of a column.

    NATURAL: the eight planes are joined in bit-reversed order, so that after one transpose the tile is
    ``[BLOCK_N, 128]`` in natural row order and each column's 128 rows go out as one 256-byte run, in
    stores the compiler coalesces across threads (the write is 4 of the 5 bytes moved per weight). The
    transpose goes through shared memory (32 KB for a 128 x 128 fp16 tile). Otherwise each plane is
    stored on its own, one 32-byte run per column (`DEQUANT_CONFIGS` picks per family)."""
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
    dt = w_ptr.dtype.element_ty
    k0 = kt * 128
    if not NATURAL:
        dst = w_ptr + offs_n.to(tl.int64)[:, None] * K
        for j in tl.static_range(8):
            rows = k0 + j * 16 + offs_r
            s, z = _scale_zero(s_ptr, z_ptr, _group_of(k0 + (j // PLANES) * PLANES * 16, K, GROUP_SIZE, EVEN_K),
                               offs_n, N, EVEN_N, HAS_ZEROS)
            w = _plane_w(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s, z, j)
            if EVEN_K and EVEN_N:
                tl.store(dst + rows[None, :], w.to(dt))
            else:
                tl.store(dst + rows[None, :], w.to(dt), mask=(offs_n < N)[:, None] & (rows < K)[None, :])
        return
    w0, w1, w2, w3, w4, w5, w6, w7 = _tile_planes(packed, w_l16, w_l8, w_r8, w_r16, e7_bits, s_ptr, z_ptr, k0, offs_n,
                                                  N, K, dt, GROUP_SIZE, CHUNKS, EVEN_K, EVEN_N, HAS_ZEROS)
    # [BLOCK_N, 16, 2, 2, 2]: index (a, b, c) of the joins is plane 4a + 2b + c, so the flattened last three
    # axes count planes in order; the transpose then puts plane-major rows (k = 16 * plane + r) last
    wt = tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)), tl.join(tl.join(w1, w5), tl.join(w3, w7)))
    wt = tl.reshape(tl.permute(tl.reshape(wt, [BLOCK_N, 16, 8]), (0, 2, 1)), [BLOCK_N, 128])
    rows = k0 + tl.arange(0, 128)
    dst = w_ptr + offs_n.to(tl.int64)[:, None] * K + rows[None, :]
    if EVEN_K and EVEN_N:
        tl.store(dst, wt)
    else:
        tl.store(dst, wt, mask=(offs_n < N)[:, None] & (rows < K)[None, :])


# ---------------------------------------------------------------- configs (keyed by arch family)

STREAM_CONFIGS: dict[str, dict[int, dict[str, Any]]] = {
    # rows class (largest M it serves) -> BLOCK_M, warps, programs per CU/SM (the persistent grid:
    # all programs resident at once; capped at run time by the occupancy the compiled kernel's
    # registers and shared memory allow). H200 sweep (benchmarks/RESULTS.md): 8 warps beat 4 for
    # every dot tile; 32-row tiles beat 64 at 33..64 rows; one joined dot per tile beats one dot per
    # nibble plane by 1.3-2.5x. waves_per_eu stays 0 on AMD (Triton passes it to LLVM as "N, N",
    # which caps occupancy at N).
    # One row, one scale group per tile, at least `wide_min_units_per_cu` tiles per SM (4096x28672 and
    # wider): programs of 4 warps, 8 per SM instead of 4 of 8 warps, so twice the tiles in flight (H200,
    # RESULTS.md round11: 8192x28672 62.3 -> 65.1 % of copy, 4096x28672 23.7 -> 22.1 us; fewer tiles lose:
    # more sharers per column block, and group 32 lost everywhere).
    # Wide flushed calls also take their x pairs prepared by a launch of their own ("wide_xprep", `prepared_pairs`):
    # the loop then loads them as plain words, no byte permutes (RESULTS.md round26: 4096x28672 and 8192x28672
    # 1.6-5 % faster on an H100, 8-9 % on an H200; narrower calls lose the launch, 0.6-1.5 us).
    # Flushed one-row calls reading prepared pairs with one scale group per tile and at least `xprep_min_units_per_cu`
    # tiles per SM (act-order 4096x11008 and wider): 4-warp programs too (`one_row_warps`, RESULTS.md round27).
    # Accumulating one-row calls (the decode step's) load their scales a tile ahead (`scales_ahead_route`, round30).
    "hopper": {1: {"BLOCK_M": 1, "num_warps": 8, "programs_per_cu": 8, "wide_min_units_per_cu": 40,
                   "wide_num_warps": 4, "wide_xprep": True, "xprep_min_units_per_cu": 16, "xprep_num_warps": 4,
                   "accum_scales_ahead": True},
               16: {"BLOCK_M": 16, "num_warps": 8, "programs_per_cu": 8},
               64: {"BLOCK_M": 32, "num_warps": 8, "programs_per_cu": 8},
               255: {"BLOCK_M": 64, "num_warps": 8, "programs_per_cu": 8}},
    # HALF_LOOP (one row of fp16 without a permutation, CDNA): the packed loop's fp16 arithmetic in Triton's own
    # operations, about 30 % fewer VALU instructions than the float32 loop on gfx90a / gfx942 (v_pk_fma_f16) and 20 fewer
    # VGPRs; on an H100 the same form ran 0-9 % faster than the float32 loop, but 8 % slower on act-order g128
    # (RESULTS.md round23; not timed on AMD silicon). gfx1100 keeps the float32 loop: its v_fma_mix_f32 form has
    # fewer instructions there.
    "cdna": {1: {"BLOCK_M": 1, "num_warps": 4, "programs_per_cu": 8, "HALF_LOOP": True},
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
DEQUANT_CONFIGS: dict[str, dict[str, Any]] = {
    # One 128 x 128 tile per program: 8 KB read, 32 KB (fp16) written. NATURAL (see the kernel): on an H100
    # 68-81 -> 82-91 % of copy bandwidth on the Llama shapes, a Llama-2-7B GPTQ prompt's dequantization
    # 6.33 -> 5.37 ms (RESULTS.md round 13). AMD keeps the plane-by-plane stores, unmeasured there: the
    # transpose's 32 KB of LDS would cut CDNA to 2 waves per SIMD (8 before) and gfx1100 to 10 (16).
    "default": {"num_warps": 4, "NATURAL": True},
    "cdna": {"num_warps": 4, "NATURAL": False},
    "rdna3": {"num_warps": 4, "NATURAL": False},
    "cpu": {"num_warps": 1, "NATURAL": True},
}
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


def is_wide(cfg: dict[str, Any], n_units: int, chunks: int, cus: int) -> bool:
    """Whether a call of `cfg` is a wide one-row call: the config names a ``wide_min_units_per_cu`` and the call has
    one row, one scale group per tile and at least that many tiles per CU/SM (see STREAM_CONFIGS)."""
    return bool(cfg["BLOCK_M"] == 1 and chunks == 1 and cfg.get("wide_min_units_per_cu")
                and n_units >= cfg["wide_min_units_per_cu"] * cus)


def prepared_pairs(cfg: dict[str, Any], packed: bool, bf16_pairs: bool, paired: bool, lookahead: bool, perm: bool,
                   even_k: bool, wide: bool, accumulate: bool) -> bool:
    """Whether a stream call's packed loop reads prepared x pairs (``XPREP``) instead of building them from x in the
    loop: only on the packed fp16 loop (bf16 builds its pairs in the loop); a `paired` input is its own pairs (no
    launch); otherwise a launch of their own prepares them (`_w4a16_xpack_kernel`) where the loop cannot build them
    (act-order: gathered through `perm`; K off the tiles), where the look-ahead form needs them, where the config asks
    (``XPREP``), and on a wide flushed call whose config names ``wide_xprep`` (`is_wide`; the decode step's
    accumulating calls are not changed)."""
    if not packed or bf16_pairs:
        return False
    return (paired or lookahead or perm or not even_k or bool(cfg.get("XPREP", False))
            or (wide and not accumulate and bool(cfg.get("wide_xprep", False))))


def scales_ahead_route(cfg: dict[str, Any], packed: bool, lookahead: bool, accumulate: bool) -> bool:
    """Whether a one-row call's packed loop loads each tile's scales and zeros a tile ahead with its words, the first
    tile's before the PDL wait (``SCALES_AHEAD``): a config's ``SCALES_AHEAD`` decides where it names one (benchmarks),
    else the call class: the decode step's accumulating calls where the family's ``accum_scales_ahead`` says. Those
    calls wait on the kernel before them, and their scales (not written by it) were a DRAM trip after the wait each
    tile: the batch-1 GPTQ step 0.6-1.4 % faster on an H200 in two runs of each order. Flushed calls hold more
    registers with it (sm_90: 80 against 64 a thread, so 3 programs per SM instead of 4) and lost 3-13 % there
    (RESULTS.md round30). Not in the look-ahead loop, which loads them a tile ahead itself."""
    if not packed or lookahead:
        return False
    return bool(cfg.get("SCALES_AHEAD", accumulate and cfg.get("accum_scales_ahead", False)))


def one_row_warps(cfg: dict[str, Any], wide: bool, xprep: bool, accumulate: bool, n_units: int, chunks: int,
                  cus: int) -> dict[str, Any]:
    """`cfg` with the warps of its one-row call's class, the first that matches (the keys are the family's, see
    STREAM_CONFIGS; a family without them keeps ``num_warps``):

    1. ``xprep_num_warps``: a flushed call whose packed loop reads prepared pairs (`xprep`, `prepared_pairs`:
       act-order, ragged K, wide) with one scale group per tile and at least ``xprep_min_units_per_cu`` tiles per
       CU/SM. That loop holds more registers than the one building its pairs (sm_90: 76 against 63 a thread), so
       8-warp programs fit 3 to an SM; 4-warp ones fit 6, twice the tiles in flight (H100, act-order g128,
       RESULTS.md round27: 4096x11008 14.3 -> 13.2 us, 4096x14336 and 14336x4096 5 % faster; 4096x4096, 8 tiles per
       SM, 1-5 % slower; group 32 1-7 % slower). The decode step's accumulating calls on paired input keep their
       warps: with the rule its batch-1 step was 0.2-1.3 % slower.
    2. ``wide_num_warps``: a wide call (`is_wide`; round 11, see STREAM_CONFIGS).
    3. ``num_warps`` otherwise."""
    if (xprep and not accumulate and chunks == 1 and cfg.get("xprep_num_warps")
            and n_units >= cfg.get("xprep_min_units_per_cu", 0) * cus):
        return dict(cfg, num_warps=cfg["xprep_num_warps"])
    if wide:
        return dict(cfg, num_warps=cfg["wide_num_warps"])
    return cfg


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
    return max(1, min(n_units, per_cu * compute_units(device) // m_blocks))


XPACK_BLOCK = 1024
"""Activation pairs per program of `_w4a16_xpack_kernel`."""


def packed_route(cfg: dict[str, Any], arch: str, dtype: torch.dtype, chunks: int, perm: bool = False,
                 even_k: bool = True, scaled_bf16: bool = False) -> bool:
    """Whether a one-row call takes the packed fp16 loop (`_DOT8_ASM_1`): NVIDIA PTX, so only on an
    NVIDIA target (AMD and the interpreter keep their loops), at most 4 scale groups per tile, not switched off by the
    config (`PACKED`), and fp16 activations, or bf16 ones where the call takes them (`scaled_bf16`: a wide call,
    `is_wide`, or one into an accumulator, the decode step's form) without a permutation on K a tile multiple: their
    pairs are built in the loop, each K tile's x scaled into fp16 by a power of two (`_xpairs_bf16`; bf16 sums would
    keep 8 bits). Flushed calls that are not wide ran faster in the float32 loop (H100, 4096x4096 6.9 against 8.4 us,
    14336x4096 18.4 against 19.3; wide 4096x28672 28.5 against 26.3); the bf16 decode step at batch 1 was 1.8-2.4 %
    faster with every accumulating call packed than with the wide ones alone (RESULTS.md round23)."""
    nvidia = not arch.startswith("gfx") and arch != "cpu" and not interpret_mode()
    half = dtype == torch.float16 or (dtype == torch.bfloat16 and scaled_bf16 and not perm and even_k)
    return cfg["BLOCK_M"] == 1 and bool(cfg.get("PACKED", True)) and nvidia and half and chunks in (1, 2, 4)


def half_loop_route(cfg: dict[str, Any], dtype: torch.dtype, perm: bool) -> bool:
    """Whether a one-row call that does not take the packed PTX loop runs its arithmetic without asm in fp16
    (``HALF_LOOP``, `_half_plane_fma`): asked by the config (CDNA), fp16 activations (bf16 sums would keep 8 bits),
    and no permutation (act-order g128 ran 8 % slower in that form than in the float32 loop on an H100, RESULTS.md
    round23)."""
    return cfg["BLOCK_M"] == 1 and bool(cfg.get("HALF_LOOP", False)) and dtype == torch.float16 and not perm


def one_row_packed(arch: str, w: "W4A16Weight") -> bool:
    """Whether one fp16 row on `w` takes the packed loop under `arch`'s shipped config (`packed_route`). fp16 only:
    the prepared pairs its caller serves (`w4a16.takes_pairs`) are fp16's; bf16 builds its pairs in the loop."""
    return packed_route(stream_config(arch, 1), arch, torch.float16, _chunks(_group_arg(w)), w.perm is not None,
                        w.in_features % TILE_K == 0)


def stream_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], out: torch.Tensor,
                  arch: str, config: Optional[dict[str, Any]] = None, accumulate: bool = False,
                  paired: bool = False) -> None:
    """``out = x2 @ W (+ bias)`` for up to `WS_ROWS` rows through the stream-K kernel.

    accumulate: `out` is a zeroed, contiguous float32 ``[M, N]`` accumulator and receives the float32 sums
    (no bias): the kernel ends without the split-K flush (the ticket, the last sharer's read-back and the
    output store: 0.6-2.2 us a call on an H200, RESULTS.md round11), and whoever reads `out` next must
    leave it zeroed (`w4a16.accumulator`).

    paired: the one row of `x2` is in the pair order (`w4a16.pair_order`), which the packed loop then reads as its
    prepared pairs (no prepare launch, no byte permutes in the loop); the caller checked `w4a16.takes_pairs`."""
    m = x2.shape[0]
    k, n = w.in_features, w.out_features
    if accumulate and (bias is not None or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError("accumulate takes a contiguous float32 accumulator and no bias")
    cfg = dict(config or stream_config(arch, m))
    if accumulate:
        cfg["LOOKAHEAD"] = False
    if m > 1 and cfg["BLOCK_M"] == 1:
        raise ValueError("BLOCK_M = 1 serves one row only")
    block_m = cfg["BLOCK_M"]
    kt, nb = w.k_tiles, w.n_blocks
    n_units = kt * nb
    m_blocks = triton.cdiv(m, block_m)
    if m_blocks * block_m > WS_ROWS:
        raise ValueError(f"the stream kernel takes at most {WS_ROWS} rows")
    gs = _group_arg(w)
    chunks = _chunks(gs)
    cus = compute_units(x2.device)
    wide = is_wide(cfg, n_units, chunks, cus)
    packed = packed_route(cfg, arch, x2.dtype, chunks, w.perm is not None, k % TILE_K == 0, wide or accumulate)
    bf16_pairs = packed and x2.dtype == torch.bfloat16  # built in the loop: no prepared pairs, no look-ahead
    half_loop = not packed and half_loop_route(cfg, x2.dtype, w.perm is not None)
    lookahead = packed and not bf16_pairs and bool(cfg.get("LOOKAHEAD", False))
    pdl_ok = pdl_for(x2, "w4a16", m)  # the look-ahead loop takes no PDL; the pairs' launch before it still does
    pdl = not lookahead and pdl_ok
    xprep = prepared_pairs(cfg, packed, bf16_pairs, paired, lookahead, w.perm is not None, k % TILE_K == 0, wide,
                           accumulate)
    cfg = one_row_warps(cfg, wide, xprep, accumulate, n_units, chunks, cus)
    scales_ahead = scales_ahead_route(cfg, packed, lookahead, accumulate)
    xp = w.qweight
    if paired:
        if not packed or bf16_pairs or m != 1 or w.perm is not None or k % TILE_K:
            raise ValueError("paired input takes one fp16 row on the packed loop, K a tile multiple, no permutation")
        xp = x2.view(torch.int32)
    elif xprep:
        xp = torch.empty(kt * 64, dtype=torch.int32, device=x2.device)
        _w4a16_xpack_kernel[(triton.cdiv(kt * 64, XPACK_BLOCK),)](
            x2, w.perm if w.perm is not None else w.qweight, xp, k, kt * 64, HAS_PERM=w.perm is not None,
            BLOCK=XPACK_BLOCK, PDL=pdl_ok, num_warps=4, launch_pdl=pdl_ok)
    key = (x2.device, x2.dtype, cfg.get("num_warps"), cfg.get("maxnreg"), cfg.get("FENCE", False), cfg.get("PIPELINE", False),
           cfg.get("STAGES", 1), cfg.get("JOIN", True), block_m, gs, w.zeros is not None, w.perm is not None,
           bias is not None, k % TILE_K == 0, n % TILE_N == 0, packed, xprep, cfg.get("PACK4", True), lookahead, pdl,
           accumulate, half_loop, scales_ahead)
    grid = stream_grid(n_units, m_blocks, cfg, x2.device, key)
    ws, cnt = _workspace(x2.device, n, m_blocks * nb)
    if accumulate:
        ws = out
    ck = _w4a16_stream_kernel[(grid, m_blocks)](
        x2, w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales,
        w.perm if w.perm is not None else w.qweight, bias if bias is not None else w.scales, out, ws, cnt, xp,
        m, n, k, kt, nb, x2.stride(0), out.stride(0), n_units, E7_BITS,
        GROUP_SIZE=gs, CHUNKS=chunks, BLOCK_M=block_m, BLOCK_N=TILE_N, HAS_ZEROS=w.zeros is not None,
        HAS_PERM=w.perm is not None, HAS_BIAS=bias is not None, EVEN_K=k % TILE_K == 0, EVEN_N=n % TILE_N == 0,
        FENCE=cfg.get("FENCE", False), PIPELINE=cfg.get("PIPELINE", False), STAGES=cfg.get("STAGES", 1),
        JOIN=cfg.get("JOIN", True), PACKED=packed, XPREP=xprep, PACK4=bool(cfg.get("PACK4", True)),
        LOOKAHEAD=lookahead, PDL=pdl, ACCUM=accumulate, HALF_LOOP=half_loop, BF16_PAIRS=bf16_pairs,
        SCALES_AHEAD=scales_ahead, launch_pdl=pdl,
        **launch_options(cfg, arch),
    )
    if key not in _RESIDENT and x2.is_cuda:
        resident = _resident_programs(ck, x2.device)
        if resident is not None:
            _RESIDENT[key] = resident


def dequant_config(arch: str) -> dict[str, Any]:
    """The dequantization kernel's config for `arch` (a `runtime.device_arch` string, "cpu" for the interpreter)."""
    return DEQUANT_CONFIGS.get(_family(arch), DEQUANT_CONFIGS["default"])


def dequantize_dense(w: "W4A16Weight", dtype: torch.dtype, arch: Optional[str] = None,
                     config: Optional[dict[str, Any]] = None) -> torch.Tensor:
    """The dense linear-layer weight ``[N, K]`` (``W`` transposed) in `dtype`, rows of K in the
    SORTED order of the repacked weight (act-order: column ``k`` is original input ``w.perm[k]``).
    `config` overrides `dequant_config(arch)` keys (tests, benchmarks)."""
    k, n = w.in_features, w.out_features
    arch = arch or kernel_arch(w.qweight)
    dense = torch.empty(n, k, dtype=dtype, device=w.qweight.device)
    gs = _group_arg(w)
    cfg = dict(dequant_config(arch), **(config or {}))
    _w4a16_dequant_kernel[(w.k_tiles * w.n_blocks,)](
        w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales, dense, n, k, w.k_tiles, E7_BITS,
        GROUP_SIZE=gs, CHUNKS=_chunks(gs), BLOCK_N=TILE_N, HAS_ZEROS=w.zeros is not None,
        EVEN_K=k % TILE_K == 0, EVEN_N=n % TILE_N == 0, NATURAL=cfg["NATURAL"], num_warps=cfg["num_warps"],
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


def _stream_spec(rows: int, group: int, zeros: bool, perm: bool, archs: tuple[str, ...],
                 accum: bool = False) -> CompileSpec:
    sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "perm_ptr": "*i32",
           "bias_ptr": "*fp16", "out_ptr": "*fp32" if accum else "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
           "xp_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "KT": "i32", "NB": "i32", "stride_xm": "i32",
           "stride_om": "i32", "n_units": "i32", "e7_bits": "i32"}
    names = ("GROUP_SIZE", "CHUNKS", "BLOCK_M", "BLOCK_N", "HAS_ZEROS", "HAS_PERM", "HAS_BIAS", "EVEN_K", "EVEN_N",
             "ACCUM", "HALF_LOOP")
    sig.update({c: "constexpr" for c in names})
    cfg0 = stream_config(archs[-1], rows)
    tag = (("asym" if zeros else "sym") + (",act-order" if perm else "") + (",accum" if accum else "")
           + (",rdna3" if archs == _RDNA3 else ""))
    return CompileSpec(
        name=f"w4a16_stream[m{rows}:{cfg0['BLOCK_M']},g{group},{tag}]",
        kernel=_w4a16_stream_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": group, "CHUNKS": _chunks(group), "BLOCK_M": cfg0["BLOCK_M"], "BLOCK_N": TILE_N,
                    "HAS_ZEROS": zeros, "HAS_PERM": perm, "HAS_BIAS": False, "EVEN_K": True, "EVEN_N": True,
                    "ACCUM": accum, "HALF_LOOP": bool(cfg0.get("HALF_LOOP", False)) and not perm},
        options=lambda arch: launch_options(stream_config(arch, rows), arch),
        hot=True,
        uses_dot=cfg0["BLOCK_M"] > 1,
        archs=archs,
        divisible_by_16=("N", "K", "stride_xm", "stride_om"),
    )


def _dequant_spec(archs: tuple[str, ...]) -> CompileSpec:
    sig = {"qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "w_ptr": "*fp16", "N": "i32", "K": "i32",
           "KT": "i32", "e7_bits": "i32"}
    sig.update({c: "constexpr" for c in ("GROUP_SIZE", "CHUNKS", "BLOCK_N", "HAS_ZEROS", "EVEN_K", "EVEN_N", "NATURAL")})
    cfg = dequant_config(archs[-1])
    return CompileSpec(
        name="w4a16_dequant[g128,asym" + (",rdna3]" if archs == _RDNA3 else "]"),
        kernel=_w4a16_dequant_kernel,
        signature=sig,
        constexprs={"GROUP_SIZE": 128, "CHUNKS": 1, "BLOCK_N": TILE_N, "HAS_ZEROS": True, "EVEN_K": True,
                    "EVEN_N": True, "NATURAL": cfg["NATURAL"]},
        options=lambda arch: {"num_warps": dequant_config(arch)["num_warps"], "num_stages": 1},
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
        _stream_spec(1, 128, False, False, archs, accum=True),  # one-row GPTQ decode (`w4a16_accumulate`)
        _stream_spec(16, 128, False, False, archs, accum=True),
        _stream_spec(1, 128, True, True, archs),
        _stream_spec(1, 32, True, False, archs),
        _stream_spec(16, 128, True, False, archs),
        _stream_spec(16, 32, False, True, archs),
        _stream_spec(64, 128, True, False, archs),
        _stream_spec(255, 128, True, False, archs),
        _dequant_spec(archs),
    )
]
