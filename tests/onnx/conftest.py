"""Fixtures for the ONNX path: tiny seeded random models (saved like hub folders) and their exports.

Tiny models get word-level tokenizers built here from the standard library's pydoc topics, so
these tests need no download; only tests/onnx/test_real_models.py uses the bundled real models. Exports are module- or session-scoped: tracing is the slow part.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

warnings.filterwarnings("ignore")


def _decoder_config(kind: str, vocab: int):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                  initializer_range=0.3)
    if kind == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(**common)


def _save_decoder(kind: str, folder: Path, tokenizer) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed({"llama": 11, "qwen2": 12}[kind])
    # A wide init (initializer_range 0.3) spreads the logits, so greedy choices are not near-ties.
    model = AutoModelForCausalLM.from_config(_decoder_config(kind, len(tokenizer)))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _save_encoder(task: str, folder: Path, tokenizer) -> Path:
    from transformers import AutoModel, AutoModelForSequenceClassification, BertConfig

    torch.manual_seed(13 if task == "feature-extraction" else 14)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128, num_labels=3,
                        id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
    cls = AutoModel if task == "feature-extraction" else AutoModelForSequenceClassification
    cls.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from optimum_amdx.models import resolve_model

    return resolve_model("default")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from optimum_amdx.models import resolve_model

    return resolve_model("all-minilm-l6-v2")


def _word_tokenizer(encoder: bool):
    """A word-level fast tokenizer over the 3000 commonest words of the stdlib's pydoc topics (no download)."""
    import collections
    import re

    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = collections.Counter(w for text in topics.values() for w in re.findall(r"[a-z]+", text.lower()))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if encoder else ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(w for w, _ in words.most_common(3000)))}
    unk = "[UNK]" if encoder else "<unk>"
    backend = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if encoder:
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=unk, pad_token="[PAD]", cls_token="[CLS]",
                                       sep_token="[SEP]", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=unk, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", padding_side="left")


@pytest.fixture(scope="session")
def decoder_tokenizer():
    return _word_tokenizer(encoder=False)


@pytest.fixture(scope="session")
def encoder_tokenizer():
    return _word_tokenizer(encoder=True)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, decoder_tokenizer) -> Path:
    return _save_decoder("llama", tmp_path_factory.mktemp("tiny-llama"), decoder_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, decoder_tokenizer) -> Path:
    return _save_decoder("qwen2", tmp_path_factory.mktemp("tiny-qwen2"), decoder_tokenizer)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, encoder_tokenizer) -> Path:
    return _save_encoder("feature-extraction", tmp_path_factory.mktemp("tiny-bert"), encoder_tokenizer)


@pytest.fixture(scope="session")
def tiny_bert_cls_dir(tmp_path_factory, encoder_tokenizer) -> Path:
    return _save_encoder("text-classification", tmp_path_factory.mktemp("tiny-bert-cls"), encoder_tokenizer)


@pytest.fixture(scope="session")
def llama_onnx(tmp_path_factory, tiny_llama_dir) -> Path:
    from optimum_amdx.exporters import export_model

    return export_model(tiny_llama_dir, tmp_path_factory.mktemp("llama-onnx") / "out", optimize="extended").output_dir


@pytest.fixture(scope="session")
def qwen2_onnx(tmp_path_factory, tiny_qwen2_dir) -> Path:
    from optimum_amdx.exporters import export_model

    return export_model(tiny_qwen2_dir, tmp_path_factory.mktemp("qwen2-onnx") / "out").output_dir


@pytest.fixture(scope="session")
def llama_static_onnx(tmp_path_factory, tiny_llama_dir) -> Path:
    """Tiny Llama with a fixed-capacity KV cache: prompt buckets 8 and 16, batch buckets 1 and 2, 40 slots."""
    from optimum_amdx.exporters import StaticShapes, export_model

    return export_model(tiny_llama_dir, tmp_path_factory.mktemp("llama-static") / "out",
                        static_shapes=StaticShapes((1, 2), (8, 16), capacity=40)).output_dir


@pytest.fixture(scope="session")
def bert_onnx(tmp_path_factory, tiny_bert_dir) -> Path:
    from optimum_amdx.exporters import StaticShapes, export_model

    return export_model(tiny_bert_dir, tmp_path_factory.mktemp("bert-onnx") / "out", optimize="extended",
                        static_shapes=StaticShapes((1, 4), (16, 32))).output_dir


@pytest.fixture(scope="session")
def bert_cls_onnx(tmp_path_factory, tiny_bert_cls_dir) -> Path:
    from optimum_amdx.exporters import export_model

    return export_model(tiny_bert_cls_dir, tmp_path_factory.mktemp("bert-cls-onnx") / "out").output_dir


def _folder_snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def folder_snapshot():
    """Names and sizes of the files under a folder (to show that a failed command changed nothing)."""
    return _folder_snapshot
