"""The padded layout of a captured prefill graph through every kernel (Triton's interpreter on CPU, set by this
folder's conftest): the attention programs of padding tokens and empty sequence slots return at once and
write nothing, so each chunked or mixed step gives the eager step's logits (tests/modeling/test_prefill_graph.py)."""

from __future__ import annotations

from optimum_amdx.modeling.engine import LLMEngine
from optimum_amdx.modeling.paged_model import PagedDecoder
from tests.modeling.conftest import random_prompts, tiny_model
from tests.modeling.test_prefill_graph import check_padded_steps, padded_on_host


def test_padded_prefill_steps_through_the_kernels_give_the_eager_logits():
    decoder = PagedDecoder(tiny_model("llama"), max_model_len=64)
    engine = LLMEngine(decoder, block_size=4, num_blocks=48, max_num_seqs=3, max_num_batched_tokens=16,
                       use_cuda_graph=False)
    seen = check_padded_steps(engine, random_prompts(3, 3, 20, seed=7), 3, padded_on_host, atol=1e-4, rtol=1e-4)
    assert any(seqs > 1 for _, seqs, _ in seen), seen
    assert engine.num_free_blocks == engine.num_blocks


def test_a_lone_prompt_in_the_one_slot_layout_through_the_kernels():
    """A one-sequence prompt, chunked, in the one-slot layout of its graph (`runner.prefill_seq_buckets`), whose
    attention computes the block ids of its run (`runner.blocks_run_from`)."""
    decoder = PagedDecoder(tiny_model("llama"), max_model_len=64)
    engine = LLMEngine(decoder, block_size=4, num_blocks=48, max_num_seqs=3, max_num_batched_tokens=16,
                       use_cuda_graph=False)
    seen = check_padded_steps(engine, random_prompts(1, 20, 30, seed=8), 2, padded_on_host, atol=1e-4, rtol=1e-4)
    assert len(seen) >= 2 and all(seqs == 1 for _, seqs, _ in seen), seen
    assert sorted(engine.runner._test_static_inputs) == [(32, 1, True)]  # its blocks one run: computed block ids
