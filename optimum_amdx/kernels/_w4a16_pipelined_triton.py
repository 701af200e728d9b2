"""The pipelined fused W4A16 GEMM: the tile loop of `_w4a16_gemm_triton` with the weight words read so that
Triton's software pipeliner keeps them in flight, and an fp16 dequantization at under two instructions per
weight. On NVIDIA some classes read the words with an inline-PTX load and the fp16 dequantization is PTX
(`_planes`); AMD runs its portable form (below).

Why a kernel of its own: in the fused GEMM the packed words are a plain ``tl.load``. Triton then fixes
their register layout for coalescing, converts the dequantized tile to the MMA operand layout through
shared memory, and, when asked to pipeline (``num_stages`` > 1), stages the words through shared memory
and reads them back with scalar loads (RESULTS.md, section w4gemm), so that kernel runs unpipelined,
with its activation tile loaded synchronously every K step. Here the words come from
``ld.global.nc`` in inline asm, which no compiler pass rewrites: Triton gives the load the layout the
dot operand needs (the dequantized tile feeds the MMA straight from registers: no shared-memory round
trip; on Hopper it is the register A operand of ``wgmma``) and pipelines the activation tile alone
(``cp.async``, ``num_stages`` buffers), with the MMA left asynchronous across the K steps
(`tests/kernels/test_w4a16_pipelined.py` checks that structure on the CPU). Every fp16 launch goes the
other way (bf16's float32 form keeps the register loads, among them its classes ``rows16_regs`` and ``rows32``): the
words are plain loads again and the pipeliner stages them through shared memory beside the activations
(``PTX_LOADS=False``): the loop waits on its words, not on the MMA, and buffered copies keep more of them in
flight than registers can (RESULTS.md round16; from 33 rows round17; every class since round21).

Where it wins (H100, RESULTS.md sections w4pipe, w4half and round17): from 4 rows to where dequant + BLAS takes
over; the dispatcher's limits are `w4a16.ROUTE_LIMITS`. It reads the same tile-major layout
(`w4a16.W4A16Weight`) and writes its tiles with the fused GEMM's own helper (`_w4a16_gemm_triton.
_write_tile`: split-K into a persistent float32 workspace whose last split, by ticket, writes the tile,
so one launch does it all and graphs can replay it). bf16 activations are dequantized by the fused
GEMM's `_dequant_tile` (the exact float32 ``2**e + q`` trick), or, with one scale group per tile, into exact bf16
planes of q - z whose tile dot product is scaled (`_planes_qb`, 1.5 instructions per weight; round23); fp16 ones
by `_planes`, packed fp16 PTX
at 1.75 instructions per weight (``HALF_DEQ``), or, where one scale group spans the K tile, by `_planes_q` at
1.25: the planes hold q - z exactly and the tile's dot product is scaled in float32 (``SCALE_AFTER``, RESULTS.md
round21). One K tile per loop step: a two-tile step (one K = 256 dot) served fp16's register-load classes
until round 21 staged them all, and bf16 lost with it (RESULTS.md section w4half). For act-order or a K off the
128-row tiles the activations are gathered once per call into the layout's row order (`_w4a16_gemm_triton.x_index`).

Programmatic dependent launch (NVIDIA sm_90+, up to `runtime.PDL_MAX_ROWS` rows, ``PDL``): before it waits for the
kernel that wrote x, a program asks L2 for the words of its first ``L2_AHEAD`` K tiles (`_l2_prefetch_words`; weights
are written by no kernel), and it lets the next kernel launch after its K loop (``PDL_TRIGGER``), so that launch
and the next call's own requests overlap this one's flush. In a graph of 2-16-row calls that took 0.4-1.8 us off
a call (4096x4096 at 16 rows 9.0 -> 7.6 us), and 1.4-3.7 % off GPTQ decode steps at 2-64 sequences (H100,
RESULTS.md round28). `PDL_KNOBS` holds the shipped values.

Two K tiles a loop step (a config's ``UNROLL``; 1 in every shipped class, an experiment until measured): the scaled
loop (``SCALE_AFTER``) unrolled by Triton (``loop_unroll_factor``), with a remainder loop for an odd last tile. One K
tile of ``rows16`` is 188 instructions a warp on sm_90 (80 of them the dequantization): 752 a program for its 4 KiB of
words, 188 cycles of an SM's four schedulers at full issue, against about 315 cycles for those bytes at the SM's share
of copy bandwidth (3.02 TB/s over 132 SMs at 1.755 GHz), so the loop must keep the schedulers 60 % busy just to keep
pace. Two tiles a step at 2 stages (the same two tiles in flight; 24 KiB of shared memory a program, so six still fit
an SM) take it to 158.5 a tile with half the barriers (Triton 3.7.1 and the ptxas of its build, 80 registers, no
spill; 8 B on the stack with Triton 3.9.0; RESULTS.md round34). At 3 stages it needs 40 KiB: five programs an SM. On
a GPU: `gpu_pending.sh unroll`. AMD builds are the same with it or without (Triton 3.6-3.9, RESULTS.md round35).

The portable form (AMD, and the interpreter in CI): plain word loads and the same fp16 arithmetic written in
Triton's own int16 and fp16 operations (`_plane_lo`, `_plane_hi`), which both compilers pack two to a register;
on an H100 it ran at 0.83-1.02x the speed of the PTX form and 1.21-1.78x the float32 one, with the same results bit
for bit (RESULTS.md round18). On gfx942 the AMD pipeliner (two stages) prefetches the words into registers and
the activations through LDS, and the dequantized tile reaches the MFMA from registers. `AMD_CLASSES` and
`amd_config` say which tiles AMD runs; `AMD_COMPILE_SPECS` compiles each for gfx90a, gfx942, gfx950 and gfx1100
(no scratch). bf16 on AMD takes it with one scale group per tile, in the portable bf16 planes of q - z
(`_plane_lo_qb`, `_plane_hi_qb`); finer groups stay on the fused GEMM (`pipelined_eligible`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import triton
import triton.language as tl

from ._w4a16_gemm_triton import (E7_BITS, TILE, TILE_WORDS, _dequant_tile, _workspace, _write_tile, family, gather_x,
                                 launch_options, split_k)
from ._pdl import gdc_launch_dependents, gdc_wait
from ._w4a16_triton import _byte_halves, _chunks, _group_arg, _group_of, _plane_hi_q, _plane_lo_q, _scale_zero
from .compile_spec import CompileSpec
from .runtime import compute_units, pdl_for
from .w4a16 import LONG_K, WIDE_N

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


# Two nibble planes of two words at once, in fp16 (the trick of the stream kernel's packed loop, here
# producing MMA operands). One PRMT gathers byte b of word A (r) and of word B (the next word in the
# thread's registers) into bytes 0 and 2, so one LOP3 with 0x000F000F (plane 2b) or 0x00F000F0 (plane
# 2b + 1) or-ed with fp16x2 (1024, 1024) makes (1024 + q, 1024 + q') or (1024 + 16q, ...). One add of
# -(1024 + z) (or one fma by 1/16 with -(64 + z)) makes q - z exactly, one multiply by the scale rounds
# once: 3.5 instructions per two weights, against 5 per weight on the float32 path. Operands: $0, $1
# the planes; $2, $3 the words; $4, $5 the scales of the two planes (fp16x2); $6 -(1024 + z) of the
# even plane, $7 -(64 + z) of the odd one. Unscaled (``SCALE_AFTER``: the caller scales the tile's dot
# product), the planes are q - z and the operands after the words are $4 -(1024 + z) and $5 -(64 + z).
def _planes_asm(sel: str, scaled: bool = True) -> str:
    tail = ("add.rn.f16x2 e, e, $6;\nfma.rn.f16x2 o, o, c16, $7;\nmul.rn.f16x2 $0, e, $4;\nmul.rn.f16x2 $1, o, $5;"
            if scaled else "add.rn.f16x2 $0, e, $4;\nfma.rn.f16x2 $1, o, c16, $5;")
    return f"""{{
.reg .b32 t, e, o, c16;
prmt.b32 t, $2, $3, {sel};
mov.b32 c16, 0x2C002C00;
lop3.b32 e, t, 0x000F000F, 0x64006400, 0xea;
lop3.b32 o, t, 0x00F000F0, 0x64006400, 0xea;
{tail}
}}"""


# The bf16 twin of `_planes_asm` without the scale (``SCALE_AFTER``): bf16 has 7 mantissa bits, so bf16 128 + q
# (bits 0x4300 or-ed with q in bits 0-3) is exact, but a nibble in bits 4-7 would reach the exponent: the odd plane is
# shifted down 4 bits first. One fma by 1.0 with -(128 + z) ($4, the same for both planes) makes q - z exactly:
# 6 instructions per four weights (fp16's form: 5). fma.rn.bf16x2 needs sm_80.
def _planes_q_bf16_asm(sel: str) -> str:
    return f"""{{
.reg .b32 t, u, e, o, one;
prmt.b32 t, $2, $3, {sel};
shr.b32 u, t, 4;
mov.b32 one, 0x3F803F80;
lop3.b32 e, t, 0x000F000F, 0x43004300, 0xea;
lop3.b32 o, u, 0x000F000F, 0x43004300, 0xea;
fma.rn.bf16x2 $0, e, one, $4;
fma.rn.bf16x2 $1, o, one, $4;
}}"""


_PLANES_QB_ASM_0 = tl.constexpr(_planes_q_bf16_asm("0x4400"))  # `_planes_qb`: bf16 q - z, the scale applied later
_PLANES_QB_ASM_1 = tl.constexpr(_planes_q_bf16_asm("0x5511"))
_PLANES_QB_ASM_2 = tl.constexpr(_planes_q_bf16_asm("0x6622"))
_PLANES_QB_ASM_3 = tl.constexpr(_planes_q_bf16_asm("0x7733"))
_PLANES_Q_ASM_0 = tl.constexpr(_planes_asm("0x4400", scaled=False))  # `_planes_q`: q - z, the scale applied later
_PLANES_Q_ASM_1 = tl.constexpr(_planes_asm("0x5511", scaled=False))
_PLANES_Q_ASM_2 = tl.constexpr(_planes_asm("0x6622", scaled=False))
_PLANES_Q_ASM_3 = tl.constexpr(_planes_asm("0x7733", scaled=False))
_PLANES_ASM_0 = tl.constexpr(_planes_asm("0x4400"))  # byte b of each word into bytes 0 and 2
_PLANES_ASM_1 = tl.constexpr(_planes_asm("0x5511"))
_PLANES_ASM_2 = tl.constexpr(_planes_asm("0x6622"))
_PLANES_ASM_3 = tl.constexpr(_planes_asm("0x7733"))


@triton.jit
def _planes(words, s_e, s_o, zl, zh, ASM: tl.constexpr):
    """fp16 planes 2b and 2b + 1 ``(q - z) * s`` of `words` ([BLOCK_N, 16] int32, pairs of adjacent
    elements share one asm instance); ASM: `_PLANES_ASM_<b>`. Each result element depends only on its own
    word, scale and zero: correct whatever the register layout, which only decides how many moves the
    MMA operand needs."""
    return tl.inline_asm_elementwise(ASM, "=r,=r,r,r,r,r,r,r", [words, s_e, s_o, zl, zh],
                                     dtype=(tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _planes_q(words, zl, zh, ASM: tl.constexpr):
    """`_planes` without the scale: q - z of planes 2b and 2b + 1 (ASM: `_PLANES_Q_ASM_<b>`)."""
    return tl.inline_asm_elementwise(ASM, "=r,=r,r,r,r,r", [words, zl, zh], dtype=(tl.float16, tl.float16),
                                     is_pure=True, pack=2)


@triton.jit
def _planes_qb(words, zb, ASM: tl.constexpr):
    """bf16 q - z of planes 2b and 2b + 1 of `words` (ASM: `_PLANES_QB_ASM_<b>`; `zb`: bf16 -(128 + z))."""
    return tl.inline_asm_elementwise(ASM, "=r,=r,r,r,r", [words, zb], dtype=(tl.bfloat16, tl.bfloat16),
                                     is_pure=True, pack=2)


@triton.jit
def _plane_lo_qb(h, zf):
    """Portable bf16 even plane: the nibble in bits 0-3 of int16 `h` or-ed with bf16 128's bits reads as bf16
    128 + q (exact: 7 mantissa bits); adding `zf` = -(128 + z) makes q - z exactly. The add is float32 (exact
    too): bf16 adds are not native on every target, and the interpreter's are wrong on bitcast values."""
    return (((h & 0x000F) | 0x4300).to(tl.bfloat16, bitcast=True).to(tl.float32) + zf).to(tl.bfloat16)


@triton.jit
def _plane_hi_qb(h, zf):
    """Portable bf16 odd plane: the nibble in bits 4-7 shifted down first (in bits 4-7 it would reach bf16's
    exponent), then as `_plane_lo_qb`."""
    return ((((h >> 4) & 0x000F) | 0x4300).to(tl.bfloat16, bitcast=True).to(tl.float32) + zf).to(tl.bfloat16)


@triton.jit
def _planes_q_of(packed, za, zb, ASM: tl.constexpr, ASM_BF16: tl.constexpr, BF16: tl.constexpr):
    """q - z of planes 2b and 2b + 1 in PTX: `_planes_qb` (ASM_BF16, `za` = bf16 -(128 + z)) with BF16, else
    `_planes_q` (ASM, `za` / `zb` = fp16 -(1024 + z) / -(64 + z))."""
    if BF16:
        return _planes_qb(packed, za, ASM_BF16)
    else:
        return _planes_q(packed, za, zb, ASM)


@triton.jit
def _pair_q(h, za, zb, BF16: tl.constexpr):
    """Portable q - z of the two planes in int16 halves `h` (bits 0-3, 4-7): `_plane_lo_qb` / `_plane_hi_qb` with
    BF16 (`za`: float32 -(128 + z)), else `_plane_lo_q` / `_plane_hi_q` (`za` / `zb` as in `_planes_q_of`)."""
    if BF16:
        return _plane_lo_qb(h, za), _plane_hi_qb(h, za)
    else:
        return _plane_lo_q(h, za), _plane_hi_q(h, zb)


@triton.jit
def _dequant_tile_q(packed, z, BLOCK_N: tl.constexpr, PTX: tl.constexpr = True, BF16: tl.constexpr = False):
    """``(q - z)^T`` [BLOCK_N, 128] fp16, or bf16 with BF16, exact, of a K tile's words `packed` for a layout with one
    scale group per tile (``SCALE_AFTER``), given the tile's zero points `z` ([BLOCK_N, 1] float32, `_scale_zero`):
    the caller scales the tile's dot product instead of every weight, which drops the two multiplies of each
    `_planes` (1.25 instead of 1.75 instructions per weight in fp16; bf16 1.5, against about 3 for its float32
    dequantization). The caller loads the zeros (and scales) at the top of the step, before the tile's words and
    activations: the zeros feed this dequantization, ahead of the dot."""
    shape: tl.constexpr = [BLOCK_N, 16]
    if BF16:  # -(128 + z) for both planes: bf16 for the PTX, float32 for the portable add
        if PTX:
            za = tl.broadcast_to((-128.0 - z).to(tl.bfloat16), shape)
        else:
            za = tl.broadcast_to(-128.0 - z, shape)
        zb = za
    else:  # -(1024 + z) for the even planes, -(64 + z) for the odd ones
        za = tl.broadcast_to((-1024.0 - z).to(tl.float16), shape)
        zb = tl.broadcast_to((-64.0 - z).to(tl.float16), shape)
    if PTX:
        w0, w1 = _planes_q_of(packed, za, zb, _PLANES_Q_ASM_0, _PLANES_QB_ASM_0, BF16)
        w2, w3 = _planes_q_of(packed, za, zb, _PLANES_Q_ASM_1, _PLANES_QB_ASM_1, BF16)
        w4, w5 = _planes_q_of(packed, za, zb, _PLANES_Q_ASM_2, _PLANES_QB_ASM_2, BF16)
        w6, w7 = _planes_q_of(packed, za, zb, _PLANES_Q_ASM_3, _PLANES_QB_ASM_3, BF16)
    else:
        lo, lo8, hi, hi8 = _byte_halves(packed)
        w0, w1 = _pair_q(lo, za, zb, BF16)
        w2, w3 = _pair_q(lo8, za, zb, BF16)
        w4, w5 = _pair_q(hi, za, zb, BF16)
        w6, w7 = _pair_q(hi8, za, zb, BF16)
    return _tile_of_planes(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_N)


@triton.jit
def _tile_of_planes(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_N: tl.constexpr):
    """The eight [BLOCK_N, 16] planes as the ``W_tile^T`` [BLOCK_N, 128] operand in row order: index (a, b, c) of
    the joins is plane a + 2b + 4c, then position = plane * 16 + r."""
    wt = tl.join(tl.join(tl.join(w0, w1), tl.join(w2, w3)), tl.join(tl.join(w4, w5), tl.join(w6, w7)))
    return tl.reshape(tl.permute(wt, (0, 4, 3, 2, 1)), [BLOCK_N, 128])


@triton.jit
def _plane_lo(h, s, zl):
    """Portable `_planes`, even plane: int16 `h` holds the nibble in bits 0-3; or-ed with fp16 1024's bits it
    reads as fp16 1024 + q, and adding `zl` = -(1024 + z) makes q - z exactly; one multiply by `s` rounds once."""
    return _plane_lo_q(h, zl) * s


@triton.jit
def _plane_hi(h, s, zh):
    """Portable `_planes`, odd plane: the nibble in bits 4-7 reads as fp16 1024 + 16q; times 1/16 plus `zh` =
    -(64 + z) is q - z exactly, then one rounding by the scale."""
    return _plane_hi_q(h, zh) * s


@triton.jit
def _planes_portable(packed, s0, s1, s2, s3, s4, s5, s6, s7, zl0, zh1, zl2, zh3, zl4, zh5, zl6, zh7):
    """The eight fp16 planes of `packed` ([BLOCK_N, 16] int32) without asm: byte b of each word (its 16-bit half,
    shifted by 8 for odd b) holds planes 2b (bits 0-3) and 2b + 1 (bits 4-7)."""
    lo, lo8, hi, hi8 = _byte_halves(packed)
    return (_plane_lo(lo, s0, zl0), _plane_hi(lo, s1, zh1), _plane_lo(lo8, s2, zl2), _plane_hi(lo8, s3, zh3),
            _plane_lo(hi, s4, zl4), _plane_hi(hi, s5, zh5), _plane_lo(hi8, s6, zl6), _plane_hi(hi8, s7, zh7))


@triton.jit
def _group_h(s_ptr, z_ptr, row, offs_n, N, K, GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr,
             EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """`_planes`' operands of the group of sorted input row `row` (the stream kernel's group lookup and
    loads): fp16 scale, -(1024 + z) and -(64 + z), each [BLOCK_N, 16]; z = 8 without zeros."""
    s, z = _scale_zero(s_ptr, z_ptr, _group_of(row, K, GROUP_SIZE, EVEN_K), offs_n, N, EVEN_N, HAS_ZEROS)
    shape: tl.constexpr = [s.shape[0], 16]
    return (tl.broadcast_to(s.to(tl.float16), shape), tl.broadcast_to((-1024.0 - z).to(tl.float16), shape),
            tl.broadcast_to((-64.0 - z).to(tl.float16), shape))


@triton.jit
def _tile_groups_h(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr,
                   HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """`_planes`' operands for the eight planes of K tile k0 (`_group_h` of each group the tile meets, each read
    once): the scales s0..s7, then zl of the even planes and zh of the odd ones, one tuple for `_planes_of_groups`."""
    s0, zl0, zh0 = _group_h(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
    if CHUNKS == 1:  # one group for all eight planes
        s1, zh1, s2, zl2, s3, zh3, s4, zl4, s5, zh5, s6, zl6, s7, zh7 = (s0, zh0, s0, zl0, s0, zh0, s0, zl0, s0, zh0,
                                                                         s0, zl0, s0, zh0)
    else:  # plane j holds rows k0 + 16j ..: CHUNKS groups per tile, each group read once
        s4, zl4, zh4 = _group_h(s_ptr, z_ptr, k0 + 64, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        if CHUNKS >= 4:
            s2, zl2, zh2 = _group_h(s_ptr, z_ptr, k0 + 32, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
            s6, zl6, zh6 = _group_h(s_ptr, z_ptr, k0 + 96, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        else:
            s2, zl2, zh2 = s0, zl0, zh0
            s6, zl6, zh6 = s4, zl4, zh4
        if CHUNKS >= 8:
            s1, zl1, zh1 = _group_h(s_ptr, z_ptr, k0 + 16, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
            s3, zl3, zh3 = _group_h(s_ptr, z_ptr, k0 + 48, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
            s5, zl5, zh5 = _group_h(s_ptr, z_ptr, k0 + 80, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
            s7, zl7, zh7 = _group_h(s_ptr, z_ptr, k0 + 112, offs_n, N, K, GROUP_SIZE, HAS_ZEROS, EVEN_K, EVEN_N)
        else:
            s1, zl1, zh1 = s0, zl0, zh0
            s3, zl3, zh3 = s2, zl2, zh2
            s5, zl5, zh5 = s4, zl4, zh4
            s7, zl7, zh7 = s6, zl6, zh6
    return (s0, s1, s2, s3, s4, s5, s6, s7, zl0, zh1, zl2, zh3, zl4, zh5, zl6, zh7)


@triton.jit
def _planes_of_groups(packed, groups, BLOCK_N: tl.constexpr, PTX: tl.constexpr = True):
    """`_w4a16_gemm_triton._dequant_tile` for fp16 activations: the weight operand ``W_tile^T`` [BLOCK_N, 128] in row
    order of a K tile's words `packed` and its `_tile_groups_h`. PTX: `_planes` (inline PTX, NVIDIA); otherwise the same
    arithmetic in Triton's own int16 and fp16 operations (`_plane_lo`, `_plane_hi`; AMD and the interpreter), which the
    compilers pack two to a register (sm_90 PTX: as many ``f16x2`` operations as `_planes`; gfx942: 72 ``v_pk_*``),
    with the same result bit for bit."""
    s0, s1, s2, s3, s4, s5, s6, s7, zl0, zh1, zl2, zh3, zl4, zh5, zl6, zh7 = groups
    if PTX:
        w0, w1 = _planes(packed, s0, s1, zl0, zh1, _PLANES_ASM_0)
        w2, w3 = _planes(packed, s2, s3, zl2, zh3, _PLANES_ASM_1)
        w4, w5 = _planes(packed, s4, s5, zl4, zh5, _PLANES_ASM_2)
        w6, w7 = _planes(packed, s6, s7, zl6, zh7, _PLANES_ASM_3)
    else:
        w0, w1, w2, w3, w4, w5, w6, w7 = _planes_portable(packed, s0, s1, s2, s3, s4, s5, s6, s7, zl0, zh1, zl2, zh3,
                                                          zl4, zh5, zl6, zh7)
    return _tile_of_planes(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_N)


@triton.jit
def _l2_prefetch_words(qw_ptr, wbase, kt0, kt1, BLOCK_N: tl.constexpr, TILES: tl.constexpr):
    """Ask L2 for the words of this program's first `TILES` K tiles (``prefetch.global.L2``, one request per
    128-byte line; NVIDIA only): issued before a PDL launch waits for its predecessor, so the first tiles are on
    their way while it finishes. Weights are written by no kernel, so reading them early is safe."""
    LINES: tl.constexpr = BLOCK_N * 16 // 32  # a K tile's words of BLOCK_N columns: contiguous, 32 words a line
    j = tl.arange(0, LINES * TILES)
    kt = tl.minimum(kt0 + j // LINES, kt1 - 1)
    ptrs = qw_ptr + wbase + kt * TILE_WORDS + (j % LINES) * 32
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _w4a16_pipelined_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, KT, stride_xm, stride_om, tiles_per_split, e7_bits,
    GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PTX_LOADS: tl.constexpr = True, HALF_DEQ: tl.constexpr = False,
    ACCUM: tl.constexpr = False, PTX_DEQ: tl.constexpr = True,
    SCALE_AFTER: tl.constexpr = False, BF16: tl.constexpr = False, SCALES_FIRST: tl.constexpr = True,
    PDL: tl.constexpr = False, PDL_TRIGGER: tl.constexpr = 1, L2_AHEAD: tl.constexpr = 0, UNROLL: tl.constexpr = 1,
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
    wbase = (n0 // 128) * KT * TILE_WORDS + (n0 % 128) * 16
    w_offs = wbase + offs_loc[:, None] * 16 + tl.arange(0, 16)[None, :]
    x_ptrs = x_ptr + offs_m[None, :] * stride_xm + tl.arange(0, 128)[:, None]  # x^T of one K tile, row order
    kt0 = pid_k * tiles_per_split
    kt1 = tl.minimum(KT, kt0 + tiles_per_split)
    if PDL:  # launched before x's producer ended (`runtime.pdl_for`): weights may be asked for, nothing else yet
        if L2_AHEAD > 0:
            _l2_prefetch_words(qw_ptr, wbase, kt0, kt1, BLOCK_N, L2_AHEAD)
        if PDL_TRIGGER == 0:  # the next kernel may launch now (else after the K loop, or at exit)
            gdc_launch_dependents()
        gdc_wait()
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    # Triton's pipeliner stages the activations (cp.async, num_stages buffers) and leaves the MMA in flight
    # across steps; the words are loaded where they are used (ahead-of-use register rings measured no
    # faster and stop Triton from pipelining the loop at all: RESULTS.md section w4half).
    if SCALE_AFTER:  # one group per tile, fp16 or bf16 planes: the dot of q - z, then the tile's scales on its sums
        # UNROLL (a config's "UNROLL", 1 as shipped): K tiles per loop step, unrolled by Triton (module docstring)
        for kt in tl.range(kt0, kt1, loop_unroll_factor=UNROLL):
            k0 = kt * 128
            g = _group_of(k0, K, GROUP_SIZE, EVEN_K)
            # SCALES_FIRST: the tile's zeros and scales are loaded before its words and activations, so their latency
            # overlaps the wait for the staged operands (the zeros feed the dequantization, ahead of the dot); else
            # the zeros first and the scales after the dot's operands (`pipelined_matmul` picks)
            if SCALES_FIRST:
                s, z = _scale_zero(s_ptr, z_ptr, g, offs_n, N, EVEN_N, HAS_ZEROS)
            else:
                _, z = _scale_zero(s_ptr, z_ptr, g, offs_n, N, EVEN_N, HAS_ZEROS)
            packed = _ld_words(qw_ptr + w_offs + kt * TILE_WORDS, PTX_LOADS)
            x_t = tl.load(x_ptrs + k0, mask=m_mask[None, :], other=0.0)
            wq = _dequant_tile_q(packed, z, BLOCK_N, PTX_DEQ, BF16)
            if not SCALES_FIRST:
                s, _ = _scale_zero(s_ptr, z_ptr, g, offs_n, N, EVEN_N, HAS_ZEROS)
            acc += tl.dot(wq, x_t) * tl.reshape(s, [BLOCK_N])[:, None]
    else:  # each weight scaled: HALF_DEQ's fp16 planes, else the fused GEMM's float32 `_dequant_tile`
        for kt in range(kt0, kt1):
            k0 = kt * 128
            if HALF_DEQ:  # the tile's groups before its words and activations (round25: 1-9.5 % less time, 64-256 rows)
                groups = _tile_groups_h(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE, CHUNKS, HAS_ZEROS, EVEN_K, EVEN_N)
            packed = _ld_words(qw_ptr + w_offs + kt * TILE_WORDS, PTX_LOADS)
            x_t = tl.load(x_ptrs + k0, mask=m_mask[None, :], other=0.0)
            if HALF_DEQ:
                wt = _planes_of_groups(packed, groups, BLOCK_N, PTX_DEQ)
            else:
                wt = _dequant_tile(packed, s_ptr, z_ptr, k0, offs_n, N, K, e7_bits, x_ptr, BLOCK_N, GROUP_SIZE, CHUNKS,
                                   HAS_ZEROS, EVEN_K, EVEN_N, True)
            acc = tl.dot(wt, x_t, acc)
    if PDL and PDL_TRIGGER == 1:  # the next kernel's launch and its weight requests overlap this tile's flush
        gdc_launch_dependents()
    _write_tile(acc, out_ptr, ws_ptr, cnt_ptr + pid, SPLIT, bias_ptr, offs_m, offs_n, m_mask, N, stride_om, SPLIT,
                HAS_BIAS, BLOCK_N, BLOCK_M, ACCUM)


PIPELINED_CONFIGS: dict[str, dict[str, Any]] = {
    # tiles and launch options by the call's class (`pipelined_config`), from the H100 sweeps (RESULTS.md,
    # sections w4pipe, w4half, round16 and round17). K splits (`_w4a16_gemm_triton.split_k`, always
    # ``within_waves`` here): the most that keep (tiles x splits) within "waves" programs per SM, at least
    # "min_k_tiles" K tiles per split. HALF_DEQ: fp16 activations take the fp16 dequantization (`_planes_of_groups`).
    # PTX_LOADS=False: the words are plain loads, which Triton's
    # pipeliner stages through shared memory with the activations (``cp.async``, num_stages buffers) and reads
    # back in the operand layout: more bytes in flight per program than the register loads, for one
    # shared-memory read per word (RESULTS.md round16). within_waves=False: the split count nearest to the target.
    # maxnreg (NVIDIA only; AMD's options drop it): ``rows16`` sizes its grid for 6 programs per SM, and 80
    # registers still fit 6 (65536 / (80 x 128)) where ptxas chose 68 on its own: 1.4-2.1 % faster at 16 rows on
    # six Llama weights, 0-0.8 % at 8 (H100, four alternating rounds, RESULTS.md round20). "overflow_maxnreg": the
    # cap when the grid outgrows ``waves`` programs per SM (the nearest split count rounded up: 4096 x 28672 makes
    # 896 programs on 132 SMs), so that 7 fit and the call stays one wave (RESULTS.md round21: 27.4 against 33.6 us).
    # SCALE_AFTER (fp16, one scale group per K tile; `_scale_after`): the tile's dot product
    # of q - z is scaled, not every weight: 1.25 instead of 1.75 dequantization instructions per weight, and 3-11 %
    # faster at 2-32 rows on the Llama weights (H100, RESULTS.md round21). In ``rows64`` the second accumulator
    # takes 142 registers (3 programs of 4 warps per SM, 4 without it): on grids that fit 3 per SM
    # ("scale_after_waves") it is 6-10 % faster (4096x4096 and 4096x6144 at 64 rows), so where a launch may take it
    # its K splits aim at 3 programs per SM (`launch_plan`); a grid that outgrows them with one split takes it
    # under the register cap "scale_after_maxnreg" (NVIDIA), which fits 4 again (ptxas keeps 16-24 B on the
    # stack), or, where no cap applies (AMD), scales each weight (H100, RESULTS.md round22).
    "rows16": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 6, "min_k_tiles": 4,
               "HALF_DEQ": True, "PTX_LOADS": False, "within_waves": False, "maxnreg": 80,
               "overflow_maxnreg": 72, "SCALE_AFTER": True},
    "rows16_regs": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 4,
                    "min_k_tiles": 4},  # bf16's float32 form only (fp16 takes rows16)
    "rows32": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 2,
               "min_k_tiles": 8},  # bf16's float32 form on wide outputs only (fp16 takes narrow32)
    "narrow32": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "min_k_tiles": 8,
                 "HALF_DEQ": True, "PTX_LOADS": False, "SCALE_AFTER": True},
    "rows64": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "min_k_tiles": 8,
               "HALF_DEQ": True, "PTX_LOADS": False, "SCALE_AFTER": True, "scale_after_waves": 3,
               "scale_after_maxnreg": 128},
    "rows64_n128": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "waves": 2, "min_k_tiles": 16,
                    "HALF_DEQ": True, "PTX_LOADS": False},
    "rows256": {"BLOCK_M": 256, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "waves": 1},  # bf16 only
}
PDL_KNOBS: dict[str, int] = {"PDL": 1, "PDL_TRIGGER": 1, "L2_AHEAD": 2}
"""The PDL form every class launches (a config may override a key; benchmarks do, `bench_w4a16.knob_on_routes`):
take part where `runtime.pdl_for` allows; ``PDL_TRIGGER`` 1 lets the next kernel launch after the K loop (0: as the
program starts, 2: as it exits); ``L2_AHEAD`` K tiles of words asked of L2 before the wait. H100, graphs of calls, against
no PDL (RESULTS.md round28): after the loop with 2 tiles ahead 0.83-0.99x the time at 2-16 rows on the Llama-3-8B
shapes; at the start 2.275 against 2.422 ms on Llama-2-7B's 2-sequence GPTQ step but 4.263 against 3.685 at 16; at
exit 0.92-1.02x; 4 tiles ahead took 0.1-4.8 % more of a GPTQ step than 2, and 0 tiles 1.4 % more at 16 sequences."""
BF16_PLANES_MAX_WIDE = 192
"""The most rows of bf16 on a wide output (`w4a16.WIDE_N` columns and more, one scale group per tile) that take its
planes of q - z (`pipelined_config`): at 33-64 rows of the widest outputs they were 1.22-1.62x faster than bf16's
float32 tiles and at 96-192 rows 1.07-1.41x, at 256 rows 0.94-0.99x the 256 x 128 one on 4096x12288-4096x28672 (H100,
RESULTS.md round23). Narrow outputs take them at every row count: 1.02-1.86x at 256 rows."""
WIDE_TILE_N = 16384
"""Outputs at least this wide (the fused gate/up, 22016 and 28672 columns) take the 64 x 128 tile from 33 rows:
their 128-column tiles alone outnumber the SMs (H100, RESULTS.md round17: 40.1-42.9 against 46.6-48.8 us with
the 64 x 64 tile on 4096x28672 at 33-64 rows; 4096x12288 was 1.03-1.17x faster with the 64 x 64 tile)."""


AMD_CLASSES: dict[str, dict[str, str]] = {
    # the class an AMD family runs instead of a Hopper one: the register-load classes (bf16's on Hopper) become
    # their staged twins; CDNA's 64 KiB of LDS holds no 256-row tile (128 KiB at 2 stages); on gfx1100 only
    # the 16-row tile stays out of scratch in every layout (the 32-row one spills 88 B in g32 asym, the 64-row
    # ones 60-164 B), so every class is that tile there
    "cdna": {"rows16_regs": "rows16", "rows32": "narrow32", "rows256": "rows64"},
    "rdna3": {name: "rows16" for name in ("rows16_regs", "rows32", "narrow32", "rows64", "rows64_n128", "rows256")},
}
AMD_LAUNCH: dict[str, dict[str, Any]] = {
    # Triton's AMD pipeliner at 2 stages prefetches the words into registers and the activations through LDS
    # (gfx942 TTGIR); the dequantized tile reaches the MFMA from registers (no LDS for it)
    "cdna": {"num_stages": 2, "matrix_instr_nonkdim": 16, "kpack": 1},
    "rdna3": {"num_stages": 2},
}


def amd_config(cfg: dict[str, Any], family: str) -> dict[str, Any]:
    """`cfg` (an entry of `PIPELINED_CONFIGS`, as `AMD_CLASSES` maps it) as an AMD `family` runs it: plain word
    loads, the portable fp16 dequantization, `AMD_LAUNCH`'s options."""
    out = dict(cfg)
    out.update(PTX_LOADS=False, PTX_DEQ=False, **AMD_LAUNCH[family])
    return out


def pipelined_config(m: int, k: int, n: int, chunks: int = 1, half: bool = True,
                     family: str = "hopper") -> dict[str, Any]:
    """The config for `m` rows times a `k` x `n` weight; `chunks`: scale groups per 128-row tile; `half`: fp16
    activations; `family`: the arch family (`_w4a16_gemm_triton.family`; an AMD one takes its `AMD_CLASSES`
    twin of the class below through `amd_config`, any other the class itself).

    - Up to 16 rows: 16-row tiles; fp16 stages the words through shared memory (``rows16``: 1.00-1.24x on the
      Llama projections, RESULTS.md round16; on 4096x4096, where the register loads of ``rows16_regs`` had been
      3-6 % faster, the staged class with its scaled dot products ties them at 2-8 rows and is 5 % faster at 16,
      round21); bf16 in its float32 form (below) keeps the register loads.
    - 17-32 rows: 32-row tiles, staged and split along K further (``narrow32``); on wide outputs (from
      `w4a16.WIDE_N` columns) bf16's float32 form keeps the register loads of ``rows32``, which fp16 left in round 21: with its
      dot products scaled the staged class took 17-28 % off 4096x12288-4096x28672 (RESULTS.md round21; staged had
      been mixed there before, round16).
    - 33 rows and more: 64-row tiles, staged: 64 columns wide, or 128 on outputs of at least `WIDE_TILE_N`
      columns, from 129 rows on every wide output, and above 384 rows on narrow outputs whose input exceeds
      `w4a16.LONG_K` (RESULTS.md round17: 0.98-1.89x the speed of round 16's routes and classes on the Llama
      projections; round18: 122-128 against 159-162 us at 448-512 rows, and 113-118 against 122-131 us the other way
      at 320-384). At 65-128 rows such outputs take the 128-column tile only where the 64 x 64 tile runs unscaled
      (AMD, several groups per tile, bf16's float32 form: round17, 41.3-44.9 against 42.5-46.7 us on 14336x4096);
      fp16 on NVIDIA with one group per tile keeps the scaled 64 x 64 tile, 2.9-7.0 % less time there since round
      22's register cap (round24, `_class_name`).

    bf16 with one scale group per tile takes exact bf16 planes of q - z and the scaled dot products
    (`_dequant_tile_q`), on narrow outputs at every row count and on wide ones up to `BF16_PLANES_MAX_WIDE` rows: the
    fp16 class where that class scales (``rows16``, ``narrow32``, ``rows64``), else ``rows64`` (in place of the
    unscaled 64 x 128 tile). On an H100 that is 1.02-1.86x faster than its float32 form at 2-256 rows, and 0.96-1.16x
    the fp16 time (RESULTS.md round23). An AMD family takes them too, in its own class (`AMD_CLASSES`) and the portable
    planes (`_plane_lo_qb`, `_plane_hi_qb`); the dispatcher sends AMD no other bf16 layout (`pipelined_eligible`).
    Its float32 form: elsewhere bf16
    takes the same tiles with the register word loads and its float32 dequantization (two K tiles a step, as
    the kernel once ran them, needed 158-196 registers on sm_90 and measured up to 1.3x slower on an H100:
    RESULTS.md section w4half), except above 64 rows: on wide outputs the 64 x 128 tile lost in
    registers (0.93-0.95x at 96-192 rows on 4096x28672), so bf16 keeps the 64 x 64 tile up to 128 rows there, and
    above 128 rows every output takes the 256 x 128 tile (round17; on 14336x4096 and 11008x4096 at 160-256 rows
    1.23-1.34x dequant + BLAS, round18). The 256 x 128 tile serves one scale group per tile only: with more, its
    sm_90 build spills (168 B with Triton 3.6.0, 1024 B with 3.9.0), and the 64 x 64 tile runs instead."""
    amd = family in AMD_CLASSES
    planes = not half and chunks == 1 and (m <= BF16_PLANES_MAX_WIDE or n < WIDE_N)  # bf16 planes of q - z
    name = _class_name(m, k, n, chunks, half or planes, can_cap=not amd)
    if amd:
        name = AMD_CLASSES[family].get(name, name)
    if planes and not PIPELINED_CONFIGS[name].get("SCALE_AFTER"):
        name = AMD_CLASSES[family].get("rows64", "rows64") if amd else "rows64"
    cfg = dict(PIPELINED_CONFIGS[name]) if half or planes else float32_config(PIPELINED_CONFIGS[name])
    return amd_config(cfg, family) if amd else cfg


def _class_name(m: int, k: int, n: int, chunks: int, half: bool, can_cap: bool = True) -> str:
    """The Hopper class of `pipelined_config` for `m` rows of a `k` x `n` weight (`half`: fp16 activations, else
    bf16 on its float32 dequantization; `can_cap`: the target takes register caps, NVIDIA). Narrow outputs of a long
    input take the 128-column tile above 384 rows, and at 65-128 rows unless the scaled 64 x 64 tile keeps its
    programs per SM under its register cap (`fit_wave`): fp16 with one scale group per tile on NVIDIA, where it was
    2.9-7.0 % less time on 14336x4096 and 11008x4096 at 65-128 rows (H100, RESULTS.md round24)."""
    narrow = n < WIDE_N
    if m <= 16:
        name = "rows16" if half else "rows16_regs"
    elif m <= 32:
        name = "narrow32" if narrow or half else "rows32"
    elif not half and m > 128:
        name = "rows256" if chunks == 1 else "rows64"
    elif narrow:
        n128 = k > LONG_K and (m > 384 or (64 < m <= 128 and not (half and can_cap and chunks == 1)))
        name = "rows64_n128" if n128 else "rows64"
    elif not half and m > 64:
        name = "rows64"
    else:
        name = "rows64_n128" if n >= WIDE_TILE_N or m > 128 else "rows64"
    return name


def float32_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` as bf16 activations run it: the float32 dequantization, register word loads."""
    out = {key: v for key, v in cfg.items() if key not in ("PTX_LOADS", "SCALE_AFTER")}
    out.update(HALF_DEQ=False)
    return out


def fit_wave(cfg: dict[str, Any], programs: int, cus: int, scaled: bool = False) -> dict[str, Any]:
    """`cfg` for a grid of `programs` on `cus` SMs, its register caps (NVIDIA; AMD's options drop them) set by the
    grid: ``overflow_maxnreg`` replaces ``maxnreg`` when the grid outgrows ``waves`` programs per SM, so one more
    fits and the call stays one wave; a `scaled` launch (``SCALE_AFTER``, `_scale_after`) past
    ``scale_after_waves`` programs per SM takes ``scale_after_maxnreg``, under which its second accumulator still
    fits as many programs as the unscaled form."""
    if "overflow_maxnreg" in cfg and programs > cfg.get("waves", 1) * cus:
        return {**cfg, "maxnreg": cfg["overflow_maxnreg"]}
    if scaled and "scale_after_maxnreg" in cfg and programs > cfg.get("scale_after_waves", programs) * cus:
        return {**cfg, "maxnreg": cfg["scale_after_maxnreg"]}
    return cfg


def _scale_after(cfg: dict[str, Any], chunks: int, programs: int = 0, cus: int = 1, can_cap: bool = False) -> bool:
    """Whether a launch of `cfg` over `programs` programs on `cus` SMs scales each K tile's dot product instead of
    each weight (``SCALE_AFTER``): asked by the config (fp16 classes; bf16 takes them where `pipelined_config`
    gives it one: its float32 form, `float32_config`, never asks), one scale group per
    tile, and a grid within the config's ``scale_after_waves`` programs per SM where it names
    one (the second accumulator's registers leave fewer programs per SM), unless the launch `can_cap` registers
    (NVIDIA) and the config names the cap that fits the larger grid (``scale_after_maxnreg``, `fit_wave`)."""
    return (bool(cfg.get("SCALE_AFTER", False)) and chunks == 1
            and (programs <= cfg.get("scale_after_waves", programs) * cus
                 or (can_cap and "scale_after_maxnreg" in cfg)))


def launch_plan(cfg: dict[str, Any], tiles: int, k_tiles: int, chunks: int, cus: int,
                can_cap: bool) -> tuple[dict[str, Any], int, int, bool]:
    """(config, K splits, K tiles per split, scaled) of a launch of `cfg` over `tiles` output tiles of `k_tiles` K
    tiles on `cus` SMs: where the launch may scale each tile's dot product (`_scale_after`), that form's own
    programs per SM (``scale_after_waves``) set the K splits, not ``waves``; `fit_wave` then sets the register
    caps of the grid. `can_cap`: the target takes register caps (NVIDIA)."""
    split_cfg = ({**cfg, "waves": cfg["scale_after_waves"]}
                 if "scale_after_waves" in cfg and _scale_after(cfg, chunks) else cfg)
    splits, per = split_k(tiles, 1, k_tiles, split_cfg, cus)
    scaled = _scale_after(cfg, chunks, tiles * splits, cus, can_cap=can_cap)
    return fit_wave(cfg, tiles * splits, cus, scaled), splits, per, scaled


def scales_first(cfg: dict[str, Any], has_zeros: bool, scaled: bool) -> bool:
    """``SCALES_FIRST`` of a launch of `cfg`: whether the scaled form (``SCALE_AFTER``, `scaled`) loads a K tile's
    scales and zeros before its words and activations, else the zeros first and the scales after them: with zeros,
    or below 64-row tiles, unless the config says (H100, RESULTS.md round24: asymmetric g128 at 256 rows 1.18-1.19x
    on 14336x4096 and 4096x4096, 1-9 % faster at 2-16 rows symmetric; the symmetric 64-row tile lost 9-12 % with it
    at 256 rows). False where the launch does not scale: the kernel reads it in the scaled form only, and the fp16
    forms that scale each weight always load their groups first (round25)."""
    return scaled and bool(cfg.get("SCALES_FIRST", has_zeros or cfg["BLOCK_M"] < 64))


def pipelined_eligible(arch: str, w: "W4A16Weight", dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the dispatcher may send `w` with activations of `dtype` (None: any) here: a 4-bit kernel-ready
    weight on a GPU; on AMD fp16 activations (the portable fp16 dequantization: 1.21-1.78x the float32 form on an
    H100, RESULTS.md round18), and bf16 ones on a weight of one scale group per 128-row tile, which take the
    portable bf16 planes of q - z (`_dequant_tile_q`); bf16 on finer groups would run the float32 form, measured at
    parity with the fused GEMM (round18). `arch` is "cpu" under the interpreter (`w4a16_matmul` sets it): the
    dispatcher never picks this kernel there, but a forced ``route="pipelined"`` runs it with plain loads (tests)."""
    if arch == "cpu" or w.bits != 4 or not w.kernel_ready:
        return False
    if not arch.startswith("gfx") or dtype in (None, torch.float16):
        return True
    return dtype == torch.bfloat16 and _chunks(_group_arg(w)) == 1


def pipelined_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], arch: str,
                     config: Optional[dict[str, Any]] = None,
                     accumulate_into: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x2 @ W (+ bias)`` through the pipelined fused GEMM; x2 is ``[M, K]`` with unit stride along K;
    `config` (benchmarks, tests) overrides `pipelined_config`.
    `accumulate_into`: a zeroed, contiguous float32 ``[M, N]`` accumulator that receives the sums and is
    returned (no bias, no split-K ticket: `w4a16.w4a16_accumulate`)."""
    if accumulate_into is not None and (bias is not None or accumulate_into.dtype != torch.float32
                                        or not accumulate_into.is_contiguous()):
        raise ValueError("accumulate_into takes a contiguous float32 accumulator and no bias")
    if w.bits != 4 or not w.kernel_ready:
        raise ValueError("the pipelined W4A16 GEMM needs a 4-bit kernel-ready weight")
    m = x2.shape[0]
    k, n = w.in_features, w.out_features
    gs = _group_arg(w)
    half = x2.dtype == torch.float16
    nvidia = not arch.startswith("gfx") and arch != "cpu"  # inline PTX (word loads, fp16 dequantization) there only
    cfg = dict(config or pipelined_config(m, k, n, _chunks(gs), half, family(arch)))
    cfg.setdefault("within_waves", True)  # this kernel's split rule (see `split_k`)
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if TILE % block_n:
        raise ValueError(f"BLOCK_N={block_n} must divide the layout's {TILE}-column tile")
    accumulate = accumulate_into is not None
    out = accumulate_into if accumulate else torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    # x in the layout's row order (act-order), zero columns for the padded rows (ragged K)
    x_src = gather_x(x2, w, True) if w.perm is not None or k % TILE else x2
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    cfg, splits, per, scaled = launch_plan(cfg, tiles, w.k_tiles, _chunks(gs), compute_units(x2.device), nvidia)
    # the fused GEMM's persistent workspace: its tickets (one per 16 x 32 tile) outnumber these tiles; an
    # accumulator is its own workspace and needs no tickets
    ws, cnt = _workspace(x2.device, n, m) if splits > 1 and not accumulate else (out, out)
    # PDL (`runtime.PDL_MAX_ROWS`): not after a gather of x, which lets nothing launch early (act-order g32, 4096x14336:
    # 1-2 % slower with it at 2-16 rows, RESULTS.md round28)
    knobs = {k: int(cfg.get(k, v)) for k, v in PDL_KNOBS.items()}
    pdl = nvidia and bool(knobs["PDL"]) and x_src is x2 and pdl_for(x2, "w4a16_rows", m)
    _w4a16_pipelined_kernel[(tiles, splits)](
        x_src, w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales,
        bias if bias is not None else w.scales, out, ws, cnt,
        m, n, k, w.k_tiles, x_src.stride(0), out.stride(0), per, E7_BITS,
        GROUP_SIZE=gs, CHUNKS=_chunks(gs), BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=cfg.get("GROUP_M", 8),
        SPLIT=splits, HAS_ZEROS=w.zeros is not None, HAS_BIAS=bias is not None,
        EVEN_K=k % TILE == 0, EVEN_N=n % block_n == 0, PTX_LOADS=nvidia and bool(cfg.get("PTX_LOADS", True)),
        HALF_DEQ=bool(cfg.get("HALF_DEQ", False)) and half, ACCUM=accumulate,
        PTX_DEQ=nvidia and bool(cfg.get("PTX_DEQ", True)),
        SCALE_AFTER=scaled, BF16=x2.dtype == torch.bfloat16,
        SCALES_FIRST=scales_first(cfg, w.zeros is not None, scaled),
        PDL=pdl, PDL_TRIGGER=knobs["PDL_TRIGGER"], L2_AHEAD=knobs["L2_AHEAD"], UNROLL=int(cfg.get("UNROLL", 1)),
        launch_pdl=pdl,
        **launch_options(cfg, arch),
    )
    return out


# ---------------------------------------------------------------- AMD compile specs

_AMD_TARGETS: dict[str, tuple[str, ...]] = {"cdna": ("gfx90a", "gfx942", "gfx950"), "rdna3": ("gfx1100",)}
"""The compile targets of each family in `AMD_CLASSES`."""


def _amd_classes(family_name: str) -> list[str]:
    """The classes `family_name` can launch: `AMD_CLASSES`' images of every Hopper class."""
    return sorted({AMD_CLASSES[family_name].get(name, name) for name in PIPELINED_CONFIGS})


def _amd_spec(family_name: str, cls: str, group: int, zeros: bool, accum: bool, large_grid: bool = False,
              bf16: bool = False) -> CompileSpec:
    """One AMD class in one layout, fp16 activations or, with `bf16`, bf16 ones (the dispatcher sends AMD bf16 only
    with one scale group per tile, `pipelined_eligible`: its planes of q - z); act-order weights reach the kernel
    with x already gathered, so g32 asym stands for them. `large_grid`: the form a grid past the class's
    ``scale_after_waves`` launches there (each weight scaled, bf16 in its float32 form: AMD takes no register
    cap)."""
    cfg = amd_config(dict(PIPELINED_CONFIGS[cls]), family_name)
    scale_after = _scale_after(cfg, _chunks(group)) and not large_grid
    act = "*bf16" if bf16 else "*fp16"
    sig = {"x_ptr": act, "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "bias_ptr": act,
           "out_ptr": "*fp32" if accum else act, "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "K": "i32", "KT": "i32", "stride_xm": "i32", "stride_om": "i32", "tiles_per_split": "i32", "e7_bits": "i32"}
    cons = {"GROUP_SIZE": group, "CHUNKS": _chunks(group), "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"],
            "GROUP_M": 8, "SPLIT": 2, "HAS_ZEROS": zeros, "HAS_BIAS": False, "EVEN_K": True, "EVEN_N": True,
            "PTX_LOADS": cfg["PTX_LOADS"], "HALF_DEQ": cfg["HALF_DEQ"] and not bf16, "ACCUM": accum,
            "PTX_DEQ": cfg["PTX_DEQ"], "SCALE_AFTER": scale_after}
    cons["SCALES_FIRST"] = scales_first(cfg, zeros, scale_after)
    if bf16:
        cons["BF16"] = True
    sig.update({c: "constexpr" for c in cons})
    tag = ("asym" if zeros else "sym") + (",accum" if accum else "") + (",rdna3" if family_name == "rdna3" else "")
    tag += (",scale_after" if scale_after else "") + (",bf16" if bf16 else "")
    return CompileSpec(
        name=f"w4a16_pipelined[{cls}:{cfg['BLOCK_M']}x{cfg['BLOCK_N']},g{group},{tag}]",
        kernel=_w4a16_pipelined_kernel,
        signature=sig,
        constexprs=cons,
        options=lambda arch, cfg=cfg: launch_options(cfg, arch),
        hot=True,
        uses_dot=True,
        archs=_AMD_TARGETS[family_name],
        divisible_by_16=("N", "K", "stride_xm", "stride_om"),
    )


def _amd_planes_classes(family_name: str) -> list[str]:
    """The classes bf16 planes run on `family_name`: `pipelined_config`'s choice for every Hopper class."""
    return sorted({AMD_CLASSES[family_name].get(name, name) for name in PIPELINED_CONFIGS
                   if PIPELINED_CONFIGS[AMD_CLASSES[family_name].get(name, name)].get("SCALE_AFTER")}
                  | {AMD_CLASSES[family_name].get("rows64", "rows64")})


AMD_COMPILE_SPECS: list[CompileSpec] = [
    _amd_spec(fam, cls, group, zeros, False)
    for fam in AMD_CLASSES
    for cls in _amd_classes(fam)
    for group, zeros in ((128, False), (32, True))
] + [_amd_spec(fam, "rows16", 128, False, True) for fam in AMD_CLASSES] + [
    _amd_spec(fam, cls, 128, False, False, large_grid=True)
    for fam in AMD_CLASSES
    for cls in _amd_classes(fam)
    if "scale_after_waves" in PIPELINED_CONFIGS[cls]
] + [
    _amd_spec(fam, cls, 128, zeros, False, bf16=True)
    for fam in AMD_CLASSES
    for cls in _amd_planes_classes(fam)
    for zeros in (False, True)
] + [_amd_spec(fam, "rows16", 128, False, True, bf16=True) for fam in AMD_CLASSES] + [
    _amd_spec(fam, cls, 128, False, False, large_grid=True, bf16=True)
    for fam in AMD_CLASSES
    for cls in _amd_planes_classes(fam)
    if "scale_after_waves" in PIPELINED_CONFIGS[cls]
]
"""Every class an AMD family runs, g128 sym and g32 asym (act-order), the 16-row class into a decode step's
float32 accumulator (`w4a16.w4a16_accumulate`), and a class's g128 form with each weight scaled where large grids
launch it (``scale_after_waves``); for bf16 every class its planes run, g128 sym and asym (act-order g128), into an
accumulator, and the float32 form of large grids."""
