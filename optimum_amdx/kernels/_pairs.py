"""The pair order of a W4A16 one-row input: a Triton helper for the kernels that produce it, not an op of its own.

The one-row packed loop of the W4A16 stream kernel (`_w4a16_triton`) multiplies two nibbles per fp16x2
instruction, so it reads its activations as pairs: word ``i`` of a 128-row K tile holds rows ``r`` and
``r + 64`` of that tile (``r = i % 64``). Built from a plain row, each pair costs the loop byte permutes every
tile; a kernel that writes the row anyway (the RMSNorm before q/k/v and gate/up, SiLU * up before the down
projection) can write it in that order instead, and the matmul then loads its pairs as plain words (on an
H100, 0.1-0.8 us less per call on the Llama decode shapes, RESULTS.md round 19).

In that order, position ``p`` of each 128-value block holds row ``p // 2 + 64 * (p % 2)`` of the block:
the block's two halves interleaved. A producer reads the two halves of each block as plain contiguous vectors
(`pair_halves`), computes on them, and interleaves its results in registers (`pair_join`), so the paired
store costs no gather (a gather through `pair_source`, the row read a second time, made the RMSNorm 0.45 us
slower per call, as much as the matmul gained; RESULTS.md round 19). `w4a16.pair_order` is the same map as a
tensor (the reference paths and the tests use it); the kernels that call these helpers are compiled in their
own AMD specs.
"""

from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def pair_halves(first_block, NB: tl.constexpr):
    """Columns ``[NB, 64]`` of the first halves of 128-value blocks ``first_block .. first_block + NB - 1``
    (add 64 for the second halves): plain, contiguous runs, for a producer that writes the pair order."""
    return (first_block + tl.arange(0, NB))[:, None] * 128 + tl.arange(0, 64)[None, :]


@triton.jit
def pair_join(lo, hi, NB: tl.constexpr):
    """``[NB * 128]`` in the pair order from the values of the blocks' first halves `lo` and second halves `hi`
    (both ``[NB, 64]``, as `pair_halves` gives their columns): position ``2r + j`` of block b holds
    ``(lo, hi)[j][b, r]``."""
    return tl.reshape(tl.join(lo, hi), [NB * 128])


@triton.jit
def pair_source(pos):
    """The plain-order column whose value sits at position `pos` of the pair order (see the module docstring)."""
    local = pos % 128
    return pos - local + local // 2 + (local % 2) * 64
