"""Plain PyTorch references for the attention kernels.

They define what the Triton kernels must compute, run anywhere (CPU included) and are what the
public functions fall back to when Triton cannot run. They favour clarity over speed: loops over
sequences, fp32 math, host synchronization allowed.
"""

from __future__ import annotations

import math

import torch


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


def _masked_softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    causal: bool,
    sliding_window: int | None,
) -> torch.Tensor:
    """Attention of q [Sq, Hq, D] over k/v [Sk, Hkv, D] in fp32; rows that see no key give zeros.

    q_positions [Sq]: the key index each query sits at (it sees keys <= its position when causal,
    and only the last `sliding_window` of them when a window is given).
    """
    group = check_gqa(q.shape[1], k.shape[1])
    qf = q.float().transpose(0, 1)  # [Hq, Sq, D]
    kf = k.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, Sk, D]
    vf = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [Hq, Sq, Sk]
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
) -> torch.Tensor:
    """Causal attention of varlen-packed queries over a paged KV cache (see `unified_attention`).

    max_query_len, max_seq_len and num_splits only size the GPU launch; they do not change the result.
    """
    del max_query_len, max_seq_len, num_splits
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
        result[q0:q1] = _masked_softmax_attention(
            q[q0:q1], k, v, positions, scale, True, sliding_window
        ).to(result.dtype)
    return result


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
        _masked_softmax_attention(
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
        out[cq[b] : cq[b + 1]] = _masked_softmax_attention(
            q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]], positions, scale, causal, None
        )
    return out
