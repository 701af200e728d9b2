"""The paged engine of the model families with every kernel running (Triton's interpreter on CPU, set by
this folder's conftest before any kernel module is imported): RMSNorm, rotary + paged cache write, soft-capped
windowed unified attention, fused MoE. Token for token equal to transformers in fp32."""

from __future__ import annotations

import pytest

from optimum_amdx.modeling import AMDModelForCausalLM
from tests.modeling.test_families import family_model, random_prompts, reference


@pytest.mark.parametrize("name", ["gemma2", "qwen3_moe"])
def test_family_engine_through_the_kernels_equals_transformers(name):
    am = AMDModelForCausalLM(family_model(name), block_size=4, max_num_seqs=2, max_num_batched_tokens=16,
                             max_model_len=64)
    prompts = random_prompts(2, 3, 20, seed=1)
    assert am.generate(prompts, max_new_tokens=6) == [reference(name, tuple(p), 6) for p in prompts]
