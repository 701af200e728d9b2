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

from ..errors import InvalidArgumentError
from .runtime import use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["rotary_embedding_", "rotary_embedding_reference"]


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


def rotary_embedding_(
    q: "torch.Tensor", k: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor",
    positions: "torch.Tensor", interleaved: bool = False,
) -> None:
    """Rotate the first ``2 * cos.shape[-1]`` features of every head of q and k, in place."""
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
    from ._rotary_triton import rotary_triton_

    rotary_triton_(q, k, cos, sin, positions, interleaved)
