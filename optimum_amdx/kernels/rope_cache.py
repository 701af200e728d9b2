"""Rotary embedding and the paged-cache write as one pass (the decode step's q/k/v epilogue).

`rotary_and_cache_(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping)` rotates q in
place (NeoX / HF-Llama ``rotate_half`` pairs ``(i, i + rot_dim / 2)``, float32 math, stored in q's
dtype), rotates k the same way and writes the rotated k and the unchanged v into the block-paged
caches ``[num_blocks, block_size, Hkv, D]`` at ``slot_mapping`` (negative slots are skipped). It
replaces `rotary_embedding_` followed by `reshape_and_cache`: one launch instead of two, and k is
read once and never written back to the projection output (attention reads it from the cache).

This module imports no Triton; the kernel lives in `_rope_cache_triton`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .runtime import arch_family, device_arch, use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["rotary_and_cache_", "rotary_and_cache_reference", "rotary_and_cache_accumulated"]


def rotary_and_cache_reference(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor",
    positions: "torch.Tensor", k_cache: "torch.Tensor", v_cache: "torch.Tensor", slot_mapping: "torch.Tensor",
) -> None:
    """PyTorch reference: rotate q in place, write rotate(k) and v into the caches (k itself is left as is)."""
    import torch

    half = cos.shape[-1]
    c = cos[positions].to(torch.float32).unsqueeze(1)
    s = sin[positions].to(torch.float32).unsqueeze(1)

    def rotated(t: "torch.Tensor") -> "torch.Tensor":
        a = t[..., :half].to(torch.float32)
        b = t[..., half:2 * half].to(torch.float32)
        out = t.clone()
        out[..., :half] = (a * c - b * s).to(t.dtype)
        out[..., half:2 * half] = (b * c + a * s).to(t.dtype)
        return out

    q.copy_(rotated(q))
    k_rot = rotated(k)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k_rot[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[keep].to(v_cache.dtype)


def _check(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise InvalidArgumentError(
            f"q, k, v must be [tokens, heads, head_dim]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}."
        )
    tokens = q.shape[0]
    if k.shape != v.shape or k.shape[0] != tokens:
        raise InvalidArgumentError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must match, with {tokens} tokens like q.")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != tuple(k.shape[1:]):
        raise InvalidArgumentError(
            f"caches must be [num_blocks, block_size, {k.shape[1]}, {k.shape[2]}]; got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}."
        )
    if cos.shape != sin.shape or cos.dim() != 2 or 2 * cos.shape[-1] > q.shape[-1]:
        raise InvalidArgumentError(
            f"cos/sin must be equal [max_pos, rot_dim / 2] tables with rot_dim <= head_dim {q.shape[-1]}; got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}."
        )
    if positions.shape != (tokens,) or slot_mapping.shape != (tokens,):
        raise InvalidArgumentError(
            f"positions {tuple(positions.shape)} and slot_mapping {tuple(slot_mapping.shape)} must be [{tokens}]."
        )


def rotary_and_cache_(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor",
    positions: "torch.Tensor", k_cache: "torch.Tensor", v_cache: "torch.Tensor", slot_mapping: "torch.Tensor",
) -> None:
    """Rotate q in place and store rotate(k), v into the paged caches, in one kernel where Triton runs.

    q [tokens, Hq, D], k/v [tokens, Hkv, D] (views of a fused QKV output are fine: unit last stride);
    cos/sin float32 [max_pos, rot_dim / 2]; positions/slot_mapping int64 [tokens].
    """
    _check(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping)
    if q.shape[0] == 0:
        return
    unit = all(t.stride(-1) == 1 for t in (q, k, v, k_cache, v_cache))
    if not unit or not use_triton(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping):
        rotary_and_cache_reference(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping)
        return
    from ._rope_cache_triton import rotary_and_cache_triton

    index = q.device.index if q.device.type == "cuda" and q.device.index is not None else 0
    rotary_and_cache_triton(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping,
                            arch_family(device_arch(index)))


def rotary_and_cache_accumulated(
    qkv: "torch.Tensor", num_heads: int, num_kv_heads: int, cos: "torch.Tensor", sin: "torch.Tensor",
    positions: "torch.Tensor", k_cache: "torch.Tensor", v_cache: "torch.Tensor", slot_mapping: "torch.Tensor",
    dtype: "torch.dtype",
) -> "torch.Tensor":
    """`rotary_and_cache_` of a fused q/k/v projection still in its float32 W4A16 accumulator
    (`w4a16.w4a16_accumulate`, ``[tokens, (num_heads + 2 num_kv_heads) * head_dim]``, contiguous): the sums are
    read rounded to `dtype` (as the matmul's own output would have been), rotate(k) and v go into the caches,
    and the rotated q comes back as a new ``[tokens, num_heads, head_dim]`` tensor of `dtype`. The accumulator
    is left zeroed for the next matmul (in the same kernel; the reference path afterwards)."""
    import torch

    head_dim = k_cache.shape[-1]
    tokens = qkv.shape[0]
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.dtype != torch.float32 or not qkv.is_contiguous() or qkv.shape != (tokens, width):
        raise InvalidArgumentError(f"qkv must be a contiguous float32 accumulator [{tokens}, {width}]; got "
                                   f"{qkv.dtype} {tuple(qkv.shape)}.")
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :q_size].view(tokens, num_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(tokens, num_kv_heads, head_dim)
    v = qkv[:, q_size + kv_size:].view(tokens, num_kv_heads, head_dim)
    _check(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping)
    q_out = torch.empty(tokens, num_heads, head_dim, dtype=dtype, device=qkv.device)
    if tokens == 0:
        return q_out
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or not use_triton(qkv, cos, sin, positions, k_cache,
                                                                             v_cache, slot_mapping):
        q_out.copy_(q.to(dtype))
        rotary_and_cache_reference(q_out, k.to(dtype), v.to(dtype), cos, sin, positions, k_cache, v_cache,
                                   slot_mapping)
        qkv.zero_()
        return q_out
    from ._rope_cache_triton import rotary_and_cache_triton

    index = qkv.device.index if qkv.device.type == "cuda" and qkv.device.index is not None else 0
    rotary_and_cache_triton(q, k, v, cos, sin, positions, k_cache, v_cache, slot_mapping,
                            arch_family(device_arch(index)), q_out=q_out)
    return q_out
