"""The bad inputs named in the issue: each is a clear error and leaves no half-written output."""

from __future__ import annotations

import shutil

import pytest

from optimum_amdx.errors import (
    ExportValidationError,
    ModelNotFoundError,
    OutputExistsError,
    ProviderError,
    UnsupportedModelError,
)
from optimum_amdx.exporters import export_model
from optimum_amdx.onnxruntime import ORTModelForCausalLM, ORTModelForFeatureExtraction


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_model_onnx(tmp_path, bert_cls_onnx):
    folder = _copy(bert_cls_onnx, tmp_path / "m")
    (folder / "model.onnx").unlink()
    with pytest.raises(ModelNotFoundError, match="has no model.onnx.*optimum-cli export rocm"):
        ORTModelForFeatureExtraction.from_pretrained(folder)


def test_corrupt_model_onnx(tmp_path, llama_onnx):
    folder = _copy(llama_onnx, tmp_path / "m")
    data = (folder / "model.onnx").read_bytes()
    (folder / "model.onnx").write_bytes(data[: len(data) // 3] + b"\x00garbage" * 10)
    with pytest.raises(ExportValidationError, match="model.onnx"):
        ORTModelForCausalLM.from_pretrained(folder)


def test_folder_without_config(tmp_path, llama_onnx):
    folder = _copy(llama_onnx, tmp_path / "m")
    (folder / "config.json").unlink()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        ORTModelForCausalLM.from_pretrained(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        export_model(empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    src = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)).save_pretrained(src)
    with pytest.raises(UnsupportedModelError, match=r"'gpt2' is not supported.*llama, qwen2, mistral"):
        export_model(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_sliding_window_decoder_is_refused(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    src = tmp_path / "mistral"
    cfg = MistralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=8, max_position_embeddings=64)
    MistralForCausalLM(cfg).save_pretrained(src)
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        export_model(src, tmp_path / "out")


def test_wrong_task_folder(bert_cls_onnx):
    with pytest.raises(UnsupportedModelError, match="'text-classification' export"):
        ORTModelForFeatureExtraction.from_pretrained(bert_cls_onnx)


def test_unknown_provider(llama_onnx):
    with pytest.raises(ProviderError, match="Unknown execution provider 'tpu'.*MIGraphXExecutionProvider"):
        ORTModelForCausalLM.from_pretrained(llama_onnx, provider="tpu")


def test_provider_not_in_installed_onnxruntime(llama_onnx):
    with pytest.raises(ProviderError, match="ROCMExecutionProvider is not available.*onnxruntime-rocm"):
        ORTModelForCausalLM.from_pretrained(llama_onnx, provider="rocm")


def test_existing_output_folder_is_kept(tmp_path, tiny_bert_cls_dir, folder_snapshot):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    before = folder_snapshot(tmp_path)
    with pytest.raises(OutputExistsError, match="--overwrite"):
        export_model(tiny_bert_cls_dir, out)
    assert folder_snapshot(tmp_path) == before


def test_overwrite_replaces_our_earlier_output_only(tmp_path, tiny_bert_cls_dir):
    from optimum_amdx.io import atomic_output_dir

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("user data")
    with pytest.raises(OutputExistsError, match="not written by optimum-amdx"):
        export_model(tiny_bert_cls_dir, mine, overwrite=True, validate=False)
    assert (mine / "notes.txt").read_text() == "user data"
    out = tmp_path / "out"
    with atomic_output_dir(out) as tmp:  # an earlier output of ours
        (tmp / "stale.txt").write_text("old")
    export_model(tiny_bert_cls_dir, out, overwrite=True, validate=False)
    assert (out / "model.onnx").is_file() and not (out / "stale.txt").exists()


def test_pytorch_folder_without_export_flag(tiny_llama_dir):
    with pytest.raises(ModelNotFoundError, match="export=True"):
        ORTModelForCausalLM.from_pretrained(tiny_llama_dir)


def test_missing_model_folder(tmp_path):
    with pytest.raises(ModelNotFoundError):
        export_model(tmp_path / "nope", tmp_path / "out")
    assert not (tmp_path / "out").exists()
