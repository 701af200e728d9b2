"""The paged engine of the model families with every kernel running (Triton's interpreter on CPU, set by
this folder's conftest before any kernel module is imported): RMSNorm, rotary + paged cache write, soft-capped
windowed unified attention, fused MoE. Token for token equal to transformers in fp32."""

from __future__ import annotations

import pytest

from optimum_amdx.modeling import AMDModelForCausalLM
from tests.modeling.test_families import FAMILY_NAMES, family_model, random_prompts, reference


@pytest.mark.parametrize("name", ["gemma2", "qwen3_moe"])
def test_family_engine_through_the_kernels_equals_transformers(name):
    am = AMDModelForCausalLM(family_model(name), block_size=4, max_num_seqs=2, max_num_batched_tokens=16,
                             max_model_len=64)
    prompts = random_prompts(2, 3, 20, seed=1)
    assert am.generate(prompts, max_new_tokens=6) == [reference(name, tuple(p), 6) for p in prompts]


def _teacher_forced_agreement(model, prompts, outs, rel_tol: float) -> int:
    """Assert every token we chose has a logit within `rel_tol * std` of transformers' best at that step (it
    scores our whole output, so one near-tie flip does not derail the comparison); the first token agrees.
    Returns how many steps picked transformers' own argmax."""
    import torch

    exact = 0
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt + out], device=model.device)
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        best = logits.max(dim=-1).values
        chosen = logits.gather(1, torch.tensor(out, device=model.device)[:, None]).squeeze(1)
        tol = rel_tol * logits.std().item() + 1e-3
        assert (best - chosen).max().item() <= tol, ((best - chosen).max().item(), tol)
        assert logits[0].argmax().item() == out[0]
        exact += sum(int(a == b) for a, b in zip(logits.argmax(-1).tolist(), out))
    return exact


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_family_engine_on_gpu_with_graphs_fp16(name):
    """On a GPU, every family in fp16 through the compiled kernels and captured decode graphs: greedy tokens are
    transformers' argmax wherever fp16 noise cannot flip it (teacher-forced), for a batch of different lengths."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    model = family_model(name).to("cuda", torch.float16)
    am = AMDModelForCausalLM(model, block_size=16, max_num_seqs=4, max_model_len=256, memory_fraction=0.05)
    assert am.engine.uses_graphs, am.engine.runner.graph_error
    prompts = random_prompts(4, 3, 90, seed=2)
    outs = am.generate(prompts, max_new_tokens=24)
    assert [len(o) for o in outs] == [24] * 4
    assert am.engine.num_free_blocks == am.engine.num_blocks
    exact = _teacher_forced_agreement(model, prompts, outs, rel_tol=0.05)
    assert exact >= 0.85 * 24 * len(prompts), exact


@pytest.mark.gpu
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_gptq_experts_decode_in_graphs_on_gpu(name, act_order):
    """On a GPU, a 4-bit GPTQ MoE (experts quantized one by one) decodes in captured graphs (the stacked-experts
    path has no host loop) and agrees with transformers running the same quantized model (teacher-forced); also
    with act-order experts whose permutations differ (a gather and a matmul per expert)."""
    import copy

    import torch

    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    if act_order:
        from ..modeling.test_act_order import act_order_experts_model

        model = act_order_experts_model(name)
    else:
        model = copy.deepcopy(family_model(name))
        GPTQQuantizer(GPTQConfig(bits=4, group_size=16), method="rtn", device="cpu", verbose=False).quantize(model)
    model = model.to("cuda", torch.float16)
    am = AMDModelForCausalLM(model, block_size=16, max_num_seqs=4, max_model_len=256, memory_fraction=0.05)
    assert am.engine.uses_graphs, am.engine.runner.graph_error
    prompts = random_prompts(4, 3, 90, seed=3)
    outs = am.generate(prompts, max_new_tokens=16)
    runner = am.decoder.layers[0].moe
    assert runner.stack_error is None and runner._stacked is not None
    exact = _teacher_forced_agreement(model, prompts, outs, rel_tol=0.05)
    assert exact >= 0.85 * 16 * len(prompts), exact
