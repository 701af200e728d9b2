"""Triton kernel behind `optimum_amdx.kernels.act_mul` (SiLU(gate) * up).

Grid (rows, column blocks): each program reads BLOCK gate and BLOCK up values of one row (16-byte
vector loads when the block is a multiple of 8 halves per thread) and writes BLOCK outputs.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import triton
import triton.language as tl

from ._pairs import pair_halves, pair_join
from ._pdl import pdl_begin
from .compile_spec import CompileSpec
from .runtime import pdl_for


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                     ACCUM: tl.constexpr = False, PAIRED: tl.constexpr = False):
    if PDL:  # programmatic dependent launch (`runtime.pdl_enabled`): let the next kernel launch, wait for the last
        pdl_begin()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PAIRED:  # the output in the W4A16 pair order (n_cols % 128 == 0): each block's halves, interleaved
        NB: tl.constexpr = BLOCK // 128
        c0 = pair_halves(tl.program_id(1) * NB, NB)
        y = pair_join(_silu_mul(x_ptr + row * x_stride, c0, n_cols, y_ptr.dtype.element_ty, ACCUM),
                      _silu_mul(x_ptr + row * x_stride, c0 + 64, n_cols, y_ptr.dtype.element_ty, ACCUM), NB)
    else:
        y = _silu_mul(x_ptr + row * x_stride, cols, n_cols, y_ptr.dtype.element_ty, ACCUM)
    tl.store(y_ptr + row * y_stride + cols, y, mask=mask)


@triton.jit
def _silu_mul(x_ptr, cols, n_cols, out_ty: tl.constexpr, ACCUM: tl.constexpr):
    """SiLU(gate) * up at columns `cols` of one row (gate at x_ptr, up n_cols further), in `out_ty`."""
    mask = cols < n_cols
    g = tl.load(x_ptr + cols, mask=mask, other=0.0)
    u = tl.load(x_ptr + n_cols + cols, mask=mask, other=0.0)
    if ACCUM:  # a float32 W4A16 accumulator: round as the matmul's own store would have, then zero it (each
        # thread zeroes only the elements it loaded itself, after its own loads: no barrier needed)
        g = g.to(out_ty)
        u = u.to(out_ty)
        tl.store(x_ptr + cols, tl.zeros(cols.shape, dtype=tl.float32), mask=mask)
        tl.store(x_ptr + n_cols + cols, tl.zeros(cols.shape, dtype=tl.float32), mask=mask)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # SiLU in float32, rounded like torch's half SiLU
    return (act.to(tl.float32) * u.to(tl.float32)).to(out_ty)


def launch_config(family: str, n_cols: int) -> dict[str, Any]:
    """Column block and warps: 1024 columns per program with 4 warps (8 halves per thread)."""
    del family
    block = min(1024, triton.next_power_of_2(n_cols))
    return {"BLOCK": block, "num_warps": max(1, min(4, block // 256)), "num_stages": 1}


def silu_and_mul_triton(gate_up: torch.Tensor, family: str, out_dtype: Optional[torch.dtype] = None,
                        paired: bool = False) -> torch.Tensor:
    """Launch `_silu_mul_kernel` on ``[..., 2I]``; returns ``[..., I]``. `out_dtype`: gate_up is a float32
    W4A16 accumulator (contiguous), read rounded to that dtype and left zeroed. `paired`: the output in the
    W4A16 pair order (`_pairs`)."""
    n = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, 2 * n)
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=out_dtype or gate_up.dtype, device=gate_up.device)
    cfg = launch_config(family, n)
    block = cfg.pop("BLOCK")
    pdl = pdl_for(x, "silu_mul", x.shape[0])
    _silu_mul_kernel[(x.shape[0], triton.cdiv(n, block))](x, y, n, x.stride(0), y.stride(0), BLOCK=block,
                                                           PDL=pdl, ACCUM=out_dtype is not None, PAIRED=paired,
                                                           launch_pdl=pdl,
                                                           **cfg)
    return y.reshape(*gate_up.shape[:-1], n)


def _spec(n: int, dtype: str, accum: bool = False) -> CompileSpec:
    cfg = launch_config("cdna3", n)
    block = cfg.pop("BLOCK")
    return CompileSpec(
        name=f"silu_and_mul[i{n},{dtype}{',accum' if accum else ''}]",
        kernel=_silu_mul_kernel,
        signature={"x_ptr": "*fp32" if accum else f"*{dtype}", "y_ptr": f"*{dtype}", "n_cols": "i32", "x_stride": "i32",
                   "y_stride": "i32", "BLOCK": "constexpr", "ACCUM": "constexpr"},
        constexprs={"BLOCK": block, "ACCUM": accum},
        options=lambda arch: dict(cfg),
        hot=True,
        uses_dot=False,
        divisible_by_16=("n_cols", "x_stride", "y_stride"),
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [_spec(14336, "fp16"), _spec(11008, "bf16"), _spec(14336, "fp16", accum=True)]
