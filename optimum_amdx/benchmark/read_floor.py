"""The shortest time any kernel can take to read N bytes in the graph-replay harness (`timing.graph_ms`).

Issue 13's goal 1 rates a one-row W4A16 call against copy bandwidth, which `ceilings.measure_copy_bandwidth`
measures on a 1 GiB copy. A 7B-8B projection reads 8-30 MB, so a call is a few microseconds of stream, and the
launch, the ramp to full bandwidth and the drain of the last loads weigh against it unless calls overlap.
This module measures that bound directly: a kernel that only reads the bytes (coalesced loads, every program one
contiguous run, an XOR of its words stored so nothing is dropped), over the same L2-cold copies and graph replay as
the W4A16 call, in several program sizes, best of them kept. A W4A16 call does at least this and more (the math,
its scales, the output), so its % of copy cannot exceed the read kernel's on the same bytes. (On an H200 a chain of
such reads with PDL, the next launch let in at the start, ran at 97-103 % of copy on every Llama shape, 4096x4096
included: the fixed costs of a call can be hidden behind the one before it; RESULTS.md round29.)

``pdl``: each read kernel is launched with programmatic dependent launch (NVIDIA sm_90+) and waits for the previous
kernel only before its one store, so its reads overlap the previous call; it lets the next launch start either at its
start (as the one-row W4A16 kernel does) or once its reads are in, both tried, the better kept. That is the most a
chain of such calls can overlap; without it each call starts after the last one ended.

A measuring instrument for benchmarks, not a runtime kernel (so no AMD compile specs); on AMD it runs as plain
Triton (no PDL).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ..kernels._pdl import gdc_launch_dependents, gdc_wait
from .timing import graph_ms, l2_cold_copies

CHUNK_WORDS = (512, 1024, 2048, 4096, 8192, 16384)
"""Words (int32) one program reads, the sizes tried: 2-64 KiB."""

BLOCK_WORDS = 2048
"""Words one load instruction group covers: a program's run is read in blocks of this many words."""


@triton.jit
def _read_words_kernel(src_ptr, out_ptr, n_words, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
                       EARLY: tl.constexpr):
    """Program p reads words ``[p * CHUNK, (p + 1) * CHUNK)`` of `src_ptr` (masked at `n_words`) and stores their
    XOR at ``out_ptr[p]``; every block of the run is loaded before any is reduced, so the whole run is in flight.
    PDL: the next launch may start at the program's start (EARLY) or after its reads; the store waits for the
    previous kernel."""
    pid = tl.program_id(0)
    base = pid * CHUNK
    offs = tl.arange(0, BLOCK)
    if PDL and EARLY:
        gdc_launch_dependents()
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for b in tl.static_range(0, CHUNK, BLOCK):
        idx = base + b + offs
        acc = acc ^ tl.load(src_ptr + idx, mask=idx < n_words, other=0)
    if PDL:
        if not EARLY:
            gdc_launch_dependents()
        gdc_wait()
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


def read_words(src: torch.Tensor, chunk: int, pdl: bool = False, early: bool = True) -> torch.Tensor:
    """One launch of the read kernel over the int32 tensor `src`: the XOR of each `chunk`-word run, int32 (`early`:
    with `pdl`, the next launch may start at the kernel's start rather than after its reads)."""
    n = src.numel()
    grid = triton.cdiv(n, chunk)
    out = torch.empty(grid, dtype=torch.int32, device=src.device)
    block = min(BLOCK_WORDS, chunk)
    extra: dict[str, Any] = {"launch_pdl": True} if pdl else {}
    _read_words_kernel[(grid,)](src, out, n, CHUNK=chunk, BLOCK=block, PDL=pdl, EARLY=early,
                                num_warps=4 if chunk <= 1024 else 8, **extra)
    return out


def read_floor_ms(nbytes: int, pdl: bool = False) -> dict[str, Any]:
    """Best milliseconds per call of reading `nbytes` (rounded up to words) from L2-cold copies in one replayed graph,
    over the program sizes `CHUNK_WORDS` (and with `pdl`, both trigger points): ``{"ms": best, "form": its
    "<chunk words>" or "<chunk words>/early|late", "by_form": {form: ms}}``."""
    n = -(-nbytes // 4)
    copies = [torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
              for _ in range(l2_cold_copies(4 * n))]
    forms = [(c, e) for c in CHUNK_WORDS for e in ((True, False) if pdl else (True,))]
    by_form = {(f"{c}/{'early' if e else 'late'}" if pdl else str(c)):
               graph_ms([lambda s=s, c=c, e=e: read_words(s, c, pdl, e) for s in copies]) for c, e in forms}
    best = min(by_form, key=by_form.get)
    del copies
    return {"ms": by_form[best], "form": best, "by_form": by_form}
