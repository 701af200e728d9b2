"""Perplexity of a causal LM on a token stream, in non-overlapping windows (the GPTQ paper's protocol)."""

from __future__ import annotations

import math
from typing import Any

import torch
from tqdm.auto import tqdm

from ..errors import InvalidArgumentError


@torch.no_grad()
def perplexity(model: Any, tokens: torch.Tensor, seqlen: int = 512, max_windows: int | None = None,
               verbose: bool = False) -> float:
    """exp(mean next-token negative log-likelihood) over consecutive windows of `seqlen` tokens.

    Each window is scored on its own (no context carried over), every token after the first of a
    window counts once; a final partial window is dropped so all windows have equal length.
    """
    check_eval_sizes(seqlen, max_windows, getattr(getattr(model, "config", None), "max_position_embeddings", None))
    tokens = tokens.reshape(-1)
    n_windows = len(tokens) // seqlen
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows == 0:
        raise InvalidArgumentError(
            f"The evaluation text has {len(tokens)} tokens, fewer than one window of {seqlen}; use a smaller --seqlen."
        )
    device = next(model.parameters()).device
    nll = 0.0
    count = 0
    for w in tqdm(range(n_windows), desc="perplexity", disable=not verbose):
        ids = tokens[w * seqlen:(w + 1) * seqlen].unsqueeze(0).to(device)
        logits = model(input_ids=ids, use_cache=False).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum")
        nll += float(loss)
        count += seqlen - 1
    return math.exp(nll / count)


def check_eval_sizes(seqlen: Any, max_windows: Any = None, context: int | None = None) -> None:
    """Refuse window sizes that cannot give a meaningful perplexity (before any model is loaded).

    A window needs at least 2 tokens (one prediction); windows longer than the model's context length
    score positions it was never trained on, so the number would not mean what it says.
    """
    if isinstance(seqlen, bool) or not isinstance(seqlen, int) or seqlen < 2:
        raise InvalidArgumentError(f"--seqlen (seqlen) is {seqlen!r}; a perplexity window needs at least 2 tokens, e.g. 512.")
    if max_windows is not None and (isinstance(max_windows, bool) or not isinstance(max_windows, int) or max_windows < 1):
        raise InvalidArgumentError(f"--max-windows (max_windows) is {max_windows!r}; give a positive count or leave it out.")
    if context and seqlen > int(context):
        raise InvalidArgumentError(
            f"--seqlen (seqlen) {seqlen} is longer than the model's context length ({context}); its perplexity there "
            f"would be meaningless. Use --seqlen {min(int(context), 2048)} or less."
        )
