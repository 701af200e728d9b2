"""Rows of a table picked by an index: the token embedding and the pick of the sampled rows, in one short kernel.

`gather_rows(table, index)` returns ``table[index]`` for a 2-D `table` and a 1-D integer `index`, as
``table.index_select(0, index)`` does. torch's index_select runs its small-index kernel for these calls, which
walks the picked rows in a loop per thread block: 13.5 us for 16 rows of a 4096-wide fp16 embedding and 7.9 us
for the 16 sampled rows of a decode step on an H100, against 1.9 us at one row (benchmarks/RESULTS.md round 20).
Here each program copies one block of one row, so every row is read at once.

This module imports no Triton; the kernel lives in `_gather_triton`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .runtime import use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["gather_rows", "gather_rows_reference"]


def gather_rows_reference(table: "torch.Tensor", index: "torch.Tensor") -> "torch.Tensor":
    """PyTorch reference: ``table.index_select(0, index)``."""
    return table.index_select(0, index)


def gather_rows(table: "torch.Tensor", index: "torch.Tensor") -> "torch.Tensor":
    """``table[index]`` as a new contiguous ``[len(index), table.shape[1]]`` tensor of table's dtype.

    `index` holds int32 or int64 row numbers in ``[0, table.shape[0])`` (not checked on the device, as torch's
    CUDA kernels do not: an index out of range reads out of bounds). Runs the Triton kernel when `use_triton`
    holds for both tensors and the table's rows are contiguous, else `gather_rows_reference`."""
    import torch

    if table.dim() != 2:
        raise InvalidArgumentError(f"gather_rows takes a 2-D table [rows, width]; got shape {tuple(table.shape)}.")
    if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
        raise InvalidArgumentError(
            f"gather_rows takes a 1-D int32/int64 index; got {index.dtype} of shape {tuple(index.shape)}.")
    if index.device != table.device:
        raise InvalidArgumentError(f"gather_rows: index on {index.device}, table on {table.device}; move one of them.")
    if index.shape[0] == 0 or table.shape[1] == 0 or table.stride(1) != 1 or not use_triton(table, index):
        return gather_rows_reference(table, index)
    from ._gather_triton import gather_rows_triton

    return gather_rows_triton(table, index)
