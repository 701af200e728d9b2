"""optimum_amdx.pipeline: transformers Pipelines on ORT or the PyTorch (rocm) path."""

from __future__ import annotations

import pytest
import torch
import transformers

from optimum_amdx import pipeline
from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.onnxruntime import ORTModelForCausalLM, ORTModelForFeatureExtraction, ORTModelForSequenceClassification


def test_text_generation_ort_equals_pytorch(llama_onnx, tiny_llama_dir):
    ort_pipe = pipeline("text-generation", model=str(llama_onnx), accelerator="ort")
    assert isinstance(ort_pipe, transformers.Pipeline) and isinstance(ort_pipe.model, ORTModelForCausalLM)
    pt_pipe = pipeline("text-generation", model=str(tiny_llama_dir), accelerator=None)
    kw = dict(max_new_tokens=8, do_sample=False, return_full_text=False)
    got = ort_pipe("Once upon a time", **kw)[0]["generated_text"]
    ref = pt_pipe("Once upon a time", **kw)[0]["generated_text"]
    assert got == ref and got


def test_text_generation_exports_on_the_fly(tmp_path, monkeypatch, tiny_qwen2_dir):
    monkeypatch.setenv("OPTIMUM_AMDX_CACHE", str(tmp_path / "cache"))
    pipe = pipeline("text-generation", model=str(tiny_qwen2_dir), accelerator="ort")
    assert isinstance(pipe.model, ORTModelForCausalLM)
    assert (pipe.model.model_path / "model.onnx").is_file() and str(tmp_path) in str(pipe.model.model_path)
    assert pipe("Hello", max_new_tokens=3, do_sample=False)[0]["generated_text"].startswith("Hello")


def test_feature_extraction_and_classification(bert_onnx, bert_cls_onnx, tiny_bert_cls_dir):
    fe = pipeline("feature-extraction", model=str(bert_onnx), accelerator="ort")
    assert isinstance(fe.model, ORTModelForFeatureExtraction)
    features = fe("hello world", return_tensors=True)
    assert features.shape[-1] == 32 and features.shape[1] >= 3
    clf = pipeline("text-classification", model=str(bert_cls_onnx), accelerator="ort")
    assert isinstance(clf.model, ORTModelForSequenceClassification)
    ref = pipeline("text-classification", model=str(tiny_bert_cls_dir), accelerator=None)
    text = "what a wonderful day"
    got, want = clf(text)[0], ref(text)[0]
    assert got["label"] == want["label"] and got["label"] in {"neg", "neu", "pos"}
    assert abs(got["score"] - want["score"]) < 1e-4


def test_rocm_accelerator_is_pytorch_on_best_device(tiny_llama_dir, tiny_bert_cls_dir):
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    pipe = pipeline("text-generation", model=str(tiny_llama_dir), accelerator="rocm")
    assert pipe.model.device.type == expected and not isinstance(pipe.model, ORTModelForCausalLM)
    assert pipe("Hi", max_new_tokens=2, do_sample=False)[0]["generated_text"].startswith("Hi")
    clf = pipeline("text-classification", model=str(tiny_bert_cls_dir), accelerator="rocm")
    assert isinstance(clf.model, transformers.PreTrainedModel) and clf.model.device.type == expected
    assert clf("fine")[0]["label"] in {"neg", "neu", "pos"}


def test_unknown_accelerator_and_task():
    with pytest.raises(InvalidArgumentError, match="Unknown accelerator 'tpu'.*'ort'.*'rocm'"):
        pipeline("text-generation", model="default", accelerator="tpu")
    with pytest.raises(InvalidArgumentError, match="Valid tasks: text-generation, feature-extraction, text-classification"):
        pipeline("translation", model="default", accelerator="ort")


def test_no_global_patching(llama_onnx):
    before = (transformers.pipeline, transformers.GenerationMixin.generate, transformers.AutoModelForCausalLM.from_pretrained)
    pipeline("text-generation", model=str(llama_onnx), accelerator="ort")
    after = (transformers.pipeline, transformers.GenerationMixin.generate, transformers.AutoModelForCausalLM.from_pretrained)
    assert before == after
