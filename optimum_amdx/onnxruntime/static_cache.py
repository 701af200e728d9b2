"""Running a static-shape decoder export (fixed-capacity KV cache) behind transformers' `generate()`.

The export (see `optimum_amdx.exporters.static_decoder`) has one prefill graph per (batch,
prompt length) bucket and one decode graph per batch bucket over KV buffers of `capacity` slots.
Here a prompt batch of B rows and L tokens is left-padded to the smallest bucket (Bb, Sb) that
holds it and written to slots [0, Sb); decode step t writes slot Sb + t. Each graph therefore
always sees the same shapes, which is what MIGraphX needs to compile each program once.

`StaticKVCache` is the transformers `Cache` that `generate()` carries between steps: it holds the
buffers as torch tensors on the provider's device. With IO binding the buffers are
double-buffered (graph reads one set, writes the other, then they swap), so decoding allocates
nothing and the cache never leaves the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache

from ..errors import InvalidArgumentError
from ..exporters.contract import (
    CACHE_POSITION, ROLE_DECODE, ROLE_PREFILL, decode_file, decoder_input_names, graph_for, prefill_file,
    present_names,
)
from ..exporters.static import StaticShapes

CAPACITY_FLAG = "--static-shapes ...,capacity=N"


class StaticKVCache(Cache):
    """Fixed-capacity KV buffers of one generation, plus where the prompt sits in them.

    `get_seq_length()` is what `generate()` sees: tokens fed so far (prompt + generated), not
    counting the padding added to reach the bucket.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, buffers: list[torch.Tensor], spare: list[torch.Tensor] | None, mask: torch.Tensor,
                 batch: int, offset: int, slot: int, length: int) -> None:
        super().__init__(layers=[])
        self.buffers, self.spare, self.mask = buffers, spare, mask
        self.batch, self.offset, self.slot, self.length = batch, offset, slot, length

    @property
    def bucket_batch(self) -> int:
        return self.buffers[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.buffers[0].shape[2]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # noqa: D102
        return self.length

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:  # noqa: D102
        return self.capacity

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: make row i hold the state of row `beam_idx[i]` (rows past the real batch stay)."""
        index = beam_idx.to(self.mask.device)
        for buf in self.buffers:
            buf[: self.batch] = buf.index_select(0, index)
        self.mask[: self.batch] = self.mask.index_select(0, index)

    def __repr__(self) -> str:
        return (f"StaticKVCache(batch={self.batch}/{self.bucket_batch}, capacity={self.capacity}, "
                f"next_slot={self.slot}, tokens={self.length})")


class StaticDecoderRunner:
    """Pads, picks the bucket graph, runs it and keeps the cache for an `ORTModelForCausalLM`."""

    def __init__(self, model: Any, metadata: dict[str, Any], use_bucket_graphs: bool) -> None:
        self.model = model
        self.metadata = metadata
        self.shapes = StaticShapes.from_dict(metadata["static_shapes"])
        self.capacity = int(metadata["kv_capacity"])
        self.use_bucket_graphs = use_bucket_graphs
        self.names = decoder_input_names(model.num_layers, static=True)
        self.present = present_names(model.num_layers)
        pad = getattr(model.generation_config, "pad_token_id", None)
        if isinstance(pad, (list, tuple)):
            pad = pad[0] if pad else None
        self.pad_id = int(pad) if pad is not None else 0

    # -- checks ---------------------------------------------------------------------------------
    def bucket(self, batch: int, length: int) -> tuple[int, int]:
        """The (batch, prompt) bucket for a prompt batch, or a clear error naming the export flag."""
        b = next((x for x in self.shapes.batch_sizes if x >= batch), None)
        s = next((x for x in self.shapes.sequence_lengths if x >= length), None)
        if b is None:
            raise InvalidArgumentError(
                f"Batch of {batch} sequences (beams included) exceeds the largest static batch bucket "
                f"{self.shapes.batch_sizes[-1]} of this export; split the batch or re-export with a larger "
                f"--static-shapes batch=... ."
            )
        if s is None:
            raise InvalidArgumentError(
                f"Prompt of {length} tokens exceeds the largest static prompt bucket {self.shapes.sequence_lengths[-1]} "
                f"of this export; shorten the prompt or re-export with a larger --static-shapes sequence=... "
                f"(and capacity=...)."
            )
        return b, s

    def check_generation(self, batch: int, length: int, max_new_tokens: int) -> None:
        """Fail before any work when prompt bucket + new tokens cannot fit the KV capacity."""
        _, s = self.bucket(batch, length)
        needed = s + max(max_new_tokens, 1) - 1  # the last new token is never written to the cache
        if needed > self.capacity:
            raise InvalidArgumentError(
                f"A {length}-token prompt (padded to the {s}-token bucket) plus max_new_tokens={max_new_tokens} needs "
                f"{needed} KV slots, but this export holds {self.capacity}. Lower max_new_tokens to "
                f"{self.capacity - s + 1} or re-export with a larger capacity ({CAPACITY_FLAG})."
            )

    # -- running --------------------------------------------------------------------------------
    def _session(self, role: str, batch: int, seq: int | None):
        if not self.use_bucket_graphs:
            return self.model.session
        entry = graph_for(self.metadata, role, batch, seq)
        name = entry.file if entry is not None else (prefill_file(batch, seq) if role == ROLE_PREFILL else decode_file(batch))
        return self.model.graph_session(name)

    def _run(self, session, feed: dict[str, torch.Tensor], cache: StaticKVCache) -> torch.Tensor:
        """Run one graph; the updated buffers replace `cache.buffers`; returns logits (Bb, 1, vocab)."""
        model = self.model
        bb = cache.bucket_batch
        feed.update(zip(self.names[4:], cache.buffers))
        if model.use_io_binding:
            from .binding import TensorBinder

            binder = TensorBinder(session, model.provider, model.device_id)
            shapes = {"logits": (bb, 1, model.vocab_size)}
            shapes.update({n: tuple(b.shape) for n, b in zip(self.present, cache.buffers)})
            dtypes = {n: model.dtype for n in shapes}
            outputs = binder.run(feed, shapes, dtypes, model.device, out=dict(zip(self.present, cache.spare)))
            cache.buffers, cache.spare = cache.spare, cache.buffers
            return outputs["logits"]
        arrays = {k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in feed.items()}
        results = session.run(None, arrays)
        named = dict(zip([o.name for o in session.get_outputs()], results))
        cache.buffers = [torch.from_numpy(named[n]).to(model.device) for n in self.present]
        return torch.from_numpy(named["logits"]).to(model.device)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, StaticKVCache]:
        """Left-pad the prompt into its bucket, run the prefill graph; logits of the last position + the new cache."""
        model = self.model
        batch, length = input_ids.shape
        bb, sb = self.bucket(batch, length)
        device = model.device
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.int64)
        offset = sb - length
        ids = torch.full((bb, sb), self.pad_id, dtype=torch.int64, device=device)
        ids[:batch, offset:] = input_ids.to(device, torch.int64)
        mask = torch.zeros(bb, self.capacity, dtype=torch.int64, device=device)
        mask[:batch, offset:sb] = attention_mask.to(device, torch.int64)
        mask[batch:, sb - 1] = 1  # rows that only fill the batch bucket attend to one slot, never to nothing
        positions = (mask[:, :sb].cumsum(-1) - 1).clamp(min=0)
        shape = (bb, model.num_kv_heads, self.capacity, model.head_dim)
        buffers = [torch.zeros(shape, dtype=model.dtype, device=device) for _ in self.present]
        spare = [torch.empty(shape, dtype=model.dtype, device=device) for _ in self.present] if model.use_io_binding else None
        cache = StaticKVCache(buffers, spare, mask, batch, offset, sb, length)
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                CACHE_POSITION: torch.arange(sb, dtype=torch.int64, device=device)}
        logits = self._run(self._session(ROLE_PREFILL, bb, sb), feed, cache)
        return logits[:batch], cache

    def decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               cache: StaticKVCache) -> torch.Tensor:
        """One new token per row written at the next slot; logits of that token."""
        model = self.model
        batch, seq = input_ids.shape
        if seq != 1 or batch != cache.batch:
            raise InvalidArgumentError(
                f"A static-cache decode step takes one new token per sequence ({cache.batch} rows); got input_ids of "
                f"shape {tuple(input_ids.shape)}."
            )
        slot = cache.slot
        if slot >= self.capacity:
            raise InvalidArgumentError(
                f"The KV cache of this export is full ({self.capacity} slots: prompt bucket + generated tokens). "
                f"Generate fewer tokens or re-export with a larger capacity ({CAPACITY_FLAG})."
            )
        device = model.device
        bb = cache.bucket_batch
        mask = cache.mask
        if attention_mask is not None and attention_mask.shape[-1] == slot + 1 - cache.offset:
            mask[:batch, cache.offset:slot + 1] = attention_mask.to(device, torch.int64)
        else:
            mask[:batch, slot] = 1
        mask[batch:, slot] = 1
        ids = torch.full((bb, 1), self.pad_id, dtype=torch.int64, device=device)
        ids[:batch] = input_ids.to(device, torch.int64)
        positions = (mask[:, :slot + 1].sum(-1, keepdim=True) - 1).clamp(min=0)
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                CACHE_POSITION: torch.tensor([slot], dtype=torch.int64, device=device)}
        logits = self._run(self._session(ROLE_DECODE, bb, None), feed, cache)
        cache.slot += 1
        cache.length += 1
        return logits[:batch]
