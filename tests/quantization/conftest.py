"""Shared fixtures: a byte-level tokenizer and tiny seeded Llama models saved as folders."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # GPT-QModel's default pool needs >1 CPU worker


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="!", pad_token='"')


def make_llama(seed: int = 0, hidden: int = 128, layers: int = 2, bias: bool = False, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attention_bias=bias, mlp_bias=bias, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def calib(tokenizer):
    from optimum_amdx.quantization import get_calibration_data

    return get_calibration_data("pydoc", tokenizer, n_samples=8, seqlen=64, seed=0)


@pytest.fixture
def tiny_dir(tmp_path, tokenizer):
    """A tiny unquantized Llama folder (safetensors + tokenizer)."""
    path = tmp_path / "tiny_fp"
    make_llama().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _one_thread_per_worker():
    """CI runs 2 xdist workers on 2 cores: one torch thread each avoids oversubscription (3-5x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
