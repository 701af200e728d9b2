"""Triton kernel behind `optimum_amdx.kernels.gather` (rows of a table picked by an index).

Grid (rows, blocks of the width): each program reads its row's index once and copies `BLOCK` values of that
table row, so every picked row is read at once and each row is a few wide, contiguous loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_spec import CompileSpec
from .triton_compat import PINNED_COMPILE_OPTIONS

__all__ = ["gather_rows_triton", "AMD_COMPILE_SPECS"]

BLOCK = 1024
"""Values per program: 4096-wide rows make four programs per row (8 fp16 values, 16 bytes, per thread)."""
NUM_WARPS = 4


@triton.jit
def _gather_rows_kernel(table_ptr, index_ptr, out_ptr, width, table_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    src = tl.load(index_ptr + row).to(tl.int64)
    vals = tl.load(table_ptr + src * table_stride + cols, mask=mask)
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, vals, mask=mask)


def gather_rows_triton(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Launch on a validated table (rows contiguous) and a non-empty 1-D index (made contiguous here if strided)."""
    index = index if index.stride(0) == 1 else index.contiguous()
    rows, width = index.shape[0], table.shape[1]
    out = torch.empty(rows, width, dtype=table.dtype, device=table.device)
    _gather_rows_kernel[(rows, triton.cdiv(width, BLOCK))](table, index, out, width, table.stride(0), out.stride(0),
                                                           BLOCK=BLOCK, num_warps=NUM_WARPS, **PINNED_COMPILE_OPTIONS)
    return out


def _spec(dtype: str, index: str) -> CompileSpec:
    return CompileSpec(
        name=f"gather_rows[{dtype},{index}]",
        kernel=_gather_rows_kernel,
        signature={"table_ptr": f"*{dtype}", "index_ptr": f"*{index}", "out_ptr": f"*{dtype}", "width": "i32",
                   "table_stride": "i32", "out_stride": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": BLOCK},
        options=lambda arch: {"num_warps": NUM_WARPS, "num_stages": 1},
        hot=True,
        uses_dot=False,
        divisible_by_16=("width", "table_stride", "out_stride"),
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [_spec(dtype, index) for dtype in ("fp16", "bf16", "fp32")
                                        for index in ("i64", "i32")]
