"""The index of each row's largest value (greedy decoding's next token), in two short kernels.

`argmax_rows(x)` takes ``[rows, n]`` logits and returns int64 ``[rows]``, the first index of each row's
maximum, as ``torch.argmax(x, dim=-1)`` does. torch reduces a row in one thread block: for one row of a
128256-token vocabulary that took 37.7 us on an H100, 1.7 % of a GPTQ Llama-3-8B decode step at batch 1
(benchmarks/RESULTS.md round 19). Here a row is cut into chunks that many programs reduce at once, and a
second launch picks the first chunk holding the row's maximum. NaN counts as +inf (torch ranks NaN above
every number; the two differ only for a row holding both NaN and +inf).

This module imports no Triton; the kernels live in `_argmax_triton`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .runtime import use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["argmax_rows", "argmax_rows_reference"]


def argmax_rows_reference(x: "torch.Tensor") -> "torch.Tensor":
    """PyTorch reference: ``x.argmax(dim=-1)``."""
    return x.argmax(dim=-1)


def argmax_rows(x: "torch.Tensor") -> "torch.Tensor":
    """First index of each row's maximum of a 2-D float tensor, int64 ``[rows]``, without a host sync.

    Runs the Triton kernels when `use_triton(x)` holds (GPU, or the interpreter) and the last dim is
    contiguous, else `argmax_rows_reference`."""
    if x.dim() != 2 or not x.is_floating_point():
        raise InvalidArgumentError(f"argmax_rows takes a 2-D float tensor [rows, n]; got {x.dtype} {tuple(x.shape)}.")
    if x.shape[1] == 0:
        raise InvalidArgumentError("argmax_rows: a row has no values (n = 0).")
    if x.shape[0] == 0 or x.stride(-1) != 1 or not use_triton(x):
        return argmax_rows_reference(x)
    from ._argmax_triton import argmax_rows_triton

    return argmax_rows_triton(x)
