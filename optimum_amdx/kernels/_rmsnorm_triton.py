"""Triton kernel, launch config and AMD compile specs of `optimum_amdx.kernels.rmsnorm` (the front).

One program per row: the row is loaded once, reduced in float32 and written back (with the residual
sum when fused). Rounding follows the front's docstring (HF LlamaRMSNorm).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import triton
import triton.language as tl

from ._pairs import pair_halves, pair_join, pair_source
from ._pdl import pdl_begin
from .compile_spec import CompileSpec
from .runtime import pdl_for
from .triton_compat import PINNED_COMPILE_OPTIONS

__all__ = ["rms_norm_triton", "AMD_COMPILE_SPECS"]


@triton.jit
def _rms_norm_paired(x_ptr, res_ptr, c0, w0, w1, y_ptr, h_ptr, n_cols, eps, HAS_RESIDUAL: tl.constexpr,
                     BLOCK: tl.constexpr, ACCUM: tl.constexpr):
    """One row (pointers at its start) with the normalized output in the W4A16 pair order and no permutation:
    the row is read as the two halves of each 128-value block (`pair_halves`: `c0`, and c0 + 64) and the results
    interleaved in registers (`pair_join`), with the rounding of the kernel's plain path. `w0` / `w1`: the weight at
    those halves, loaded by the caller (before its PDL wait)."""
    NB: tl.constexpr = BLOCK // 128
    c1 = c0 + 64
    m0 = c0 < n_cols
    m1 = c1 < n_cols
    x0 = tl.load(x_ptr + c0, mask=m0, other=0.0)
    x1 = tl.load(x_ptr + c1, mask=m1, other=0.0)
    if HAS_RESIDUAL:
        r0 = tl.load(res_ptr + c0, mask=m0, other=0.0)
        r1 = tl.load(res_ptr + c1, mask=m1, other=0.0)
    if ACCUM:
        in_ty = h_ptr.dtype.element_ty
        x0 = x0.to(in_ty)
        x1 = x1.to(in_ty)
    else:
        in_ty = x0.dtype
    f0 = x0.to(tl.float32)
    f1 = x1.to(tl.float32)
    if HAS_RESIDUAL:
        h0 = (f0 + r0.to(tl.float32)).to(in_ty)
        h1 = (f1 + r1.to(tl.float32)).to(in_ty)
        tl.store(h_ptr + c0, h0, mask=m0)
        tl.store(h_ptr + c1, h1, mask=m1)
        f0 = h0.to(tl.float32)
        f1 = h1.to(tl.float32)
    var = (tl.sum(tl.sum(f0 * f0, axis=1), axis=0) + tl.sum(tl.sum(f1 * f1, axis=1), axis=0)) / n_cols
    rstd = tl.math.rsqrt(var + eps)
    out_ty = y_ptr.dtype.element_ty
    y0 = w0.to(out_ty).to(tl.float32) * (f0 * rstd).to(in_ty).to(out_ty).to(tl.float32)
    y1 = w1.to(out_ty).to(tl.float32) * (f1 * rstd).to(in_ty).to(out_ty).to(tl.float32)
    pos = tl.arange(0, BLOCK)
    tl.store(y_ptr + pos, pair_join(y0.to(out_ty), y1.to(out_ty), NB), mask=pos < n_cols)
    if ACCUM:  # leave the accumulator zeroed (after every thread's reads of the row)
        tl.debug_barrier()
        tl.store(x_ptr + c0, tl.zeros([NB, 64], dtype=tl.float32), mask=m0)
        tl.store(x_ptr + c1, tl.zeros([NB, 64], dtype=tl.float32), mask=m1)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, perm_ptr,
    n_cols, x_stride, res_stride, y_stride, h_stride, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, HAS_PERM: tl.constexpr = False,
    PDL: tl.constexpr = False, ACCUM: tl.constexpr = False, PAIRED: tl.constexpr = False,
):
    # PDL (programmatic dependent launch, `runtime.pdl_enabled`): let the next kernel launch, then wait for the
    # last. The weight (and the permutation) are the model's: no kernel of the step writes them, so they are loaded
    # before the wait, while the kernel before still runs, and the row's reads after it are the only trip left.
    row = tl.program_id(0).to(tl.int64)
    if PAIRED and not HAS_PERM:
        c0 = pair_halves(0, BLOCK // 128)
        w0 = tl.load(w_ptr + c0, mask=c0 < n_cols, other=0.0)
        w1 = tl.load(w_ptr + c0 + 64, mask=c0 + 64 < n_cols, other=0.0)
        if PDL:
            pdl_begin()
        _rms_norm_paired(x_ptr + row * x_stride, res_ptr + row * res_stride, c0, w0, w1, y_ptr + row * y_stride,
                         h_ptr + row * h_stride, n_cols, eps, HAS_RESIDUAL, BLOCK, ACCUM)
        return
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    GATHER: tl.constexpr = HAS_PERM or PAIRED
    if GATHER:
        # y[j] is the normalized input column perm[j] (with PAIRED, position j of the W4A16 pair order is
        # perm[pair_source(j)]): the row is read a second time, from there, and h re-formed there, so h
        # is still written in order (a store through perm would cost the compiler a shared-memory layout
        # change of the whole row)
        if PAIRED:
            pos = pair_source(cols)
        else:
            pos = cols
        if HAS_PERM:
            src = tl.load(perm_ptr + pos, mask=mask, other=0)
        else:
            src = pos
    else:
        src = cols
    w = tl.load(w_ptr + src, mask=mask, other=0.0)
    if PDL:
        pdl_begin()
    # Every global load is issued before the row's reduction: loads after it would wait behind its
    # barrier, a memory round trip more per call (with perm, the gathered row).
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
    if GATHER:
        xg = tl.load(x_ptr + row * x_stride + src, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            rg = tl.load(res_ptr + row * res_stride + src, mask=mask, other=0.0)
    # Arithmetic in float32, rounded to the storage dtype where HF rounds: one fp32 add or
    # multiply of two fp16/bf16 values rounded once equals the native half-precision operation.
    if ACCUM:  # x is a float32 W4A16 accumulator: round it as the matmul's own store would have
        in_ty = h_ptr.dtype.element_ty
        x = x.to(in_ty)
        if GATHER:
            xg = xg.to(in_ty)
    else:
        in_ty = x.dtype
    xf = x.to(tl.float32)
    if HAS_RESIDUAL:
        h = (xf + r.to(tl.float32)).to(in_ty)
        tl.store(h_ptr + row * h_stride + cols, h, mask=mask)
        xf = h.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    if GATHER:
        xf = xg.to(tl.float32)
        if HAS_RESIDUAL:
            xf = (xf + rg.to(tl.float32)).to(in_ty).to(tl.float32)
    normed = (xf * tl.math.rsqrt(var + eps)).to(in_ty)
    out_ty = y_ptr.dtype.element_ty
    y = w.to(out_ty).to(tl.float32) * normed.to(out_ty).to(tl.float32)
    tl.store(y_ptr + row * y_stride + cols, y.to(out_ty), mask=mask)
    if ACCUM:  # leave the accumulator zeroed for the next matmul (after every thread's reads of the row)
        tl.debug_barrier()
        tl.store(x_ptr + row * x_stride + cols, tl.zeros([BLOCK], dtype=tl.float32), mask=mask)


def _num_warps(block: int) -> int:
    """Launch config (the same on every arch): one warp per 256 columns, 1 to 16 warps."""
    return max(1, min(16, block // 256))


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None,
    perm: Optional[torch.Tensor] = None, accumulated: bool = False, paired: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Launch the kernel on inputs the front has validated (GPU tensors or the interpreter). `accumulated`:
    x is a contiguous float32 W4A16 accumulator, read in the residual's dtype and left zeroed. `paired`: the
    output in the W4A16 pair order (`_pairs`), after `perm` when both are given."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    act_dtype = residual.dtype if accumulated else x.dtype
    out_dtype = torch.promote_types(weight.dtype, act_dtype)
    y = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if residual is not None:
        r2 = residual.reshape(-1, hidden)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        r2 = r2.to(act_dtype)
        h = torch.empty(x2.shape, dtype=act_dtype, device=x.device)
    else:
        r2, h = x2, y
    block = triton.next_power_of_2(hidden)
    pdl = pdl_for(x2, "rmsnorm", x2.shape[0])
    _rms_norm_kernel[(x2.shape[0],)](
        x2, r2, weight, y, h, perm if perm is not None else x2,
        hidden, x2.stride(0), r2.stride(0), y.stride(0), h.stride(0), eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, HAS_PERM=perm is not None, PDL=pdl, ACCUM=accumulated,
        PAIRED=paired, launch_pdl=pdl, num_warps=_num_warps(block), **PINNED_COMPILE_OPTIONS,
    )
    y = y.reshape(x.shape)
    return y if residual is None else (y, h.reshape(x.shape))


def _rms_spec(hidden: int, dtype: str, residual: bool, perm: bool = False, accum: bool = False) -> CompileSpec:
    block = triton.next_power_of_2(hidden)
    sig = {
        "x_ptr": "*fp32" if accum else f"*{dtype}", "res_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "y_ptr": f"*{dtype}",
        "h_ptr": f"*{dtype}", "perm_ptr": "*i32", "n_cols": "i32", "x_stride": "i32", "res_stride": "i32",
        "y_stride": "i32", "h_stride": "i32", "eps": "fp32", "HAS_RESIDUAL": "constexpr", "BLOCK": "constexpr",
        "HAS_PERM": "constexpr", "ACCUM": "constexpr",
    }
    tags = (",residual" if residual else "") + (",perm" if perm else "") + (",accum" if accum else "")
    return CompileSpec(
        name=f"rms_norm[h{hidden},{dtype}{tags}]",
        kernel=_rms_norm_kernel,
        signature=sig,
        constexprs={"HAS_RESIDUAL": residual, "BLOCK": block, "HAS_PERM": perm, "ACCUM": accum},
        options=lambda arch: {"num_warps": _num_warps(block), "num_stages": 1},
        hot=True,
        uses_dot=False,
        divisible_by_16=("n_cols", "x_stride", "res_stride", "y_stride", "h_stride"),
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [
    _rms_spec(4096, "fp16", True),
    _rms_spec(4096, "bf16", False),
    _rms_spec(8192, "fp16", True),
    _rms_spec(4096, "fp16", True, perm=True),
    _rms_spec(4096, "fp16", True, accum=True),  # a W4A16 accumulator's reader (one-row GPTQ decode)
    _rms_spec(4096, "bf16", True, perm=True, accum=True),
]
