"""On a GPU: a random 1B-class Llama in fp16 through the Triton kernels and captured decode graphs."""

from __future__ import annotations

import functools

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@functools.lru_cache(maxsize=None)
def _llama_1b():
    from transformers import AutoModelForCausalLM

    from optimum_amdx.models.shapes import shape_config

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(shape_config("llama-1b"), dtype=torch.float16,
                                                 attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 32000, (int(length),), generator=g).tolist()
            for length in torch.randint(5, 300, (n,), generator=g)]


def test_greedy_matches_transformers_within_fp16_tolerance_with_graphs():
    """Our greedy tokens are transformers' argmax wherever fp16 noise cannot flip it.

    Teacher-forced check: transformers scores our whole output; every token we chose has a logit
    within `tol` of transformers' best at that step, and the first token of every prompt agrees.
    """
    from optimum_amdx.modeling import AMDModelForCausalLM

    model = _llama_1b()
    am = AMDModelForCausalLM(model, max_num_seqs=8, memory_fraction=0.3, max_model_len=1024)
    engine = am.engine
    assert engine.uses_graphs, engine.runner.graph_error
    prompts = _prompts(6, seed=1)
    outs = am.generate(prompts, max_new_tokens=32)
    assert engine.num_free_blocks == engine.num_blocks
    exact = 0
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt + out], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        best = logits.max(dim=-1).values
        chosen = logits.gather(1, torch.tensor(out, device="cuda")[:, None]).squeeze(1)
        tol = 0.02 * logits.std().item() + 1e-3
        assert (best - chosen).max().item() <= tol, (best - chosen).max().item()
        assert logits[0].argmax().item() == out[0]
        exact += sum(int(a == b) for a, b in zip(logits.argmax(-1).tolist(), out))
    assert exact >= 0.9 * 32 * len(prompts)


def test_attn_implementation_amdx_prefill_matches_sdpa_on_gpu():
    model = _llama_1b()
    ids = torch.tensor(_prompts(1, seed=2), device="cuda")
    with torch.no_grad():
        ref = model(ids).logits.float()
        model.set_attn_implementation("amdx")
        try:
            got = model(ids).logits.float()
        finally:
            model.set_attn_implementation("sdpa")
    assert (got - ref).abs().max().item() <= 0.02 * ref.std().item() + 1e-2
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.97


def test_captured_prefill_steps_give_the_eager_logits_within_fp16_tolerance():
    """Chunked and mixed steps replayed from the captured prefill graphs (padded to their token bucket) score
    like the same steps run eagerly; steps past the last bucket run eagerly."""
    from optimum_amdx.modeling.engine import LLMEngine
    from optimum_amdx.modeling.paged_model import PagedDecoder

    from .test_prefill_graph import check_padded_steps

    decoder = PagedDecoder(_llama_1b(), max_model_len=1024)
    engine = LLMEngine(decoder, max_num_seqs=4, max_num_batched_tokens=256, memory_fraction=0.3)
    runner = engine.runner
    assert sorted(runner.prefill_graphs) == sorted((t, s, r) for t in (32, 64, 128, 256) for s in (1, 4)
                                                   for r in {False, s == 1}), runner.prefill_graph_error
    replays = []

    def replayed(runner, batch):
        g = runner.prefill_graph_for(batch)
        replays.append((g.seqs, g.runs))
        return runner._replay_prefill(batch, g)[0]

    seen = check_padded_steps(engine, _prompts(4, seed=3), 8, replayed, atol=5e-2, rtol=2e-2)
    assert any(seqs > 1 for _, seqs, _ in seen) and any(tokens < 256 for tokens, _, _ in seen), seen
    # a lone prompt through the one-slot graph, its blocks one run (the idle engine's pool), then not
    replays.clear()
    seen = check_padded_steps(engine, _prompts(1, seed=4), 2, replayed, atol=5e-2, rtol=2e-2)
    assert seen and all(seqs == 1 for _, seqs, _ in seen) and set(replays) == {(1, True)}, (seen, replays)
    pool = engine.scheduler.allocator
    held = pool.allocate(2)
    pool.free(held[:1])  # the next prompt gets blocks 0, 2, 3, ...: not a run
    replays.clear()
    seen = check_padded_steps(engine, _prompts(1, seed=5), 2, replayed, atol=5e-2, rtol=2e-2)
    assert seen and set(replays) == {(1, False)}, replays
    pool.free(held[1:])
    assert engine.num_free_blocks == engine.num_blocks
