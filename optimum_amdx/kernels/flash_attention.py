"""Dense FlashAttention-2 forward (causal or not, GQA, varlen), for attention without a KV cache.

Front of the op: the dispatcher and the plain PyTorch references (no triton import). The
references define what the kernel in `_flash_attention_triton` must compute, run anywhere and are
what the dispatcher falls back to when Triton cannot run; they favour clarity over speed (fp32
math, loops over sequences, host synchronization allowed). `masked_softmax_attention` and the
shape checks are shared with the paged front.
"""

from __future__ import annotations

import math

import torch

from optimum_amdx.kernels.runtime import tensor_family, use_triton

__all__ = [
    "check_gqa",
    "check_qkv",
    "flash_attention",
    "flash_attention_reference",
    "flash_attention_varlen",
    "flash_attention_varlen_reference",
    "masked_softmax_attention",
]


def check_gqa(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head; raises InvalidArgumentError when the head counts do not divide."""
    from optimum_amdx.errors import InvalidArgumentError

    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise InvalidArgumentError(
            f"attention: num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}; "
            "grouped-query attention needs every KV head to serve the same number of query heads."
        )
    return num_heads // num_kv_heads


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_head_dim: int) -> int:
    """Validate q against keys/values (same head size, same K/V shapes); returns query heads per KV head."""
    from optimum_amdx.errors import InvalidArgumentError

    if k.shape != v.shape:
        raise InvalidArgumentError(
            f"attention: keys {tuple(k.shape)} and values {tuple(v.shape)} must have the same shape."
        )
    if q.shape[-1] != k.shape[-1]:
        raise InvalidArgumentError(
            f"attention: query head size {q.shape[-1]} differs from the key/value head size {k.shape[-1]}; "
            "pass q, k and v of one model layer."
        )
    return check_gqa(q.shape[1], k.shape[kv_head_dim])


def masked_softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    causal: bool,
    sliding_window: int | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention of q [Sq, Hq, D] over k/v [Sk, Hkv, D] in fp32; rows that see no key give zeros.

    q_positions [Sq]: the key index each query sits at (it sees keys <= its position when causal,
    and only the last `sliding_window` of them when a window is given). `softcap` (Gemma 2's
    attn_logit_softcapping): scaled scores s become softcap * tanh(s / softcap) before masking.
    """
    group = check_gqa(q.shape[1], k.shape[1])
    qf = q.float().transpose(0, 1)  # [Hq, Sq, D]
    kf = k.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, Sk, D]
    vf = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [Hq, Sq, Sk]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    key_idx = torch.arange(k.shape[0], device=q.device)
    visible = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device)
    if causal:
        visible &= key_idx[None, :] <= q_positions[:, None]
    if sliding_window is not None:
        visible &= key_idx[None, :] > q_positions[:, None] - sliding_window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows that see no key
    out = torch.matmul(probs, vf)  # [Hq, Sq, D]
    return out.transpose(0, 1).to(q.dtype)


def flash_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Dense attention in transformers layout: q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] -> [B, Hq, Sq, D].

    Causal is aligned bottom-right: query i sees keys <= i + (Sk - Sq); rows that see no key give zeros.
    """
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    sq, sk = q.shape[2], k.shape[2]
    positions = torch.arange(sq, device=q.device) + (sk - sq)
    outs = [
        masked_softmax_attention(
            q[b].transpose(0, 1), k[b].transpose(0, 1), v[b].transpose(0, 1), positions, scale, causal, None
        ).transpose(0, 1)
        for b in range(q.shape[0])
    ]
    return torch.stack(outs)


def flash_attention_varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = True,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Varlen-packed dense attention: q [total_q, Hq, D], k/v [total_k, Hkv, D] -> [total_q, Hq, D].

    Sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1]
    of k/v; causal is aligned bottom-right within each sequence.
    """
    del max_seqlen_q, max_seqlen_k
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        sq, sk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if sq == 0:
            continue
        positions = torch.arange(sq, device=q.device) + (sk - sq)
        out[cq[b] : cq[b + 1]] = masked_softmax_attention(
            q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]], positions, scale, causal, None
        )
    return out


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Attention in transformers layout: q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] -> [B, Hq, Sq, D].

    Causal is aligned bottom-right when Sq < Sk (query i sees keys <= i + Sk - Sq); rows that see no
    key are zeros. On the Triton path the result is a view of a [B, Sq, Hq, D] buffer.
    """
    check_qkv(q, k, v, kv_head_dim=1)
    if use_triton(q, k, v):
        from optimum_amdx.kernels._flash_attention_triton import flash_attention_triton

        return flash_attention_triton(q, k, v, causal, softmax_scale, tensor_family(q))
    return flash_attention_reference(q, k, v, causal, softmax_scale)


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = True,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Varlen-packed attention: q [total_q, Hq, D], k/v [total_k, Hkv, D] -> [total_q, Hq, D].

    cu_seqlens_q/k [B + 1] int32 delimit the sequences; max_seqlen_q/k are caller-given upper bounds
    that only size the launch (no host synchronization). Causal is bottom-right within each sequence.
    """
    check_qkv(q, k, v, kv_head_dim=1)
    if use_triton(q, k, v):
        from optimum_amdx.kernels._flash_attention_triton import flash_attention_varlen_triton

        return flash_attention_varlen_triton(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, tensor_family(q)
        )
    return flash_attention_varlen_reference(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale
    )
