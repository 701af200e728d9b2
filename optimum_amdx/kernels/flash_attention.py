"""Dense FlashAttention-2 forward (causal or not, GQA, varlen), for attention without a KV cache."""

from __future__ import annotations

from typing import Any

import torch

from optimum_amdx.kernels.attention_reference import (
    check_qkv,
    flash_attention_reference,
    flash_attention_varlen_reference,
)
from optimum_amdx.kernels.runtime import arch_family, device_arch, use_triton

__all__ = [
    "AMD_COMPILE_SPECS",
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

    Causal is aligned bottom-right when Sq < Sk (query i sees keys <= i + Sk - Sq); rows that see no
    key are zeros. On the Triton path the result is a view of a [B, Sq, Hq, D] buffer.
    """
    check_qkv(q, k, v, kv_head_dim=1)
    if use_triton(q, k, v):
        from optimum_amdx.kernels.flash_attention_triton import flash_attention_triton

        return flash_attention_triton(q, k, v, causal, softmax_scale, _family(q))
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
        from optimum_amdx.kernels.flash_attention_triton import flash_attention_varlen_triton

        return flash_attention_varlen_triton(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, _family(q)
        )
    return flash_attention_varlen_reference(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale
    )


def _family(t: torch.Tensor) -> str:
    index = t.device.index if t.device.type == "cuda" and t.device.index is not None else 0
    return arch_family(device_arch(index))


def __getattr__(name: str) -> Any:
    if name == "AMD_COMPILE_SPECS":
        from optimum_amdx.kernels.attention_specs import flash_attention_specs

        return flash_attention_specs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
