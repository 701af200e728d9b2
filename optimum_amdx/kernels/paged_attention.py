"""Paged attention: write K/V into a block-paged cache and attend over it (prefill chunks and decode).

`unified_attention` is one kernel family for any number of query tokens per sequence (decode,
chunked prefill, or a mix in one batch), reading keys and values through a block table.

Front of the op: dispatchers and PyTorch references (no triton import); the kernels, their launch
configs and AMD compile specs are in `_paged_attention_triton`. The references gather the paged
KV and reuse the dense reference of `flash_attention`.
"""

from __future__ import annotations

import math

import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.flash_attention import check_qkv, masked_softmax_attention
from optimum_amdx.kernels.runtime import tensor_family, use_triton

__all__ = [
    "gather_paged_kv",
    "reshape_and_cache",
    "reshape_and_cache_reference",
    "unified_attention",
    "unified_attention_reference",
]


def reshape_and_cache_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [num_tokens, Hkv, D] into the paged caches [num_blocks, block_size, Hkv, D].

    slot_mapping [num_tokens] holds block_id * block_size + offset; a negative slot is skipped.
    """
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[keep].to(v_cache.dtype)


def gather_paged_kv(
    cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> torch.Tensor:
    """The first `length` tokens of one sequence from a paged cache, as [length, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [nb, bs, Hkv, D]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def unified_attention_reference(
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
    softcap: float | None = None,
    out_cols: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of varlen-packed queries over a paged KV cache (see `unified_attention`).

    max_query_len, max_seq_len and num_splits only size the GPU launch; they do not change the result.
    """
    del max_query_len, max_seq_len, num_splits
    if out_cols is not None:  # computed in head order, then each token's row put in the consumer's column order
        plain = unified_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, 0, 0,
                                            softmax_scale, sliding_window, None, None, softcap)
        result = out if out is not None else torch.empty_like(q)
        flat = result.view(q.shape[0], -1)
        flat[:, out_cols.long()] = plain.reshape(q.shape[0], -1).to(result.dtype)
        return result
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    result = out if out is not None else torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for s, ctx in enumerate(lens):
        q0, q1 = starts[s], starts[s + 1]
        q_len = q1 - q0
        if q_len == 0:
            continue
        k = gather_paged_kv(k_cache, block_tables[s], ctx)
        v = gather_paged_kv(v_cache, block_tables[s], ctx)
        positions = torch.arange(ctx - q_len, ctx, device=q.device)
        result[q0:q1] = masked_softmax_attention(
            q[q0:q1], k, v, positions, scale, True, sliding_window, softcap
        ).to(result.dtype)
    return result


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
        from optimum_amdx.kernels._paged_attention_triton import reshape_and_cache_triton

        reshape_and_cache_triton(key, value, k_cache, v_cache, slot_mapping, tensor_family(key))
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
    softcap: float | None = None,
    fused_reduce: bool | None = None,
    first_pages: torch.Tensor | None = None,
    out_cols: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal GQA attention of varlen-packed queries over a paged KV cache.

    q [total_q, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D]; block_tables
    [num_seqs, max_blocks_per_seq] int32; seq_lens [num_seqs] int32 = context length including this
    step's (already cached) query tokens; query_start_loc [num_seqs + 1] int32. Query i of sequence s
    sits at position seq_lens[s] - q_len + i and sees keys up to it (the last `sliding_window` only, if
    given). `softmax_scale` defaults to 1/sqrt(D) (Gemma passes query_pre_attn_scalar ** -0.5); `softcap`
    (Gemma 2's attn_logit_softcapping) turns scaled scores s into softcap * tanh(s / softcap) before the
    softmax. Returns [total_q, Hq, D].

    No host synchronization: max_query_len / max_seq_len are caller-given upper bounds used only to
    size the launch, so the call can be captured in a CUDA/HIP graph. For few sequences with long
    contexts the key range is split across programs (flash-decoding) and reduced; `num_splits` forces
    a split count (1 disables it). The splits are combined by a second kernel, or with `fused_reduce`
    by the last split to finish in the same launch (measured slower on an H100, so off by default).

    first_pages: optional int32 [num_seqs], given only when every sequence's blocks are one ascending run:
    sequence s's block-table row (up to its length) is first_pages[s], first_pages[s] + 1, ... The kernel is
    then compiled to compute each key's block instead of loading it from the table, a dependent load ahead
    of every K/V tile (a lone 512-token prompt's attention about 10 % faster on an H200; benchmarks/RESULTS.md
    round 15). The result is the same; the engine passes it for a lone prompt whose blocks form a run
    (`runner.blocks_run_from`).

    out_cols: optional int32 [Hq * D], a permutation of the columns of a token's flattened result: column c
    (head c // D, dim c % D) is stored at position out_cols[c] of the token's row instead (`out`, if given, must
    then keep each token's row contiguous). For a consumer that reads the heads' outputs in another order: an
    act-order GPTQ o_proj reads its input sorted by its permutation, which the stores do here at no cost instead of a
    gather launch before the matmul (`modeling.paged_model`). Not checked to be a permutation (that would
    synchronize with the device).
    """
    check_qkv(q, k_cache, v_cache, kv_head_dim=2)
    if softcap is not None and not softcap > 0:
        raise InvalidArgumentError(f"softcap={softcap!r}: expected a positive number (or None for no capping).")
    if sliding_window is not None and sliding_window < 1:
        raise InvalidArgumentError(f"sliding_window={sliding_window!r}: expected a positive number of keys (or None).")
    if first_pages is not None and (first_pages.dtype != torch.int32 or first_pages.shape != seq_lens.shape):
        raise InvalidArgumentError(
            f"first_pages: expected int32 of shape {tuple(seq_lens.shape)} (one entry per sequence), got "
            f"{first_pages.dtype} of shape {tuple(first_pages.shape)}.")
    width = q.shape[1] * q.shape[2]
    if out_cols is not None and (out_cols.dtype != torch.int32 or tuple(out_cols.shape) != (width,)
                                 or out_cols.device != q.device):
        raise InvalidArgumentError(
            f"out_cols: expected int32 of shape ({width},) on {q.device} (a permutation of the heads' columns), got "
            f"{out_cols.dtype} of shape {tuple(out_cols.shape)} on {out_cols.device}.")
    if out_cols is not None and out is not None and out.stride(1) != q.shape[2]:
        raise InvalidArgumentError("out_cols: `out` must keep each token's row contiguous ([tokens, heads, head_dim]).")
    if use_triton(q, k_cache, v_cache):
        from optimum_amdx.kernels._paged_attention_triton import unified_attention_triton

        return unified_attention_triton(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len,
            softmax_scale, sliding_window, out, num_splits, tensor_family(q), softcap=softcap,
            fused_reduce=fused_reduce, first_pages=first_pages, out_cols=out_cols,
        )
    return unified_attention_reference(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len,
        softmax_scale, sliding_window, out, num_splits, softcap, out_cols,
    )
