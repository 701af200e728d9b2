"""`attn_implementation="amdx"` for plain transformers models.

`register_attention()` adds our function to transformers' `AttentionInterface` and a mask
function to `AttentionMaskInterface` under the name "amdx". The mask function is transformers'
SDPA mask builder, which returns no mask when attention is plainly causal (no padding, prefill
with as many keys as queries, or a single decode query): those calls go through our flash kernel.
When a mask is needed (left padding, chunked prefill over a cache), the call takes SDPA's path, so
results stay correct for every input transformers' generate produces.
"""

from __future__ import annotations

import torch

from ..kernels.flash_attention import flash_attention

ATTN_IMPLEMENTATION = "amdx"


def amdx_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention signature: q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] -> ([B, Sq, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    plain = (
        attention_mask is None
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
        and kwargs.get("softcap") is None
        and (dropout == 0.0 or not module.training)
        and (causal or query.shape[2] == 1)
    )
    if not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = flash_attention(query, key, value, causal=bool(causal), softmax_scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> str:
    """Register "amdx" with transformers' attention and mask interfaces (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, amdx_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
