"""Our own forward over a transformers decoder's weights, reading and writing a paged KV cache.

Tokens of all sequences in a step are packed into one varlen batch ([tokens, hidden]); attention
goes through `unified_attention`, which serves prefill chunks and decode tokens in the same call.
Supported families: Llama, Mistral and Qwen2 (grouped-query attention; Qwen2 has q/k/v biases).
Where q/k/v (and gate/up) are plain `nn.Linear`, their weights are concatenated into one matrix
so a layer runs 4 matmuls instead of 7; the transformers modules are re-pointed at views of the
fused matrix, so no weight memory is duplicated and the original model keeps working. GPTQ
linears with matching group layout are fused the same way into one W4A16 weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..kernels.paged_attention import reshape_and_cache, unified_attention
from ..kernels.rmsnorm import rms_norm
from ..kernels.rotary import rotary_embedding_
from .cache import CacheLayout, PagedKVCache

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass
class BatchInputs:
    """One step's packed inputs. Tensors live on the model's device.

    input_ids/positions/slot_mapping: [tokens]; block_tables: int32 [seqs, max_blocks];
    seq_lens: int32 [seqs], context length including this step's tokens; query_start_loc: int32
    [seqs + 1]; logits_indices: int64 [seqs], the packed row whose logits each sequence samples from.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    logits_indices: torch.Tensor
    max_query_len: int
    max_seq_len: int


def _fuse_linears(linears: list[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Concatenate plain nn.Linear weights (and biases) into one matrix; re-point each module at a view.

    Returns None when any module is not a plain nn.Linear (e.g. a quantized linear), in which case
    the modules are called one by one.
    """
    if not all(type(m) is nn.Linear for m in linears):
        return None
    with torch.no_grad():
        weight = torch.cat([m.weight.detach() for m in linears], dim=0)
        has_bias = [m.bias is not None for m in linears]
        bias = torch.cat([m.bias.detach() for m in linears], dim=0) if all(has_bias) else None
        if any(has_bias) and bias is None:
            return None
        start = 0
        for m in linears:
            n = m.weight.shape[0]
            m.weight = nn.Parameter(weight[start:start + n], requires_grad=False)
            if bias is not None:
                m.bias = nn.Parameter(bias[start:start + n], requires_grad=False)
            start += n
    return weight, bias


def _fuse_quantized(linears: list[nn.Module]):
    """One W4A16 weight (and bias) for GPTQ linears of the same input whose group layout matches
    (q/k/v, gate/up): their codes side by side along N, so the layer launches one matmul as an
    fp16 one does. None when any module is not a 4-bit GPTQ linear ready for the kernel, or their
    K, group size or act-order permutation differ. The modules' own repacked copies are dropped
    (they rebuild on demand), so the fused weight costs no extra memory at steady state."""
    from ..kernels.w4a16 import concat_weights

    if len(linears) < 2 or not all(callable(getattr(m, "kernel_weight", None)) for m in linears):
        return None
    with torch.no_grad():
        fused = concat_weights([m.kernel_weight() for m in linears])
        if fused is None:
            return None
        biases = [getattr(m, "bias", None) for m in linears]
        bias = None
        if any(b is not None for b in biases):
            dtype = next(b.dtype for b in biases if b is not None)
            bias = torch.cat([b.to(dtype) if b is not None else torch.zeros(m.out_features, dtype=dtype,
                                                                             device=fused.device)
                              for b, m in zip(biases, linears)])
    for m in linears:
        m.invalidate()
    return fused, bias


class _Projection:
    """Several output projections of the same input, as one matmul when they could be fused
    (plain nn.Linear weights concatenated, or GPTQ linears through one fused W4A16 weight)."""

    def __init__(self, linears: list[nn.Module]) -> None:
        self.modules = linears
        self.sizes = [m.out_features for m in linears]
        fused = _fuse_linears(linears)
        self.weight, self.bias = fused if fused is not None else (None, None)
        self.qweight, self.qbias = (None, None) if fused is not None else (_fuse_quantized(linears) or (None, None))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.weight is not None:
            return list(torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, dim=-1))
        if self.qweight is not None and x.dtype in (torch.float16, torch.bfloat16):
            from ..kernels.w4a16 import w4a16_matmul

            return list(w4a16_matmul(x, self.qweight, self.qbias).split(self.sizes, dim=-1))
        return [m(x) for m in self.modules]


class _Layer:
    """Handles on one decoder layer's weights."""

    def __init__(self, layer: nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _Projection([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj = attn.o_proj
        self.gate_up = _Projection([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.act: Callable[[torch.Tensor], torch.Tensor] = mlp.act_fn
        self.ln1_w = layer.input_layernorm.weight
        self.ln1_eps = float(getattr(layer.input_layernorm, "variance_epsilon", getattr(layer.input_layernorm, "eps", 1e-6)))
        self.ln2_w = layer.post_attention_layernorm.weight
        self.ln2_eps = float(getattr(layer.post_attention_layernorm, "variance_epsilon",
                                     getattr(layer.post_attention_layernorm, "eps", 1e-6)))


class PagedDecoder:
    """Runs a transformers Llama/Mistral/Qwen2 causal LM over packed tokens and a paged KV cache."""

    def __init__(self, hf_model: nn.Module, max_model_len: int) -> None:
        config = hf_model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"AMDModelForCausalLM supports model types {', '.join(SUPPORTED_MODEL_TYPES)}; got "
                f"{config.model_type!r}. Use the transformers model with attn_implementation='amdx' instead."
            )
        self.hf_model = hf_model
        self.config = config
        base = hf_model.model
        self.embed = base.embed_tokens
        self.layers = [_Layer(layer) for layer in base.layers]
        self.norm_w = base.norm.weight
        self.norm_eps = float(getattr(base.norm, "variance_epsilon", getattr(base.norm, "eps", 1e-6)))
        self.lm_head = hf_model.lm_head
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = float(base.layers[0].self_attn.scaling)
        self.sliding_window = self._sliding_window(config)
        self.max_model_len = max_model_len
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.cos, self.sin = self._rotary_tables(base.rotary_emb, max_model_len)

    @staticmethod
    def _sliding_window(config) -> int | None:
        window = getattr(config, "sliding_window", None)
        if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
            return None
        return int(window) if window else None

    def _rotary_tables(self, rotary_emb: nn.Module, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos/sin tables [length, rotary_dim / 2] from the model's own inv_freq (honours rope scaling)."""
        inv_freq = rotary_emb.inv_freq.to(device=self.device, dtype=torch.float32)
        scaling = float(getattr(rotary_emb, "attention_scaling", 1.0))
        positions = torch.arange(length, device=self.device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        cos = (freqs.cos() * scaling).contiguous()
        sin = (freqs.sin() * scaling).contiguous()
        return cos, sin

    def cache_layout(self, block_size: int, dtype: torch.dtype | None = None) -> CacheLayout:
        """The paged-pool layout this model needs."""
        return CacheLayout(num_layers=len(self.layers), num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           block_size=block_size, dtype=dtype or self.dtype)

    @torch.inference_mode()
    def forward(self, batch: BatchInputs, cache: PagedKVCache) -> torch.Tensor:
        """Logits [seqs, vocab] for the rows named by `batch.logits_indices`; writes K/V into the cache."""
        h = self.embed(batch.input_ids)
        tokens = h.shape[0]
        residual = None
        q_size = self.num_heads * self.head_dim
        for i, layer in enumerate(self.layers):
            if residual is None:
                residual = h
                x = rms_norm(h, layer.ln1_w, layer.ln1_eps)
            else:
                x, residual = rms_norm(h, layer.ln1_w, layer.ln1_eps, residual=residual)
            q, k, v = layer.qkv(x)
            q = q.reshape(tokens, self.num_heads, self.head_dim)
            k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
            v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
            rotary_embedding_(q, k, self.cos, self.sin, batch.positions)
            reshape_and_cache(k, v, cache.k[i], cache.v[i], batch.slot_mapping)
            attn = unified_attention(q, cache.k[i], cache.v[i], batch.block_tables, batch.seq_lens,
                                     batch.query_start_loc, batch.max_query_len, batch.max_seq_len,
                                     softmax_scale=self.scale, sliding_window=self.sliding_window)
            h = layer.o_proj(attn.reshape(tokens, q_size))
            x, residual = rms_norm(h, layer.ln2_w, layer.ln2_eps, residual=residual)
            gate, up = layer.gate_up(x)
            h = layer.down_proj(layer.act(gate) * up)
        rows = batch.logits_indices
        x, _ = rms_norm(h.index_select(0, rows), self.norm_w, self.norm_eps, residual=residual.index_select(0, rows))
        return self.lm_head(x)
