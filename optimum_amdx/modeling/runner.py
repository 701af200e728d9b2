"""Turns a scheduled batch into packed tensors and runs it: eagerly, or by replaying a device graph.

Pure-decode batches (one new token per sequence) are padded to the next batch bucket
(1, 2, 4, ..., max_num_seqs) and replayed from a captured `torch.cuda.CUDAGraph` (a HIP graph on
ROCm) whose inputs are static buffers; a step then costs two host-to-device copies (plus the device
copy of pending tokens, below) and one replay.
Padding rows write nowhere (slot -1) and their logits are ignored. Prefill and mixed batches run
eagerly. On CPU everything runs eagerly through the same code.

A sequence's newest token may still be unknown on the host (`PENDING`: the engine reads sampled tokens
one step late). Such a token is taken on the device from the previous step's token tensor (`Feed`),
so building and launching a step never waits for the step before it; every host-to-device copy here
is non-blocking for the same reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .cache import PagedKVCache
from .paged_model import BatchInputs, PagedDecoder
from .sampling import to_device
from .scheduler import PENDING, ScheduledBatch, Sequence

logger = logging.getLogger(__name__)


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... up to and including max_num_seqs."""
    buckets, b = [], 1
    while b < max_num_seqs:
        buckets.append(b)
        b *= 2
    buckets.append(max_num_seqs)
    return buckets


def _token_slice(seq: Sequence, start: int, n: int) -> list[int]:
    p = len(seq.prompt_ids)
    if start >= p:
        return seq.output_ids[start - p:start - p + n]
    if start + n <= p:
        return seq.prompt_ids[start:start + n]
    return seq.prompt_ids[start:] + seq.output_ids[:start + n - p]


@dataclass
class Feed:
    """The previous step's sampled tokens, still on the device: `tokens[rows[seq]]` is the value of
    `seq`'s newest token where the host holds `PENDING`."""

    rows: dict[Sequence, int]
    tokens: torch.Tensor


def _patch(input_ids: torch.Tensor, dst: list[int], src: list[int], feed: Feed | None) -> None:
    """Overwrite input_ids[dst] with feed.tokens[src] on the device (no host wait)."""
    if not dst:
        return
    if feed is None:
        raise RuntimeError("a token of this step is still pending but no previous step's tokens were given")
    n = len(dst)
    if dst == src == list(range(n)):  # the steady state: same sequences, same order
        input_ids[:n].copy_(feed.tokens[:n])
        return
    dev = input_ids.device
    input_ids.index_copy_(0, to_device(dst, torch.long, dev),
                          feed.tokens.index_select(0, to_device(src, torch.long, dev)))


class _DecodeGraph:
    """One captured decode step for a fixed batch bucket, with its static input buffers."""

    def __init__(self, bucket: int, max_blocks: int, device: torch.device) -> None:
        self.bucket = bucket
        self.max_blocks = max_blocks
        self.i64 = torch.zeros(3, bucket, dtype=torch.int64, device=device)
        self.i32 = torch.zeros(bucket * (1 + max_blocks), dtype=torch.int32, device=device)
        self.inputs = BatchInputs(
            input_ids=self.i64[0], positions=self.i64[1], slot_mapping=self.i64[2],
            block_tables=self.i32[bucket:].view(bucket, max_blocks), seq_lens=self.i32[:bucket],
            query_start_loc=torch.arange(bucket + 1, dtype=torch.int32, device=device),
            logits_indices=torch.arange(bucket, dtype=torch.int64, device=device),
            max_query_len=1, max_seq_len=0,
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def load_dummy(self) -> None:
        self.i64.zero_()
        self.i64[2].fill_(-1)
        self.i32.zero_()
        self.i32[: self.bucket].fill_(1)


class ModelRunner:
    """Executes scheduled batches of a PagedDecoder over a PagedKVCache."""

    def __init__(self, decoder: PagedDecoder, cache: PagedKVCache, max_num_seqs: int, use_graphs: bool) -> None:
        self.decoder = decoder
        self.cache = cache
        self.device = decoder.device
        self.block_size = cache.block_size
        self.max_blocks = -(-decoder.max_model_len // self.block_size)
        self.buckets = batch_buckets(max_num_seqs)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.graphs: dict[int, _DecodeGraph] = {}
        self.graph_error: str | None = None
        if self.use_graphs:
            self._capture_all()

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        try:
            for bucket in sorted(self.buckets, reverse=True):
                g = _DecodeGraph(bucket, self.max_blocks, self.device)
                g.inputs.max_seq_len = self.decoder.max_model_len
                g.load_dummy()
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self.decoder.forward(g.inputs, self.cache)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                g.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g.graph, pool=pool):
                    g.logits = self.decoder.forward(g.inputs, self.cache)
                self.graphs[bucket] = g
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # a kernel that syncs with the host cannot be captured: run eagerly
            self.graph_error = f"{type(exc).__name__}: {exc}"
            logger.warning("Decode graph capture failed (%s); decoding eagerly.", self.graph_error)
            self.graphs.clear()
            self.use_graphs = False
            torch.cuda.synchronize(self.device)

    def _slots(self, seq: Sequence, start: int, n: int) -> list[int]:
        bs, blocks = self.block_size, seq.blocks
        return [blocks[p // bs] * bs + p % bs for p in range(start, start + n)]

    def build(self, batch: ScheduledBatch) -> tuple[BatchInputs, list[Sequence]]:
        """Packed inputs for an eager step and the sequences whose next token is sampled, in row order."""
        feed: Feed | None = batch.feed
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        qsl = [0]
        logits_rows: list[int] = []
        sampled: list[Sequence] = []
        width = max(len(s.blocks) for s in batch.seqs)
        tables = []
        dst: list[int] = []
        src: list[int] = []
        for seq, n in zip(batch.seqs, batch.num_new):
            start = seq.num_computed
            chunk = _token_slice(seq, start, n)
            if chunk[-1] == PENDING:  # only the newest token can be pending
                dst.append(len(ids) + n - 1)
                src.append(feed.rows[seq] if feed is not None else -1)
                chunk[-1] = 0
            ids += chunk
            pos += range(start, start + n)
            slots += self._slots(seq, start, n)
            seq_lens.append(start + n)
            qsl.append(qsl[-1] + n)
            tables.append(seq.blocks + [0] * (width - len(seq.blocks)))
            if start + n == seq.num_tokens:
                logits_rows.append(qsl[-1] - 1)
                sampled.append(seq)
        dev = self.device
        i64 = to_device(ids + pos + slots + logits_rows, torch.int64, dev)
        i32 = to_device(seq_lens + qsl + [b for row in tables for b in row], torch.int32, dev)
        t, s = len(ids), len(batch.seqs)
        inputs = BatchInputs(
            input_ids=i64[:t], positions=i64[t:2 * t], slot_mapping=i64[2 * t:3 * t],
            logits_indices=i64[3 * t:], seq_lens=i32[:s], query_start_loc=i32[s:2 * s + 1],
            block_tables=i32[2 * s + 1:].view(s, width),
            max_query_len=max(batch.num_new), max_seq_len=max(seq_lens),
        )
        _patch(inputs.input_ids, dst, src, feed)
        return inputs, sampled

    def _replay(self, batch: ScheduledBatch) -> torch.Tensor:
        feed: Feed | None = batch.feed
        n = len(batch)
        bucket = next(b for b in self.buckets if b >= n)
        g = self.graphs[bucket]
        pad = bucket - n
        bs, width = self.block_size, self.max_blocks
        tokens, pos, slots, lens, tables = [], [], [], [], []
        dst: list[int] = []
        src: list[int] = []
        for row, seq in enumerate(batch.seqs):
            p = seq.num_computed
            token = seq.output_ids[-1] if seq.output_ids else seq.prompt_ids[-1]
            if token == PENDING:
                dst.append(row)
                src.append(feed.rows[seq] if feed is not None else -1)
                token = 0
            tokens.append(token)
            pos.append(p)
            slots.append(seq.blocks[p // bs] * bs + p % bs)
            lens.append(p + 1)
            tables += seq.blocks
            tables += [0] * (width - len(seq.blocks))
        i64 = torch.tensor(tokens + [0] * pad + pos + [0] * pad + slots + [-1] * pad, dtype=torch.int64)
        i32 = torch.tensor(lens + [1] * pad + tables + [0] * (pad * width), dtype=torch.int32)
        g.i64.view(-1).copy_(i64, non_blocking=True)
        g.i32.copy_(i32, non_blocking=True)
        _patch(g.i64[0], dst, src, feed)
        g.graph.replay()
        return g.logits[:n]

    def execute(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Launch one step; returns logits [sampled, vocab] and the sampled sequences in the same order.

        Newest tokens still `PENDING` on the host are taken from `batch.feed` on the device."""
        if self.use_graphs and batch.is_pure_decode and len(batch) <= self.buckets[-1]:
            return self._replay(batch), list(batch.seqs)
        inputs, sampled = self.build(batch)
        return self.decoder.forward(inputs, self.cache), sampled
