"""Triton kernels behind `optimum_amdx.kernels.argmax` (each row's first maximum).

Stage one, grid (rows, chunks): each program reduces `CHUNK` values of one row to its maximum (float32,
NaN as +inf) and the first index holding it. Stage two, one program per row: the first chunk whose maximum
is the row's, and that chunk's index. Ties go to the lower index at both stages, so the result is the first
maximum of the row.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .compile_spec import CompileSpec
from .triton_compat import PINNED_COMPILE_OPTIONS

__all__ = ["argmax_rows_triton", "AMD_COMPILE_SPECS"]

CHUNK = 4096
"""Values per stage-one program: 128256 logits make 32 programs per row."""
MAX_CHUNKS = 1024
"""Chunks per row that stage two reduces in one block (rows up to 4M values)."""


@triton.jit
def _chunk_argmax_kernel(x_ptr, val_ptr, idx_ptr, n, x_stride, n_chunks, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    v = tl.load(x_ptr + row * x_stride + cols, mask=cols < n, other=float("-inf")).to(tl.float32)
    v = tl.where(v != v, float("inf"), v)  # NaN ranks as +inf
    best, at = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(val_ptr + row * n_chunks + chunk, best)
    tl.store(idx_ptr + row * n_chunks + chunk, chunk * CHUNK + at)


@triton.jit
def _row_argmax_kernel(val_ptr, idx_ptr, out_ptr, n_chunks, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    v = tl.load(val_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
    _, at = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * n_chunks + at).to(tl.int64))


def _stage_two_block(n_chunks: int) -> int:
    return max(16, triton.next_power_of_2(n_chunks))


def argmax_rows_triton(x: torch.Tensor) -> torch.Tensor:
    """Launch both stages on a validated ``[rows, n]`` tensor (last dim contiguous)."""
    rows, n = x.shape
    n_chunks = triton.cdiv(n, CHUNK)
    if n_chunks > MAX_CHUNKS:
        return x.argmax(dim=-1)
    val = torch.empty(rows, n_chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int32, device=x.device)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    _chunk_argmax_kernel[(rows, n_chunks)](x, val, idx, n, x.stride(0), n_chunks, CHUNK=CHUNK, num_warps=8,
                                           **PINNED_COMPILE_OPTIONS)
    _row_argmax_kernel[(rows,)](val, idx, out, n_chunks, BLOCK=_stage_two_block(n_chunks), num_warps=1,
                                **PINNED_COMPILE_OPTIONS)
    return out


def _chunk_spec(dtype: str) -> CompileSpec:
    return CompileSpec(
        name=f"argmax_rows[chunk,{dtype}]",
        kernel=_chunk_argmax_kernel,
        signature={"x_ptr": f"*{dtype}", "val_ptr": "*fp32", "idx_ptr": "*i32", "n": "i32", "x_stride": "i32",
                   "n_chunks": "i32", "CHUNK": "constexpr"},
        constexprs={"CHUNK": CHUNK},
        options=lambda arch: {"num_warps": 8, "num_stages": 1},
        hot=True,
        uses_dot=False,
        divisible_by_16=("x_stride",),
    )


def _row_spec(vocab: int) -> CompileSpec:
    block = _stage_two_block(triton.cdiv(vocab, CHUNK))
    return CompileSpec(
        name=f"argmax_rows[row,b{block}]",
        kernel=_row_argmax_kernel,
        signature={"val_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*i64", "n_chunks": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": block},
        options=lambda arch: {"num_warps": 1, "num_stages": 1},
        hot=True,
        uses_dot=False,
        divisible_by_16=(),
    )


ROW_SPEC_VOCABS = (32000, 128256, 152064)
"""Vocabularies whose stage-two block the AMD compile check covers: Llama 2 / Mistral (8 chunks: block 16), Llama 3
(32: block 32), Qwen 2 / 2.5 (38: block 64). A larger vocabulary compiles its own block unchecked."""

AMD_COMPILE_SPECS: list[CompileSpec] = [_chunk_spec("fp16"), _chunk_spec("bf16"), _chunk_spec("fp32")] + [
    _row_spec(vocab) for vocab in ROW_SPEC_VOCABS]
