"""Paged attention: write K/V into a block-paged cache and attend over it (prefill chunks and decode).

`unified_attention` is one kernel family for any number of query tokens per sequence (decode,
chunked prefill, or a mix in one batch), reading keys and values through a block table.
"""

from __future__ import annotations

import torch

from typing import Any

from optimum_amdx.kernels.attention_reference import (
    check_qkv,
    reshape_and_cache_reference,
    unified_attention_reference,
)
from optimum_amdx.kernels.runtime import arch_family, device_arch, use_triton

__all__ = [
    "AMD_COMPILE_SPECS",
    "reshape_and_cache",
    "reshape_and_cache_reference",
    "unified_attention",
    "unified_attention_reference",
]


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [num_tokens, Hkv, D] into k_cache/v_cache [num_blocks, block_size, Hkv, D].

    slot_mapping [num_tokens] (int64) = block_id * block_size + offset; a negative slot is skipped.
    """
    if use_triton(key, value, k_cache, v_cache):
        from optimum_amdx.kernels.paged_attention_triton import reshape_and_cache_triton

        reshape_and_cache_triton(key, value, k_cache, v_cache, slot_mapping, _family(key))
    else:
        reshape_and_cache_reference(key, value, k_cache, v_cache, slot_mapping)


def unified_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal GQA attention of varlen-packed queries over a paged KV cache.

    q [total_q, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D]; block_tables
    [num_seqs, max_blocks_per_seq] int32; seq_lens [num_seqs] int32 = context length including this
    step's (already cached) query tokens; query_start_loc [num_seqs + 1] int32. Query i of sequence s
    sits at position seq_lens[s] - q_len + i and sees keys up to it (the last `sliding_window` only, if
    given). Returns [total_q, Hq, D].

    No host synchronization: max_query_len / max_seq_len are caller-given upper bounds used only to
    size the launch, so the call can be captured in a CUDA/HIP graph. For few sequences with long
    contexts the key range is split across programs (flash-decoding) and reduced; `num_splits` forces
    a split count (1 disables it).
    """
    check_qkv(q, k_cache, v_cache, kv_head_dim=2)
    if use_triton(q, k_cache, v_cache):
        from optimum_amdx.kernels.paged_attention_triton import unified_attention_triton

        return unified_attention_triton(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len,
            softmax_scale, sliding_window, out, num_splits, _family(q),
        )
    return unified_attention_reference(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len,
        softmax_scale, sliding_window, out, num_splits,
    )


def _family(t: torch.Tensor) -> str:
    index = t.device.index if t.device.type == "cuda" and t.device.index is not None else 0
    return arch_family(device_arch(index))


def __getattr__(name: str) -> Any:
    if name == "AMD_COMPILE_SPECS":
        from optimum_amdx.kernels.attention_specs import paged_attention_specs

        return paged_attention_specs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
