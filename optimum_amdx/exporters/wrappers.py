"""Thin `torch.nn.Module` wrappers that give transformers models a flat, ONNX-friendly signature.

The decoder wrapper takes the past key/values as a flat list of tensors and returns the present
ones, so a single graph serves both prefill (past length 0) and decode (one new token). The
encoder wrappers return plain tensors instead of ModelOutput objects. No graph code is written by
hand: torch.onnx (dynamo) traces the real transformers forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import Dim
from transformers import DynamicCache

from .contract import DecoderShape, decoder_shape, past_names, present_names  # noqa: F401 - re-exported
from .tasks import FEATURE_EXTRACTION, TEXT_CLASSIFICATION, TEXT_GENERATION


class DecoderWithPast(torch.nn.Module):
    """`(input_ids, attention_mask, position_ids, past) -> (logits, *present)` for a causal LM.

    `past` is a list of 2 * num_layers tensors shaped (batch, kv_heads, past_len, head_dim);
    `attention_mask` covers past + new tokens. The present tensors are past concatenated with the
    new keys/values, so the caller feeds them back unchanged at the next step.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.num_layers = decoder_shape(model.config).num_layers

    def forward(self, input_ids, attention_mask, position_ids, past):  # noqa: D102 - documented on the class
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        cache = DynamicCache(pairs, config=self.model.config)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


class EncoderOutputs(torch.nn.Module):
    """`(input_ids, attention_mask[, token_type_ids]) -> first output` of an encoder model.

    For feature extraction that is `last_hidden_state`, for sequence classification `logits`.
    """

    def __init__(self, model: torch.nn.Module, output_name: str, uses_token_type_ids: bool) -> None:
        super().__init__()
        self.model = model
        self.output_name = output_name
        self.uses_token_type_ids = uses_token_type_ids

    def forward(self, input_ids, attention_mask, token_type_ids=None):  # noqa: D102
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.uses_token_type_ids:
            kwargs["token_type_ids"] = token_type_ids
        out = self.model(**kwargs)
        return out[self.output_name]


@dataclass
class TraceSpec:
    """Everything torch.onnx.export needs for one wrapper: example args, names, dynamic axes."""

    module: torch.nn.Module
    args: tuple
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: tuple
    dynamic_axes: dict[str, dict[int, str]]


def uses_token_type_ids(config) -> bool:
    """Whether the encoder takes `token_type_ids` (BERT does, DistilBERT and RoBERTa-likes mostly not)."""
    return config.model_type in ("bert", "electra") or (getattr(config, "type_vocab_size", 0) or 0) > 1


def example_inputs(config, task: str, dtype: torch.dtype, batch: int = 2, seq: int = 5, past: int = 7,
                   seed: int = 0) -> dict[str, object]:
    """Seeded random inputs for tracing and validation (never all-ones masks: one row is left-padded)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = config.get_text_config(decoder=True).vocab_size if task == TEXT_GENERATION else config.vocab_size
    ids = torch.randint(3, vocab, (batch, seq), generator=gen)
    if task == TEXT_GENERATION:
        shape = decoder_shape(config)
        mask = torch.ones(batch, past + seq, dtype=torch.int64)
        if batch > 1:
            mask[-1, :2] = 0
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)[:, -seq:]
        kv = [
            torch.randn(batch, shape.num_kv_heads, past, shape.head_dim, generator=gen).to(dtype)
            for _ in range(2 * shape.num_layers)
        ]
        return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids, "past": kv}
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if batch > 1:
        mask[-1, -2:] = 0
    inputs: dict[str, object] = {"input_ids": ids, "attention_mask": mask}
    if uses_token_type_ids(config):
        inputs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.int64)
    return inputs


def trace_spec(model: torch.nn.Module, task: str, dtype: torch.dtype) -> TraceSpec:
    """Wrap `model` for `task` and describe names and dynamic dimensions for the exporter."""
    config = model.config
    batch, seq = Dim("batch_size"), Dim("sequence_length")
    if task == TEXT_GENERATION:
        layers = decoder_shape(config).num_layers
        past_len, total = Dim("past_sequence_length"), Dim("total_sequence_length")
        ex = example_inputs(config, task, dtype)
        names_in = ["input_ids", "attention_mask", "position_ids"] + past_names(layers)
        names_out = ["logits"] + present_names(layers)
        axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
                "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                "position_ids": {0: "batch_size", 1: "sequence_length"},
                "logits": {0: "batch_size", 1: "sequence_length"}}
        for n in past_names(layers):
            axes[n] = {0: "batch_size", 2: "past_sequence_length"}
        for n in present_names(layers):
            axes[n] = {0: "batch_size", 2: "total_sequence_length"}
        return TraceSpec(
            module=DecoderWithPast(model),
            args=(ex["input_ids"], ex["attention_mask"], ex["position_ids"], ex["past"]),
            input_names=names_in,
            output_names=names_out,
            dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
                            [{0: batch, 2: past_len}] * (2 * layers)),
            dynamic_axes=axes,
        )
    output = "last_hidden_state" if task == FEATURE_EXTRACTION else "logits"
    assert task in (FEATURE_EXTRACTION, TEXT_CLASSIFICATION)
    tt = uses_token_type_ids(config)
    ex = example_inputs(config, task, dtype)
    names_in = ["input_ids", "attention_mask"] + (["token_type_ids"] if tt else [])
    args = tuple(ex[n] for n in names_in)
    shapes = tuple({0: batch, 1: seq} for _ in names_in)
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names_in}
    axes[output] = {0: "batch_size", 1: "sequence_length"} if task == FEATURE_EXTRACTION else {0: "batch_size"}
    return TraceSpec(
        module=EncoderOutputs(model, output, tt),
        args=args,
        input_names=names_in,
        output_names=[output],
        dynamic_shapes=shapes,
        dynamic_axes=axes,
    )
