"""Calibration sources: the offline pydoc text and its split, local files, lists of strings, errors."""

from __future__ import annotations

import json

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError, ModelNotFoundError
from optimum_amdx.quantization import get_calibration_data, load_text_dataset
from optimum_amdx.quantization.calibration import get_eval_tokens


def test_pydoc_split_is_disjoint_and_seeded(tokenizer):
    train = "\n\n".join(load_text_dataset("pydoc", "train")["text"])
    test = "\n\n".join(load_text_dataset("pydoc", "test")["text"])
    assert len(train) > 8 * len(test) > 0 and test[:200] not in train
    a = get_calibration_data("pydoc", tokenizer, n_samples=4, seqlen=32, seed=1)
    b = get_calibration_data("pydoc", tokenizer, n_samples=4, seqlen=32, seed=1)
    c = get_calibration_data("pydoc", tokenizer, n_samples=4, seqlen=32, seed=2)
    assert all(x.shape == (1, 32) for x in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not all(torch.equal(x, y) for x, y in zip(a, c))
    assert len(get_eval_tokens("pydoc", tokenizer)) > 1000


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet", "list"])
def test_local_sources(tmp_path, tokenizer, kind):
    lines = [f"sample {i}: calibration text with some words in it, number {i * 13}." for i in range(60)]
    if kind == "txt":
        source = tmp_path / "c.txt"
        source.write_text("\n".join(lines))
    elif kind == "jsonl":
        source = tmp_path / "c.jsonl"
        source.write_text("\n".join(json.dumps({"content": s}) for s in lines))
    elif kind == "parquet":
        from datasets import Dataset

        source = tmp_path / "c.parquet"
        Dataset.from_dict({"text": lines}).to_parquet(str(source))
    else:
        source = lines
    samples = get_calibration_data(str(source) if kind != "list" else source, tokenizer, n_samples=3, seqlen=40)
    assert len(samples) == 3 and all(s.shape == (1, 40) for s in samples)
    assert tokenizer.decode(samples[0][0]).count("sample") >= 1


def test_bad_sources(tmp_path, tokenizer):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        get_calibration_data(str(tmp_path / "nope.json"), tokenizer)
    (tmp_path / "x.bin").write_bytes(b"\0\1")
    with pytest.raises(InvalidArgumentError, match="unknown type"):
        get_calibration_data(str(tmp_path / "x.bin"), tokenizer)
    with pytest.raises(InvalidArgumentError, match="only"):
        get_calibration_data(["tiny"], tokenizer)
