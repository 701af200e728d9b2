"""Calibration and evaluation text: named datasets, local files, lists of strings, or the offline default.

The offline default is the text of the standard library's `pydoc_data.topics` (about 65k words,
present in every CPython), loaded through `datasets`. It is split once by characters: the first
90% is the calibration ("train") part and the last 10% the held-out ("test") part used for
perplexity, so quantization never sees the evaluation text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, ModelNotFoundError

OFFLINE_NAMES = ("pydoc", "pydoc_data", "default")
ONLINE_NAMES = ("wikitext2", "wikitext", "c4")
TRAIN_FRACTION = 0.9
_TEXT_SUFFIXES = {".txt": "text", ".md": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def pydoc_text() -> str:
    """All topic texts of `pydoc_data.topics`, joined in sorted key order (deterministic)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def _pydoc_dataset(split: str):
    from datasets import Dataset

    text = pydoc_text()
    cut = text.rfind("\n\n", 0, int(len(text) * TRAIN_FRACTION))
    part = text[:cut] if split == "train" else text[cut:]
    paragraphs = [p for p in part.split("\n\n") if p.strip()]
    return Dataset.from_dict({"text": paragraphs})


def _online_dataset(name: str, split: str):
    from datasets import load_dataset

    try:
        if name in ("wikitext2", "wikitext"):
            return load_dataset("wikitext", "wikitext-2-raw-v1", split="train" if split == "train" else "test")
        return load_dataset(
            "allenai/c4",
            data_files={"train": "en/c4-train.00000-of-01024.json.gz", "validation": "en/c4-validation.00000-of-00008.json.gz"},
            split="train" if split == "train" else "validation",
        )
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds when offline
        raise ModelNotFoundError(
            f"Could not load the dataset {name!r} from the Hugging Face Hub ({type(err).__name__}: {err}). "
            "It needs network access; offline, use --dataset pydoc, a local .txt/.json/.parquet file, or a list of strings."
        ) from err


def _file_dataset(path: Path, split: str):
    from datasets import load_dataset

    if not path.is_file():
        raise ModelNotFoundError(
            f"Calibration dataset file {str(path)!r} does not exist. Give an existing .txt, .json/.jsonl, .parquet or "
            ".csv file, or a named set (pydoc, wikitext2, c4)."
        )
    kind = _TEXT_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise InvalidArgumentError(
            f"Calibration file {path.name!r} has an unknown type; expected one of {sorted(_TEXT_SUFFIXES)}."
        )
    ds = load_dataset(kind, data_files=str(path), split="train")
    if "text" not in ds.column_names:
        string_cols = [c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
        if not string_cols:
            raise InvalidArgumentError(
                f"Calibration file {path.name!r} has no text column (columns: {ds.column_names}); add a 'text' column."
            )
        ds = ds.rename_column(string_cols[0], "text")
    return _split_rows(ds, split)


def _split_rows(ds: Any, split: str):
    """Hold out the last 10% of rows (at least one) for evaluation when a source has no splits."""
    n = len(ds)
    if n < 2:
        return ds
    cut = max(1, min(n - 1, int(n * TRAIN_FRACTION)))
    return ds.select(range(cut)) if split == "train" else ds.select(range(cut, n))


def load_text_dataset(source: Any = "pydoc", split: str = "train"):
    """A `datasets.Dataset` with a "text" column from a name, a file path, a list of strings or a Dataset."""
    from datasets import Dataset

    if split not in ("train", "test"):
        raise InvalidArgumentError(f"split={split!r}; expected 'train' (calibration) or 'test' (evaluation).")
    if source is None:
        source = "pydoc"
    if isinstance(source, Dataset):
        if "text" not in source.column_names:
            raise InvalidArgumentError(f"The given Dataset has no 'text' column (columns: {source.column_names}).")
        return source
    if isinstance(source, (list, tuple)):
        if not source or not all(isinstance(s, str) for s in source):
            raise InvalidArgumentError("A calibration list must be a non-empty list of strings.")
        return Dataset.from_dict({"text": list(source)})
    if isinstance(source, (str, os.PathLike)):
        text = str(source)
        if text.lower() in OFFLINE_NAMES:
            return _pydoc_dataset(split)
        if text.lower() in ONLINE_NAMES:
            return _online_dataset(text.lower(), split)
        return _file_dataset(Path(text).expanduser(), split)
    raise InvalidArgumentError(
        f"Unsupported dataset {type(source).__name__}; give a name (pydoc, wikitext2, c4), a file path or a list of strings."
    )


def _token_stream(ds: Any, tokenizer: Any) -> "Any":
    import torch

    text = "\n\n".join(t for t in ds["text"] if t)
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def get_calibration_data(
    source: Any,
    tokenizer: Any,
    n_samples: int = 128,
    seqlen: int = 2048,
    seed: int = 0,
) -> list["Any"]:
    """`n_samples` windows of `seqlen` tokens ([1, seqlen] LongTensors) drawn at seeded random offsets
    from the concatenated "train" text. A text shorter than `seqlen` gives windows of its own length;
    one shorter than 33 tokens is an error. A list of token-id tensors is passed through."""
    import torch

    if isinstance(source, (list, tuple)) and source and all(isinstance(s, torch.Tensor) for s in source):
        return [s.reshape(1, -1).long() for s in source]
    stream = _token_stream(load_text_dataset(source, "train"), tokenizer)
    if len(stream) < seqlen + 1:
        if len(stream) < 33:
            raise InvalidArgumentError(
                f"The calibration text has only {len(stream)} tokens; give more text (at least {seqlen + 1} tokens)."
            )
        seqlen = len(stream) - 1
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - seqlen, (n_samples,), generator=gen)
    return [stream[s : s + seqlen].unsqueeze(0) for s in starts.tolist()]


def get_eval_tokens(source: Any, tokenizer: Any) -> "Any":
    """The held-out ("test") token stream of `source` as one LongTensor (for perplexity)."""
    return _token_stream(load_text_dataset(source, "test"), tokenizer)


def describe_split() -> str:
    """One sentence on how the offline text is split (printed by eval-ppl and the benchmarks)."""
    return (
        f"pydoc_data.topics text split by characters at a paragraph break: first {int(TRAIN_FRACTION * 100)}% "
        f"for calibration, last {100 - int(TRAIN_FRACTION * 100)}% held out for perplexity"
    )

