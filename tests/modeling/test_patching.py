"""attn_implementation="amdx" through transformers' own generate, and patch()/unpatch() round trips."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

import optimum_amdx
from optimum_amdx.modeling import FusedRMSNorm, patch, unpatch

from .conftest import random_prompts, tiny_model


def _amdx_copy(model_type: str):
    ref = tiny_model(model_type)
    model = AutoModelForCausalLM.from_config(ref.config, dtype=torch.float32, attn_implementation="amdx")
    model.load_state_dict(ref.state_dict())
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return ref, model.eval()


def test_attn_implementation_amdx_generates_like_sdpa(monkeypatch):
    import optimum_amdx.modeling.attention as attention

    calls = []
    kernel = attention.flash_attention
    monkeypatch.setattr(attention, "flash_attention", lambda *a, **k: calls.append(a[0].shape) or kernel(*a, **k))
    ref, model = _amdx_copy("llama")
    assert model.config._attn_implementation == "amdx"
    prompts = random_prompts(3, 3, 12, seed=23)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    with torch.no_grad():
        single = torch.tensor([prompts[0]])
        assert torch.equal(model.generate(single, max_new_tokens=10, do_sample=False),
                           ref.generate(single, max_new_tokens=10, do_sample=False))
        assert calls and calls[0][2] == len(prompts[0]) and calls[-1][2] == 1
        out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        expected = ref.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, expected)


def test_patch_swaps_norms_and_attention_and_unpatch_restores_exactly():
    model = tiny_model("qwen2", seed=29)
    ids = torch.tensor(random_prompts(1, 16, 16, seed=31))
    with torch.no_grad():
        before = model(ids).logits
        norm_types = [type(m) for m in model.modules()]
        assert optimum_amdx.patch(model) is model
        assert model.config._attn_implementation == "amdx"
        fused = [m for m in model.modules() if isinstance(m, FusedRMSNorm)]
        assert len(fused) == 2 * model.config.num_hidden_layers + 1
        assert fused[0].weight is fused[0].original.weight
        patched = model(ids).logits
        torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-5)
        patch(model)
        assert unpatch(model) is model
        assert model.config._attn_implementation == "sdpa"
        assert [type(m) for m in model.modules()] == norm_types
        assert torch.equal(model(ids).logits, before)
        unpatch(model)
