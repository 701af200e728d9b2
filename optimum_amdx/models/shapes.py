"""Named model shapes (configs only) for benchmarks, memory estimates and random-weight tests.

Shapes follow the public configs of their namesakes; weights are never downloaded.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError

_LLAMA_BASE = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False)

SHAPES: dict[str, dict[str, Any]] = {
    "llama-2-7b": dict(_LLAMA_BASE, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                       max_position_embeddings=4096),
    "llama-2-13b": dict(_LLAMA_BASE, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                        num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                        max_position_embeddings=4096),
    "llama-2-70b": dict(_LLAMA_BASE, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                        max_position_embeddings=4096),
    "llama-3-8b": dict(_LLAMA_BASE, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                       max_position_embeddings=8192, rope_theta=500000.0),
    "llama-1b": dict(_LLAMA_BASE, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                     max_position_embeddings=4096),
    "mistral-7b": dict(model_type="mistral", hidden_act="silu", rms_norm_eps=1e-5, hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
                       rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False),
    "qwen2-7b": dict(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6, hidden_size=3584,
                     intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                     rope_theta=1000000.0, tie_word_embeddings=False),
    # Families of issue 18 (public configs; random weights for benchmarks).
    "qwen3-8b": dict(model_type="qwen3", hidden_act="silu", rms_norm_eps=1e-6, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                     tie_word_embeddings=False),
    "gemma-2-9b": dict(model_type="gemma2", hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                       hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=256, vocab_size=256000, max_position_embeddings=8192,
                       query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0),
    "phi-4": dict(model_type="phi3", hidden_act="silu", rms_norm_eps=1e-5, hidden_size=5120, intermediate_size=17920,
                  num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=10, vocab_size=100352,
                  max_position_embeddings=16384, rope_theta=250000.0, tie_word_embeddings=False,
                  pad_token_id=100349, bos_token_id=100257, eos_token_id=100265),
    "mixtral-8x7b": dict(model_type="mixtral", hidden_act="silu", rms_norm_eps=1e-5, hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                         max_position_embeddings=32768, rope_theta=1000000.0, sliding_window=None,
                         tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_act="silu", rms_norm_eps=1e-6, hidden_size=2048,
                          intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                          num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, vocab_size=151936,
                          max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False),
    "tiny-llama": dict(_LLAMA_BASE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                       max_position_embeddings=512),
}


def shape_config(name: str, **overrides: Any):
    """A transformers config for the named shape (see `SHAPES`), with optional overrides."""
    from transformers import AutoConfig

    key = name.strip().lower()
    if key not in SHAPES:
        raise InvalidArgumentError(
            f"Unknown model shape {name!r}. Known shapes: {', '.join(sorted(SHAPES))}."
        )
    params = dict(SHAPES[key])
    params.update(overrides)
    model_type = params.pop("model_type")
    return AutoConfig.for_model(model_type, **params)


def parameter_count(config) -> int:
    """Parameters of a decoder-only transformer config, counted from its shapes (no weights needed)."""
    h = config.hidden_size
    inter = config.intermediate_size
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    vocab = config.vocab_size
    attn = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
    if getattr(config, "model_type", "") == "qwen2":
        attn += heads * head_dim + 2 * kv_heads * head_dim
    mlp = 3 * h * inter
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if experts:  # sparse MoE (Mixtral, Qwen3-MoE): every expert's gate/up/down plus the router
        expert_inter = getattr(config, "moe_intermediate_size", None) or inter
        mlp = experts * 3 * h * expert_inter + h * experts
    model_type = getattr(config, "model_type", "")
    norms = (4 if model_type in ("gemma2", "gemma3_text") else 2) * h
    if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
        norms += 2 * head_dim  # per-head q/k norms
    per_layer = attn + mlp + norms
    embed = vocab * h
    lm_head = 0 if getattr(config, "tie_word_embeddings", False) else vocab * h
    return layers * per_layer + embed + lm_head + h
