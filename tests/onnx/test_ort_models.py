"""ORT classes: generate() equals PyTorch, IO binding, encoders, provider choice and fallback checks."""

from __future__ import annotations

import warnings

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError, ProviderError
from optimum_amdx.onnxruntime import (
    ORTModelForCausalLM,
    ORTModelForFeatureExtraction,
    ORTModelForSequenceClassification,
    mean_pooling,
)
from optimum_amdx.onnxruntime import providers as P


def _prompts(tokenizer):
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer(["The capital of France is", "A short one"], return_tensors="pt", padding=True)


@pytest.mark.parametrize("fixture, source", [("llama_onnx", "tiny_llama_dir"), ("qwen2_onnx", "tiny_qwen2_dir")])
def test_greedy_generate_matches_pytorch(request, fixture, source, decoder_tokenizer):
    from transformers import AutoModelForCausalLM

    onnx_dir, src = request.getfixturevalue(fixture), request.getfixturevalue(source)
    pt = AutoModelForCausalLM.from_pretrained(src).eval()
    model = ORTModelForCausalLM.from_pretrained(onnx_dir)
    assert model.can_generate() and model.provider == "CPUExecutionProvider" and not model.use_io_binding
    enc = _prompts(decoder_tokenizer)
    kw = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=decoder_tokenizer.pad_token_id)
    ref = pt.generate(**enc, **kw)
    got = model.generate(**enc, **kw)
    assert torch.equal(ref, got)
    assert len(set(got[0, -10:].tolist())) > 1


def test_io_binding_on_cpu_matches_plain_run(llama_onnx, decoder_tokenizer):
    plain = ORTModelForCausalLM.from_pretrained(llama_onnx)
    bound = ORTModelForCausalLM.from_pretrained(llama_onnx, use_io_binding=True)
    assert bound.use_io_binding
    enc = _prompts(decoder_tokenizer)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=decoder_tokenizer.pad_token_id)
    assert torch.equal(plain.generate(**enc, **kw), bound.generate(**enc, **kw))
    out = bound(**enc)
    ref = plain(**enc)
    torch.testing.assert_close(out.logits, ref.logits)
    assert out.past_key_values.get_seq_length() == enc["input_ids"].shape[1]


def test_beam_search_and_sampling(llama_onnx, tiny_llama_dir, decoder_tokenizer):
    from transformers import AutoModelForCausalLM

    pt = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    model = ORTModelForCausalLM.from_pretrained(llama_onnx)
    enc = _prompts(decoder_tokenizer)
    kw = dict(max_new_tokens=5, num_beams=3, do_sample=False, pad_token_id=decoder_tokenizer.pad_token_id)
    assert torch.equal(pt.generate(**enc, **kw), model.generate(**enc, **kw))
    torch.manual_seed(0)
    sampled = model.generate(**enc, max_new_tokens=5, do_sample=True, top_k=20,
                             pad_token_id=decoder_tokenizer.pad_token_id)
    assert sampled.shape == (2, enc["input_ids"].shape[1] + 5)


def test_forward_checks_mask_length(llama_onnx):
    model = ORTModelForCausalLM.from_pretrained(llama_onnx)
    ids = torch.randint(5, 100, (1, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(InvalidArgumentError, match="attention_mask has length 3"):
        model(ids, attention_mask=torch.ones(1, 3, dtype=torch.int64))


def test_feature_extraction_matches_pytorch_and_static_buckets(bert_onnx, tiny_bert_dir, encoder_tokenizer):
    from transformers import AutoModel

    enc = encoder_tokenizer(["a first sentence about cats", "second", "the third sentence is longer than the others"],
                            return_tensors="pt", padding=True)
    pt = AutoModel.from_pretrained(tiny_bert_dir).eval()
    with torch.no_grad():
        ref = mean_pooling(pt(**enc).last_hidden_state, enc["attention_mask"])
    dynamic = ORTModelForFeatureExtraction.from_pretrained(bert_onnx)
    assert not dynamic.use_static_shapes  # CPU provider: buckets only by default on MIGraphX
    static = ORTModelForFeatureExtraction.from_pretrained(bert_onnx, use_static_shapes=True)
    for model in (dynamic, static):
        out = model(**enc).last_hidden_state
        assert out.shape == (3, enc["input_ids"].shape[1], 32)
        torch.testing.assert_close(mean_pooling(out, enc["attention_mask"]), ref, atol=1e-5, rtol=1e-4)
    assert "model_b4_s16.onnx" in static._graph_sessions
    too_long = encoder_tokenizer(["word " * 40], return_tensors="pt")
    with pytest.raises(InvalidArgumentError, match="exceeds the largest static bucket"):
        static(**too_long)


def test_sequence_classification_matches_pytorch(bert_cls_onnx, tiny_bert_cls_dir, encoder_tokenizer):
    from transformers import AutoModelForSequenceClassification

    enc = encoder_tokenizer(["good movie", "a terrible, boring film"], return_tensors="pt", padding=True)
    pt = AutoModelForSequenceClassification.from_pretrained(tiny_bert_cls_dir).eval()
    with torch.no_grad():
        ref = pt(**enc).logits
    for binding in (False, True):
        model = ORTModelForSequenceClassification.from_pretrained(bert_cls_onnx, use_io_binding=binding)
        torch.testing.assert_close(model(**enc).logits, ref, atol=1e-5, rtol=1e-4)


def test_save_pretrained_round_trip(tmp_path, bert_cls_onnx):
    model = ORTModelForSequenceClassification.from_pretrained(bert_cls_onnx)
    target = model.save_pretrained(tmp_path / "copy")
    again = ORTModelForSequenceClassification.from_pretrained(target)
    ids = torch.randint(10, 3000, (2, 6), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(model(ids).logits, again(ids).logits)


def test_provider_priority_and_aliases():
    assert P.choose_provider(None, ["CPUExecutionProvider", "ROCMExecutionProvider"]) == P.ROCM
    assert P.choose_provider(None, ["CUDAExecutionProvider", "MIGraphXExecutionProvider", "CPUExecutionProvider"]) == P.MIGRAPHX
    assert P.choose_provider(None, ["CPUExecutionProvider"]) == P.CPU
    assert P.choose_provider("migraphx", ["MIGraphXExecutionProvider"]) == P.MIGRAPHX
    with pytest.raises(ProviderError, match="not available"):
        P.choose_provider("cuda", ["CPUExecutionProvider"])


def test_provider_options_validation_and_defaults():
    rocm = P.provider_options("rocm", {"tunable_op_tuning_enable": True, "device_id": 1})
    assert rocm == {"device_id": "1", "tunable_op_enable": "1", "tunable_op_tuning_enable": "1"}
    mgx = P.provider_options("MIGraphXExecutionProvider", {"migraphx_fp16_enable": "true"})
    assert mgx["migraphx_fp16_enable"] == "1" and mgx["device_id"] == "0"
    with pytest.raises(InvalidArgumentError, match="Unknown ROCMExecutionProvider option 'tunable'.*tunable_op_enable"):
        P.provider_options("rocm", {"tunable": 1})
    with pytest.raises(InvalidArgumentError, match="expected a boolean"):
        P.provider_options("rocm", {"tunable_op_enable": "maybe"})
    with pytest.raises(InvalidArgumentError, match="device_id"):
        P.provider_options("migraphx", {"device_id": "gpu0"})


class _FakeSession:
    def __init__(self, providers):
        self._providers = providers

    def get_providers(self):
        return self._providers


def test_silent_fallback_is_an_error_naming_the_library():
    with pytest.raises(ProviderError, match=r"ROCMExecutionProvider was requested but .* CPUExecutionProvider.*libonnxruntime_providers_rocm\.so"):
        P.verify_session(_FakeSession(["CPUExecutionProvider"]), P.ROCM)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert P.verify_session(_FakeSession(["CPUExecutionProvider"]), P.MIGRAPHX, allow_fallback=True) == P.CPU
    assert any("MIGraphXExecutionProvider was requested" in str(w.message) for w in caught)
    assert P.verify_session(_FakeSession(["ROCMExecutionProvider", "CPUExecutionProvider"]), P.ROCM) == P.ROCM


def test_binding_device_names():
    from optimum_amdx.onnxruntime.binding import ort_device_type

    assert ort_device_type(P.CPU) == "cpu"
    assert ort_device_type(P.ROCM) == "cuda" and ort_device_type(P.CUDA) == "cuda"
    assert ort_device_type(P.MIGRAPHX, "1.22.2") == "cuda"
    assert ort_device_type(P.MIGRAPHX, "1.23.0") == "gpu"
