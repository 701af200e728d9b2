"""Prefill and mixed steps in the padded layout of a captured prefill graph (`runner._PrefillGraph`): padding
tokens that belong to no sequence, empty sequence slots, unused logits rows. Every such step of a chunked,
continuously batched run gives the eager step's logits; on CPU through the PyTorch references (here) and
through the Triton kernels in the interpreter (tests/kernels/test_family_engine.py)."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.modeling.engine import LLMEngine
from optimum_amdx.modeling.paged_model import PagedDecoder
from optimum_amdx.modeling.runner import (
    ModelRunner,
    _patch,
    _PrefillGraph,
    blocks_run_from,
    in_run_form,
    prefill_buckets,
    prefill_seq_buckets,
)
from optimum_amdx.modeling.sampling import SamplingParams
from optimum_amdx.modeling.scheduler import ScheduledBatch

from .conftest import random_prompts


def padded_on_host(runner: ModelRunner, batch: ScheduledBatch) -> torch.Tensor:
    """The step run eagerly in the padded layout of the token and sequence-slot buckets a captured graph would
    use; one set of static inputs per pair, reused by later steps as a graph's are (what an earlier step left
    there is stale)."""
    p = runner._pack(batch)
    seqs = next(s for s in prefill_seq_buckets(runner.max_num_seqs) if s >= len(batch))
    runs = in_run_form(batch)  # as `ModelRunner.prefill_graph_for` picks
    key = (next(b for b in prefill_buckets(1024) if b >= len(p.ids)), seqs, runs)
    held = runner.__dict__.setdefault("_test_static_inputs", {})
    if key not in held:
        held[key] = _PrefillGraph(*key[:2], runner.max_blocks, runner.decoder.max_model_len, runner.device, runs)
        held[key].load_dummy()
    g = held[key]
    g.load(p)
    _patch(g.inputs.input_ids, p.dst, p.src, batch.feed)
    return runner.decoder.forward(g.inputs, runner.cache)[:len(p.sampled)]


def check_padded_steps(engine: LLMEngine, prompts: list[list[int]], new_tokens: int,
                       padded: Callable[[ModelRunner, ScheduledBatch], torch.Tensor], atol: float,
                       rtol: float) -> list[tuple[int, int, int]]:
    """Generate greedily; at every step that is not pure decode, compare `padded(runner, batch)` with the
    eager step's logits. Returns (tokens, sequences, sampled) of each compared step."""
    runner = engine.runner
    eager = runner.execute
    seen: list[tuple[int, int, int]] = []

    def execute(batch: ScheduledBatch):
        if batch.is_pure_decode:
            return eager(batch)
        got = padded(runner, batch).float().clone()
        inputs, sampled = runner.build(batch)
        logits = runner.decoder.forward(inputs, runner.cache)
        torch.testing.assert_close(got, logits.float(), atol=atol, rtol=rtol)
        seen.append((sum(batch.num_new), len(batch), len(sampled)))
        return logits, sampled

    runner.execute = execute
    try:
        engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    finally:
        del runner.execute
    return seen


def test_padded_prefill_steps_give_the_eager_logits(llama):
    decoder = PagedDecoder(llama, max_model_len=96)
    engine = LLMEngine(decoder, block_size=4, num_blocks=96, max_num_seqs=4, max_num_batched_tokens=24,
                       use_cuda_graph=False)
    seen = check_padded_steps(engine, random_prompts(4, 3, 40, seed=5), 5, padded_on_host, atol=1e-4, rtol=1e-4)
    assert any(sampled < seqs for _, seqs, sampled in seen), seen  # a prompt chunk that samples nothing
    assert any(seqs > 1 and sampled == seqs for _, seqs, sampled in seen), seen  # decode rows beside a prompt end
    assert engine.num_free_blocks == engine.num_blocks


def test_a_lone_prompt_pads_to_one_sequence_slot(llama):
    """A one-sequence prefill step (an idle server's first prompt) in the one-slot layout gives the eager
    logits, its first chunk and its last."""
    decoder = PagedDecoder(llama, max_model_len=96)
    engine = LLMEngine(decoder, block_size=4, num_blocks=96, max_num_seqs=4, max_num_batched_tokens=24,
                       use_cuda_graph=False)
    seen = check_padded_steps(engine, random_prompts(1, 30, 40, seed=6), 3, padded_on_host, atol=1e-4, rtol=1e-4)
    assert [(seqs, sampled) for _, seqs, sampled in seen] == [(1, 0), (1, 1)], seen  # two chunks of one prompt
    assert sorted(engine.runner._test_static_inputs) == [(32, 1, True)]  # a fresh pool's blocks: one run


def test_prefill_graph_choice_takes_the_fewest_tokens_then_slots_then_the_run_form():
    runner = ModelRunner.__new__(ModelRunner)
    graphs = {(t, s, r): object() for t in (32, 64) for s in prefill_seq_buckets(4) for r in (False, s == 1)}
    runner.prefill_graphs = graphs
    assert prefill_seq_buckets(4) == [1, 4] and prefill_seq_buckets(1) == [1]
    assert runner.prefill_graph(20, 1) is graphs[32, 1, False]
    assert runner.prefill_graph(20, 1, runs=True) is graphs[32, 1, True]
    assert runner.prefill_graph(32, 2) is graphs[32, 4, False]
    assert runner.prefill_graph(32, 2, runs=True) is graphs[32, 4, False]  # no run form with more slots
    assert runner.prefill_graph(33, 1, runs=True) is graphs[64, 1, True]
    assert runner.prefill_graph(64, 4) is graphs[64, 4, False]
    assert runner.prefill_graph(65, 1) is None and runner.prefill_graph(8, 5) is None


def test_prefill_buckets_follow_the_step_budget():
    assert prefill_buckets(4096) == [32, 64, 128, 256, 384, 512, 768, 1024]
    assert prefill_buckets(1024) == [32, 64, 128, 256, 384, 512, 768, 1024]
    assert prefill_buckets(300) == [32, 64, 128, 256, 300]
    assert prefill_buckets(32) == [32]
    assert prefill_buckets(16) == []


def test_positions_and_slots_follow_each_sequences_blocks():
    """The one-pass numpy packing gives every token the position and cache slot of the per-token rule
    (slot = block[pos // block_size] * block_size + pos % block_size), across sequences of any length; one
    sequence (its own path) from any start."""
    import random

    from optimum_amdx.modeling.runner import _block_table, _positions_and_slots

    rng = random.Random(7)
    for seqs in [1] * 20 + [rng.randint(2, 6) for _ in range(40)]:
        starts, counts, tables = [], [], []
        for _ in range(seqs):
            start, n = rng.randint(0, 90), rng.randint(1, 40)
            starts.append(start)
            counts.append(n)
            tables.append(rng.sample(range(500), (start + n + 3) // 4 + rng.randint(0, 2)))
        pos, slots = _positions_and_slots(starts, counts, _block_table(tables), 4)
        want_pos = [p for s, n in zip(starts, counts) for p in range(s, s + n)]
        want_slots = [t[p // 4] * 4 + p % 4 for s, n, t in zip(starts, counts, tables) for p in range(s, s + n)]
        assert pos.tolist() == want_pos and slots.tolist() == want_slots


def test_blocks_run_from_names_the_first_block_of_one_ascending_run():
    assert blocks_run_from([7]) == 7 and blocks_run_from([3, 4, 5, 6]) == 3
    for not_a_run in ([], [3, 5, 4, 6], [4, 3], [0, 5, 2, 3], [2, 2, 3]):
        assert blocks_run_from(not_a_run) == -1, not_a_run


def test_blocks_allocated_together_are_one_run_again_once_the_pool_is_idle():
    """A prompt's blocks are one run where the top free range holds them; blocks come back in their order; a
    wholly free pool starts over as one range, however the sequences before it interleaved."""
    from optimum_amdx.modeling.cache import BlockAllocator

    pool = BlockAllocator(16)
    a, b = pool.allocate(4), pool.allocate(3)  # two prompts
    a += pool.allocate(1)
    b += pool.allocate(1)  # decode growth, interleaved
    assert (a, b) == ([0, 1, 2, 3, 7], [4, 5, 6, 8])
    pool.free(b)
    assert pool.allocate(4) == [4, 5, 6, 8]  # back in b's order
    c = pool.allocate(3)
    assert blocks_run_from(c) == 9 and pool.num_free == 4
    with pytest.raises(InvalidArgumentError, match="not allocated"):
        pool.free([0, 15])  # 15 is free: nothing is taken back
    with pytest.raises(InvalidArgumentError, match="twice"):
        pool.free([0, 0])
    assert pool.num_free == 4
    pool.free(a)
    pool.free([4, 5, 6, 8])
    pool.free(c)
    assert pool.num_free == 16 and pool.allocate(16) == list(range(16))
