"""Roofline floors for LLM inference: what the hardware cannot beat.

Decode is memory-bound: every step reads all weights once (the embedding table aside: only the
rows of the current tokens) plus the whole KV cache at the current length. Its floor is those
bytes over the memory bandwidth. Prefill does 2 FLOPs per weight per token plus the causal
attention products; its floor is the larger of those FLOPs over the matmul rate and the weight
bytes over the bandwidth (short prompts at batch 1 are still memory-bound). Measured times are reported as a percentage of
these floors (100 % = at the hardware limit).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class ModelGeometry:
    """The shape facts of a decoder that decide its bytes and FLOPs."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, config: Any) -> "ModelGeometry":
        """Read the geometry from a transformers config (text config for multimodal ones)."""
        cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(
            num_layers=cfg.num_hidden_layers,
            hidden_size=cfg.hidden_size,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=cfg.vocab_size,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_cache_bytes(geom: ModelGeometry, batch_size: int, context_length: int, element_bytes: float) -> float:
    """Bytes of keys and values held for `batch_size` sequences of `context_length` tokens."""
    return 2.0 * geom.num_layers * geom.num_kv_heads * geom.head_dim * context_length * batch_size * element_bytes


def decode_weight_bytes(total_weight_bytes: float, embedding_bytes: float, tied: bool) -> float:
    """Weight bytes one decode step reads: all of them, except an untied input embedding table
    (only the rows of the current tokens are gathered, which is negligible)."""
    return total_weight_bytes if tied else total_weight_bytes - embedding_bytes


def decode_floor(
    weight_bytes: float,
    geom: ModelGeometry,
    batch_size: int,
    prompt_length: int,
    new_tokens: int,
    kv_element_bytes: float,
    bandwidth_bytes_per_s: float | None,
) -> dict[str, Any]:
    """The memory floor of the decode phase, averaged over its steps.

    Decode step k (k = 1 .. new_tokens - 1) attends over prompt_length + k cached positions, so the
    mean KV read is taken over those lengths. Returns bytes per step and, when a bandwidth is given,
    the floor time per token and the matching tokens/s limit for the whole batch.
    """
    if batch_size < 1 or prompt_length < 1 or new_tokens < 1:
        raise InvalidArgumentError("batch_size, prompt_length and new_tokens must all be at least 1.")
    steps = max(new_tokens - 1, 1)
    mean_context = prompt_length + (steps + 1) / 2.0
    kv = kv_cache_bytes(geom, batch_size, mean_context, kv_element_bytes)
    bytes_per_step = weight_bytes + kv
    out: dict[str, Any] = {
        "weight_bytes": weight_bytes,
        "kv_bytes_mean": kv,
        "bytes_per_step": bytes_per_step,
        "bandwidth_bytes_per_s": bandwidth_bytes_per_s,
        "tpot_floor_s": None,
        "tokens_per_s_limit": None,
    }
    if bandwidth_bytes_per_s:
        floor = bytes_per_step / bandwidth_bytes_per_s
        out["tpot_floor_s"] = floor
        out["tokens_per_s_limit"] = batch_size / floor
    return out


def prefill_flops(non_embedding_params: float, geom: ModelGeometry, batch_size: int, prompt_length: int) -> float:
    """FLOPs of one prefill: 2 per weight per token, plus QK^T and PV over the causal triangle."""
    dense = 2.0 * non_embedding_params * batch_size * prompt_length
    causal_pairs = prompt_length * (prompt_length + 1) / 2.0
    attention = 2 * 2.0 * geom.num_layers * geom.num_heads * geom.head_dim * causal_pairs * batch_size
    return dense + attention


def prefill_floor(
    non_embedding_params: float,
    geom: ModelGeometry,
    batch_size: int,
    prompt_length: int,
    flops_per_s: float | None,
    weight_bytes: float | None = None,
    bandwidth_bytes_per_s: float | None = None,
) -> dict[str, Any]:
    """The floor of prefill (time to first token): the larger of its compute and memory floors.

    Short prompts at small batch are memory-bound like decode (all weights are read once); long
    ones are compute-bound. `bound` says which floor is the limit, when both are known.
    """
    flops = prefill_flops(non_embedding_params, geom, batch_size, prompt_length)
    compute = flops / flops_per_s if flops_per_s else None
    memory = weight_bytes / bandwidth_bytes_per_s if weight_bytes and bandwidth_bytes_per_s else None
    known = [(t, name) for t, name in ((compute, "compute"), (memory, "memory")) if t is not None]
    floor, bound = max(known) if known else (None, None)
    return {
        "flops": flops,
        "flops_per_s": flops_per_s,
        "compute_floor_s": compute,
        "memory_floor_s": memory,
        "ttft_floor_s": floor,
        "bound": bound,
    }


def percent_of_limit(floor_s: float | None, measured_s: float | None) -> float | None:
    """How close a measurement is to its floor: 100 * floor / measured (None if either is unknown)."""
    if not floor_s or not measured_s or measured_s <= 0:
        return None
    return 100.0 * floor_s / measured_s
