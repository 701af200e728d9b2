"""AMDModelForCausalLM: a transformers causal LM served from a paged KV cache with graph-captured decode.

    model = AMDModelForCausalLM.from_pretrained("default")          # GPU fp16 if present, else CPU fp32
    out = model.generate(input_ids, max_new_tokens=32)              # same call as transformers

`generate` takes the transformers arguments people use (max_new_tokens, do_sample, temperature,
top_k, top_p, repetition_penalty, eos_token_id, streamer, generation_config) and returns what
transformers returns for a tensor input: prompt plus new tokens, rows padded with pad_token_id.
Rows of a batch (left padding is removed using attention_mask) are served as independent
requests by the continuous-batching engine, so prompts of different lengths waste no compute.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import InvalidArgumentError
from .engine import LLMEngine
from .generate_args import REFUSED, SUPPORTED, check_generate_kwargs
from .paged_model import PagedDecoder
from .sampling import SamplingParams


def _as_id_list(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        return tuple(int(v) for v in value.flatten().tolist())
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


UNSUPPORTED_GENERATE_ARGS = tuple(sorted(REFUSED))
"""generate() arguments that change the output and that this path does not implement: refused, not ignored."""

CPU_CACHE_BYTES = 512 * 2**20
"""Default KV pool size on CPU, where the pool is not sized from free memory."""


class AMDModelForCausalLM:
    """Wraps a loaded transformers causal LM of a supported family (`modeling.families`); the engine is built on first use.

    Engine knobs (see `LLMEngine`): block_size, num_blocks (None: from free GPU memory x
    memory_fraction; on CPU about `CPU_CACHE_BYTES`, at least one full-length sequence),
    memory_fraction, max_num_seqs, max_num_batched_tokens, max_model_len (default
    min(max_position_embeddings, 4096)), use_cuda_graph.
    """

    def __init__(self, model: torch.nn.Module, *, block_size: int = 16, num_blocks: int | None = None,
                 memory_fraction: float = 0.9, max_num_seqs: int = 64, max_num_batched_tokens: int = 4096,
                 max_model_len: int | None = None, use_cuda_graph: bool = True) -> None:
        self.model = model.eval()
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        limit = getattr(self.config, "max_position_embeddings", None) or 4096
        self.max_model_len = int(max_model_len or min(limit, 4096))
        self.decoder = PagedDecoder(model, self.max_model_len)
        if num_blocks is None and self.decoder.device.type != "cuda":
            per_seq = -(-self.max_model_len // block_size)
            budget = CPU_CACHE_BYTES // self.decoder.cache_layout(block_size).bytes_per_block()
            num_blocks = min(max_num_seqs * per_seq, max(per_seq, budget))
        self._engine_kwargs = dict(block_size=block_size, num_blocks=num_blocks, memory_fraction=memory_fraction,
                                   max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   use_cuda_graph=use_cuda_graph)
        self._engine: LLMEngine | None = None
        self.model_path: Path | None = None
        """The folder the weights came from (set by `from_pretrained`; None for a model object)."""

    @classmethod
    def from_pretrained(cls, name_or_path: Any, *, dtype: Any = "auto", device: str | None = None,
                        allow_pickle: bool = False, trust_remote_code: bool = False,
                        **engine_kwargs: Any) -> "AMDModelForCausalLM":
        """Load a model folder, hub id or "default" through the package's one loader (`optimum_amdx.models`):
        GPTQ checkpoints load through our W4A16 linears; `allow_pickle` / `trust_remote_code` as in transformers.
        The folder stays in `model_path`, so its tokenizer can be found from the model."""
        from ..models import load_model

        loaded = load_model(name_or_path, dtype=dtype, device=device, allow_pickle=allow_pickle,
                            trust_remote_code=trust_remote_code)
        obj = cls(loaded.model, **engine_kwargs)
        obj.model_path = loaded.folder.path
        return obj

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    @property
    def engine(self) -> LLMEngine:
        """The continuous-batching engine (allocates the KV pool and captures graphs on first access)."""
        if self._engine is None:
            self._engine = LLMEngine(self.decoder, **self._engine_kwargs)
        return self._engine

    main_input_name = "input_ids"

    def to(self, device: Any) -> "AMDModelForCausalLM":
        """No-op on the model's own device; the paged cache cannot move, so another device is refused."""
        if torch.device(device).type != self.device.type:
            raise InvalidArgumentError(
                f"AMDModelForCausalLM lives on {self.device}; load it on {device} instead of moving it "
                "(from_pretrained(..., device=...))."
            )
        return self

    def eval(self) -> "AMDModelForCausalLM":
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped transformers model's forward (full logits, its own cache)."""
        return self.model(*args, **kwargs)

    def can_generate(self) -> bool:
        return True

    def sampling_params(self, generation_config: Any = None, prompt_len: int = 0, **overrides: Any) -> SamplingParams:
        """Merge explicit arguments over a transformers GenerationConfig into SamplingParams.

        Out-of-range values raise `InvalidArgumentError` naming the argument; `max_new_tokens <= 0` (or an
        explicit `max_length` not longer than the prompt) is refused, not turned into one token.
        """
        gc = generation_config or self.generation_config

        def pick(name: str, default: Any) -> Any:
            value = overrides.get(name)
            if value is None and gc is not None:
                value = getattr(gc, name, None)
            return default if value is None else value

        max_new = overrides.get("max_new_tokens")
        if max_new is None and overrides.get("max_length") is not None:
            max_new = _as_int("max_length", overrides["max_length"]) - prompt_len
            if max_new < 1:
                raise InvalidArgumentError(
                    f"max_length={overrides['max_length']} leaves no room after the {prompt_len}-token prompt; "
                    "pass max_new_tokens (tokens to generate) instead."
                )
        if max_new is None and gc is not None:
            max_new = getattr(gc, "max_new_tokens", None)
            if max_new is None and getattr(gc, "max_length", None) is not None:
                max_new = int(gc.max_length) - prompt_len
                if max_new < 1:  # a saved config's max_length (transformers' default is 20): not the caller's ask
                    max_new = 20
        do_sample = bool(pick("do_sample", False))
        stops = _as_id_list(pick("eos_token_id", None)) + _as_id_list(overrides.get("stop_token_ids"))
        return SamplingParams(
            max_new_tokens=_as_int("max_new_tokens", max_new if max_new is not None else 20),
            do_sample=do_sample,
            temperature=_as_float("temperature", pick("temperature", 1.0)) if do_sample else 1.0,
            top_k=_as_int("top_k", pick("top_k", 0)) if do_sample else 0,
            top_p=_as_float("top_p", pick("top_p", 1.0)) if do_sample else 1.0,
            repetition_penalty=_as_float("repetition_penalty", pick("repetition_penalty", 1.0)),
            stop_token_ids=tuple(dict.fromkeys(stops)),
            min_new_tokens=_as_int("min_new_tokens", pick("min_new_tokens", 0)),
        )

    def _prompt_rows(self, input_ids: Any, attention_mask: Any) -> list[list[int]]:
        """Token-id rows of the input (left padding removed), each non-empty and of integers."""
        if isinstance(input_ids, torch.Tensor):
            if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
                raise InvalidArgumentError(f"input_ids must hold integer token ids, not {input_ids.dtype}.")
            if input_ids.dim() not in (1, 2):
                raise InvalidArgumentError(f"input_ids must be [batch, seq] or [seq]; got shape {tuple(input_ids.shape)}.")
            ids2d = input_ids if input_ids.dim() == 2 else input_ids.unsqueeze(0)
            rows = ids2d.tolist()
            if attention_mask is not None:
                if tuple(attention_mask.shape) != tuple(ids2d.shape):
                    raise InvalidArgumentError(f"attention_mask shape {tuple(attention_mask.shape)} differs from "
                                               f"input_ids shape {tuple(ids2d.shape)}.")
                rows = [[t for t, m in zip(r, mr) if m] for r, mr in zip(rows, attention_mask.tolist())]
        else:
            seq = list(input_ids)
            rows = [seq] if seq and not isinstance(seq[0], (list, tuple, torch.Tensor)) else [list(r) for r in seq]
        if not rows:
            raise InvalidArgumentError("generate() got an empty batch; give at least one prompt.")
        for i, row in enumerate(rows):
            if not row:
                raise InvalidArgumentError(
                    f"Prompt {i} is empty{' after removing padding' if attention_mask is not None else ''}; "
                    "give at least one token (e.g. the tokenizer's BOS token)."
                )
            if all(type(t) is int for t in row):  # the common case, cheaply (it is on the time to first token)
                continue
            for t in row:
                if isinstance(t, bool) or not isinstance(t, int):
                    try:
                        _ = int(t.__index__())  # numpy / 0-d tensor integers
                    except (AttributeError, TypeError):
                        raise InvalidArgumentError(
                            f"Prompt {i} holds {t!r} ({type(t).__name__}); token ids must be integers."
                        ) from None
            rows[i] = [int(t) for t in row]
        return rows

    def generate(self, input_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None = None,
                 attention_mask: torch.Tensor | None = None, generation_config: Any = None,
                 streamer: Any = None, **kwargs: Any) -> torch.Tensor | list[list[int]]:
        """Generate like transformers. A tensor in gives a tensor out (prompt + new tokens, padded);
        a list of token-id lists in gives the list of new token ids per prompt.

        Everything is checked before the first request is queued (ids in the vocabulary, non-empty prompts,
        argument names and ranges); if the call fails or is interrupted (Ctrl-C) its requests are aborted,
        so the engine is clean for the next call.
        """
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        if input_ids is None:
            raise InvalidArgumentError("generate() needs input_ids (a tensor [batch, seq] or lists of token ids).")
        check_generate_kwargs(kwargs, generation_config)
        overrides = {k: kwargs.pop(k) for k in SUPPORTED if k in kwargs}
        pad_id = overrides.pop("pad_token_id", None)
        as_tensor = isinstance(input_ids, torch.Tensor)
        rows = self._prompt_rows(input_ids, attention_mask)
        if streamer is not None and len(rows) != 1:
            raise InvalidArgumentError(f"streamer works with one prompt at a time; got a batch of {len(rows)}.")
        if streamer is not None and not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
            raise InvalidArgumentError(f"streamer must have put() and end() methods (like transformers' TextStreamer); "
                                       f"got {type(streamer).__name__}.")
        ids2d = (input_ids if input_ids.dim() == 2 else input_ids.unsqueeze(0)) if as_tensor else None
        prompt_len = ids2d.shape[1] if as_tensor else max(len(r) for r in rows)
        params = self.sampling_params(generation_config, prompt_len, **overrides)
        engine = self.engine
        for i, row in enumerate(rows):
            engine.check_request(row, params, name=f"prompt {i}")
        longest = max(len(r) for r in rows)
        if longest + params.max_new_tokens > self.max_model_len:
            warnings.warn(
                f"A {longest}-token prompt plus max_new_tokens={params.max_new_tokens} exceeds max_model_len="
                f"{self.max_model_len}: generation stops at {self.max_model_len} tokens (finish reason 'length').",
                stacklevel=2,
            )
        added: list[Any] = []
        try:
            if streamer is not None:
                streamer.put(torch.tensor([rows[0]]))
            for r in rows:
                added.append(engine.add_request(r, params, streamer=streamer))
            done = engine.run()
            outputs = [done[r] for r in added]
        finally:
            for rid in added:  # no-op for finished requests; frees whatever a failed call left queued
                engine.abort(rid)
        if not as_tensor:
            return outputs
        if pad_id is None:
            gc = generation_config or self.generation_config
            pad_id = getattr(gc, "pad_token_id", None) if gc is not None else None
            if pad_id is None:
                pad_id = params.stop_token_ids[0] if params.stop_token_ids else 0
        width = max(len(o) for o in outputs)
        new = torch.full((len(outputs), width), int(pad_id), dtype=ids2d.dtype)
        for i, o in enumerate(outputs):
            new[i, : len(o)] = torch.tensor(o, dtype=ids2d.dtype)
        return torch.cat([ids2d.cpu(), new], dim=1).to(ids2d.device)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{name}={value!r}: expected an integer.")
    if isinstance(value, float) and not value.is_integer():
        raise InvalidArgumentError(f"{name}={value!r}: expected an integer.")
    return int(value)


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name}={value!r}: expected a number.") from None
