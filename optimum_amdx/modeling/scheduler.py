"""Continuous-batching scheduler: which sequences run this step, with how many tokens, in which blocks.

Every step processes, per scheduled sequence, the tokens whose K/V are not yet cached: one token
for a decoding sequence, a chunk of the prompt for a prefilling one (chunked by a token budget).
Decodes are scheduled first, then unfinished prefills, then new requests in arrival order.
A sequence is admitted only when blocks for all its tokens so far are free (and takes them), so
prefill chunks never need more; decodes take a block when they cross a block edge. When none are left, the most recently admitted sequence is preempted:
its blocks are freed and it goes back to the front of the queue to be recomputed later. The oldest
running sequence is never the victim while another runs, and a request is refused up front if it
could not fit in the whole pool alone, so every request finishes.
"""

from __future__ import annotations

import collections
import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, Hashable

from ..errors import InvalidArgumentError, OutOfBlocksError
from .cache import BlockAllocator
from .sampling import SamplingParams


PENDING = -1
"""Stands in `Sequence.output_ids` for a token sampled on the device but not yet read by the host."""


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request's state. `num_computed` tokens of `tokens` have their K/V in `blocks`."""

    request_id: Hashable
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int
    output_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class ScheduledBatch:
    """The sequences of one step and how many new tokens each contributes, in packing order.
    `feed`: where tokens still `PENDING` on the host are found on the device (a `runner.Feed`; set by the engine)."""

    seqs: list[Sequence]
    num_new: list[int]
    feed: Any = None

    @property
    def is_pure_decode(self) -> bool:
        return all(n == 1 for n in self.num_new) and all(s.num_computed + 1 == s.num_tokens for s in self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    """Admits, chunks, preempts and retires sequences over one block pool."""

    def __init__(self, allocator: BlockAllocator, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int) -> None:
        if max_num_batched_tokens < max_num_seqs:
            raise InvalidArgumentError(
                f"max_num_batched_tokens={max_num_batched_tokens} must be at least max_num_seqs={max_num_seqs} "
                "so that every running sequence can decode in one step."
            )
        self.allocator = allocator
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self._arrivals = itertools.count()
        self.num_preemptions = 0

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def check(self, request_id: Hashable, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise if a request could never run (empty, longer than the model, or larger than the whole pool)."""
        if num_prompt_tokens < 1:
            raise InvalidArgumentError(f"Request {request_id!r} has an empty prompt; give at least one token.")
        total = num_prompt_tokens + params.max_new_tokens
        if num_prompt_tokens >= self.max_model_len:
            raise InvalidArgumentError(
                f"Request {request_id!r}: prompt of {num_prompt_tokens} tokens does not fit max_model_len="
                f"{self.max_model_len}. Shorten the prompt or raise max_model_len."
            )
        need = self._blocks_for(min(total, self.max_model_len))
        if need > self.allocator.num_blocks:
            raise OutOfBlocksError(
                f"Request {request_id!r} needs {need} KV blocks ({total} tokens) but the whole pool has "
                f"{self.allocator.num_blocks}. Lower max_new_tokens or give the cache more blocks."
            )

    def add(self, request_id: Hashable, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """Queue a request; refuses one that could never fit (model length or whole pool)."""
        self.check(request_id, len(prompt_ids), params)
        seq = Sequence(request_id=request_id, prompt_ids=list(prompt_ids), params=params,
                       arrival=next(self._arrivals))
        self.waiting.append(seq)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.allocator.free(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Make `seq` own blocks for `num_tokens` tokens, preempting newer sequences if needed.

        Returns False when `seq` itself had to be preempted (it was the newest).
        """
        need = self._blocks_for(num_tokens) - len(seq.blocks)
        while need > 0 and not self.allocator.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        if need > 0:
            seq.blocks.extend(self.allocator.allocate(need))
        return True

    def schedule(self) -> ScheduledBatch:
        """Pick this step's work. Mutates block ownership, never token state."""
        batch = ScheduledBatch([], [])
        budget = self.max_num_batched_tokens
        decoding = [s for s in self.running if s.num_tokens - s.num_computed == 1]
        for seq in decoding:
            if seq.status is not SeqStatus.RUNNING:
                continue
            if self._reserve(seq, seq.num_computed + 1):
                batch.seqs.append(seq)
                batch.num_new.append(1)
                budget -= 1
        prefilling = [s for s in self.running if s.num_tokens - s.num_computed > 1]
        for seq in prefilling:
            if budget <= 0:
                break
            if seq.status is not SeqStatus.RUNNING:
                continue
            n = min(seq.num_tokens - seq.num_computed, budget)
            if self._reserve(seq, seq.num_computed + n):
                batch.seqs.append(seq)
                batch.num_new.append(n)
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.allocator.can_allocate(self._blocks_for(seq.num_tokens)):
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            seq.blocks = self.allocator.allocate(self._blocks_for(seq.num_tokens))
            n = min(seq.num_tokens, budget)
            batch.seqs.append(seq)
            batch.num_new.append(n)
            budget -= n
        return batch

    def retire(self, seq: Sequence) -> None:
        """Stop scheduling a running sequence whose end is already certain (its last token, still on the
        device, reaches max_new_tokens or max_model_len) and free its blocks now; the engine calls
        `finish` with the reason once the token is read. Steps already queued on the device that still
        write these blocks run before any later step that reuses them (one stream)."""
        self.allocator.free(seq.blocks)
        seq.blocks = []
        seq.status = SeqStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence and return its blocks."""
        self.allocator.free(seq.blocks)
        seq.blocks = []
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
