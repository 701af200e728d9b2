"""LLMEngine: continuous batching over a paged KV cache.

Requests can be added at any time, also while others decode; each `step()` runs one batch
(chunks of new prompts packed with the decode tokens of running sequences) and returns the tokens
it produced. Finished sequences give their KV blocks back at once; when blocks run out the newest
sequence is preempted and recomputed later (see `scheduler`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Sequence as Seq

import torch

from ..errors import InvalidArgumentError
from .cache import PagedKVCache, blocks_for_memory
from .paged_model import PagedDecoder
from .runner import ModelRunner
from .sampling import SamplingParams, sample_next
from .scheduler import Scheduler, Sequence


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: Hashable
    new_token_ids: list[int]
    output_ids: list[int]
    finished: bool
    finish_reason: str | None


class LLMEngine:
    """Admits requests continuously and decodes them in shared batches over one KV block pool.

    block_size: tokens per KV block. num_blocks: pool size; when None it is sized from free GPU
    memory times `memory_fraction` (a GPU is required then). max_num_seqs: most sequences decoding
    together (also the largest graph bucket). max_num_batched_tokens: token budget of one step
    (prefill chunk size). use_cuda_graph: capture decode steps as device graphs (GPU only).
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
            activations = max_num_batched_tokens * decoder.config.intermediate_size * 6 * 2
            num_blocks = blocks_for_memory(layout, decoder.device, memory_fraction, reserve_bytes=activations)
        self.cache = PagedKVCache(layout, num_blocks, decoder.device)
        self.scheduler = Scheduler(self.cache.allocator, block_size, max_num_seqs, max_num_batched_tokens,
                                   decoder.max_model_len)
        self.runner = ModelRunner(decoder, self.cache, max_num_seqs, use_cuda_graph)
        self.generator = generator
        self._ids = itertools.count()
        self._seqs: dict[Hashable, Sequence] = {}
        self._streamers: dict[Hashable, Any] = {}
        self._generators: dict[Hashable, torch.Generator] = {}

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
        ids = []
        for t in prompt_ids:
            if isinstance(t, bool) or not hasattr(t, "__index__"):
                raise InvalidArgumentError(f"{name}: token id {t!r} ({type(t).__name__}) is not an integer.")
            ids.append(int(t))
        vocab = self.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
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
        self._end_stream(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def _end_stream(self, request_id: Hashable) -> None:
        streamer = self._streamers.pop(request_id, None)
        if streamer is not None:
            streamer.end()

    def _check_finish(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids:
            return "stop"
        if len(seq.output_ids) >= seq.params.max_new_tokens or seq.num_tokens >= self.decoder.max_model_len:
            return "length"
        return None

    def step(self) -> list[RequestOutput]:
        """Run one batch; returns an output for every sequence that produced a token."""
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        logits, sampled = self.runner.execute(batch)
        tokens: list[int] = []
        if sampled:
            params = [s.params for s in sampled]
            histories = [s.tokens for s in sampled] if any(p.repetition_penalty != 1.0 for p in params) else []
            counts = [len(s.output_ids) for s in sampled]
            tokens = sample_next(logits, params, histories, self.generator, counts)
            for i, seq in enumerate(sampled):
                own = self._generators.get(seq.request_id)
                if own is not None and params[i].do_sample:
                    tokens[i] = sample_next(logits[i:i + 1], params[i:i + 1], histories[i:i + 1], own, counts[i:i + 1])[0]
        # committed only once the step succeeded: after an error (or Ctrl-C) the same work is simply redone
        for seq, n in zip(batch.seqs, batch.num_new):
            seq.num_computed += n
        if not sampled:
            return []
        outputs = []
        for seq, token in zip(sampled, tokens):
            seq.output_ids.append(token)
            streamer = self._streamers.get(seq.request_id)
            if streamer is not None:
                streamer.put(torch.tensor([token]))
            reason = self._check_finish(seq, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self._generators.pop(seq.request_id, None)
                self._end_stream(seq.request_id)
            outputs.append(RequestOutput(seq.request_id, [token], seq.output_ids, reason is not None, reason))
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
