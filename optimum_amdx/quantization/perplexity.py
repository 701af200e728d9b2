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
