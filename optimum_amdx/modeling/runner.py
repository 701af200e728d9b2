"""Turns a scheduled batch into packed tensors and runs it: eagerly, or by replaying a device graph.

Pure-decode batches (one new token per sequence) are padded to the next batch bucket
(1, 2, 4, ..., max_num_seqs) and replayed from a captured `torch.cuda.CUDAGraph` (a HIP graph on
ROCm) whose inputs are static buffers; a step then costs one host-to-device copy from a pinned twin of
those buffers (`_StaticInputs`; plus the device copy of pending tokens, below) and one replay.
Padding rows write nowhere (slot -1) and their logits are ignored.

Prefill and mixed batches (prompt chunks, possibly with decode tokens) of up to `PREFILL_TOKEN_BUCKETS[-1]`
tokens are replayed the same way from graphs captured per token bucket, with room for every sequence
slot: an eager forward launches about ten kernels per layer from Python, and for a short prompt the
host takes longer to launch them than the GPU takes to run them (Llama-3-8B, 512 tokens, H100: 12 ms
of kernels in a 25-31 ms TTFT; benchmarks/RESULTS.md). Padding tokens belong to no sequence (every
unused sequence slot is empty), so attention skips them and they write no KV. Larger steps, MoE
models (their long-prompt expert loop reads counts on the host) and CPU runs go eagerly through the
same forward.

A sequence's newest token may still be unknown on the host (`PENDING`: the engine reads sampled tokens
one step late). Such a token is taken on the device from the previous step's token tensor (`Feed`),
so building and launching a step never waits for the step before it; every host-to-device copy here
is non-blocking for the same reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
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


PREFILL_TOKEN_BUCKETS = (32, 64, 128, 256, 384, 512, 768, 1024)
"""Token counts of the captured prefill/mixed-step graphs. A step is padded to the next one (at most
1.5x above 256 tokens); past the last, a forward's kernels outlast their launches, so eager costs
little more (Llama-3-8B on an H100: about 24 us of kernels per prompt token, and back-to-back eager
512-token forwards took 24 ms each). 32 and up keep a padded step clear of split decode attention
(only steps of at most 16 query tokens split)."""


def prefill_buckets(max_num_batched_tokens: int) -> list[int]:
    """The prefill graph buckets a step budget of `max_num_batched_tokens` can use (the budget itself
    caps the last one; none under the first bucket)."""
    if max_num_batched_tokens < PREFILL_TOKEN_BUCKETS[0]:
        return []
    buckets = [b for b in PREFILL_TOKEN_BUCKETS if b < max_num_batched_tokens]
    if max_num_batched_tokens <= PREFILL_TOKEN_BUCKETS[-1]:
        buckets.append(max_num_batched_tokens)
    return buckets


def prefill_seq_buckets(max_num_seqs: int) -> list[int]:
    """Sequence slots of the captured prefill graphs, per token bucket: one (a lone prompt, what an idle
    server's time to first token replays) and `max_num_seqs` (every other prefill or mixed step). A graph's
    prompt attention launches programs for every slot, and the empty ones still queue behind the kernel's
    two programs per SM: a lone 512-token prompt's graph runs 48 us faster with one slot than with 64
    (Llama-2-7B, H100; benchmarks/RESULTS.md round 14, section 2). The graphs share one memory pool."""
    return sorted({1, max_num_seqs})


def blocks_run_from(blocks: list[int]) -> int:
    """The first of `blocks` when they are one ascending run (b, b + 1, ...), else -1. A lone prompt whose
    blocks are a run replays the one-slot prefill graph whose attention computes each key's block instead of
    loading it from the block table, a dependent load ahead of every key tile (Llama-2-7B 512-token prompt:
    20.0 -> 18.0 us per layer, H200; benchmarks/RESULTS.md round 15). The allocator hands a freed run back in
    order (`BlockAllocator.free`), so an idle server's successive requests keep getting runs."""
    if not blocks or blocks[-1] - blocks[0] != len(blocks) - 1:
        return -1
    first = blocks[0]
    return first if all(b == first + i for i, b in enumerate(blocks)) else -1


def in_run_form(batch: ScheduledBatch) -> bool:
    """Whether the step replays a prefill graph's run form: one sequence (the one-slot graphs are the only ones
    captured in that form) whose blocks are one run (`blocks_run_from`)."""
    return len(batch) == 1 and blocks_run_from(batch.seqs[0].blocks) >= 0


def _block_table(rows: list[list[int]]) -> np.ndarray:
    """The step's block-table rows as one int64 array, padded with block 0 to the longest row."""
    table = np.zeros((len(rows), max(len(row) for row in rows)), dtype=np.int64)
    for i, row in enumerate(rows):
        table[i, :len(row)] = row
    return table


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


class _StaticInputs:
    """A captured graph's int64 and int32 input buffers, end to end in one device allocation, with a pinned
    host twin of the same bytes.

    A step's inputs are written into the twin through numpy views (slice assignment from the host lists and
    arrays) and go up in one asynchronous DMA. A fresh tensor built from Python lists and copied from pageable
    memory, twice per step, cost about 0.3 ms of host time for a 512-token prompt, all of it on the time to
    first token (benchmarks/RESULTS.md, round 12). An event recorded after the copy guards the twin: the
    next write waits until the device has read the last upload (by then long done in the engine's step
    order). On the CPU (tests) the twin is plain memory and the copy synchronous.
    """

    def __init__(self, n64: int, n32: int, device: torch.device) -> None:
        on_gpu = device.type == "cuda"
        self._dev = torch.zeros(8 * n64 + 4 * n32, dtype=torch.uint8, device=device)
        self._host = torch.empty(8 * n64 + 4 * n32, dtype=torch.uint8, pin_memory=on_gpu)
        self.i64 = self._dev[:8 * n64].view(torch.int64)
        self.i32 = self._dev[8 * n64:].view(torch.int32)
        host = self._host.numpy()
        self._views = (host[:8 * n64].view(np.int64), host[8 * n64:].view(np.int32))
        self._done = torch.cuda.Event() if on_gpu else None
        self._in_flight = False

    def writable(self) -> tuple[np.ndarray, np.ndarray]:
        """(int64, int32) numpy views of the host twin, safe to overwrite."""
        if self._in_flight:
            self._done.synchronize()
            self._in_flight = False
        return self._views

    def upload(self, n32: int | None = None) -> None:
        """Copy the int64 part and the first `n32` int32 values (all by default) to the device."""
        n32 = self.i32.numel() if n32 is None else n32
        nbytes = 8 * self.i64.numel() + 4 * n32
        self._dev[:nbytes].copy_(self._host[:nbytes], non_blocking=True)
        if self._done is not None:
            self._done.record()
            self._in_flight = True


class _DecodeGraph:
    """One captured decode step for a fixed batch bucket, with its static input buffers."""

    def __init__(self, bucket: int, max_blocks: int, device: torch.device) -> None:
        self.bucket = bucket
        self.max_blocks = max_blocks
        self.staging = _StaticInputs(3 * bucket, bucket * (1 + max_blocks), device)
        self.i64 = self.staging.i64.view(3, bucket)
        self.i32 = self.staging.i32
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


def _positions_and_slots(starts: list[int], counts: list[int], blocks: np.ndarray,
                         block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Position and cache slot of every packed token (sequence i contributes counts[i] tokens from
    position starts[i], its blocks in row i of `blocks`, `_block_table`), computed for the whole step at
    once: a per-token Python loop took about 40 us of a 512-token prompt's host time, before its first
    kernel. One sequence (a lone prompt, the idle server's time to first token) takes four numpy calls instead
    of a dozen: its slots are a slice of its blocks' slot ranges (16 -> 3 us here, 4-6x that on a GPU host
    right after the device idles; benchmarks/RESULTS.md round 14)."""
    if len(counts) == 1:
        start, stop = starts[0], starts[0] + counts[0]
        slots = (blocks[0][:, None] * block_size + np.arange(block_size, dtype=np.int64)).ravel()[start:stop]
        return np.arange(start, stop, dtype=np.int64), slots
    n = np.asarray(counts, dtype=np.int64)
    first_row = np.cumsum(n) - n
    pos = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(first_row - np.asarray(starts, dtype=np.int64), n)
    slots = blocks[np.repeat(np.arange(len(blocks)), n), pos // block_size] * block_size + pos % block_size
    return pos, slots


@dataclass
class _Packed:
    """One step's inputs on the host, in packing order (what `BatchInputs` holds, before upload).

    pos/slots: int64 arrays; blocks: the block table (`_block_table`); dst/src: rows of `ids` whose token is
    still pending, and where `Feed.tokens` has each."""

    ids: list[int]
    pos: np.ndarray
    slots: np.ndarray
    seq_lens: list[int]
    qsl: list[int]
    logits_rows: list[int]
    blocks: np.ndarray
    dst: list[int]
    src: list[int]
    sampled: list[Sequence]


class _PrefillGraph:
    """One captured step of up to `tokens` packed tokens and `seqs` sequences, with static inputs.

    A smaller step is padded: its tokens first, then padding tokens (id 0, position 0, slot -1) that
    belong to no sequence; unused sequence slots are empty (zero query tokens, zero context), so the
    attention kernel's programs for them and for the padding return at once. Unused logits rows read
    row 0 and are dropped. The launch is sized for `tokens` query rows and `max_model_len` keys, as the
    attention kernel allows (sizes are upper bounds). `runs`: every sequence of a step it replays has its
    blocks in one ascending run (`blocks_run_from`), and its attention computes block ids from each first
    block (`BatchInputs.first_pages`)."""

    def __init__(self, tokens: int, seqs: int, max_blocks: int, max_model_len: int, device: torch.device,
                 runs: bool = False) -> None:
        self.tokens, self.seqs, self.max_blocks, self.runs = tokens, seqs, max_blocks, runs
        t, s = tokens, seqs
        self.table_at = 2 * s + 1 + (s if runs else 0)  # int32: seq_lens, query_start_loc, [first_pages], tables
        self.staging = _StaticInputs(3 * t + s, self.table_at + s * max_blocks, device)
        self.i64, self.i32 = self.staging.i64, self.staging.i32
        self.inputs = BatchInputs(
            input_ids=self.i64[:t], positions=self.i64[t:2 * t], slot_mapping=self.i64[2 * t:3 * t],
            logits_indices=self.i64[3 * t:], seq_lens=self.i32[:s], query_start_loc=self.i32[s:2 * s + 1],
            block_tables=self.i32[self.table_at:].view(s, max_blocks), max_query_len=t, max_seq_len=max_model_len,
            first_pages=self.i32[2 * s + 1:3 * s + 1] if runs else None,
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def load_dummy(self) -> None:
        """Inputs of an empty step (every sequence slot empty, no KV written): safe to run for capture."""
        t = self.tokens
        self.i64.zero_()
        self.i64[2 * t:3 * t].fill_(-1)
        self.i32.zero_()

    def load(self, p: _Packed) -> None:
        """Upload a packed step (at most `tokens` tokens and `seqs` sequences) into the static inputs.

        Every token row is written (a stale slot would let a padding token write K/V); the block-table rows
        of unused sequence slots are not (their attention programs return before reading them)."""
        n, used, t, s, width = len(p.ids), len(p.seq_lens), self.tokens, self.seqs, self.max_blocks
        a64, a32 = self.staging.writable()
        a64[:n], a64[n:t] = p.ids, 0
        a64[t:t + n], a64[t + n:2 * t] = p.pos, 0
        a64[2 * t:2 * t + n], a64[2 * t + n:3 * t] = p.slots, -1
        rows = len(p.logits_rows)
        a64[3 * t:3 * t + rows], a64[3 * t + rows:] = p.logits_rows, 0
        a32[:used], a32[used:s] = p.seq_lens, 0
        a32[s:s + used + 1], a32[s + used + 1:2 * s + 1] = p.qsl, n
        if self.runs:  # the caller checked that each sequence's blocks are one run
            a32[2 * s + 1:2 * s + 1 + used], a32[2 * s + 1 + used:3 * s + 1] = p.blocks[:, 0], 0
        at = self.table_at
        table = a32[at:at + used * width].reshape(used, width)
        table[:, :p.blocks.shape[1]], table[:, p.blocks.shape[1]:] = p.blocks, 0
        self.staging.upload(at + used * width)


class ModelRunner:
    """Executes scheduled batches of a PagedDecoder over a PagedKVCache.

    max_num_batched_tokens: the step budget; with graphs, steps of up to `prefill_buckets(...)[-1]` tokens
    are replayed from prefill graphs (None: prefill and mixed steps always run eagerly)."""

    def __init__(self, decoder: PagedDecoder, cache: PagedKVCache, max_num_seqs: int, use_graphs: bool,
                 max_num_batched_tokens: int | None = None) -> None:
        self.decoder = decoder
        self.cache = cache
        self.device = decoder.device
        self.block_size = cache.block_size
        self.max_blocks = -(-decoder.max_model_len // self.block_size)
        self.max_num_seqs = max_num_seqs
        self.buckets = batch_buckets(max_num_seqs)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.graphs: dict[int, _DecodeGraph] = {}
        self.graph_error: str | None = None
        # (tokens, sequence slots, runs) -> graph; one-slot graphs in both forms (`blocks_run_from`)
        self.prefill_graphs: dict[tuple[int, int, bool], _PrefillGraph] = {}
        self.prefill_graph_error: str | None = None
        self._pool = None
        if self.use_graphs:
            self._pool = torch.cuda.graph_pool_handle()
            self._capture_all()
        if self.use_graphs and max_num_batched_tokens is not None:
            self._capture_prefill(prefill_buckets(max_num_batched_tokens))

    def _capture(self, inputs: BatchInputs) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm `inputs`' step up on a side stream (compiles kernels, makes lazy workspaces), then
        capture it into a graph of the shared pool; returns the graph and its logits tensor."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.decoder.forward(inputs, self.cache)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.decoder.forward(inputs, self.cache)
        return graph, logits

    def _capture_all(self) -> None:
        try:
            for bucket in sorted(self.buckets, reverse=True):
                g = _DecodeGraph(bucket, self.max_blocks, self.device)
                g.inputs.max_seq_len = self.decoder.max_model_len
                g.load_dummy()
                g.graph, g.logits = self._capture(g.inputs)
                self.graphs[bucket] = g
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # a kernel that syncs with the host cannot be captured: run eagerly
            self.graph_error = f"{type(exc).__name__}: {exc}"
            logger.warning("Decode graph capture failed (%s); decoding eagerly.", self.graph_error)
            self.graphs.clear()
            self.use_graphs = False
            torch.cuda.synchronize(self.device)

    def _capture_prefill(self, buckets: list[int]) -> None:
        """Capture a prefill/mixed-step graph per token bucket and sequence-slot bucket
        (`prefill_seq_buckets`; largest first, so the shared pool is sized by it), the one-slot ones also in
        the form for blocks in one run (`blocks_run_from`). Skipped for MoE models; a failed capture leaves
        those steps eager and decode graphs intact."""
        if any(layer.moe is not None for layer in self.decoder.layers):
            self.prefill_graph_error = "MoE layers: the expert loop of long steps reads counts on the host"
            return
        try:
            for tokens in sorted(buckets, reverse=True):
                for seqs in sorted(prefill_seq_buckets(self.max_num_seqs), reverse=True):
                    for runs in ((False, True) if seqs == 1 else (False,)):
                        g = _PrefillGraph(tokens, seqs, self.max_blocks, self.decoder.max_model_len, self.device,
                                          runs)
                        g.load_dummy()
                        g.graph, g.logits = self._capture(g.inputs)
                        self.prefill_graphs[tokens, seqs, runs] = g
            torch.cuda.synchronize(self.device)
        except Exception as exc:
            self.prefill_graph_error = f"{type(exc).__name__}: {exc}"
            logger.warning("Prefill graph capture failed (%s); prefill steps run eagerly.", self.prefill_graph_error)
            self.prefill_graphs.clear()
            torch.cuda.synchronize(self.device)

    def _pack(self, batch: ScheduledBatch) -> _Packed:
        """The step's inputs on the host, and the sequences whose next token is sampled, in row order."""
        feed: Feed | None = batch.feed
        p = _Packed([], np.empty(0, np.int64), np.empty(0, np.int64), [], [0], [], np.empty((0, 0), np.int64), [],
                    [], [])
        starts, tables = [], []
        for seq, n in zip(batch.seqs, batch.num_new):
            start = seq.num_computed
            chunk = _token_slice(seq, start, n)
            if chunk[-1] == PENDING:  # only the newest token can be pending
                p.dst.append(len(p.ids) + n - 1)
                p.src.append(feed.rows[seq] if feed is not None else -1)
                chunk[-1] = 0
            p.ids += chunk
            starts.append(start)
            p.seq_lens.append(start + n)
            p.qsl.append(p.qsl[-1] + n)
            tables.append(seq.blocks)
            if start + n == seq.num_tokens:
                p.logits_rows.append(p.qsl[-1] - 1)
                p.sampled.append(seq)
        if tables:
            p.blocks = _block_table(tables)
            p.pos, p.slots = _positions_and_slots(starts, batch.num_new, p.blocks, self.block_size)
        return p

    def build(self, batch: ScheduledBatch) -> tuple[BatchInputs, list[Sequence]]:
        """Packed inputs for an eager step and the sequences whose next token is sampled, in row order."""
        p = self._pack(batch)
        width = p.blocks.shape[1]
        dev = self.device
        host = torch.from_numpy(np.concatenate([np.asarray(p.ids, np.int64), p.pos, p.slots,
                                                np.asarray(p.logits_rows, np.int64)]))
        i64 = host.to(dev, non_blocking=True) if dev.type == "cuda" else host
        host32 = torch.from_numpy(np.concatenate([np.asarray(p.seq_lens + p.qsl, np.int32),
                                                  p.blocks.astype(np.int32).ravel()]))
        i32 = host32.to(dev, non_blocking=True) if dev.type == "cuda" else host32
        t, s = len(p.ids), len(batch.seqs)
        inputs = BatchInputs(
            input_ids=i64[:t], positions=i64[t:2 * t], slot_mapping=i64[2 * t:3 * t],
            logits_indices=i64[3 * t:], seq_lens=i32[:s], query_start_loc=i32[s:2 * s + 1],
            block_tables=i32[2 * s + 1:].view(s, width),
            max_query_len=max(batch.num_new), max_seq_len=max(p.seq_lens),
        )
        _patch(inputs.input_ids, p.dst, p.src, batch.feed)
        return inputs, p.sampled

    def prefill_graph(self, tokens: int, seqs: int, runs: bool = False) -> _PrefillGraph | None:
        """The captured graph a step of `tokens` tokens over `seqs` sequences replays: the fewest token
        rows, then the fewest sequence slots, that hold it, in the run form when `runs` (every sequence's
        blocks one run, `blocks_run_from`) and one exists; None when no graph does (the step runs eagerly)."""
        fits = [key for key in self.prefill_graphs if key[0] >= tokens and key[1] >= seqs and (runs or not key[2])]
        return self.prefill_graphs[min(fits, key=lambda k: (k[0], k[1], not k[2]))] if fits else None

    def prefill_graph_for(self, batch: ScheduledBatch) -> _PrefillGraph | None:
        """The captured graph `batch` (a prefill or mixed step) replays, in the run form where it may
        (`in_run_form`); None when none holds it."""
        if not self.prefill_graphs:
            return None
        return self.prefill_graph(sum(batch.num_new), len(batch), in_run_form(batch))

    def _replay_prefill(self, batch: ScheduledBatch, g: _PrefillGraph) -> tuple[torch.Tensor, list[Sequence]]:
        p = self._pack(batch)
        g.load(p)
        _patch(g.inputs.input_ids, p.dst, p.src, batch.feed)
        g.graph.replay()
        return g.logits[:len(p.sampled)], p.sampled

    def _replay(self, batch: ScheduledBatch) -> torch.Tensor:
        feed: Feed | None = batch.feed
        n = len(batch)
        bucket = next(b for b in self.buckets if b >= n)
        g = self.graphs[bucket]
        bs, width = self.block_size, self.max_blocks
        tokens, pos, slots, lens = [], [], [], []
        dst: list[int] = []
        src: list[int] = []
        a64, a32 = g.staging.writable()
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
            base = bucket + row * width
            a32[base:base + len(seq.blocks)], a32[base + len(seq.blocks):base + width] = seq.blocks, 0
        a64[:n], a64[n:bucket] = tokens, 0
        a64[bucket:bucket + n], a64[bucket + n:2 * bucket] = pos, 0
        a64[2 * bucket:2 * bucket + n], a64[2 * bucket + n:] = slots, -1
        a32[:n], a32[n:bucket] = lens, 1
        a32[bucket + n * width:] = 0
        g.staging.upload()
        _patch(g.i64[0], dst, src, feed)
        g.graph.replay()
        return g.logits[:n]

    def execute(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Launch one step; returns logits [sampled, vocab] and the sampled sequences in the same order.

        Newest tokens still `PENDING` on the host are taken from `batch.feed` on the device."""
        if self.use_graphs and batch.is_pure_decode and len(batch) <= self.buckets[-1]:
            return self._replay(batch), list(batch.seqs)
        g = self.prefill_graph_for(batch)
        if g is not None:
            return self._replay_prefill(batch, g)
        inputs, sampled = self.build(batch)
        return self.decoder.forward(inputs, self.cache), sampled
