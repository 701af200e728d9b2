"""Tiny seeded random Llama / Mistral / Qwen2 models for the modeling tests (fp32, CPU)."""

from __future__ import annotations

import functools

import pytest
import torch

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
            tie_word_embeddings=False)


@functools.lru_cache(maxsize=None)
def tiny_model(model_type: str = "llama", seed: int = 0, **overrides):
    """A random fp32 model with larger-than-default weights so logits are not near-ties."""
    from transformers import AutoConfig, AutoModelForCausalLM

    params = dict(TINY, **overrides)
    config = AutoConfig.for_model(model_type, **params)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
            elif "bias" in str(p.shape) or p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.05)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def hf_greedy(model, prompt: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    """transformers' own greedy continuation of one unpadded prompt."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, **kwargs)
    return out[0, len(prompt):].tolist()


def random_prompts(n: int, low: int, high: int, seed: int, vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (length,), generator=g).tolist() for length in lengths]


@pytest.fixture
def llama():
    return tiny_model("llama")


@pytest.fixture(autouse=True)
def _one_thread_per_worker():
    """The modeling tests run many tiny ops: one intra-op thread per pytest worker avoids
    oversubscribing CI's 2 cores (pytest -n 2), where extra threads only spin."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
