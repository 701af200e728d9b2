"""LLMEngine: continuous batching over a paged KV cache.

Requests can be added at any time, also while others decode; each `step()` runs one batch
(chunks of new prompts packed with the decode tokens of running sequences) and returns the tokens
it produced. Finished sequences give their KV blocks back at once; when blocks run out the newest
sequence is preempted and recomputed later (see `scheduler`).

The host runs one step ahead of what it has read. `step()` schedules and launches step n (its inputs
built while step n-1 still runs on the device; a token sampled by n-1 reaches n's inputs on the device,
`runner.Feed`), then waits for step n-1's tokens (a non-blocking copy and an event) while step n runs,
and returns step n-1's outputs. Sampling stays on the device (`sampling.sample_tokens`). So the
scheduler, the input build, stop checks and streaming of one step overlap the device work of the
next, and the device never idles waiting for the host. Until a token is read, `output_ids` holds
`PENDING` in its place. A sequence whose last token reaches max_new_tokens (or max_model_len) is
retired when that step is launched, so it never runs an extra step; one that ends on a stop token
is known one step late: it ran one extra step, whose token is dropped and never reported. A batch
that needs the true history (a repetition penalty) first reads the previous step, losing the overlap.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Sequence as Seq

import torch

from ..errors import InvalidArgumentError
from .cache import PagedKVCache, blocks_for_memory
from .paged_model import PagedDecoder
from .runner import Feed, ModelRunner, prefill_buckets
from .sampling import SamplingParams, sample_tokens, to_device
from .scheduler import PENDING, Scheduler, Sequence


@dataclass
class RequestOutput:
    """What one step produced for one request; `output_ids`: every token generated up to this one."""

    request_id: Hashable
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    _ids: list[int] = field(repr=False, default_factory=list)
    _count: int = field(repr=False, default=0)

    @property
    def output_ids(self) -> list[int]:
        # a slice of the live list: tokens before `_count` never change, later ones may still be pending
        return self._ids[:self._count]


@dataclass
class _InFlight:
    """A launched step whose sampled tokens the host has not read yet: `tokens` on the device, `host`
    its non-blocking copy (complete once `event` fired); row i is `seqs[i]`'s token number `index[i]`."""

    seqs: list[Sequence]
    index: list[int]
    tokens: torch.Tensor
    host: torch.Tensor
    event: Any

    def feed(self) -> Feed:
        return Feed({seq: row for row, seq in enumerate(self.seqs)}, self.tokens)


class LLMEngine:
    """Admits requests continuously and decodes them in shared batches over one KV block pool.

    block_size: tokens per KV block. num_blocks: pool size; when None it is sized from free GPU
    memory times `memory_fraction` (a GPU is required then). max_num_seqs: most sequences decoding
    together (also the largest graph bucket). max_num_batched_tokens: token budget of one step
    (prefill chunk size). use_cuda_graph: capture decode steps, and prefill steps of up to 1024 tokens, as
    device graphs (GPU only).
    """

    def __init__(self, decoder: PagedDecoder, *, block_size: int = 16, num_blocks: int | None = None,
                 memory_fraction: float = 0.9, max_num_seqs: int = 64, max_num_batched_tokens: int = 4096,
                 use_cuda_graph: bool = True, generator: torch.Generator | None = None) -> None:
        if block_size < 1:
            raise InvalidArgumentError(f"block_size={block_size}: expected a positive number of tokens.")
        if max_num_seqs < 1:
            raise InvalidArgumentError(f"max_num_seqs={max_num_seqs}: expected at least 1.")
        self.decoder = decoder
        layout = decoder.cache_layout(block_size)
        if num_blocks is None:
            if decoder.device.type != "cuda":
                raise InvalidArgumentError(
                    "num_blocks is required on CPU (the pool is sized from free memory only on a GPU)."
                )
            # eager steps, plus the prefill graphs' pool (it holds the activations of their largest bucket)
            graph_tokens = max(prefill_buckets(max_num_batched_tokens), default=0) if use_cuda_graph else 0
            activations = (max_num_batched_tokens + graph_tokens) * decoder.config.intermediate_size * 6 * 2
            num_blocks = blocks_for_memory(layout, decoder.device, memory_fraction, reserve_bytes=activations)
        self.cache = PagedKVCache(layout, num_blocks, decoder.device)
        self.scheduler = Scheduler(self.cache.allocator, block_size, max_num_seqs, max_num_batched_tokens,
                                   decoder.max_model_len)
        self.runner = ModelRunner(decoder, self.cache, max_num_seqs, use_cuda_graph, max_num_batched_tokens)
        self.generator = generator
        self._ids = itertools.count()
        self._seqs: dict[Hashable, Sequence] = {}
        self._streamers: dict[Hashable, Any] = {}
        self._generators: dict[Hashable, torch.Generator] = {}
        self._inflight: _InFlight | None = None

    @property
    def num_blocks(self) -> int:
        return self.cache.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.cache.allocator.num_free

    @property
    def uses_graphs(self) -> bool:
        return self.runner.use_graphs

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding table: valid token ids are 0 .. vocab_size - 1."""
        embed = getattr(self.decoder, "embed", None)
        rows = getattr(embed, "num_embeddings", None)
        return int(rows if rows is not None else self.decoder.config.vocab_size)

    def check_request(self, prompt_ids: Seq[int], params: SamplingParams | None = None,
                      name: Hashable = "request") -> list[int]:
        """Validate a request without queueing it; return the prompt as a list of ints.

        Refuses non-integer or out-of-vocabulary ids (they would fail inside a batch shared with other
        requests), stop ids outside the vocabulary, an empty prompt, and one that can never fit.
        """
        if params is not None and not isinstance(params, SamplingParams):
            raise InvalidArgumentError(f"{name}: params must be a SamplingParams, not {type(params).__name__}.")
        params = params or SamplingParams()
        if isinstance(prompt_ids, torch.Tensor):
            if prompt_ids.dtype.is_floating_point or prompt_ids.dtype == torch.bool or prompt_ids.dim() > 1:
                raise InvalidArgumentError(f"{name}: prompt ids must be a 1-D integer sequence, got a "
                                           f"{prompt_ids.dtype} tensor of shape {tuple(prompt_ids.shape)}.")
            prompt_ids = prompt_ids.tolist()
        if isinstance(prompt_ids, (str, bytes)):
            raise InvalidArgumentError(f"{name}: got text; tokenize it first (token ids are expected).")
        ids = list(prompt_ids)
        # plain ints (what tolist() and tokenizers give) pass one cheap type test: this check sits on the
        # time to first token (a per-token loop of isinstance/int calls took about 0.2 ms for 512 tokens)
        if not all(type(t) is int for t in ids):
            for i, t in enumerate(ids):
                if isinstance(t, bool) or not hasattr(t, "__index__"):
                    raise InvalidArgumentError(f"{name}: token id {t!r} ({type(t).__name__}) is not an integer.")
                ids[i] = int(t)
        vocab = self.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            bad = [t for t in ids if not 0 <= t < vocab]
            raise InvalidArgumentError(
                f"{name}: token ids {bad[:5]} are outside the vocabulary [0, {vocab}); was the prompt encoded "
                "with this model's tokenizer?"
            )
        bad_stops = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad_stops:
            raise InvalidArgumentError(f"{name}: stop_token_ids/eos_token_id {bad_stops} are outside the vocabulary [0, {vocab}).")
        self.scheduler.check(name, len(ids), params)
        return ids

    def add_request(self, prompt_ids: Seq[int], params: SamplingParams | None = None,
                    request_id: Hashable | None = None, streamer: Any = None, seed: int | None = None) -> Hashable:
        """Queue a prompt (token ids); returns its request id. `streamer` gets put(tensor)/end() calls.

        `seed`: this request samples from its own generator, so its output does not depend on its batch mates.
        The request is validated first (`check_request`); a refused one leaves the engine unchanged.
        """
        if request_id is not None and request_id in self._seqs:
            raise InvalidArgumentError(f"Request id {request_id!r} is already in use.")
        ids = self.check_request(prompt_ids, params, name=request_id if request_id is not None else "request")
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self._seqs:
                request_id = next(self._ids)
        seq = self.scheduler.add(request_id, ids, params or SamplingParams())
        self._seqs[request_id] = seq
        if streamer is not None:
            self._streamers[request_id] = streamer
        if seed is not None:
            self._generators[request_id] = torch.Generator(self.decoder.device).manual_seed(int(seed))
        return request_id

    def abort(self, request_id: Hashable) -> None:
        """Drop a request (queued, running or finished but not yet collected) and free its blocks."""
        self._generators.pop(request_id, None)
        seq = self._seqs.pop(request_id, None)
        if seq is not None and seq.finish_reason is None:
            self.scheduler.finish(seq, "abort")
        if self._inflight is not None and all(s.finish_reason is not None for s in self._inflight.seqs):
            self._inflight = None  # nothing left in it to report
        self._end_stream(request_id)

    def has_unfinished(self) -> bool:
        """Requests still queued or running, or a launched step whose tokens were not returned yet."""
        return self.scheduler.has_unfinished() or self._inflight is not None

    def _end_stream(self, request_id: Hashable) -> None:
        streamer = self._streamers.pop(request_id, None)
        if streamer is not None:
            streamer.end()

    def _check_finish(self, seq: Sequence, token: int | None, count: int) -> str | None:
        """Why `seq` ends with its `count`-th generated token (`token`; None: not known yet), or None."""
        if token is not None and token in seq.params.stop_token_ids:
            return "stop"
        if count >= seq.params.max_new_tokens or len(seq.prompt_ids) + count >= self.decoder.max_model_len:
            return "length"
        return None

    def step(self) -> list[RequestOutput]:
        """Launch the next batch and return the outputs of the one launched before it (see the module
        docstring): an output for every sequence whose token was read, finished ones last-token included."""
        batch = self.scheduler.schedule()
        prev = self._inflight
        outputs: list[RequestOutput] = []
        if batch.seqs:
            batch.feed = prev.feed() if prev is not None else None
            logits, sampled = self.runner.execute(batch)
            if prev is not None and any(s.params.repetition_penalty != 1.0 for s in sampled):
                outputs = self._read(prev)  # the penalty needs every earlier token on the host
                prev = self._inflight = None
            tokens = self._sample(logits, sampled) if sampled else None
            # committed only once the step launched: after an error (or Ctrl-C) the same work is simply redone
            for seq, n in zip(batch.seqs, batch.num_new):
                seq.num_computed += n
            self._inflight = self._launched(sampled, tokens) if sampled else None
        else:
            self._inflight = None
        if prev is not None:
            outputs = self._read(prev)
        return outputs

    def _sample(self, logits: torch.Tensor, sampled: list[Sequence]) -> torch.Tensor:
        """The sampled rows' next tokens on the device (no host sync)."""
        params = [s.params for s in sampled]
        histories = [s.tokens for s in sampled] if any(p.repetition_penalty != 1.0 for p in params) else []
        counts = [len(s.output_ids) for s in sampled]
        tokens = sample_tokens(logits, params, histories, self.generator, counts)
        for i, seq in enumerate(sampled):
            own = self._generators.get(seq.request_id)
            if own is not None and params[i].do_sample:
                tokens[i:i + 1] = sample_tokens(logits[i:i + 1], params[i:i + 1], histories[i:i + 1], own,
                                                counts[i:i + 1])
        return tokens

    def _launched(self, sampled: list[Sequence], tokens: torch.Tensor) -> _InFlight | None:
        """Hold places for the tokens just sampled, start their copy to the host, and retire the
        sequences that end with them whatever they are."""
        seqs, index, rows = [], [], []
        for row, seq in enumerate(sampled):
            if seq.finish_reason is not None:  # ended meanwhile (read early for a repetition penalty)
                continue
            seq.output_ids.append(PENDING)
            seqs.append(seq)
            index.append(len(seq.output_ids) - 1)
            rows.append(row)
            if self._check_finish(seq, None, len(seq.output_ids)) is not None:
                self.scheduler.retire(seq)
        if not seqs:
            return None
        if len(rows) != len(sampled):
            tokens = tokens.index_select(0, to_device(rows, torch.long, tokens.device))
        if tokens.device.type == "cuda":
            host = tokens.to("cpu", non_blocking=True)  # lands in pinned memory
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = tokens, None
        return _InFlight(seqs, index, tokens, host, event)

    def _read(self, step: _InFlight) -> list[RequestOutput]:
        """Wait for a launched step's tokens, put them in place, and report them (stops, streams, ends)."""
        if step.event is not None:
            step.event.synchronize()
        outputs = []
        for seq, index, token in zip(step.seqs, step.index, step.host.tolist()):
            if seq.finish_reason is not None:  # aborted, or ended by a stop token the step before
                continue
            seq.output_ids[index] = token
            streamer = self._streamers.get(seq.request_id)
            if streamer is not None:
                streamer.put(torch.tensor([token]))
            reason = self._check_finish(seq, token, index + 1)
            if reason is not None:
                del seq.output_ids[index + 1:]  # a token of a step run after the end: never reported
                self.scheduler.finish(seq, reason)
                self._generators.pop(seq.request_id, None)
                self._end_stream(seq.request_id)
            outputs.append(RequestOutput(seq.request_id, [token], reason is not None, reason, seq.output_ids,
                                         index + 1))
        return outputs

    def run(self) -> dict[Hashable, list[int]]:
        """Step until every queued request finished; returns generated ids per request id."""
        while self.has_unfinished():
            self.step()
        done = {rid: seq.output_ids for rid, seq in self._seqs.items()}
        self._seqs = {rid: s for rid, s in self._seqs.items() if s.finish_reason is None}
        return done

    def generate(self, prompts: Iterable[Seq[int]],
                 params: SamplingParams | Seq[SamplingParams] | None = None) -> list[list[int]]:
        """Generate for several prompts (any lengths) together; returns the new ids of each, in order."""
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidArgumentError(f"Got {len(params)} sampling params for {len(prompts)} prompts.")
        for i, (p, sp) in enumerate(zip(prompts, params)):
            self.check_request(p, sp, name=f"prompt {i}")
        ids: list[Hashable] = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self.add_request(p, sp))
            done = self.run()
            return [done[i] for i in ids]
        finally:
            for i in ids:  # a failed or interrupted call leaves nothing of its own behind
                self.abort(i)
