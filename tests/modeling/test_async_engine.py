"""The engine's one-step-late reading of sampled tokens: what users see must not change.

Tokens are sampled on the device and read by the host one step later (`engine` docstring); these
tests pin the consequences: outputs arrive one step late, a pending placeholder never reaches a
user, a stop token's extra step is dropped, a length-finished sequence runs no extra step, and the
sync-free sampler draws exactly what `torch.multinomial` draws.
"""

from __future__ import annotations

import torch

from optimum_amdx.modeling import AMDModelForCausalLM, LLMEngine, SamplingParams
from optimum_amdx.modeling.sampling import sample_tokens
from optimum_amdx.modeling.scheduler import PENDING

from .conftest import random_prompts, tiny_model


def _model() -> AMDModelForCausalLM:
    return AMDModelForCausalLM(tiny_model("llama", seed=4), num_blocks=64, block_size=4, max_model_len=96)


class _Recorder:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.tokens += value.tolist()

    def end(self) -> None:
        self.ended += 1


def _count_launches(engine: LLMEngine) -> dict[str, int]:
    calls = {"n": 0}
    real = engine.runner.execute

    def counted(batch):
        calls["n"] += 1
        return real(batch)

    engine.runner.execute = counted
    return calls


def test_outputs_arrive_one_step_late_and_never_show_a_pending_token():
    am = _model()
    prompts = random_prompts(3, 3, 9, seed=2)
    reference = [am.generate([p], max_new_tokens=6)[0] for p in prompts]
    engine = am.engine
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_new_tokens=6), request_id=i)
    assert engine.step() == []  # the prefill was launched; its tokens are read by the next step
    seen: dict[int, list[int]] = {i: [] for i in range(3)}
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            assert PENDING not in out.output_ids and PENDING not in out.new_token_ids
            seen[out.request_id] += out.new_token_ids
            assert out.output_ids == seen[out.request_id]
            if out.finished:
                finished[out.request_id] = out.output_ids
    assert [finished[i] for i in range(3)] == reference == [seen[i] for i in range(3)]
    assert engine.num_free_blocks == engine.num_blocks


def test_a_stop_token_ends_the_output_there_and_its_extra_step_never_reaches_the_user():
    am = _model()
    prompt, mate = random_prompts(2, 5, 8, seed=7)
    free_run = am.generate([prompt], max_new_tokens=10)[0]
    stop = free_run[3]
    want = free_run[: free_run.index(stop) + 1]
    mate_ref = am.generate([mate], max_new_tokens=10)[0]
    engine = am.engine
    rec = _Recorder()
    a = engine.add_request(prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(stop,)), streamer=rec)
    b = engine.add_request(mate, SamplingParams(max_new_tokens=10))
    reported: dict = {a: [], b: []}
    reasons = {}
    while engine.has_unfinished():
        for out in engine.step():
            reported[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    assert reported[a] == want and rec.tokens == want and rec.ended == 1
    assert reasons[a] == "stop"
    assert reported[b] == mate_ref and reasons[b] == "length"
    assert engine.num_free_blocks == engine.num_blocks


def test_a_length_finished_sequence_runs_no_extra_step():
    am = _model()
    engine = am.engine
    calls = _count_launches(engine)
    engine.add_request([5, 9, 11, 2], SamplingParams(max_new_tokens=5))
    done = engine.run()
    assert len(next(iter(done.values()))) == 5
    assert calls["n"] == 5  # the prefill and four decode steps: the fifth token is read, not run past
    assert engine.num_free_blocks == engine.num_blocks and not engine.has_unfinished()


def test_sync_free_sampling_draws_what_torch_multinomial_draws():
    torch.manual_seed(0)
    logits = torch.randn(4, 300)
    params = [SamplingParams(do_sample=True, temperature=0.7, top_k=50, top_p=0.9)] * 4
    got = sample_tokens(logits, params, [], torch.Generator().manual_seed(11))
    from optimum_amdx.modeling.sampling import _filter_top_k_top_p

    probs = _filter_top_k_top_p(logits / 0.7, torch.full((4,), 50), torch.full((4,), 0.9)).softmax(-1)
    want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(11)).squeeze(1)
    assert got.tolist() == want.tolist()


def test_seeded_requests_reproduce_alone_and_in_a_batch_with_a_preempting_pool():
    am = _model()
    params = SamplingParams(max_new_tokens=12, do_sample=True, temperature=0.9, top_p=0.95)
    prompts = random_prompts(3, 6, 14, seed=9)
    alone = []
    for p in prompts:
        rid = am.engine.add_request(p, params, seed=123)
        alone.append(am.engine.run()[rid])
    tight = LLMEngine(am.decoder, block_size=4, num_blocks=12, max_num_seqs=3, max_num_batched_tokens=16)
    ids = [tight.add_request(p, params, seed=123) for p in prompts]
    done = tight.run()
    assert [done[i] for i in ids] == alone
    assert tight.scheduler.num_preemptions > 0
    assert tight.num_free_blocks == tight.num_blocks


def test_each_step_is_launched_before_the_previous_one_is_read():
    am = _model()
    engine = am.engine
    order: list[str] = []
    execute, read = engine.runner.execute, engine._read

    def launched(batch):
        order.append("launch")
        return execute(batch)

    def waited(step):
        order.append("read")
        return read(step)

    engine.runner.execute = launched
    engine._read = waited
    engine.add_request([3, 1, 4, 1, 5], SamplingParams(max_new_tokens=4))
    engine.run()
    # prefill, then each decode step goes out before the host waits for the step before it
    assert order == ["launch", "launch", "read", "launch", "read", "launch", "read", "read"]
