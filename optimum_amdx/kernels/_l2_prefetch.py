"""Bring the next kernel's read-only bytes into L2 while this kernel runs (NVIDIA sm_80+ PTX; a Triton helper,
not an op of its own, like `_pdl`).

Why: a decode step's small W4A16 calls are one wave of short programs that wait on DRAM; with their weight
already in L2 the 16-row 4096x4096 call takes 5.6 instead of 7.2 us on an H100 (benchmarks/RESULTS.md round 21).
A kernel before them that leaves DRAM bandwidth idle (the decode attention at 16 sequences reads its keys and
values at about 60 % of it) can issue ``prefetch.global.L2::evict_last`` for those bytes: no register is held
and nothing waits on it, so the request costs the issuing program one instruction per 128-byte line. A second
stream running a read kernel beside the attention did not overlap with it (same round): the prefetch has to
ride inside the kernel that runs.

Kernels call `l2_prefetch` only under a constexpr that is False on AMD and under the interpreter (no PTX
there); `prefetch_plan` says, on the host, how many lines each program takes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .runtime import device_arch, interpret_mode

if TYPE_CHECKING:
    import torch

LINE_BYTES = tl.constexpr(128)
"""One prefetch request per L2 line (128 bytes on NVIDIA GPUs)."""


@triton.jit
def l2_prefetch(base_ptr, pid, per_program, total_lines, BLOCK: tl.constexpr):
    """Prefetch lines ``[pid * per_program, (pid + 1) * per_program)`` (of `total_lines`) of the bytes at
    `base_ptr` (an int8 pointer) into L2 with the evict-last priority. `BLOCK`: lines per request batch, at
    least the program's thread count (a smaller tensor would be replicated across warps: the same line
    requested several times)."""
    base = base_ptr.to(tl.pointer_type(tl.int8))
    offs = tl.arange(0, BLOCK)
    first = pid * per_program
    for start in range(0, per_program, BLOCK):
        line = first + start + offs
        keep = (start + offs < per_program) & (line < total_lines)
        ptrs = base + line.to(tl.int64) * LINE_BYTES
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.b32 $0, 0; }",
            "=r,l,r", [ptrs, keep.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_plan(nbytes: int, programs: int) -> tuple[int, int]:
    """(lines per program, total lines) for `programs` programs sharing `nbytes`."""
    lines = triton.cdiv(nbytes, LINE_BYTES.value)
    return triton.cdiv(lines, max(1, programs)), lines


def l2_prefetch_enabled(t: "torch.Tensor") -> bool:
    """Whether a kernel launched for the tensor `t` may prefetch into L2: an NVIDIA GPU of sm_80 or later (the
    PTX instruction with its eviction priority), not the interpreter, not AMD."""
    if interpret_mode() or t.device.type != "cuda":
        return False
    arch = device_arch(t.device.index or 0)
    return arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 80
