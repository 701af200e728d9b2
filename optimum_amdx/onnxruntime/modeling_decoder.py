"""`ORTModelForCausalLM`: an exported decoder run by ONNX Runtime behind transformers' `generate()`.

The class is a real `GenerationMixin` model: it has `config`, `generation_config`, `device`,
`main_input_name` and a `forward` that takes and returns a transformers `DynamicCache`, so
`generate()` (greedy, sampling, beam search) and transformers pipelines work unchanged. The cache
holds the graph's present key/values as torch tensors; they are fed back as the next step's past.

With IO binding (default on GPU providers) inputs and outputs are bound by device pointer to
torch tensors, so the KV cache never leaves the GPU between steps. Without it, tensors cross as
NumPy arrays that share memory with the torch tensors (no copies on the CPU).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import torch
from transformers import DynamicCache, GenerationConfig, GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..exporters.tasks import TEXT_GENERATION
from ..errors import InvalidArgumentError
from ..exporters.contract import KV_STATIC, decode_file, decoder_input_names, decoder_shape, past_names, present_names
from ..exporters.static import StaticShapes
from .binding import TensorBinder
from .modeling_base import ORTSessionMixin
from .static_cache import StaticDecoderRunner, StaticKVCache

_ORT_TO_TORCH = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}


class ORTModelForCausalLM(ORTSessionMixin, GenerationMixin):
    """A causal LM exported by `optimum_amdx.exporters`, run by ONNX Runtime, usable with `generate()`."""

    task = TEXT_GENERATION
    main_input_name = "input_ids"
    base_model_prefix = "model"
    _is_stateful = False
    _supports_cache_class = True
    _can_compile_fullgraph = False
    _is_hf_initialized = True

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
        self.generation_config = (
            GenerationConfig.from_pretrained(folder)
            if (folder / "generation_config.json").is_file()
            else GenerationConfig.from_model_config(self.config)
        )
        meta = self.metadata or {}
        self.static_cache = meta.get("kv_cache") == KV_STATIC
        if use_static_shapes and not self.static_cache:
            raise InvalidArgumentError(
                f"use_static_shapes=True but {folder} holds a dynamic-cache decoder; re-export it with "
                "--static-shapes batch=1,sequence=64,capacity=512 (sizes to taste)."
            )
        # Static exports run their fixed-shape bucket graphs (what MIGraphX needs) unless asked not to; then the
        # same fixed-capacity graph runs from model.onnx with one session for every bucket (less memory on CPU).
        self.use_static_shapes = self.static_cache and use_static_shapes is not False
        onnx_file = "model.onnx"
        if self.use_static_shapes:
            onnx_file = decode_file(StaticShapes.from_dict(meta["static_shapes"]).batch_sizes[0])
        self._init_session(folder, provider, provider_options, session_options, use_io_binding, allow_fallback,
                           onnx_file=onnx_file)
        if self.use_static_shapes:
            self._graph_sessions[onnx_file] = self.session
        shape = decoder_shape(self.config)
        self.num_layers, self.num_kv_heads, self.head_dim = shape.num_layers, shape.num_kv_heads, shape.head_dim
        self._past_names = past_names(self.num_layers)
        self._present_names = present_names(self.num_layers)
        types = {i.name: i.type for i in self.session.get_inputs()}
        expected = decoder_input_names(self.num_layers, static=self.static_cache)
        if [n for n in expected if n not in types]:
            from ..errors import ExportValidationError

            raise ExportValidationError(
                f"{folder / 'model.onnx'} is not a decoder-with-past graph of this config: it lacks inputs "
                f"{[n for n in expected if n not in types]}. Re-export with `optimum-cli export rocm`."
            )
        self._dtype = _ORT_TO_TORCH.get(types[self._past_names[0]], torch.float32)
        logits_shape = self.session.get_outputs()[0].shape
        self.vocab_size = logits_shape[-1] if isinstance(logits_shape[-1], int) else self.config.vocab_size
        self._binder = TensorBinder(self.session, self.provider, self.device_id) if self.use_io_binding else None
        self._static = StaticDecoderRunner(self, meta, self.use_static_shapes) if self.static_cache else None

    @classmethod
    def can_generate(cls) -> bool:
        return True

    @classmethod
    def is_remote_code(cls) -> bool:
        """Asked by `generate()`: this class ships with optimum-amdx, never loaded from the Hub."""
        return False

    def get_experts_implementation(self) -> dict[str, str]:
        """Asked by `generate()` to switch MoE kernels; an ONNX graph has no switchable experts."""
        return {}

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def to(self, device: Any) -> "ORTModelForCausalLM":
        """Kept for pipeline compatibility: the provider, not torch, decides where the graph runs."""
        return self

    def eval(self) -> "ORTModelForCausalLM":
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> CausalLMOutputWithPast:
        return self.forward(*args, **kwargs)

    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None,
                 **kwargs: Any):
        """transformers' `generate()`; on a static-cache export, first checks the request fits the buckets and capacity."""
        if self._static is not None:
            ids = inputs if inputs is not None else kwargs.get("input_ids")
            if ids is not None and ids.dim() == 2:
                config = generation_config or self.generation_config
                beams = int(kwargs.get("num_beams") or getattr(config, "num_beams", 1) or 1)
                returned = int(kwargs.get("num_return_sequences") or getattr(config, "num_return_sequences", 1) or 1)
                new = kwargs.get("max_new_tokens") or getattr(config, "max_new_tokens", None)
                if new is None:
                    new = (kwargs.get("max_length") or getattr(config, "max_length", 20) or 20) - ids.shape[1]
                self._static.check_generation(ids.shape[0] * max(beams, returned), ids.shape[1], int(new))
        return super().generate(inputs, generation_config, **kwargs)

    def _empty_past(self, batch: int) -> torch.Tensor:
        return torch.empty((batch, self.num_kv_heads, 0, self.head_dim), dtype=self._dtype, device=self.device)

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: DynamicCache | None = None,
        use_cache: bool | None = None,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """One graph run: prefill (empty cache) or decode; returns logits and the updated cache.

        Static-cache exports return the logits of the last position only (all `generate()` uses)
        and a `StaticKVCache`.
        """
        use_cache = True if use_cache is None else use_cache
        if self._static is not None:
            return self._static_forward(input_ids, attention_mask, past_key_values, use_cache)
        input_ids = input_ids.to(self.device)
        batch, seq = input_ids.shape
        cache = past_key_values
        if cache is None and use_cache:
            cache = DynamicCache(config=self.config)
        past_len = cache.get_seq_length() if cache is not None else 0
        if attention_mask is None:
            attention_mask = torch.ones(batch, past_len + seq, dtype=torch.int64, device=self.device)
        attention_mask = attention_mask.to(self.device, torch.int64)
        if attention_mask.shape[-1] != past_len + seq:
            raise InvalidArgumentError(
                f"attention_mask has length {attention_mask.shape[-1]}, expected past ({past_len}) + new tokens ({seq})."
            )
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -seq:]
        position_ids = position_ids.to(self.device, torch.int64)

        pasts: list[torch.Tensor] = []
        for i in range(self.num_layers):
            layer = cache.layers[i] if cache is not None and past_len else None
            if layer is None:
                pasts += [self._empty_past(batch), self._empty_past(batch)]
            else:
                pasts += [layer.keys, layer.values]
        inputs = {"input_ids": input_ids.to(torch.int64), "attention_mask": attention_mask, "position_ids": position_ids}
        inputs.update(zip(self._past_names, pasts))

        if self._binder is not None:
            shapes = {"logits": (batch, seq, self.vocab_size)}
            for name in self._present_names:
                shapes[name] = (batch, self.num_kv_heads, past_len + seq, self.head_dim)
            dtypes = {name: self._dtype for name in shapes}
            outputs = self._binder.run(inputs, shapes, dtypes, self.device)
            logits = outputs["logits"]
            presents = [outputs[n] for n in self._present_names]
        else:
            feed = {k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in inputs.items()}
            results = self.session.run(None, feed)
            named = dict(zip(self.output_names, results))
            logits = torch.from_numpy(named["logits"]).to(self.device)
            presents = [torch.from_numpy(named[n]).to(self.device) for n in self._present_names]

        if cache is not None and use_cache:
            for i, layer in enumerate(cache.layers):
                key, value = presents[2 * i], presents[2 * i + 1]
                if not layer.is_initialized:
                    layer.lazy_initialization(key, value)
                layer.keys, layer.values = key, value
        return CausalLMOutputWithPast(logits=logits, past_key_values=cache if use_cache else None)

    def _static_forward(self, input_ids, attention_mask, past_key_values, use_cache: bool) -> CausalLMOutputWithPast:
        if isinstance(past_key_values, StaticKVCache) and use_cache:
            logits = self._static.decode(input_ids, attention_mask, past_key_values)
            return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values)
        if past_key_values is not None and past_key_values.get_seq_length() > 0:
            raise InvalidArgumentError(
                "A static-cache export continues only its own StaticKVCache; got a "
                f"{type(past_key_values).__name__} holding {past_key_values.get_seq_length()} tokens."
            )
        logits, cache = self._static.prefill(input_ids, attention_mask)
        return CausalLMOutputWithPast(logits=logits, past_key_values=cache if use_cache else None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={str(self.model_path)!r}, provider={self.provider!r}, io_binding={self.use_io_binding})"
