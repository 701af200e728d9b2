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

from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import InvalidArgumentError
from .engine import LLMEngine
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


UNSUPPORTED_GENERATE_ARGS = ("min_length", "no_repeat_ngram_size", "logits_processor", "stopping_criteria",
                             "stop_strings", "bad_words_ids", "output_scores", "output_logits",
                             "return_dict_in_generate", "prefix_allowed_tokens_fn", "assistant_model",
                             "penalty_alpha", "num_beam_groups", "constraints", "force_words_ids")
"""generate() arguments that change the output and that this path does not implement: refused, not ignored."""

CPU_CACHE_BYTES = 512 * 2**20
"""Default KV pool size on CPU, where the pool is not sized from free memory."""


class AMDModelForCausalLM:
    """Wraps a loaded transformers Llama/Mistral/Qwen2 model; the engine is built on first use.

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
        """Merge explicit arguments over a transformers GenerationConfig into SamplingParams."""
        gc = generation_config or self.generation_config

        def pick(name: str, default: Any) -> Any:
            value = overrides.get(name)
            if value is None and gc is not None:
                value = getattr(gc, name, None)
            return default if value is None else value

        max_new = overrides.get("max_new_tokens")
        if max_new is None and overrides.get("max_length") is not None:
            max_new = int(overrides["max_length"]) - prompt_len
        if max_new is None and gc is not None:
            max_new = getattr(gc, "max_new_tokens", None)
            if max_new is None and getattr(gc, "max_length", None) is not None:
                max_new = int(gc.max_length) - prompt_len
        do_sample = bool(pick("do_sample", False))
        stops = _as_id_list(pick("eos_token_id", None)) + _as_id_list(overrides.get("stop_token_ids"))
        return SamplingParams(
            max_new_tokens=max(1, int(max_new if max_new is not None else 20)),
            do_sample=do_sample,
            temperature=float(pick("temperature", 1.0)) if do_sample else 1.0,
            top_k=int(pick("top_k", 0)) if do_sample else 0,
            top_p=float(pick("top_p", 1.0)) if do_sample else 1.0,
            repetition_penalty=float(pick("repetition_penalty", 1.0)),
            stop_token_ids=tuple(dict.fromkeys(stops)),
            min_new_tokens=int(pick("min_new_tokens", 0)),
        )

    def generate(self, input_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None = None,
                 attention_mask: torch.Tensor | None = None, generation_config: Any = None,
                 streamer: Any = None, **kwargs: Any) -> torch.Tensor | list[list[int]]:
        """Generate like transformers. A tensor in gives a tensor out (prompt + new tokens, padded);
        a list of token-id lists in gives the list of new token ids per prompt."""
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        if input_ids is None:
            raise InvalidArgumentError("generate() needs input_ids (a tensor [batch, seq] or lists of token ids).")
        if int(kwargs.pop("num_beams", 1) or 1) != 1 or int(kwargs.pop("num_return_sequences", 1) or 1) != 1:
            raise InvalidArgumentError("AMDModelForCausalLM.generate supports num_beams=1 and num_return_sequences=1.")
        known = ("max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p",
                 "repetition_penalty", "eos_token_id", "stop_token_ids", "min_new_tokens")
        overrides = {k: kwargs.pop(k) for k in known if k in kwargs}
        unsupported = sorted(k for k in UNSUPPORTED_GENERATE_ARGS if kwargs.get(k) not in (None, False, 0, [], ()))
        if unsupported:
            raise InvalidArgumentError(
                f"AMDModelForCausalLM.generate does not support {', '.join(unsupported)}. Drop them, or use the "
                "transformers model (model.model.generate) for these features."
            )
        pad_id = kwargs.pop("pad_token_id", None)
        as_tensor = isinstance(input_ids, torch.Tensor)
        if as_tensor:
            ids2d = input_ids if input_ids.dim() == 2 else input_ids.unsqueeze(0)
            rows = ids2d.tolist()
            if attention_mask is not None:
                mask = attention_mask.tolist()
                rows = [[t for t, m in zip(r, mr) if m] for r, mr in zip(rows, mask)]
        else:
            rows = [list(input_ids)] if input_ids and isinstance(list(input_ids)[0], int) else [list(r) for r in input_ids]
        if streamer is not None and len(rows) != 1:
            raise InvalidArgumentError(f"streamer works with one prompt at a time; got a batch of {len(rows)}.")
        prompt_len = len(ids2d[0]) if as_tensor else max(len(r) for r in rows)
        params = self.sampling_params(generation_config, prompt_len, **overrides)
        engine = self.engine
        if streamer is not None:
            streamer.put(torch.tensor([rows[0]]))
        req = [engine.add_request(r, params, streamer=streamer) for r in rows]
        done = engine.run()
        outputs = [done[r] for r in req]
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
