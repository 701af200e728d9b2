"""Paged attention kernels (reshape_and_cache, unified_attention) against their PyTorch references.

On CPU the Triton kernels run in the interpreter (tests/kernels/conftest.py) at small shapes; on a GPU
the same tests run compiled, plus full-size `gpu` tests (decode 32x4096, split-K, graph capture).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.paged_attention import (
    reshape_and_cache,
    reshape_and_cache_reference,
    unified_attention,
    unified_attention_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 inputs go through TF32 tensor-core dots on a GPU (as torch matmul with TF32 allowed).
TOL = {torch.float16: (3e-3, 1e-2), torch.bfloat16: (2e-2, 2e-2),
       torch.float32: (5e-3, 1e-2) if DEVICE == "cuda" else (1e-4, 1e-4)}


def make_batch(
    seed: int, ctx_lens: list[int], q_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
    block_size: int, dtype: torch.dtype, device: str = DEVICE, spare_blocks: int = 3,
) -> dict:
    """A paged cache holding each sequence's context in randomly permuted blocks, plus packed queries."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(c / block_size) for c in ctx_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(device, dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(device, dtype)
    perm = torch.randperm(num_blocks, generator=g)
    width = max(blocks_per_seq) + 2
    # Unused table entries hold out-of-range ids: the kernel must never read them.
    block_tables = torch.full((len(ctx_lens), width), 10**6, dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks_per_seq):
        block_tables[s, :n] = perm[used : used + n]
        used += n
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=g).to(device, dtype)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables.to(device),
        "seq_lens": torch.tensor(ctx_lens, dtype=torch.int32, device=device),
        "query_start_loc": qsl.to(device), "max_query_len": max(q_lens), "max_seq_len": max(ctx_lens),
    }


def check(batch: dict, dtype: torch.dtype, **kwargs) -> torch.Tensor:
    out = unified_attention(**batch, **kwargs)
    kwargs.pop("num_splits", None)
    kwargs.pop("fused_reduce", None)
    kwargs.pop("first_pages", None)  # a promise about the table the kernel may use; the reference reads the table
    ref = unified_attention_reference(**batch, **kwargs)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_gqa_head_dims(dtype, num_heads, num_kv_heads, head_dim):
    # Context lengths: one token, exactly one block, a block plus one, and an uneven length.
    ctx = [1, 16, 17, 45]
    batch = make_batch(1, ctx, [1] * len(ctx), num_heads, num_kv_heads, head_dim, 16, dtype)
    check(batch, dtype, num_splits=1)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_chunked_prefill_with_prior_context(block_size):
    # Second chunk of a prompt: 13 new tokens on top of 30 cached ones, and a fresh 21-token prompt.
    batch = make_batch(2, [43, 21], [13, 21], 6, 2, 64, block_size, torch.float16)
    check(batch, torch.float16)


def test_mixed_decode_and_prefill_batch_with_empty_sequence():
    # Decode rows, a prefill chunk, and a sequence with no query tokens this step (q_len 0).
    batch = make_batch(3, [9, 40, 12, 33], [1, 25, 0, 1], 9, 3, 64, 16, torch.float16)
    out = check(batch, torch.float16)
    assert out.shape == batch["q"].shape


def test_query_block_spanning_many_tokens_fp32():
    # More query tokens than one M tile holds, so a sequence spans several query blocks.
    batch = make_batch(4, [70], [70], 2, 2, 64, 16, torch.float32)
    check(batch, torch.float32)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("q_lens", [[1, 1, 1, 1, 1], [1, 0, 1, 1, 1]])
def test_one_token_per_sequence_decode(num_splits, q_lens):
    """A decode step (one query token per sequence: query block i is sequence i, no search) against
    the reference, and a step where one sequence has no token (then the search runs as for prefill)."""
    batch = make_batch(6, [1, 33, 64, 90, 17], q_lens, 8, 2, 64, 16, torch.float16)
    check(batch, torch.float16, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [2, 3, 8])
def test_split_k_agrees_with_single_pass(num_splits):
    batch = make_batch(5, [150, 7, 64], [1, 1, 2], 8, 2, 128, 16, torch.float16)
    single = unified_attention(**batch, num_splits=1)
    split = check(batch, torch.float16, num_splits=num_splits)
    torch.testing.assert_close(split.float(), single.float(), atol=3e-3, rtol=1e-2)


@pytest.mark.parametrize("q_lens,num_splits,fused", [([1, 1, 1], 1, False), ([1, 1, 1], 3, False),
                                                      ([1, 1, 1], 3, True), ([5, 1, 9], 1, False)])
def test_out_cols_puts_each_tokens_row_in_the_consumers_order(q_lens, num_splits, fused):
    """`out_cols` (an act-order o_proj's sorted order): every store path (one pass, the split reduce kernel, the
    fused reduce, a prompt step) writes column c of a token's flattened row at position out_cols[c], which is the
    plain result's row permuted; the reference does the same. A bad index tensor is refused."""
    batch = make_batch(9, [40, 70, 25], q_lens, 8, 2, 64, 16, torch.float16)
    width = 8 * 64
    cols = torch.randperm(width, generator=torch.Generator().manual_seed(3)).to(torch.int32).to(DEVICE)
    plain = unified_attention(**batch, num_splits=num_splits, fused_reduce=fused)
    got = unified_attention(**batch, num_splits=num_splits, fused_reduce=fused, out_cols=cols)
    ref = unified_attention_reference(**batch, out_cols=cols)
    torch.testing.assert_close(got.float(), ref.float(), atol=TOL[torch.float16][0], rtol=TOL[torch.float16][1])
    want = torch.empty_like(plain).view(plain.shape[0], width)
    want[:, cols.long()] = plain.view(plain.shape[0], width)
    assert torch.equal(got.view(plain.shape[0], width), want)
    for bad in (cols.long(), cols[:-1]):
        with pytest.raises(InvalidArgumentError, match="out_cols"):
            unified_attention(**batch, out_cols=bad)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_sliding_window(num_splits):
    batch = make_batch(6, [90, 20, 50], [1, 20, 9], 4, 2, 64, 16, torch.float16)
    check(batch, torch.float16, sliding_window=24, num_splits=num_splits)
    wide = unified_attention(**batch, sliding_window=10_000, num_splits=num_splits)
    torch.testing.assert_close(wide.float(), unified_attention(**batch, num_splits=num_splits).float())


def with_runs(batch: dict, starts: list[int], block_size: int = 16) -> dict:
    """`batch` with sequence s's blocks made the ascending run starts[s], starts[s] + 1, ... (ids into the same
    cache, so the reference reads them too), and `first_pages` saying so."""
    tables = batch["block_tables"].clone()
    for s, start in enumerate(starts):
        n = math.ceil(int(batch["seq_lens"][s]) / block_size)
        tables[s, :n] = torch.arange(start, start + n, dtype=torch.int32)
    first = torch.tensor(starts, dtype=torch.int32, device=tables.device)
    return dict(batch, block_tables=tables, first_pages=first)


@pytest.mark.parametrize("ctx,q_lens,starts,window,num_splits", [
    ([1, 33, 64, 90, 17], [1, 1, 1, 1, 1], [5, 0, 9, 1, 2], None, 1),  # decode
    ([1, 33, 64, 90, 17], [1, 1, 1, 1, 1], [3, 1, 7, 0, 4], None, 4),  # decode split by keys
    ([150, 40, 70], [30, 40, 5], [2, 6, 0], None, 1),  # prompt chunks after earlier context
    ([150, 40, 70], [30, 40, 5], [0, 3, 9], 24, 1),  # sliding window
    ([96], [96], [1], None, 1),  # a lone prompt (the engine's one-slot prefill graph)
])
def test_first_pages_computes_the_blocks_of_runs(ctx, q_lens, starts, window, num_splits):
    """Sequences whose blocks are runs, read through computed block ids: the output is the one the table
    gives (bit for bit: the same loads and arithmetic) and the reference's."""
    batch = with_runs(make_batch(9, ctx, q_lens, 8, 2, 64, 16, torch.float16, spare_blocks=8), starts)
    first_pages = batch.pop("first_pages")
    through_table = unified_attention(**batch, num_splits=num_splits, sliding_window=window)
    computed = check(batch, torch.float16, num_splits=num_splits, sliding_window=window, first_pages=first_pages)
    assert torch.equal(computed, through_table)
    # the kernel reads first_pages (not the table) in this form: a run one block later reads other keys
    shifted = unified_attention(**batch, num_splits=num_splits, sliding_window=window, first_pages=first_pages + 1)
    assert not torch.equal(shifted, through_table)


def test_first_pages_must_hold_one_int32_per_sequence():
    batch = make_batch(9, [40, 20], [1, 1], 4, 2, 64, 16, torch.float16)
    for bad in (torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int32)):
        with pytest.raises(InvalidArgumentError, match="first_pages"):
            unified_attention(**batch, first_pages=bad.to(DEVICE))


def test_head_dim_80_padded_and_custom_scale_into_out():
    batch = make_batch(7, [33, 5], [3, 5], 4, 1, 80, 16, torch.float16)
    out = torch.empty_like(batch["q"])
    result = check(batch, torch.float16, softmax_scale=0.05, out=out)
    assert result.data_ptr() == out.data_ptr()


def test_reference_matches_sdpa_on_contiguous_kv():
    """The reference itself, checked against torch SDPA on the gathered (unpaged) keys."""
    ctx, q_len, h, hk, d = 37, 5, 6, 2, 64
    batch = make_batch(8, [ctx], [q_len], h, hk, d, 16, torch.float32, device="cpu")
    ref = unified_attention_reference(**batch)
    table = batch["block_tables"][0]
    k = batch["k_cache"][table[:3].long()].reshape(-1, hk, d)[:ctx]
    v = batch["v_cache"][table[:3].long()].reshape(-1, hk, d)[:ctx]
    mask = torch.ones(q_len, ctx, dtype=torch.bool).tril(diagonal=ctx - q_len)
    expected = F.scaled_dot_product_attention(
        batch["q"].transpose(0, 1), k.transpose(0, 1).repeat_interleave(3, 0),
        v.transpose(0, 1).repeat_interleave(3, 0), attn_mask=mask,
    ).transpose(0, 1)
    torch.testing.assert_close(ref, expected, atol=1e-5, rtol=1e-5)


def test_rejects_head_counts_that_do_not_divide():
    batch = make_batch(9, [4], [1], 6, 4, 64, 16, torch.float16, device="cpu")
    with pytest.raises(InvalidArgumentError, match="num_kv_heads"):
        unified_attention(**batch)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (3, 128), (8, 64)])
def test_reshape_and_cache_skips_negative_slots(dtype, num_kv_heads, head_dim):
    g = torch.Generator().manual_seed(10)
    num_blocks, block_size, tokens = 6, 16, 9
    key = torch.randn(tokens, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    value = torch.randn(tokens, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    # Block boundaries (15 -> 16), the very last slot, and padding (-1) entries.
    slots = torch.tensor([15, 16, -1, 0, 95, 47, -1, 33, 64], device=DEVICE)
    k_out, v_out = k_cache.clone(), v_cache.clone()
    reshape_and_cache(key, value, k_out, v_out, slots)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reshape_and_cache_reference(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_out, k_ref) and torch.equal(v_out, v_ref)
    assert torch.equal(k_out[0, 15], key[0]) and torch.equal(v_out[5, 15], value[4])
    changed = (k_out != k_cache).flatten(2).any(-1).sum().item()
    assert changed == 7  # seven real tokens written, padding left the cache alone


def test_cache_write_then_attend_round_trip():
    """Prefill writes K/V through reshape_and_cache, then decode attends over it."""
    g = torch.Generator().manual_seed(11)
    h, hk, d, bs, ctx = 4, 2, 64, 16, 21
    k_cache = torch.zeros(4, bs, hk, d, dtype=torch.float16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(ctx, hk, d, generator=g).to(DEVICE, torch.float16)
    value = torch.randn(ctx, hk, d, generator=g).to(DEVICE, torch.float16)
    table = torch.tensor([[2, 0, 3]], dtype=torch.int32, device=DEVICE)
    slots = (table[0].long()[torch.arange(ctx, device=DEVICE) // bs] * bs + torch.arange(ctx, device=DEVICE) % bs)
    reshape_and_cache(key, value, k_cache, v_cache, slots)
    q = torch.randn(1, h, d, generator=g).to(DEVICE, torch.float16)
    out = unified_attention(
        q, k_cache, v_cache, table, torch.tensor([ctx], dtype=torch.int32, device=DEVICE),
        torch.tensor([0, 1], dtype=torch.int32, device=DEVICE), 1, ctx,
    )
    expected = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), key.float().transpose(0, 1).repeat_interleave(2, 0),
        value.float().transpose(0, 1).repeat_interleave(2, 0),
    ).transpose(0, 1)
    torch.testing.assert_close(out.float(), expected, atol=3e-3, rtol=1e-2)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_gpu_full_size_decode(num_splits):
    ctx = [4096 - 37 * i for i in range(32)]
    batch = make_batch(20, ctx, [1] * 32, 32, 8, 128, 16, torch.float16)
    check(batch, torch.float16, num_splits=num_splits)


@pytest.mark.gpu
@gpu
def test_gpu_long_context_split_k_bf16_window():
    batch = make_batch(21, [16384, 9000, 123, 16000], [1, 1, 1, 3], 32, 8, 128, 16, torch.bfloat16)
    check(batch, torch.bfloat16)
    check(batch, torch.bfloat16, sliding_window=4096)


@pytest.mark.gpu
@gpu
def test_gpu_mixed_prefill_decode_full_size():
    batch = make_batch(22, [2048, 3000, 17, 1500], [2048, 512, 1, 1], 32, 8, 128, 16, torch.float16)
    check(batch, torch.float16)


@pytest.mark.gpu
@gpu
def test_gpu_graph_capture_replays_with_new_lengths():
    """No host synchronization inside: the call is captured once and replayed for other lengths."""
    batch = make_batch(23, [3000, 200, 1000, 40], [1, 1, 1, 1], 32, 8, 128, 16, torch.float16)
    out = torch.empty_like(batch["q"])
    kwargs = dict(batch, max_seq_len=4096, out=out)
    unified_attention(**kwargs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        unified_attention(**kwargs)
    batch["seq_lens"].copy_(torch.tensor([2999, 17, 1001, 33], dtype=torch.int32))
    batch["q"].normal_()
    graph.replay()
    torch.cuda.synchronize()
    ref = unified_attention_reference(**batch)
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-3, rtol=1e-2)


def test_split_k_heuristic_only_splits_an_underfilled_gpu():
    from optimum_amdx.kernels._paged_attention_triton import choose_num_splits

    # 4 sequences x 8 KV heads on 132 SMs (H200): 32 programs -> 16 splits (4 programs per SM).
    assert choose_num_splits("hopper", 4, 8, 16384, 1, 132) == 16
    # 32 x 8 = 256 programs already cover the GPU: no split (the H200 sweep measured splitting as slower).
    assert choose_num_splits("hopper", 32, 8, 4096, 1, 132) == 1
    # Short contexts: one split per 64-key decode tile (at 513 keys 9, none empty; Hopper took 32 keys and 17
    # splits before round 31); at most 64 splits; prefill batches and the interpreter never split.
    assert choose_num_splits("hopper", 1, 8, 513, 1, 132) == 9
    assert choose_num_splits("hopper", 1, 32, 576, 1, 132) == 9
    assert choose_num_splits("hopper", 16, 8, 513, 1, 132) == 4
    assert choose_num_splits("cdna3", 1, 8, 1024, 1, 304) == 16
    assert choose_num_splits("cdna3", 1, 2, 576, 1, 132) == 9
    assert choose_num_splits("cdna3", 40, 2, 4096, 1, 132) == 6  # 80 programs: up to 4 * 132 // 80
    assert choose_num_splits("cdna3", 1, 2, 1 << 20, 1, 132) == 64
    assert choose_num_splits("hopper", 4, 8, 16384, 512, 132) == 1
    assert choose_num_splits("cpu", 1, 1, 16384, 1, 1) == 1


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("q_lens", [[1, 1, 1, 1], [5, 1, 17, 1]], ids=["decode", "prompt"])
def test_fused_split_reduce_matches_the_reduce_kernel_and_leaves_counters_at_zero(num_splits, q_lens):
    """Decode and prompt launches (the latter with the KV head on grid axis 0): on a GPU the splits of
    every (query block, KV head) run concurrently, so two of them sharing a counter slot give wrong rows
    (the interpreter runs each one's splits back to back and cannot see it)."""
    from optimum_amdx.kernels._paged_attention_triton import split_counters

    batch = make_batch(31, [150, 7, 64, 17], q_lens, 8, 2, 128, 16, torch.float16)
    two_kernels = unified_attention(**batch, num_splits=num_splits, fused_reduce=False)
    for _ in range(2):  # a second launch must start from zeroed counters (graph replays rely on it)
        fused = unified_attention(**batch, num_splits=num_splits, fused_reduce=True)
        torch.testing.assert_close(fused.float(), two_kernels.float(), atol=1e-3, rtol=1e-3)
        ref = unified_attention_reference(**batch)
        torch.testing.assert_close(fused.float(), ref.float(), atol=TOL[torch.float16][0], rtol=TOL[torch.float16][1])
    counters = split_counters(batch["q"].device, 1)
    if counters is not None:
        assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("num_heads,num_kv_heads,num_splits", [(6, 2, 3), (4, 4, 16), (8, 1, 7)])
def test_fused_reduce_of_a_decode_step_combines_every_query_head_of_a_kv_head(num_heads, num_kv_heads, num_splits):
    """A decode step's fused reduce (the last split to finish combines them) against the reference with 3, 1 and 8
    query heads a KV head, empty splits included (16 and 7 splits of at most 90 keys)."""
    batch = make_batch(32, [90, 1, 33], [1, 1, 1], num_heads, num_kv_heads, 64, 16, torch.float16)
    check(batch, torch.float16, num_splits=num_splits, fused_reduce=True)


def test_keys_ahead_of_the_wait_only_for_grouped_query_decode_under_pdl():
    """`kv_ahead`: a decode step under PDL with grouped queries reads its first tile of earlier keys before its wait;
    a prompt step, a launch without PDL and one query head per KV head (slower, RESULTS.md round31) do not."""
    from optimum_amdx.kernels._paged_attention_triton import kv_ahead

    assert kv_ahead(True, True, 4)
    assert not kv_ahead(True, True, 1)
    assert not kv_ahead(False, True, 4)
    assert not kv_ahead(True, False, 4)


def test_decode_launch_options_only_for_few_programs_on_hopper():
    """One stage and a register cap for Hopper decode launches of at most 4 programs per SM; more
    programs, or another family, keep the config's own options."""
    from optimum_amdx.kernels._paged_attention_triton import decode_launch_options

    base = {"num_warps": 4, "num_stages": 2}
    assert decode_launch_options("hopper", base, 512, 132) == {"num_warps": 4, "num_stages": 1, "maxnreg": 128}
    assert decode_launch_options("hopper", base, 2048, 132) == base
    assert decode_launch_options("cdna3", base, 64, 304) == base


@pytest.mark.parametrize("head_dim,reads_runs", [(128, True), (256, False)])
def test_rdna3_reads_the_block_table_for_256_wide_heads(monkeypatch, head_dim, reads_runs):
    """`runs_form`: gfx1100 keeps the run form (block ids computed from ``first_pages``) up to 128-wide heads; at 256
    it reads the block table (the run form spills to scratch there), so a wrong promise (every run one block later)
    leaves the output as the table gives it. Other families keep the run form at 256."""
    from optimum_amdx.kernels import paged_attention
    from optimum_amdx.kernels._paged_attention_triton import runs_form

    assert runs_form("rdna3", 128) and not runs_form("rdna3", 256)
    assert runs_form("cdna3", 256) and runs_form("hopper", 256) and runs_form("cpu", 256)
    monkeypatch.setattr(paged_attention, "tensor_family", lambda t: "rdna3")
    batch = with_runs(make_batch(9, [33, 70], [1, 1], 4, 2, head_dim, 16, torch.float16, spare_blocks=8), [3, 0])
    first_pages = batch.pop("first_pages")
    through_table = unified_attention(**batch)
    shifted = unified_attention(**batch, first_pages=first_pages + 1)
    assert torch.equal(shifted, through_table) != reads_runs


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter runs each program as Python, so its wait can be replaced")
@pytest.mark.parametrize("ctx,num_splits,window", [([1], 1, None), ([16], 1, None), ([17], 1, None), ([45], 1, None),
                                                   ([40, 150], 3, None), ([150, 33], 4, 40), ([90], 8, None)])
def test_a_decode_step_reads_this_steps_keys_only_after_its_wait(monkeypatch, ctx, num_splits, window):
    """A decode step under PDL (`KV_AHEAD`) reads its first tile's keys and values before its wait, but only those of
    earlier steps: the newest key of each sequence is written by the rotary + cache kernel just before, and is
    visible only after the wait. The interpreter runs the kernel with PDL, each program starting with NaN in those
    slots (not written yet) and its wait writing them, so a read ahead of the wait shows in the result."""
    import triton.runtime.interpreter as interp

    from optimum_amdx.kernels import _paged_attention_triton as pat

    batch = make_batch(11, ctx, [1] * len(ctx), 8, 2, 64, 16, torch.float16)
    ref = unified_attention_reference(**batch, sliding_window=window)
    slots = [(batch["block_tables"][s, (c - 1) // 16].item(), (c - 1) % 16) for s, c in enumerate(ctx)]
    new_kv = [(batch["k_cache"][b, o].clone(), batch["v_cache"][b, o].clone()) for b, o in slots]
    waits = []

    def write(poison: bool) -> None:
        for (b, o), (k, v) in zip(slots, new_kv):
            batch["k_cache"][b, o] = float("nan") if poison else k
            batch["v_cache"][b, o] = float("nan") if poison else v

    def wait() -> None:  # the kernel before has ended: its writes are visible
        waits.append(1)
        write(poison=False)

    real_start = interp.interpreter_builder.set_grid_idx

    def start(*idx):  # each program starts before the kernel before has written the newest keys
        write(poison=True)
        real_start(*idx)

    monkeypatch.setattr(pat, "pdl_for", lambda t, kernel, rows: kernel == "attention")
    monkeypatch.setattr(pat, "pdl_begin", wait)
    monkeypatch.setattr(interp.interpreter_builder, "set_grid_idx", start)
    got = unified_attention(**batch, num_splits=num_splits, sliding_window=window)
    monkeypatch.undo()
    assert len(waits) == len(ctx) * 2 * num_splits  # every program waited
    torch.testing.assert_close(got.float(), ref.float(), atol=TOL[torch.float16][0], rtol=TOL[torch.float16][1])
