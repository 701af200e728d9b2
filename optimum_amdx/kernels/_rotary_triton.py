"""Triton kernel, launch config and AMD compile specs of `optimum_amdx.kernels.rotary` (the front).

One program per token rotates all query and key heads of that token; cos/sin are read once per token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_spec import CompileSpec
from .triton_compat import PINNED_COMPILE_OPTIONS

__all__ = ["rotary_triton_", "AMD_COMPILE_SPECS"]


@triton.jit
def _rotate_heads(base, tok_stride, head_stride, t, n_heads, c, s, offs_h, offs_p,
                  HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    ptr = base + t * tok_stride + offs_h[:, None] * head_stride
    if INTERLEAVED:
        # one contiguous load of the rotated features, split into (even, odd) pairs in registers
        BLOCK_P: tl.constexpr = offs_p.shape[0]
        offs_d = tl.arange(0, 2 * BLOCK_P)
        mask = (offs_h[:, None] < n_heads) & (offs_d[None, :] < 2 * HALF)
        x = tl.load(ptr + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(x, [offs_h.shape[0], BLOCK_P, 2]))
        y = tl.reshape(tl.join(a * c - b * s, b * c + a * s), [offs_h.shape[0], 2 * BLOCK_P])
        tl.store(ptr + offs_d[None, :], y.to(base.dtype.element_ty), mask=mask)
    else:
        mask = (offs_h[:, None] < n_heads) & (offs_p[None, :] < HALF)
        pa = ptr + offs_p[None, :]
        pb = pa + HALF
        a = tl.load(pa, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(pb, mask=mask, other=0.0).to(tl.float32)
        tl.store(pa, (a * c - b * s).to(base.dtype.element_ty), mask=mask)
        tl.store(pb, (b * c + a * s).to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr,
    q_tok_stride, q_head_stride, k_tok_stride, k_head_stride, table_stride,
    n_q_heads, n_k_heads,
    HALF: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t)
    offs_p = tl.arange(0, BLOCK_P)
    pmask = offs_p < HALF
    c = tl.load(cos_ptr + pos * table_stride + offs_p, mask=pmask, other=0.0)[None, :]
    s = tl.load(sin_ptr + pos * table_stride + offs_p, mask=pmask, other=0.0)[None, :]
    _rotate_heads(q_ptr, q_tok_stride, q_head_stride, t, n_q_heads, c, s, tl.arange(0, BLOCK_HQ), offs_p,
                  HALF, INTERLEAVED)
    _rotate_heads(k_ptr, k_tok_stride, k_head_stride, t, n_k_heads, c, s, tl.arange(0, BLOCK_HK), offs_p,
                  HALF, INTERLEAVED)


def _num_warps(elems: int) -> int:
    """Launch config (the same on every arch): one warp per 512 rotated elements, 1 to 8 warps."""
    return max(1, min(8, elems // 512))


def rotary_triton_(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    positions: torch.Tensor, interleaved: bool = False,
) -> None:
    """Launch the kernel in place on inputs the front has validated (unit last stride, tokens > 0)."""
    half = cos.shape[-1]
    cos_c = cos.to(torch.float32).contiguous()
    sin_c = sin.to(torch.float32).contiguous()
    block_p = triton.next_power_of_2(half)
    block_hq = triton.next_power_of_2(q.shape[1])
    block_hk = triton.next_power_of_2(k.shape[1])
    _rotary_kernel[(q.shape[0],)](
        q, k, cos_c, sin_c, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_c.stride(0),
        q.shape[1], k.shape[1],
        HALF=half, BLOCK_P=block_p, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, INTERLEAVED=interleaved,
        num_warps=_num_warps(block_hq * block_p * 2), **PINNED_COMPILE_OPTIONS,
    )


def _rotary_spec(hq: int, hk: int, d: int, dtype: str, interleaved: bool) -> CompileSpec:
    half = d // 2
    sig = {
        "q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64",
        "q_tok_stride": "i32", "q_head_stride": "i32", "k_tok_stride": "i32", "k_head_stride": "i32",
        "table_stride": "i32", "n_q_heads": "i32", "n_k_heads": "i32",
        "HALF": "constexpr", "BLOCK_P": "constexpr", "BLOCK_HQ": "constexpr", "BLOCK_HK": "constexpr",
        "INTERLEAVED": "constexpr",
    }
    bq = triton.next_power_of_2(hq)
    return CompileSpec(
        name=f"rotary[{'gptj' if interleaved else 'neox'},hq{hq},hkv{hk},d{d},{dtype}]",
        kernel=_rotary_kernel,
        signature=sig,
        constexprs={"HALF": half, "BLOCK_P": triton.next_power_of_2(half), "BLOCK_HQ": bq,
                    "BLOCK_HK": triton.next_power_of_2(hk), "INTERLEAVED": interleaved},
        options=lambda arch: {"num_warps": _num_warps(bq * triton.next_power_of_2(half) * 2), "num_stages": 1},
        hot=True,
        uses_dot=False,
        divisible_by_16=("q_tok_stride", "q_head_stride", "k_tok_stride", "k_head_stride", "table_stride"),
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [
    _rotary_spec(32, 8, 128, "fp16", False),
    _rotary_spec(32, 32, 128, "bf16", False),
    _rotary_spec(16, 16, 64, "fp16", True),
]
