"""Choosing the next token: greedy, temperature, top-k, top-p and repetition penalty.

The order of operations follows transformers' generate (repetition penalty, then temperature,
top-k, top-p), so greedy output matches it token for token. Rows of one batch may carry different
parameters; the all-greedy batch takes a single argmax.

`sample_tokens` never waits for the GPU: its small per-row tensors go up with non-blocking copies and
the draw is the exponential-race form of a one-sample multinomial (argmax of probs / Exp(1) noise),
which is what `torch.multinomial` computes for one sample, with the same generator draws, minus its
host-side validity check (a sync). The engine reads the tokens one step later (see `engine`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..errors import InvalidArgumentError
from ..kernels.argmax import argmax_rows


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. `stop_token_ids` end a sequence (the stop token is kept in the output);
    they cannot be chosen before `min_new_tokens` tokens were generated."""

    max_new_tokens: int = 20
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    min_new_tokens: int = 0

    def __post_init__(self) -> None:
        """Check every field's type and range; errors name the argument and the accepted values."""
        for name in ("max_new_tokens", "top_k", "min_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name}={value!r}: expected an integer.")
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidArgumentError(f"{name}={value!r}: expected a finite number.")
        if not isinstance(self.do_sample, bool):
            raise InvalidArgumentError(f"do_sample={self.do_sample!r}: expected True or False.")
        stops = self.stop_token_ids
        if not isinstance(stops, (tuple, list)) or any(
                isinstance(t, bool) or not hasattr(t, "__index__") or int(t) < 0 for t in stops):
            raise InvalidArgumentError(f"stop_token_ids={stops!r}: expected a tuple of non-negative token ids.")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stops))
        if self.max_new_tokens < 1:
            raise InvalidArgumentError(f"max_new_tokens={self.max_new_tokens}: expected at least 1.")
        if self.do_sample and self.temperature <= 0:
            raise InvalidArgumentError(
                f"temperature={self.temperature}: sampling needs a positive temperature (or do_sample=False)."
            )
        if self.top_k < 0:
            raise InvalidArgumentError(f"top_k={self.top_k}: expected 0 (off) or a positive count.")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgumentError(f"top_p={self.top_p}: expected a value in (0, 1].")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise InvalidArgumentError(
                f"min_new_tokens={self.min_new_tokens}: expected between 0 and max_new_tokens={self.max_new_tokens}."
            )
        if self.repetition_penalty <= 0:
            raise InvalidArgumentError(f"repetition_penalty={self.repetition_penalty}: expected a positive value.")

    @property
    def greedy(self) -> bool:
        return not self.do_sample


def to_device(values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list as a tensor on `device`, copied without making the host wait for the GPU."""
    host = torch.tensor(values, dtype=dtype)
    return host.to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


def _apply_repetition_penalty(logits: torch.Tensor, rows: list[int], penalties: list[float],
                              histories: Sequence[Sequence[int]]) -> None:
    for row, penalty in zip(rows, penalties):
        seen = to_device(sorted(set(histories[row])), torch.long, logits.device)
        if seen.numel() == 0:
            continue
        score = logits[row].index_select(0, seen)
        score = torch.where(score < 0, score * penalty, score / penalty)
        logits[row].index_copy_(0, seen, score)


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k and nucleus top-p. top_k 0 = off."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
    remove = rank >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    remove = remove | ((before > top_p[:, None]) & (rank > 0))
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def _draw_one(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row drawn with probability `probs` (rows need not be normalized): the same
    exponential race and generator draws as `torch.multinomial(probs, 1)`, without its host sync."""
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return argmax_rows(probs / noise)


def sample_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  histories: Sequence[Sequence[int]], generator: torch.Generator | None = None,
                  num_generated: Sequence[int] | None = None) -> torch.Tensor:
    """The next token of each row as an int64 tensor on the logits' device, without a host sync.

    logits [rows, vocab]; histories: prompt + generated ids per row (needed only with a repetition
    penalty); num_generated: tokens generated so far per row (for min_new_tokens)."""
    counts = num_generated if num_generated is not None else [0] * len(params)
    blocked = [i for i, p in enumerate(params) if p.stop_token_ids and counts[i] < p.min_new_tokens]
    if not blocked and all(p.greedy and p.repetition_penalty == 1.0 for p in params):
        return argmax_rows(logits)
    dev = logits.device
    logits = logits.float().clone()
    if blocked:
        rows = [row for row in blocked for _ in params[row].stop_token_ids]
        cols = [t for row in blocked for t in params[row].stop_token_ids]
        logits.index_put_((to_device(rows, torch.long, dev), to_device(cols, torch.long, dev)),
                          torch.full((), float("-inf"), device=dev))  # filled on the device: no copy
    pen_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if pen_rows:
        _apply_repetition_penalty(logits, pen_rows, [params[i].repetition_penalty for i in pen_rows], histories)
    out = argmax_rows(logits)
    sample_rows = [i for i, p in enumerate(params) if p.do_sample]
    if sample_rows:
        idx = to_device(sample_rows, torch.long, dev)
        sub = logits.index_select(0, idx)
        temps = to_device([params[i].temperature for i in sample_rows], torch.float32, dev)
        sub = sub / temps[:, None]
        top_k = to_device([params[i].top_k for i in sample_rows], torch.long, dev)
        top_p = to_device([params[i].top_p for i in sample_rows], torch.float32, dev)
        sub = _filter_top_k_top_p(sub, top_k, top_p)
        out = out.index_copy(0, idx, _draw_one(sub.softmax(dim=-1), generator))
    return out


def sample_next(logits: torch.Tensor, params: Sequence[SamplingParams],
                histories: Sequence[Sequence[int]], generator: torch.Generator | None = None,
                num_generated: Sequence[int] | None = None) -> list[int]:
    """`sample_tokens` read back to the host (waits for the GPU)."""
    return sample_tokens(logits, params, histories, generator, num_generated).tolist()
