"""Rotary position embedding applied in place to Q and K.

``q [tokens, Hq, D]`` and ``k [tokens, Hkv, D]`` (any strides with a unit last stride, e.g. views
of a fused QKV projection), ``cos``/``sin`` ``[max_pos, rot_dim // 2]`` float32 tables and
``positions [tokens]`` int64. The first ``rot_dim`` features of each head are rotated; the rest
(partial rotary) are left untouched.

- ``interleaved=False`` (NeoX / HF-Llama ``rotate_half``): pairs ``(i, i + rot_dim/2)``.
- ``interleaved=True`` (GPT-J): pairs ``(2i, 2i + 1)``.

Each pair ``(a, b)`` becomes ``(a cos - b sin, b cos + a sin)``, computed in float32 and stored
in the tensor's dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ..errors import InvalidArgumentError
from .compile_spec import CompileSpec
from .runtime import use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["rotary_embedding_", "rotary_embedding_reference", "AMD_COMPILE_SPECS"]


def _pair_views(x: "torch.Tensor", rot_dim: int, interleaved: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
    if interleaved:
        return x[..., 0:rot_dim:2], x[..., 1:rot_dim:2]
    half = rot_dim // 2
    return x[..., :half], x[..., half:rot_dim]


def rotary_embedding_reference(
    q: "torch.Tensor", k: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor",
    positions: "torch.Tensor", interleaved: bool = False,
) -> None:
    """PyTorch reference of `rotary_embedding_` (in place, float32 math)."""
    rot_dim = 2 * cos.shape[-1]
    c = cos[positions].float().unsqueeze(1)
    s = sin[positions].float().unsqueeze(1)
    for t in (q, k):
        a, b = _pair_views(t, rot_dim, interleaved)
        af, bf = a.float(), b.float()
        new_a = af * c - bf * s
        new_b = bf * c + af * s
        a.copy_(new_a.to(t.dtype))
        b.copy_(new_b.to(t.dtype))


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
    return max(1, min(8, elems // 512))


def rotary_embedding_(
    q: "torch.Tensor", k: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor",
    positions: "torch.Tensor", interleaved: bool = False,
) -> None:
    """Rotate the first ``2 * cos.shape[-1]`` features of every head of q and k, in place."""
    import torch

    if q.dim() != 3 or k.dim() != 3:
        raise InvalidArgumentError(f"q and k must be [tokens, heads, head_dim]; got {tuple(q.shape)} and {tuple(k.shape)}.")
    half = cos.shape[-1]
    rot_dim = 2 * half
    if rot_dim > q.shape[-1] or rot_dim > k.shape[-1]:
        raise InvalidArgumentError(f"rotary dim {rot_dim} (2 x cos.shape[-1]) exceeds head_dim {q.shape[-1]}.")
    if cos.shape != sin.shape:
        raise InvalidArgumentError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have the same shape.")
    if positions.shape != (q.shape[0],) or k.shape[0] != q.shape[0]:
        raise InvalidArgumentError(
            f"positions {tuple(positions.shape)} must be [tokens] with tokens = q.shape[0] = k.shape[0] "
            f"({q.shape[0]}, {k.shape[0]})."
        )
    if not use_triton(q, k, cos, sin, positions) or q.shape[0] == 0 or q.stride(-1) != 1 or k.stride(-1) != 1:
        rotary_embedding_reference(q, k, cos, sin, positions, interleaved)
        return
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
        num_warps=_num_warps(block_hq * block_p * 2),
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
