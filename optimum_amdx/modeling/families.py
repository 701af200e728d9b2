"""What each model family the paged engine runs does differently from Llama, in one table.

`PagedDecoder` runs one forward for every family (pre-norm decoder layers over a paged KV cache);
a `FamilySpec` says where a family departs from Llama, and `LayerParts` / `DecoderParts` are those
differences resolved for one loaded model (weights, eps, windows, rotary tables), so the forward reads
fields instead of branching on model types.

| family            | model_type(s)            | what differs from Llama |
|-------------------|--------------------------|-------------------------|
| Llama, Mistral    | llama, mistral           | (Mistral: one sliding window for all layers) |
| Qwen2             | qwen2                    | q/k/v biases; sliding window on layers of `layer_types` |
| Qwen3             | qwen3                    | per-head RMSNorm of q and k before rotary; windows by `layer_types` |
| Gemma             | gemma                    | `(1 + w)` RMSNorm, embeddings x sqrt(hidden), GELU-tanh gated MLP |
| Gemma 2           | gemma2                   | as Gemma, + 4 norms per layer (post-attention, pre/post-feed-forward), attention and final logit soft-capping, scale `query_pre_attn_scalar ** -0.5`, alternating sliding/global layers |
| Gemma 3 (text)    | gemma3_text              | as Gemma 2 (soft-capping only if configured), + per-head `(1 + w)` q/k norm, local/global rotary bases per layer type |
| Phi-3 / Phi-4     | phi3                     | fused `qkv_proj` and `gate_up_proj` in the checkpoint, partial rotary, LongRoPE/su scaling |
| Mixtral           | mixtral                  | sparse MoE feed-forward: softmax -> top-k -> renormalized weights |
| Qwen3-MoE         | qwen3_moe                | Qwen3 attention + sparse MoE (top-k renormalized when `norm_topk_prob`), dense MLP on `mlp_only_layers` |

Rotary tables always come from the model's own rotary module (its forward, per layer type where
the model has several), so every rope scaling transformers implements (linear, llama3, yarn,
longrope/su, ...) gives transformers' numbers. LongRoPE picks its short or long factors from the
sequence length; a paged cache cannot re-rotate cached keys, so the tables are built for
`max_model_len` (short factors while it is within `original_max_position_embeddings`, long ones
beyond: the same choice vLLM makes).

`(1 + w)` norms are applied as a plain RMSNorm with the weight `1 + w` precomputed in the model's
dtype: exact in fp32; in fp16/bf16 the product is rounded slightly differently from transformers'
float32 multiply (within the dtype's rounding, not bit-equal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..errors import UnsupportedModelError

__all__ = ["FAMILIES", "FamilySpec", "LayerParts", "DecoderParts", "family_for", "supported_model_types"]


@dataclass(frozen=True)
class FamilySpec:
    """How one model family departs from Llama (all defaults = Llama)."""

    name: str
    model_types: tuple[str, ...]
    norm_plus_one: bool = False
    """RMSNorm weights are stored as w and applied as (1 + w) (Gemma)."""
    qk_norm: bool = False
    """Per-head RMSNorm of q and k (`self_attn.q_norm` / `k_norm`) before rotary (Qwen3, Gemma 3)."""
    sandwich_norms: bool = False
    """Four norms per layer: input, post-attention (on the attention output, before the residual add),
    pre-feed-forward and post-feed-forward (Gemma 2/3)."""
    embed_scale: bool = False
    """Embeddings are multiplied by sqrt(hidden_size) rounded to the model dtype (Gemma 1/2/3). Applied by the
    decoder only when the embedding module does not do it itself (transformers' `*ScaledWordEmbedding`,
    which carries an `embed_scale` buffer)."""
    attn_softcap: bool = False
    """`config.attn_logit_softcapping`: scores become cap * tanh(scores / cap) before the softmax."""
    final_softcap: bool = False
    """`config.final_logit_softcapping`: logits become cap * tanh(logits / cap)."""
    window_by_layer_type: bool = False
    """The sliding window applies to the layers whose `config.layer_types` entry is "sliding_attention"
    (else the config's one window applies to every layer)."""
    rope_by_layer_type: bool = False
    """The rotary module takes a layer type (Gemma 3: local and global rope bases)."""
    fused_checkpoint_projections: bool = False
    """q/k/v and gate/up are single `qkv_proj` / `gate_up_proj` linears in the checkpoint (Phi-3)."""
    moe: str | None = None
    """Sparse MoE feed-forward and its routing rule: "mixtral" (top-k weights renormalized) or "qwen3_moe"
    (renormalized when `config.norm_topk_prob`)."""


FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec("Llama", ("llama",)),
    FamilySpec("Mistral", ("mistral",)),
    FamilySpec("Qwen2", ("qwen2",), window_by_layer_type=True),
    FamilySpec("Qwen3", ("qwen3",), qk_norm=True, window_by_layer_type=True),
    FamilySpec("Gemma", ("gemma",), norm_plus_one=True, embed_scale=True),
    FamilySpec("Gemma 2", ("gemma2",), norm_plus_one=True, sandwich_norms=True, embed_scale=True,
               attn_softcap=True, final_softcap=True, window_by_layer_type=True),
    FamilySpec("Gemma 3", ("gemma3_text",), norm_plus_one=True, qk_norm=True, sandwich_norms=True, embed_scale=True,
               attn_softcap=True, final_softcap=True, window_by_layer_type=True, rope_by_layer_type=True),
    FamilySpec("Phi-3 / Phi-4", ("phi3",), fused_checkpoint_projections=True),
    FamilySpec("Mixtral", ("mixtral",), moe="mixtral"),
    FamilySpec("Qwen3-MoE", ("qwen3_moe",), qk_norm=True, moe="qwen3_moe"),
)

_BY_TYPE = {t: spec for spec in FAMILIES for t in spec.model_types}

_KNOWN_UNSUPPORTED = {
    "gemma3": "the multimodal Gemma 3 wrapper: load its text model (Gemma3ForCausalLM, model_type 'gemma3_text')",
    "qwen2_moe": "Qwen2-MoE (shared experts are not implemented in the paged engine)",
    "phimoe": "Phi-3.5-MoE",
    "phi": "Phi-1/Phi-2 (LayerNorm and parallel attention)",
    "gpt2": "GPT-2 (learned positions, LayerNorm)",
}


def supported_model_types() -> tuple[str, ...]:
    """Every `config.model_type` the paged engine runs."""
    return tuple(_BY_TYPE)


def family_for(config: Any) -> FamilySpec:
    """The family of a transformers config; `UnsupportedModelError` naming the family and the fallback if none."""
    model_type = getattr(config, "model_type", None)
    spec = _BY_TYPE.get(model_type)
    fallback = ("Use the transformers model with attn_implementation='amdx' instead (`optimum_amdx.modeling.patch`; "
                "pipeline(accelerator='rocm') does this by itself).")
    if spec is None:
        what = _KNOWN_UNSUPPORTED.get(model_type, f"model type {model_type!r}")
        families = ", ".join(f"{s.name} ({'/'.join(s.model_types)})" for s in FAMILIES)
        raise UnsupportedModelError(
            f"AMDModelForCausalLM (the paged engine) does not run {what} (model type {model_type!r}); it runs "
            f"{families}. {fallback}"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(
            f"{spec.name} with use_bidirectional_attention=True is not causal; the paged engine runs causal "
            f"decoders only. {fallback}"
        )
    return spec


def _eps(norm: nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


@dataclass
class Norm:
    """An RMSNorm's effective weight (already `1 + w` for Gemma) and eps."""

    weight: torch.Tensor
    eps: float


def norm_of(spec: FamilySpec, module: nn.Module) -> Norm:
    """The effective weight of a transformers RMSNorm module under the family's convention."""
    weight = module.weight
    if spec.norm_plus_one:
        with torch.no_grad():
            weight = (1.0 + weight.detach().float()).to(weight.dtype)
    return Norm(weight, _eps(module))


@dataclass
class LayerParts:
    """One decoder layer's departures from Llama, resolved: `PagedDecoder` reads these fields."""

    input_norm: Norm
    mlp_norm: Norm
    """The norm in front of the feed-forward (post_attention_layernorm; Gemma 2/3: pre_feedforward_layernorm)."""
    post_attn_norm: Norm | None = None
    post_mlp_norm: Norm | None = None
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    scale: float = 1.0
    window: int | None = None
    softcap: float | None = None
    rope_key: str | None = None
    """Which rotary table (`DecoderParts.rope`) this layer uses."""
    qkv_modules: list[nn.Module] = field(default_factory=list)
    qkv_sizes: list[int] = field(default_factory=list)
    """Output sizes [q, k, v] (one fused checkpoint module or three)."""
    o_proj: nn.Module | None = None
    gate_up_modules: list[nn.Module] = field(default_factory=list)
    gate_up_sizes: list[int] = field(default_factory=list)
    down_proj: nn.Module | None = None
    act: Callable[[torch.Tensor], torch.Tensor] | None = None
    moe: nn.Module | None = None
    """The transformers sparse-MoE block of this layer (None: a dense gated MLP)."""


@dataclass
class DecoderParts:
    """Model-wide departures from Llama, resolved."""

    spec: FamilySpec
    final_norm: Norm
    embed_scale: torch.Tensor | None
    final_softcap: float | None
    rope: dict[str | None, tuple[torch.Tensor, torch.Tensor]]
    layers: list[LayerParts]


def _sizes(config: Any) -> tuple[int, int, int]:
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv, head_dim


def _window(spec: FamilySpec, config: Any, attn: nn.Module, index: int) -> int | None:
    if spec.window_by_layer_type:
        types = getattr(config, "layer_types", None)
        if types is None:
            window = getattr(attn, "sliding_window", None)
        else:
            window = getattr(config, "sliding_window", None) if types[index] == "sliding_attention" else None
    else:
        window = getattr(attn, "sliding_window", getattr(config, "sliding_window", None))
    return int(window) if window else None


def _layer_parts(spec: FamilySpec, config: Any, layer: nn.Module, index: int) -> LayerParts:
    attn, mlp = layer.self_attn, layer.mlp
    heads, kv, head_dim = _sizes(config)
    if spec.sandwich_norms:
        mlp_norm = norm_of(spec, layer.pre_feedforward_layernorm)
        post_attn = norm_of(spec, layer.post_attention_layernorm)
        post_mlp = norm_of(spec, layer.post_feedforward_layernorm)
    else:
        mlp_norm, post_attn, post_mlp = norm_of(spec, layer.post_attention_layernorm), None, None
    if spec.fused_checkpoint_projections:
        qkv_modules = [attn.qkv_proj]
    else:
        qkv_modules = [attn.q_proj, attn.k_proj, attn.v_proj]
    cap = getattr(config, "attn_logit_softcapping", None) if spec.attn_softcap else None
    parts = LayerParts(
        input_norm=norm_of(spec, layer.input_layernorm), mlp_norm=mlp_norm, post_attn_norm=post_attn,
        post_mlp_norm=post_mlp,
        q_norm=norm_of(spec, attn.q_norm) if spec.qk_norm else None,
        k_norm=norm_of(spec, attn.k_norm) if spec.qk_norm else None,
        scale=float(getattr(attn, "scaling", head_dim ** -0.5)),
        window=_window(spec, config, attn, index), softcap=float(cap) if cap else None,
        rope_key=config.layer_types[index] if spec.rope_by_layer_type else None,
        qkv_modules=qkv_modules, qkv_sizes=[heads * head_dim, kv * head_dim, kv * head_dim], o_proj=attn.o_proj,
    )
    if spec.moe is not None and hasattr(mlp, "experts"):
        parts.moe = mlp
        return parts
    if spec.fused_checkpoint_projections:
        parts.gate_up_modules = [mlp.gate_up_proj]
        inter = mlp.gate_up_proj.out_features // 2
        parts.gate_up_sizes = [inter, inter]
        parts.act = mlp.activation_fn
    else:
        parts.gate_up_modules = [mlp.gate_proj, mlp.up_proj]
        parts.gate_up_sizes = [mlp.gate_proj.out_features, mlp.up_proj.out_features]
        parts.act = mlp.act_fn
    parts.down_proj = mlp.down_proj
    return parts


def rotary_table(rotary_emb: nn.Module, length: int, device: torch.device,
                 layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin [length, rotary_dim / 2] from the rotary module's own forward.

    The forward applies the module's rope scaling (and its `attention_scaling`); positions 0..length-1
    in one call, so length-dependent variants (LongRoPE, dynamic NTK) see `length` as the sequence length.
    """
    positions = torch.arange(length, device=device, dtype=torch.int64)[None]
    x = torch.zeros(1, dtype=torch.float32, device=device)
    with torch.no_grad():
        cos, sin = rotary_emb(x, positions, layer_type) if layer_type is not None else rotary_emb(x, positions)
    half = cos.shape[-1] // 2
    return cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous()


def decoder_parts(hf_model: nn.Module, max_model_len: int) -> DecoderParts:
    """Resolve the family of a loaded transformers causal LM into the fields `PagedDecoder` reads."""
    config = hf_model.config
    spec = family_for(config)
    base = hf_model.model
    device = base.embed_tokens.weight.device
    dtype = base.embed_tokens.weight.dtype
    layers = [_layer_parts(spec, config, layer, i) for i, layer in enumerate(base.layers)]
    keys = sorted({p.rope_key for p in layers}, key=str)
    rope = {key: rotary_table(base.rotary_emb, max_model_len, device, key) for key in keys}
    scaled_inside = hasattr(base.embed_tokens, "embed_scale")
    embed_scale = (torch.tensor(math.sqrt(config.hidden_size), dtype=dtype, device=device)
                   if spec.embed_scale and not scaled_inside else None)
    cap = getattr(config, "final_logit_softcapping", None) if spec.final_softcap else None
    return DecoderParts(spec=spec, final_norm=norm_of(spec, base.norm), embed_scale=embed_scale,
                        final_softcap=float(cap) if cap else None, rope=rope, layers=layers)
