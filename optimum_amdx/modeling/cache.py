"""Paged KV cache: one preallocated pool of fixed-size blocks and an allocator that never leaks.

A sequence owns a list of block ids (its block table); token `t` of the sequence lives at slot
`block_table[t // block_size] * block_size + t % block_size`. The pool is sized from free GPU
memory times a fraction knob, or given explicitly (always explicit on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import HardwareError, InvalidArgumentError, OutOfBlocksError


class BlockAllocator:
    """Hands out block ids from a fixed pool; `free` returns them. Double frees are refused.

    The free ids are a stack of ascending ranges, and a sequence takes its blocks from the top range first,
    so blocks allocated together (a prompt's, at admission) are one ascending run where the top range is long
    enough. `free` pushes a sequence's blocks back so the next `allocate` takes them in their old order, and a
    pool that is wholly free again starts over as the one range of all blocks, however the sequences before it
    interleaved. Runs matter for speed only: a lone prompt whose blocks are one run replays the prefill graph
    whose attention computes block ids instead of reading the table (`runner.blocks_run_from`).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise InvalidArgumentError(f"num_blocks={num_blocks}: the KV pool needs at least one block.")
        self.num_blocks = num_blocks
        self._ranges: list[list[int]] = [[0, num_blocks]]  # [start, stop) each; allocation takes from the last
        self._num_free = num_blocks
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        """Blocks not owned by any sequence."""
        return self._num_free

    def can_allocate(self, n: int) -> bool:
        """Whether `n` more blocks are available."""
        return n <= self._num_free

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks; raises OutOfBlocksError (taking none) when fewer are free."""
        if n > self._num_free:
            raise OutOfBlocksError(
                f"Asked for {n} KV blocks but only {self._num_free} of {self.num_blocks} are free. "
                "Lower the batch size or max_new_tokens, or give the cache more memory (memory_fraction / num_blocks)."
            )
        blocks: list[int] = []
        while len(blocks) < n:
            top = self._ranges[-1]
            take = min(n - len(blocks), top[1] - top[0])
            blocks.extend(range(top[0], top[0] + take))
            top[0] += take
            if top[0] == top[1]:
                self._ranges.pop()
        self._num_free -= n
        self._used.update(blocks)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Give blocks back to the pool (the next `allocate` takes them in this order)."""
        for b in blocks:
            if b not in self._used:
                raise InvalidArgumentError(f"KV block {b} is not allocated (double free or foreign block).")
        if len(set(blocks)) != len(blocks):
            raise InvalidArgumentError(f"KV blocks {list(blocks)} name a block twice (double free).")
        self._used.difference_update(blocks)
        self._num_free += len(blocks)
        if not self._used:
            self._ranges = [[0, self.num_blocks]]
            return
        runs: list[list[int]] = []
        for b in blocks:
            if runs and runs[-1][1] == b:
                runs[-1][1] += 1
            else:
                runs.append([b, b + 1])
        self._ranges.extend(reversed(runs))


@dataclass(frozen=True)
class CacheLayout:
    """Shape of the paged pool: per layer, K and V tensors of [num_blocks, block_size, kv_heads, head_dim]."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    def bytes_per_block(self) -> int:
        """Bytes one block costs across all layers, K and V."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem


def blocks_for_memory(layout: CacheLayout, device: torch.device, memory_fraction: float,
                      reserve_bytes: int = 0) -> int:
    """How many blocks fit in `memory_fraction` of the GPU's currently free memory, minus `reserve_bytes`."""
    if not 0.0 < memory_fraction <= 1.0:
        raise InvalidArgumentError(f"memory_fraction={memory_fraction}: expected a value in (0, 1].")
    if device.type != "cuda":
        raise InvalidArgumentError("Sizing the KV pool from free memory needs a GPU; on CPU pass num_blocks.")
    free, _total = torch.cuda.mem_get_info(device)
    budget = int(free * memory_fraction) - reserve_bytes
    n = budget // layout.bytes_per_block()
    if n < 1:
        raise HardwareError(
            f"Only {free / 2**30:.2f} GiB of GPU memory is free: not enough for one KV block "
            f"({layout.bytes_per_block() / 2**20:.1f} MiB). Free memory or raise memory_fraction."
        )
    return int(n)


class PagedKVCache:
    """The block pool itself (per-layer K and V tensors) plus its allocator."""

    def __init__(self, layout: CacheLayout, num_blocks: int, device: torch.device) -> None:
        self.layout = layout
        self.device = device
        self.num_blocks = num_blocks
        shape = (num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
        self.k: list[torch.Tensor] = [torch.zeros(shape, dtype=layout.dtype, device=device)
                                      for _ in range(layout.num_layers)]
        self.v: list[torch.Tensor] = [torch.zeros(shape, dtype=layout.dtype, device=device)
                                      for _ in range(layout.num_layers)]
        self.allocator = BlockAllocator(num_blocks)

    @property
    def block_size(self) -> int:
        return self.layout.block_size
