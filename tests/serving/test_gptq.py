"""A GPTQ checkpoint is served through the same path (our W4A16 QuantLinear), output equal to the engine alone."""

from __future__ import annotations

import pytest
import torch

openai = pytest.importorskip("openai")

from optimum_amdx.modeling import AMDModelForCausalLM, SamplingParams  # noqa: E402
from optimum_amdx.models import load_tokenizer  # noqa: E402
from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, QuantLinear  # noqa: E402

from .conftest import expected_text, running_server  # noqa: E402


@pytest.fixture(scope="module")
def gptq_dir(tiny_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    GPTQQuantizer(GPTQConfig(bits=4, group_size=32), method="rtn", verbose=False).quantize(model)
    return GPTQQuantizer().save_pretrained(model, tmp_path_factory.mktemp("gptq") / "q", load_tokenizer(tiny_dir))


def test_gptq_checkpoint_served_like_the_engine_alone(gptq_dir):
    tok = load_tokenizer(gptq_dir)
    served = AMDModelForCausalLM.from_pretrained(gptq_dir, device="cpu", num_blocks=64, block_size=4, max_model_len=128)
    assert isinstance(served.model.model.layers[0].self_attn.q_proj, QuantLinear)
    alone = AMDModelForCausalLM.from_pretrained(gptq_dir, device="cpu", num_blocks=64, block_size=8, max_model_len=128)
    prompt = "the value of a class is"
    ids = tok(prompt)["input_ids"]
    out = alone.engine.generate([ids], SamplingParams(max_new_tokens=10, stop_token_ids=(tok.eos_token_id,)))[0]
    with running_server(served, tok, model_name="q") as (url, _state):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        res = client.completions.create(model="q", prompt=prompt, max_tokens=10, temperature=0)
    assert res.choices[0].text == expected_text(tok, ids, out) and res.usage.completion_tokens == len(out)
