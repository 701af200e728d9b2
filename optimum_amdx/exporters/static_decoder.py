"""Static-shape decoder export for MIGraphX: a fixed-capacity KV cache, prefill buckets, one decode graph per batch.

MIGraphX compiles one program per input shape, so a decoder whose cache grows by one token per
step would be recompiled at every step. Here the cache is a buffer of fixed capacity `C`:

- inputs: `input_ids` (B, S), `attention_mask` (B, C) with 1 where a slot holds a real token
  (after this step's writes), `position_ids` (B, S), `cache_position` (S,) the slots this step
  writes, and the past buffers `past_key_values.{i}.key/value` (B, kv_heads, C, head_dim);
- outputs: `logits` (B, 1, vocab) of the last position only (all `generate()` needs) and the
  updated buffers `present.{i}.key/value`, same shape as the past ones.

Prompts are left-padded to a prompt bucket S and written to slots [0, S); decode step t writes
slot S + t. Every decode step therefore has the same shapes. One graph is traced (batch and
sequence dynamic, capacity fixed); each bucket graph is a copy with fixed input dimensions that
points at the same weight file, so a bucket costs kilobytes, not another copy of the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.export import Dim
from transformers.cache_utils import Cache, CacheLayerMixin

from ..errors import InvalidArgumentError
from .contract import (
    BATCH_DIM, CACHE_POSITION, ROLE_DECODE, ROLE_PREFILL, SEQUENCE_DIM, GraphEntry, decode_file, decoder_input_names,
    decoder_output_names, decoder_shape, past_names, prefill_file, present_names,
)
from .static import StaticShapes
from .validate import ValidationReport, check, record
from .wrappers import TraceSpec


class _BufferLayer(CacheLayerMixin):
    """One layer's fixed-capacity key/value buffers, written out of place at `position` (traceable, no mutation)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.position = keys, values, position
        self.max_cache_len = keys.shape[2]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # noqa: D102 - buffers are given
        return None

    def update(self, key_states, value_states, *args, **kwargs):  # noqa: D102
        self.keys = self.keys.index_copy(2, self.position, key_states.to(self.keys.dtype))
        self.values = self.values.index_copy(2, self.position, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:  # noqa: D102
        return self.max_cache_len, 0

    def get_seq_length(self) -> int:  # noqa: D102 - positions come from position_ids / cache_position
        return 0

    def get_max_length(self) -> int:  # noqa: D102
        return self.max_cache_len


class StaticCacheDecoder(torch.nn.Module):
    """`(input_ids, attention_mask, position_ids, cache_position, past) -> (last logits, *updated buffers)`."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.num_layers = decoder_shape(model.config).num_layers

    def forward(self, input_ids, attention_mask, position_ids, cache_position, past):  # noqa: D102 - see class
        layers = [_BufferLayer(past[2 * i], past[2 * i + 1], cache_position) for i in range(self.num_layers)]
        cache = Cache(layers=layers)
        capacity = past[0].shape[2]
        dtype = past[0].dtype
        slots = torch.arange(capacity, device=input_ids.device)
        # Query at slot q sees slot k when k holds a real token and k <= q (causal within the buffer).
        allowed = attention_mask.bool()[:, None, None, :] & (slots[None, None, None, :] <= cache_position[None, None, :, None])
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        present = []
        for layer in layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def check_capacity(config: Any, shapes: StaticShapes) -> int:
    """The KV capacity for `shapes` (default: the largest prompt bucket + 256), checked against the model."""
    text = config.get_text_config(decoder=True)
    max_pos = int(getattr(text, "max_position_embeddings", 0) or 0)
    longest = shapes.sequence_lengths[-1]
    capacity = shapes.capacity if shapes.capacity is not None else longest + 256
    if max_pos and shapes.capacity is None:
        capacity = min(capacity, max_pos)
    if capacity <= longest:
        raise InvalidArgumentError(
            f"--static-shapes capacity={capacity} leaves no room to generate after the longest prompt bucket "
            f"(sequence={longest}); give capacity larger than every sequence bucket."
        )
    if max_pos and capacity > max_pos:
        raise InvalidArgumentError(
            f"--static-shapes capacity={capacity} exceeds the model's max_position_embeddings ({max_pos})."
        )
    return capacity


def static_example(config: Any, dtype: torch.dtype, capacity: int, batch: int = 2, seq: int = 3,
                   seed: int = 0) -> dict[str, Any]:
    """Seeded inputs of a left-padded prefill (row 0 padded by one token) into empty buffers."""
    gen = torch.Generator().manual_seed(seed)
    shape = decoder_shape(config)
    vocab = config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(3, vocab, (batch, seq), generator=gen)
    mask = torch.zeros(batch, capacity, dtype=torch.int64)
    mask[:, :seq] = 1
    mask[0, :1] = 0
    positions = (mask[:, :seq].cumsum(-1) - 1).clamp(min=0)
    past = [torch.zeros(batch, shape.num_kv_heads, capacity, shape.head_dim, dtype=dtype)
            for _ in range(2 * shape.num_layers)]
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions,
            "cache_position": torch.arange(seq), "past": past}


def static_trace_spec(model: torch.nn.Module, dtype: torch.dtype, capacity: int) -> TraceSpec:
    """What torch.onnx.export needs for the static-cache decoder (batch and sequence dynamic, capacity fixed)."""
    layers = decoder_shape(model.config).num_layers
    batch, seq = Dim(BATCH_DIM), Dim(SEQUENCE_DIM)
    ex = static_example(model.config, dtype, capacity)
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: BATCH_DIM, 1: SEQUENCE_DIM}, "attention_mask": {0: BATCH_DIM},
        "position_ids": {0: BATCH_DIM, 1: SEQUENCE_DIM}, CACHE_POSITION: {0: SEQUENCE_DIM}, "logits": {0: BATCH_DIM}}
    for name in past_names(layers) + present_names(layers):
        axes[name] = {0: BATCH_DIM}
    return TraceSpec(
        module=StaticCacheDecoder(model),
        args=(ex["input_ids"], ex["attention_mask"], ex["position_ids"], ex["cache_position"], ex["past"]),
        input_names=decoder_input_names(layers, static=True),
        output_names=decoder_output_names(layers),
        dynamic_shapes=({0: batch, 1: seq}, {0: batch}, {0: batch, 1: seq}, {0: seq}, [{0: batch}] * (2 * layers)),
        dynamic_axes=axes,
    )


def pin_graph(folder: Path, source: str, target: str, sizes: dict[str, int]) -> None:
    """Copy graph `source` to `target` with the named dynamic input/output dimensions fixed (weights stay shared)."""
    import onnx

    model = onnx.load(str(folder / source), load_external_data=False)
    for value in list(model.graph.input) + list(model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in sizes:
                dim.dim_value = sizes[dim.dim_param]
    del model.graph.value_info[:]
    onnx.save(model, str(folder / target))


def write_decoder_graphs(folder: Path, source: str, shapes: StaticShapes) -> list[GraphEntry]:
    """One prefill graph per (batch, prompt) bucket and one decode graph per batch bucket, all sharing the weights."""
    entries = []
    for b in shapes.batch_sizes:
        for s in shapes.sequence_lengths:
            pin_graph(folder, source, prefill_file(b, s), {BATCH_DIM: b, SEQUENCE_DIM: s})
            entries.append(GraphEntry(prefill_file(b, s), ROLE_PREFILL, b, s))
        pin_graph(folder, source, decode_file(b), {BATCH_DIM: b, SEQUENCE_DIM: 1})
        entries.append(GraphEntry(decode_file(b), ROLE_DECODE, b, 1))
    return entries


def _reference_logits(model: torch.nn.Module, ex: dict[str, Any], seq: int, nxt: torch.Tensor,
                      mask: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-position logits of transformers (dynamic cache, unpadded layout) for the prefill and one decode step."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    first = model(input_ids=ex["input_ids"], attention_mask=ex["attention_mask"][:, :seq],
                  position_ids=ex["position_ids"], past_key_values=cache, use_cache=True)
    second = model(input_ids=nxt, attention_mask=mask[:, :seq + 1], position_ids=pos, past_key_values=cache,
                   use_cache=True)
    return first.logits[:, -1], second.logits[:, -1]


def validate_static(onnx_path: Path, model: torch.nn.Module, dtype: torch.dtype, capacity: int, atol: float,
                    reference: torch.nn.Module | None = None, optimized: bool = False) -> ValidationReport:
    """Run a left-padded prefill and one decode step through the graph and through transformers (dynamic cache).

    The graph writes the padded prompt into buffer slots; transformers sees the unpadded layout,
    so agreement shows the masking, positions and buffer writes are right, not only the weights.
    `reference` is the fp32 twin of an fp16 `model` (see `validate`).
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = decoder_input_names(decoder_shape(model.config).num_layers, static=True)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    seq = 6
    ex = static_example(model.config, dtype, capacity, batch=2, seq=seq, seed=5)
    got = session.run(None, {n: t.numpy() for n, t in zip(names, [ex["input_ids"], ex["attention_mask"],
                                                                   ex["position_ids"], ex["cache_position"],
                                                                   *ex["past"]])})
    nxt = torch.randint(3, vocab, (2, 1), generator=torch.Generator().manual_seed(6))
    mask = ex["attention_mask"].clone()
    mask[:, seq] = 1
    pos = ex["position_ids"][:, -1:] + 1
    got2 = session.run(None, dict(zip(names, [nxt.numpy(), mask.numpy(), pos.numpy(), np.array([seq], dtype=np.int64),
                                              *got[1:]])))
    report = ValidationReport(atol=atol)
    with torch.inference_mode():
        ref = _reference_logits(model, ex, seq, nxt, mask, pos)
        ref32 = _reference_logits(reference, ex, seq, nxt, mask, pos) if reference is not None else (None, None)
    record(report, "prefill.logits", got[0][:, -1], ref[0], ref32[0])
    record(report, "decode.logits", got2[0][:, -1], ref[1], ref32[1])
    return check(report, onnx_path.name, optimized)
