"""ORT classes for BERT-family encoders: feature extraction and sequence classification.

They behave like the transformers models in pipelines: `model(**tokenizer_output)` returns a
ModelOutput with torch tensors. When the export has static shape buckets (for MIGraphX, which
compiles one program per shape) the batch is padded up to the smallest bucket that fits, run on
that bucket's fixed-shape graph, and sliced back; padded tokens are masked out.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput, SequenceClassifierOutput

from ..exporters.contract import encoder_bucket_file as bucket_file
from ..exporters.static import StaticShapes
from ..exporters.tasks import FEATURE_EXTRACTION, TEXT_CLASSIFICATION
from .binding import TensorBinder
from .modeling_base import ORTSessionMixin
from .providers import MIGRAPHX


class _ORTEncoder(ORTSessionMixin):
    """Common loading and running for the encoder tasks."""

    main_input_name = "input_ids"
    output_key = ""

    def __init__(
        self,
        model_path: str | os.PathLike,
        provider: str | None = None,
        provider_options: Mapping[str, Any] | None = None,
        session_options: Any = None,
        use_io_binding: bool | None = None,
        allow_fallback: bool = False,
        use_static_shapes: bool | None = None,
    ) -> None:
        folder = self._open_folder(model_path)
        self._init_session(folder, provider, provider_options, session_options, use_io_binding, allow_fallback)
        meta_shapes = (self.metadata or {}).get("static_shapes")
        self.static_shapes = StaticShapes.from_dict(meta_shapes) if meta_shapes else None
        if use_static_shapes is None:
            use_static_shapes = self.static_shapes is not None and self.provider == MIGRAPHX
        if use_static_shapes and self.static_shapes is None:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"use_static_shapes=True but {folder} was exported without static shape buckets; re-export with "
                "--static-shapes batch=1,8 sequence=128,512."
            )
        self.use_static_shapes = bool(use_static_shapes)
        self._binder = TensorBinder(self.session, self.provider, self.device_id) if self.use_io_binding else None


    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float16 if "float16" in self.session.get_outputs()[0].type else torch.float32

    def to(self, device: Any):
        """Kept for pipeline compatibility: the provider decides where the graph runs."""
        return self

    def eval(self):
        return self

    @classmethod
    def can_generate(cls) -> bool:
        return False

    def __call__(self, *args: Any, **kwargs: Any):
        return self.forward(*args, **kwargs)

    def _run(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        batch, seq = inputs["input_ids"].shape
        if self.use_static_shapes:
            b, s = self.static_shapes.bucket_for(batch, seq)
            padded = {}
            for name, t in inputs.items():
                buf = torch.zeros((b, s), dtype=torch.int64)
                buf[:batch, :seq] = t.cpu()
                padded[name] = buf
            session = self.graph_session(bucket_file(b, s))
            out = session.run(None, {k: v.numpy() for k, v in padded.items()})[0]
            out = torch.from_numpy(out)[:batch]
            return (out[:, :seq] if out.dim() == 3 else out).to(self.device)
        if self._binder is not None:
            shape = self._output_shape(batch, seq)
            return self._binder.run(inputs, {self.output_names[0]: shape}, {self.output_names[0]: self.dtype},
                                    self.device)[self.output_names[0]]
        feed = {k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in inputs.items()}
        return torch.from_numpy(self.session.run(None, feed)[0]).to(self.device)

    def _output_shape(self, batch: int, seq: int) -> tuple[int, ...]:
        raise NotImplementedError

    def _inputs(self, input_ids, attention_mask, token_type_ids) -> dict[str, torch.Tensor]:
        input_ids = torch.as_tensor(input_ids).to(torch.int64)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        inputs = {"input_ids": input_ids, "attention_mask": torch.as_tensor(attention_mask).to(torch.int64)}
        if "token_type_ids" in self.input_names:
            inputs["token_type_ids"] = (
                torch.zeros_like(input_ids) if token_type_ids is None else torch.as_tensor(token_type_ids).to(torch.int64)
            )
        return inputs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={str(self.model_path)!r}, provider={self.provider!r})"


class ORTModelForFeatureExtraction(_ORTEncoder):
    """Encoder returning `last_hidden_state` (mean-pool it for sentence embeddings)."""

    task = FEATURE_EXTRACTION

    def _output_shape(self, batch: int, seq: int) -> tuple[int, ...]:
        return (batch, seq, self.config.hidden_size)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, return_dict: bool = True,
                **kwargs: Any) -> BaseModelOutput:
        """Run the encoder; returns `BaseModelOutput(last_hidden_state=...)`."""
        return BaseModelOutput(last_hidden_state=self._run(self._inputs(input_ids, attention_mask, token_type_ids)))


class ORTModelForSequenceClassification(_ORTEncoder):
    """Encoder with a classification head returning `logits` (labels in `config.id2label`)."""

    task = TEXT_CLASSIFICATION

    def _output_shape(self, batch: int, seq: int) -> tuple[int, ...]:
        return (batch, self.config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, return_dict: bool = True,
                **kwargs: Any) -> SequenceClassifierOutput:
        """Run the classifier; returns `SequenceClassifierOutput(logits=...)`."""
        return SequenceClassifierOutput(logits=self._run(self._inputs(input_ids, attention_mask, token_type_ids)))


def mean_pooling(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings the sentence-transformers way: average of the unmasked token vectors."""
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
