"""Continuous batching: random request mixes, requests added mid-run, preemption, no leaks, no starvation."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.modeling import AMDModelForCausalLM, LLMEngine, SamplingParams
from optimum_amdx.modeling.cache import BlockAllocator
from optimum_amdx.errors import OutOfBlocksError

from .conftest import tiny_model

MAX_STEPS = 5000


@functools.lru_cache(maxsize=None)
def _reference(prompt: tuple[int, ...], max_new: int) -> list[int]:
    """Greedy continuation computed alone in a roomy pool (no batching, no preemption)."""
    am = _roomy()
    return am.generate([list(prompt)], max_new_tokens=max_new)[0]


@functools.lru_cache(maxsize=None)
def _roomy() -> AMDModelForCausalLM:
    return AMDModelForCausalLM(tiny_model("llama", seed=1), num_blocks=64, block_size=8, max_model_len=128)


def test_allocator_hands_out_and_takes_back_every_block():
    alloc = BlockAllocator(6)
    a = alloc.allocate(4)
    assert len(set(a)) == 4 and alloc.num_free == 2
    with pytest.raises(OutOfBlocksError, match="only 2"):
        alloc.allocate(3)
    assert alloc.num_free == 2
    alloc.free(a[:2])
    with pytest.raises(InvalidArgumentError, match="not allocated"):
        alloc.free(a[:1])
    alloc.free(a[2:])
    assert alloc.num_free == 6 and sorted(alloc.allocate(6)) == list(range(6))


request = st.tuples(
    st.lists(st.integers(1, 255), min_size=1, max_size=30),  # prompt
    st.integers(1, 16),                                       # max_new_tokens
    st.integers(0, 6),                                        # step at which it arrives
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(request, min_size=1, max_size=7), block_size=st.sampled_from([1, 2, 4, 8]),
       spare_blocks=st.integers(0, 6), max_num_seqs=st.integers(1, 5), budget=st.integers(5, 24))
def test_random_mixes_all_finish_without_leaks_and_match_solo_runs(requests, block_size, spare_blocks,
                                                                    max_num_seqs, budget):
    am = _roomy()
    need = max(-(-(len(p) + n) // block_size) for p, n, _ in requests)
    engine = LLMEngine(am.decoder, block_size=block_size, num_blocks=need + spare_blocks,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max(budget, max_num_seqs))
    pending = sorted(enumerate(requests), key=lambda r: r[1][2])
    finished: dict[int, list[int]] = {}
    steps = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][2] <= steps:
            i, (prompt, max_new, _) = pending.pop(0)
            engine.add_request(prompt, SamplingParams(max_new_tokens=max_new), request_id=i)
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.output_ids
        steps += 1
        assert steps < MAX_STEPS, "scheduler made no progress (starvation or livelock)"
        used = engine.num_blocks - engine.num_free_blocks
        assert used == sum(len(s.blocks) for s in engine.scheduler.running)
    assert engine.num_free_blocks == engine.num_blocks
    assert sorted(finished) == list(range(len(requests)))
    for i, (prompt, max_new, _) in enumerate(requests):
        assert finished[i] == _reference(tuple(prompt), max_new)


def test_tight_pool_preempts_and_recomputes_to_the_same_tokens():
    am = _roomy()
    prompts = [[(7 * i + j) % 250 + 1 for j in range(10 + 3 * i)] for i in range(4)]
    engine = LLMEngine(am.decoder, block_size=4, num_blocks=10, max_num_seqs=4, max_num_batched_tokens=64)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=14))
    assert engine.scheduler.num_preemptions > 0
    assert engine.num_free_blocks == engine.num_blocks
    assert outs == [_reference(tuple(p), 14) for p in prompts]


def test_abort_frees_blocks_and_others_continue():
    am = _roomy()
    engine = LLMEngine(am.decoder, block_size=4, num_blocks=20, max_num_seqs=4)
    a = engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_new_tokens=30))
    b = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=5))
    engine.step()
    engine.step()
    engine.abort(a)
    done = engine.run()
    assert done[b] == _reference((1, 2, 3), 5)
    assert engine.num_free_blocks == engine.num_blocks
    with pytest.raises(InvalidArgumentError, match="num_blocks is required"):
        LLMEngine(am.decoder)
