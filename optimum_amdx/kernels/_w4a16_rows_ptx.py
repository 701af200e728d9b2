"""The few-row W4A16 kernel on NVIDIA: up to `ROWS_MAX` rows of fp16 activations, each weight
dequantized once per tile and reused by every row, no dot padded to 16 rows.

Why a kernel of its own: at a few rows a decode step is still a weight read (the bytes do not grow
with the rows), but the fused GEMM (`_w4a16_gemm_triton`) pads the rows to a 16-row MMA operand and
takes about 2.2x the one-row stream kernel's time at 2 rows (H100, benchmarks/RESULTS.md, section
w4gemm). This kernel is the one-row packed loop of `_w4a16_triton` (persistent stream-K grid, same
tile-major layout, same flush and ticket, same exact ``q - z`` in fp16x2) with the dequantization
split from the products: one asm per word makes the four fp16x2 pairs ``q - z`` (1 shift, 4 LOP3,
4 HADD2/HFMA2), then each row adds its products (4 HFMA2 per word, fp16 sums of at most 8 products
per half, one float32 FMA by the group's scale per word pair).

Where it wins (H100, section w4rows): 2 rows 1.6x and 3 rows 1.2x faster than the fused GEMM on the
large Llama weights; from 4 rows on it loses, because each row adds an accumulator tile and its
activation pairs to every thread's registers, fewer warps fit per SM, and the loop is latency-bound
(Nsight Compute: 3.9 active warps per scheduler at 4 rows). Since round 17 the dispatcher sends it 2-3 rows of
act-order weights only (`w4a16.dispatch_route`): without act-order the pipelined GEMM's staged 16-row class is
1.02-1.31x faster at 2 rows and 1.31-1.62x at 3, with act-order 0.47-0.73x (RESULTS.md round17). The limit is
`w4a16.ROUTE_LIMITS`; the kernel takes 1..`ROWS_MAX` rows when forced (benchmarks, tests).

NVIDIA only (inline PTX); AMD, bf16, 16-row groups and the interpreter take the fused GEMM. The
module holds no AMD compile spec (hence not a `_*_triton` module) and moves no line of
`_w4a16_triton` (its kernels' cache keys, and so the committed AMD compile tables, stay as they are).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import triton
import triton.language as tl

from ._w4a16_triton import (
    TILE_K,
    TILE_N,
    XPACK_BLOCK,
    _RESIDENT,
    _chunks,
    _flush_row,
    _group_arg,
    _group_consts,
    _resident_programs,
    _w4a16_xpack_kernel,
    _workspace,
    _xpair,
    launch_options,
    stream_grid,
)

if TYPE_CHECKING:
    from .w4a16 import W4A16Weight

ROWS_MAX = 4
"""The most rows one program carries (one float32 accumulator tile per row). 8 rows were measured
and lost to the fused GEMM on every shape, 1.3-2.1x slower with the default config (section
w4rows); 4 stay for layouts where they win (act-order g32: 43.6 vs 70.2 us on 4096x14336)."""

_DEQ_ASM = tl.constexpr("""{
.reg .b32 w8, c16, p0, p1, p2, p3;
shr.u32 w8, $4, 8;
lop3.b32 p0, $4, 0x000f000f, 0x64006400, 0xea;
lop3.b32 p1, $4, 0x00f000f0, 0x64006400, 0xea;
lop3.b32 p2, w8, 0x000f000f, 0x64006400, 0xea;
lop3.b32 p3, w8, 0x00f000f0, 0x64006400, 0xea;
mov.b32 c16, 0x2c002c00;
add.f16x2 $0, p0, $5;
fma.rn.f16x2 $1, p1, c16, $6;
add.f16x2 $2, p2, $7;
fma.rn.f16x2 $3, p3, c16, $8;
}""")
"""One word -> four fp16x2 pairs of exact ``q - z``: pair j holds nibbles (j, j + 4), i.e. input rows
j*16 + r and (j + 4)*16 + r. LOP3 puts a nibble into the mantissa of 1024.0 (or 16x that nibble for
the odd planes, scaled back by 1/16 in the FMA); adding the negated bias pair ``-(1024 + z)`` (or
``-(64 + z)``) leaves ``q - z``. Bias pairs: `_bias_pairs`; planes 2|6 and 3|7 take the second pair
(a different group when a tile holds four)."""


def _rowdot_asm(chunks: int) -> str:
    """PTX for `_rowdot`: four words (pack=4: input rows r..r+3 of one column, held by one thread)
    of already dequantized pairs, ``acc[e] += s_e * sum((q - z) * x)`` for the tile's group slots e
    (`chunks` of them; the other accumulators pass through). Products are summed in fp16 over at
    most 8 per half before the float32 conversion, as in `_w4a16_triton._dot32_asm`."""
    ins = ["acc", "p0", "p1", "p2", "p3", "x0", "x1", "x2", "x3"] + [f"s{e}" for e in range(chunks)]
    op = {name: [4 + 4 * i + e for e in range(4)] for i, name in enumerate(ins)}
    lines = [".reg .b32 a, b;", ".reg .b16 lo, hi;", ".reg .f32 t0, t1, t2, t3, f;"]

    def fma(dst: str, plane: int, e: int, first: bool) -> None:
        p, x = f"${op[f'p{plane}'][e]}", f"${op[f'x{plane}'][e]}"
        lines.append(f"mul.f16x2 {dst}, {p}, {x};" if first else f"fma.rn.f16x2 {dst}, {p}, {x}, {dst};")

    if chunks == 4:  # a: planes (0|4, 1|5) = groups 0|2; b: planes (2|6, 3|7) = groups 1|3
        for e in range(4):
            fma("a", 0, e, e == 0)
            fma("a", 1, e, False)
            fma("b", 2, e, e == 0)
            fma("b", 3, e, False)
        lines += ["mov.b32 {lo, hi}, a;", "cvt.f32.f16 t0, lo;", "cvt.f32.f16 t2, hi;",
                  "mov.b32 {lo, hi}, b;", "cvt.f32.f16 t1, lo;", "cvt.f32.f16 t3, hi;"]
        lines += [f"fma.rn.f32 ${e}, ${op[f's{e}'][0]}, t{e}, ${op['acc'][e]};" for e in range(4)]
    else:
        for run in range(2):
            for e in (2 * run, 2 * run + 1):
                for plane in range(4):
                    fma("a", plane, e, e == 2 * run and plane == 0)
            lines += ["mov.b32 {lo, hi}, a;", f"cvt.f32.f16 t{2 * run}, lo;", f"cvt.f32.f16 t{2 * run + 1}, hi;"]
        if chunks == 1:
            lines += ["add.f32 t0, t0, t1;", "add.f32 t2, t2, t3;", "add.f32 f, t0, t2;",
                      f"fma.rn.f32 $0, ${op['s0'][0]}, f, ${op['acc'][0]};"]
            rest = (1, 2, 3)
        else:  # lo halves (planes 0-3): group slot 0, hi halves (planes 4-7): slot 1
            lines += ["add.f32 t0, t0, t2;", "add.f32 t1, t1, t3;",
                      f"fma.rn.f32 $0, ${op['s0'][0]}, t0, ${op['acc'][0]};",
                      f"fma.rn.f32 $1, ${op['s1'][0]}, t1, ${op['acc'][1]};"]
            rest = (2, 3)
        lines += [f"mov.f32 ${e}, ${op['acc'][e]};" for e in rest]
    return "{\n" + "\n".join(lines) + "\n}"


def _rowdot_constraints(chunks: int) -> str:
    return ",".join(["=f"] * 4 + ["f"] * 4 + ["r"] * 32 + ["f"] * (4 * chunks))


_ROWDOT_ASM_1 = tl.constexpr(_rowdot_asm(1))
_ROWDOT_ASM_2 = tl.constexpr(_rowdot_asm(2))
_ROWDOT_ASM_4 = tl.constexpr(_rowdot_asm(4))
_ROWDOT_CON_1 = tl.constexpr(_rowdot_constraints(1))
_ROWDOT_CON_2 = tl.constexpr(_rowdot_constraints(2))
_ROWDOT_CON_4 = tl.constexpr(_rowdot_constraints(4))


@triton.jit
def _deq_pairs(w, zl0, zh0, zl1, zh1):
    """The four fp16x2 ``q - z`` pairs of every word of a tile (see `_DEQ_ASM`)."""
    return tl.inline_asm_elementwise(_DEQ_ASM, "=r,=r,=r,=r,r,r,r,r,r", [w, zl0, zh0, zl1, zh1],
                                     dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _rowdot(acc, p0, p1, p2, p3, x0, x1, x2, x3, s0, s1, s2, s3, CHUNKS: tl.constexpr):
    """One row's accumulator tile plus its scaled products with the dequantized pairs (`_rowdot_asm`)."""
    if CHUNKS == 1:
        return tl.inline_asm_elementwise(_ROWDOT_ASM_1, _ROWDOT_CON_1, [acc, p0, p1, p2, p3, x0, x1, x2, x3, s0],
                                         dtype=tl.float32, is_pure=True, pack=4)
    elif CHUNKS == 2:
        return tl.inline_asm_elementwise(_ROWDOT_ASM_2, _ROWDOT_CON_2,
                                         [acc, p0, p1, p2, p3, x0, x1, x2, x3, s0, s1],
                                         dtype=tl.float32, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(_ROWDOT_ASM_4, _ROWDOT_CON_4,
                                         [acc, p0, p1, p2, p3, x0, x1, x2, x3, s0, s1, s2, s3],
                                         dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _row_step(acc, row, p0, p1, p2, p3, x_ptr, xp_ptr, stride_xm, KT, k0, kt, offs_r, s0, s1, s2, s3,
              CHUNKS: tl.constexpr, XPREP: tl.constexpr):
    """Row `row` meets the tile: its four activation-pair vectors, then `_rowdot`."""
    xr = x_ptr + row * stride_xm
    pr = xp_ptr + row * KT * 64
    x0 = _xpair(xr, pr, k0, kt, offs_r, 0, XPREP)
    x1 = _xpair(xr, pr, k0, kt, offs_r, 1, XPREP)
    x2 = _xpair(xr, pr, k0, kt, offs_r, 2, XPREP)
    x3 = _xpair(xr, pr, k0, kt, offs_r, 3, XPREP)
    return _rowdot(acc, p0, p1, p2, p3, x0, x1, x2, x3, s0, s1, s2, s3, CHUNKS)


@triton.jit
def _w4a16_rows_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, xp_ptr,
    N, K, KT, NB, stride_xm, stride_om, n_units,
    ROWS: tl.constexpr, GROUP_SIZE: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, XPREP: tl.constexpr,
):
    # Tile = [BLOCK_N, 16] words = [BLOCK_N columns, 128 rows]; unit u = column block u // KT, K tile u % KT.
    tl.static_assert(ROWS <= 4, "at most 4 rows per program")
    TILE_WORDS: tl.constexpr = BLOCK_N * 16
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    u0 = pid * n_units // n_prog
    u1 = (pid + 1) * n_units // n_prog
    offs_loc = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, 16)
    tile_offs = offs_loc[:, None] * 16 + offs_r[None, :]
    acc0 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    cur = tl.load(qw_ptr + u0 * TILE_WORDS + tile_offs)
    for u in range(u0, u1):
        # prefetch the next tile (the last iteration reloads its own, an L2 hit) before computing this one
        nxt = tl.load(qw_ptr + tl.minimum(u + 1, u1 - 1) * TILE_WORDS + tile_offs)
        nb = u // KT
        kt = u - nb * KT
        k0 = kt * 128
        offs_n = nb * BLOCK_N + offs_loc
        # the tile's scales and bias pairs as [BLOCK_N, 1] columns (`_group_consts`); the stream module's
        # `_tile_consts` (1-D, expanded) measured 1.65x slower for act-order g32 at 2 rows (H100, w4rows)
        zl0, zh0, zl1, zh1, s0, s1, s2, s3 = _group_consts(s_ptr, z_ptr, k0, offs_n, N, K, GROUP_SIZE, CHUNKS,
                                                           HAS_ZEROS, EVEN_K)
        p0, p1, p2, p3 = _deq_pairs(cur, zl0, zh0, zl1, zh1)
        acc0 = _row_step(acc0, 0, p0, p1, p2, p3, x_ptr, xp_ptr, stride_xm, KT, k0, kt, offs_r, s0, s1, s2, s3,
                         CHUNKS, XPREP)
        if ROWS > 1:
            acc1 = _row_step(acc1, 1, p0, p1, p2, p3, x_ptr, xp_ptr, stride_xm, KT, k0, kt, offs_r, s0, s1, s2, s3,
                             CHUNKS, XPREP)
        if ROWS > 2:
            acc2 = _row_step(acc2, 2, p0, p1, p2, p3, x_ptr, xp_ptr, stride_xm, KT, k0, kt, offs_r, s0, s1, s2, s3,
                             CHUNKS, XPREP)
        if ROWS > 3:
            acc3 = _row_step(acc3, 3, p0, p1, p2, p3, x_ptr, xp_ptr, stride_xm, KT, k0, kt, offs_r, s0, s1, s2, s3,
                             CHUNKS, XPREP)
        cur = nxt
        if (kt == KT - 1) | (u == u1 - 1):
            # each row flushes on its own ticket (row r's counters sit at cnt_ptr + r * NB)
            _flush_row(acc0, nb, u0, u1, n_prog, n_units, KT, NB, N, 0, offs_loc, out_ptr, ws_ptr, cnt_ptr,
                       bias_ptr, stride_om, BLOCK_N, HAS_BIAS)
            if ROWS > 1:
                _flush_row(acc1, nb, u0, u1, n_prog, n_units, KT, NB, N, 1, offs_loc, out_ptr, ws_ptr, cnt_ptr,
                           bias_ptr, stride_om, BLOCK_N, HAS_BIAS)
            if ROWS > 2:
                _flush_row(acc2, nb, u0, u1, n_prog, n_units, KT, NB, N, 2, offs_loc, out_ptr, ws_ptr, cnt_ptr,
                           bias_ptr, stride_om, BLOCK_N, HAS_BIAS)
            if ROWS > 3:
                _flush_row(acc3, nb, u0, u1, n_prog, n_units, KT, NB, N, 3, offs_loc, out_ptr, ws_ptr, cnt_ptr,
                           bias_ptr, stride_om, BLOCK_N, HAS_BIAS)
            acc0 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
            acc1 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
            acc3 = tl.zeros([BLOCK_N, 16], dtype=tl.float32)


ROWS_CONFIG: dict[str, Any] = {"num_warps": 4, "programs_per_cu": 8}
"""Launch config (the persistent grid, capped by the compiled kernel's occupancy as in the stream
kernel). H100 sweep: 4 warps beat 8 at 3 rows (29.0 vs 37.7 us on 4096x14336) and tie at 2 and 4."""


def rows_eligible(arch: str, dtype: torch.dtype, w: "W4A16Weight") -> bool:
    """Whether this kernel can serve `w` at all: an NVIDIA target (inline PTX), fp16 activations
    (fp16 sums), at most four scale groups per 128-row tile, 4-bit. `arch` is "cpu" under the
    interpreter (`w4a16_matmul` sets it), so interpreted runs never take it."""
    nvidia = not arch.startswith("gfx") and arch != "cpu"
    return nvidia and dtype == torch.float16 and _chunks(_group_arg(w)) in (1, 2, 4) and w.bits == 4


def rows_matmul(x2: torch.Tensor, w: "W4A16Weight", bias: Optional[torch.Tensor], out: torch.Tensor, arch: str,
                config: Optional[dict[str, Any]] = None) -> None:
    """``out = x2 @ W (+ bias)`` for 2..`ROWS_MAX` rows (see the module docstring)."""
    m = x2.shape[0]
    if not 1 <= m <= ROWS_MAX:
        raise ValueError(f"the few-row kernel takes 1 to {ROWS_MAX} rows, got {m}")
    if not rows_eligible(arch, x2.dtype, w):
        raise ValueError("the few-row kernel needs an NVIDIA GPU, fp16 activations and at most 4 groups per 128 rows")
    k, n = w.in_features, w.out_features
    cfg = dict(config or ROWS_CONFIG)
    kt, nb = w.k_tiles, w.n_blocks
    n_units = kt * nb
    gs = _group_arg(w)
    xprep = w.perm is not None or k % TILE_K != 0 or bool(cfg.get("XPREP", False))
    xp = w.qweight
    if xprep:  # act-order / ragged K: each row's activation pairs gathered once per call
        xp = torch.empty(m, kt * 64, dtype=torch.int32, device=x2.device)
        for r in range(m):
            _w4a16_xpack_kernel[(triton.cdiv(kt * 64, XPACK_BLOCK),)](
                x2[r], w.perm if w.perm is not None else w.qweight, xp[r], k, kt * 64, HAS_PERM=w.perm is not None,
                BLOCK=XPACK_BLOCK, num_warps=4)
    key = ("rows", x2.device, m, cfg.get("num_warps"), cfg.get("maxnreg"), gs, w.zeros is not None,
           bias is not None, k % TILE_K == 0, xprep)
    grid = stream_grid(n_units, 1, cfg, x2.device, key)
    ws, cnt = _workspace(x2.device, n, m * nb)
    ck = _w4a16_rows_kernel[(grid,)](
        x2, w.qweight, w.scales, w.zeros if w.zeros is not None else w.scales,
        bias if bias is not None else w.scales, out, ws, cnt, xp,
        n, k, kt, nb, x2.stride(0), out.stride(0), n_units,
        ROWS=m, GROUP_SIZE=gs, CHUNKS=_chunks(gs), BLOCK_N=TILE_N, HAS_ZEROS=w.zeros is not None,
        HAS_BIAS=bias is not None, EVEN_K=k % TILE_K == 0, XPREP=xprep, **launch_options(cfg, arch),
    )
    if key not in _RESIDENT and x2.is_cuda:
        resident = _resident_programs(ck, x2.device)
        if resident is not None:
            _RESIDENT[key] = resident
