"""The ONNX contract between the exporter and the runtime: file names, tensor names, graph roles, metadata.

An export folder is read by `optimum_amdx.onnxruntime` and written by `optimum_amdx.exporters`;
everything both sides must agree on lives here, once, and imports neither torch nor onnx, so the
runtime, the CLI and error paths can use it without loading the exporter (torch.onnx, onnxscript).

Folder layout (all names relative to the export folder):

- `model.onnx` (+ `model.onnx.data`, the one weight file): the main graph. For decoders it takes
  `input_ids`, `attention_mask`, `position_ids` and the past key/values (`past_key_values.{i}.key`
  / `.value`) and returns `logits` and `present.{i}.key` / `.value`. Dynamic decoders grow the
  cache (present = past + new); static decoders (`kv_cache: "static"`) take a fixed-capacity
  buffer plus `cache_position` (where the new tokens are written) and return the updated buffer.
- Fixed-shape graphs for MIGraphX, which compiles one program per input shape, each pointing at
  the same weight file: `model_b{B}_s{S}.onnx` (encoder buckets), `prefill_b{B}_s{S}.onnx` and
  `decode_b{B}.onnx` (static decoders).
- `amdx_export.json`: the metadata; its `graphs` list says what each graph file is for.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import ExportValidationError

ONNX_FILE = "model.onnx"
WEIGHTS_FILE = ONNX_FILE + ".data"
METADATA_FILE = "amdx_export.json"
# 1: one graph (+ encoder buckets, listed in "static_bucket_files"); 2: adds "graphs", "files", "kv_cache".
CONTRACT_VERSION = 2

# Tensor names.
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
TOKEN_TYPE_IDS = "token_type_ids"
CACHE_POSITION = "cache_position"
LOGITS = "logits"
LAST_HIDDEN_STATE = "last_hidden_state"

# Dimension names of dynamic axes.
BATCH_DIM = "batch_size"
SEQUENCE_DIM = "sequence_length"
PAST_DIM = "past_sequence_length"
TOTAL_DIM = "total_sequence_length"

# Graph roles (the "role" of each entry of metadata["graphs"]).
ROLE_MAIN = "main"                # model.onnx: any shape its dynamic axes allow
ROLE_ENCODER_BUCKET = "encoder_bucket"  # encoder graph with fixed (batch, sequence)
ROLE_PREFILL = "prefill"          # static decoder: fixed (batch, prompt bucket), writes the prompt into the buffer
ROLE_DECODE = "decode"            # static decoder: fixed batch, one new token per step

KV_DYNAMIC = "dynamic"
KV_STATIC = "static"


def past_names(num_layers: int) -> list[str]:
    """Graph input names of the past key/values, in the flat order the exporter's wrapper takes them."""
    return [f"past_key_values.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


def present_names(num_layers: int) -> list[str]:
    """Graph output names of the present key/values, same order as `past_names`."""
    return [f"present.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


def decoder_input_names(num_layers: int, static: bool = False) -> list[str]:
    """All decoder graph inputs in order; static-cache graphs add `cache_position` before the past."""
    head = [INPUT_IDS, ATTENTION_MASK, POSITION_IDS] + ([CACHE_POSITION] if static else [])
    return head + past_names(num_layers)


def decoder_output_names(num_layers: int) -> list[str]:
    """All decoder graph outputs in order."""
    return [LOGITS] + present_names(num_layers)


@dataclass(frozen=True)
class DecoderShape:
    """The KV cache geometry of a decoder: layers, KV heads and head size."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def decoder_shape(config: Any) -> DecoderShape:
    """Read the KV-cache geometry from a transformers decoder config (handles GQA and explicit head_dim)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return DecoderShape(int(text.num_hidden_layers), int(kv_heads), int(head_dim))


def encoder_bucket_file(batch: int, seq: int) -> str:
    """File name of the encoder graph for one (batch, sequence) bucket."""
    return f"model_b{batch}_s{seq}.onnx"


def prefill_file(batch: int, seq: int) -> str:
    """File name of the static decoder's prefill graph for one (batch, prompt length) bucket."""
    return f"prefill_b{batch}_s{seq}.onnx"


def decode_file(batch: int) -> str:
    """File name of the static decoder's one-token decode graph for one batch bucket."""
    return f"decode_b{batch}.onnx"


@dataclass(frozen=True)
class GraphEntry:
    """One graph file of an export and what it is for; `None` sizes are dynamic."""

    file: str
    role: str
    batch: int | None = None
    sequence: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def graphs(metadata: dict[str, Any] | None) -> list[GraphEntry]:
    """The graphs of an export, from `metadata["graphs"]` (or the older `static_bucket_files`)."""
    if not metadata:
        return [GraphEntry(ONNX_FILE, ROLE_MAIN)]
    if metadata.get("graphs"):
        return [GraphEntry(g["file"], g["role"], g.get("batch"), g.get("sequence")) for g in metadata["graphs"]]
    entries = [GraphEntry(ONNX_FILE, ROLE_MAIN)]
    shapes = metadata.get("static_shapes") or {}
    for b in shapes.get("batch_sizes", []):
        for s in shapes.get("sequence_lengths", []):
            entries.append(GraphEntry(encoder_bucket_file(b, s), ROLE_ENCODER_BUCKET, b, s))
    return entries


def graph_for(metadata: dict[str, Any] | None, role: str, batch: int, sequence: int | None = None) -> GraphEntry | None:
    """The graph of `role` with exactly this batch (and sequence) bucket, or None."""
    for g in graphs(metadata):
        if g.role == role and g.batch == batch and (sequence is None or g.sequence == sequence):
            return g
    return None


def read_metadata(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The metadata of an export folder, or None when the folder has none (not written by us)."""
    path = Path(folder) / METADATA_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ExportValidationError(
            f"{path} is not valid JSON ({err}); the export is damaged. Re-export with `optimum-cli export rocm`."
        ) from err
    if not isinstance(data, dict):
        raise ExportValidationError(f"{path} does not hold a JSON object; re-export with `optimum-cli export rocm`.")
    return data


def write_metadata(folder: str | os.PathLike, metadata: dict[str, Any]) -> Path:
    """Write `metadata` (plus the contract version and the list of files the export owns) as amdx_export.json.

    The two added keys are also set in `metadata` itself, so the caller holds what was written.

    `files` is every file of the folder at this point plus the metadata file itself: the export
    writes the metadata last, so this is exactly what the export wrote.
    """
    folder = Path(folder)
    metadata["contract_version"] = CONTRACT_VERSION
    metadata["files"] = sorted({p.name for p in folder.iterdir() if p.is_file()} | {METADATA_FILE})
    path = folder / METADATA_FILE
    path.write_text(json.dumps(metadata, indent=2) + "\n")
    return path


def export_files(folder: str | os.PathLike, metadata: dict[str, Any] | None = None) -> list[str]:
    """The files that belong to the export in `folder` (never anything else a user put there).

    From `metadata["files"]` when present; for older exports, the graph files, their weight
    files, config/generation/tokenizer files the metadata names, and the metadata itself.
    """
    folder = Path(folder)
    metadata = read_metadata(folder) if metadata is None else metadata
    if metadata and metadata.get("files"):
        names: Iterable[str] = metadata["files"]
    else:
        names = [g.file for g in graphs(metadata)] + [ONNX_FILE + ".data", "config.json", "generation_config.json",
                                                      METADATA_FILE]
        names = list(names) + list((metadata or {}).get("tokenizer_files", []))
    return sorted(n for n in set(names) if (folder / n).is_file())


ONNX_EXTRA_HINT = 'pip install "optimum-amdx[onnx]"'


def require_onnx_packages(*packages: str) -> None:
    """Import-check the ONNX stack (`onnx`, `onnxruntime`, `onnxscript`); a clear error naming the extra if absent.

    AMD GPU users install `onnxruntime-migraphx` (or `onnxruntime-rocm` <= 1.22) in place of
    `onnxruntime`; each provides the same `onnxruntime` module.
    """
    import importlib

    from ..errors import HardwareError

    missing = []
    for name in packages or ("onnx", "onnxruntime"):
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing.append(f"{name} ({err})")
    if missing:
        raise HardwareError(
            f"The ONNX path needs packages that are not installed: {'; '.join(missing)}. Install them with "
            f"{ONNX_EXTRA_HINT} (on AMD GPUs, then replace onnxruntime by onnxruntime-migraphx)."
        )
