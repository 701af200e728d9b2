"""Our own forward over a transformers decoder's weights, reading and writing a paged KV cache.

Tokens of all sequences in a step are packed into one varlen batch ([tokens, hidden]); attention
goes through `unified_attention`, which serves prefill chunks and decode tokens in the same call.
Supported families: those of `families.FAMILIES` (Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3/4, Mixtral,
Qwen3-MoE); what each does differently from Llama is resolved there into fields this forward reads.
Where q/k/v (and gate/up) are plain `nn.Linear`, their weights are concatenated into one matrix
so a layer runs 4 matmuls instead of 7; the transformers modules are re-pointed at views of the
fused matrix, so no weight memory is duplicated and the original model keeps working. GPTQ
linears with matching group layout are fused the same way into one W4A16 weight.

Act-order GPTQ weights read their input in a permuted order (`W4A16Weight.perm`), which costs every
call a gather of the activations in a launch of its own. Where the producer of that input is ours, the
gather moves into it (`_Projection.input_perm`): q/k/v and gate/up take their input from an RMSNorm that
writes it already permuted, and a down projection's input is SiLU(gate) * up, elementwise, so the fused
gate/up weight is built with its columns in the down projection's order (`_Layer.down_sorted`) and the
down projection needs no gather at all (also for a checkpoint's own fused qkv_proj / gate_up_proj, as
Phi-3's); in steps of few tokens the attention stores its result in o_proj's sorted order (`_Layer.o_sorted`,
`out_cols` of `unified_attention`), so o_proj runs without its gather too.

The decode step is trimmed toward its memory floor (benchmarks/RESULTS.md, decode section):
rotary and the paged K/V write are one kernel, SiLU(gate) * up is one pass, decode attention splits
its keys across programs when few sequences run, and steps of few tokens use our skinny GEMM where
the GPU family's table takes the shape (`DecodeFusions` switches each of these).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import nn

from ..kernels.act_mul import silu_and_mul
from ..kernels.gather import gather_rows
from ..kernels.paged_attention import reshape_and_cache, unified_attention
from ..kernels.rmsnorm import rms_norm
from ..kernels.rope_cache import rotary_and_cache_, rotary_and_cache_accumulated
from ..kernels.rotary import rotary_embedding_
from ..kernels.runtime import tensor_family
from ..kernels.skinny_gemm import skinny_gemm, skinny_gemm_norm, skinny_max_m
from ..quantization.quant_linear import share_columns
from .cache import CacheLayout, PagedKVCache
from .families import LayerParts, decoder_parts, supported_model_types
from .moe import moe_runner

SUPPORTED_MODEL_TYPES = supported_model_types()

@dataclass
class BatchInputs:
    """One step's packed inputs. Tensors live on the model's device.

    input_ids/positions/slot_mapping: [tokens]; block_tables: int32 [seqs, max_blocks];
    seq_lens: int32 [seqs], context length including this step's tokens; query_start_loc: int32
    [seqs + 1]; logits_indices: int64 [seqs], the packed row whose logits each sequence samples from;
    first_pages: int32 [seqs] or None, set only when every sequence's blocks are one ascending run, each
    from its first block (`unified_attention` then computes block ids instead of reading the table).
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
    first_pages: torch.Tensor | None = None


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


def _fuse_quantized(linears: list[nn.Module], column_order: torch.Tensor | None = None):
    """One W4A16 weight (and bias) for GPTQ linears of the same input whose group layout matches
    (q/k/v, gate/up): their codes side by side along N, so the layer launches one matmul as an
    fp16 one does; `column_order` reorders the joined columns (see `concat_weights`). None when any
    module is not a 4-bit GPTQ linear ready for the kernel, or their K, group size or act-order
    permutation differ. The fused weight then holds the modules' codes (`QuantLinear.share_kernel_weight`): they
    drop their own copies, so a fused projection costs no second copy of its weight."""
    from ..kernels.w4a16 import concat_weights

    if not linears or not all(callable(getattr(m, "kernel_weight", None)) for m in linears):
        return None
    if len(linears) == 1 and column_order is None:
        if not (HOIST_ACT_ORDER and linears[0].kernel_weight().perm is not None):
            return None  # one linear, nothing to join, reorder or hoist: the module runs itself
    with torch.no_grad():
        fused = concat_weights([m.kernel_weight() for m in linears], column_order)
        if fused is None:
            return None
        biases = [getattr(m, "bias", None) for m in linears]
        bias = None
        if any(b is not None for b in biases):
            dtype = next(b.dtype for b in biases if b is not None)
            bias = torch.cat([b.to(dtype) if b is not None else torch.zeros(m.out_features, dtype=dtype,
                                                                             device=fused.device)
                              for b, m in zip(biases, linears)])
            if column_order is not None:
                bias = bias[column_order.to(device=bias.device, dtype=torch.long)]
    share_columns(linears, fused, column_order)
    return fused, bias


O_COLS_MAX_TOKENS = 16
"""The most tokens a step may have for its act-order o_proj to take the attention's sorted stores (`_Layer.o_cols`);
larger steps keep o_proj's own gather. H100, act-order GPTQ decode step (benchmarks/RESULTS.md round27): at 1 and 16
sequences the sorted stores were 0.6-1.1 % faster; at 64, Llama-2-7B (32 KV heads, one head a program, every value a
scattered store) was 0.5 % slower and Llama-3-8B 0.3 % faster."""


O_COLS_SKIP_FAMILIES = ("rdna3",)
"""GPU families whose act-order o_proj keeps its own gather at every step size: on gfx1100 the decode attention's
sorted stores cost registers (scratch of 20-56 bytes a lane on Triton 3.6-3.7, 5 waves a SIMD instead of 6-7; the AMD
compile tables), against a gain of under 1 % measured on an H100."""


HOIST_ACT_ORDER = True
"""Build-time switch for moving act-order gathers into their producers (see the module docstring); off,
every act-order GPTQ projection gathers its own input as before. Read when a `PagedDecoder` is built
(tests and benchmarks build one of each to compare)."""
_HALF = (torch.float16, torch.bfloat16)
"""Activation dtypes the W4A16 kernel takes: only these run a fused GPTQ weight (others call the modules)."""


class _Projection:
    """Several output projections of the same input, as one matmul when they could be fused
    (plain nn.Linear weights concatenated, or GPTQ linears through one fused W4A16 weight).

    An act-order fused GPTQ weight is kept without its permutation: its input must arrive already
    permuted by `input_perm` (`input_order` says when), which the RMSNorm producing it does in the
    same pass. `column_order` reorders the fused GPTQ weight's output columns (see `_Layer`)."""

    def __init__(self, linears: list[nn.Module], column_order: torch.Tensor | None = None) -> None:
        self.modules = linears
        self.sizes = [m.out_features for m in linears]
        fused = _fuse_linears(linears)
        self.weight, self.bias = fused if fused is not None else (None, None)
        self.qweight, self.qbias = ((None, None) if fused is not None
                                    else (_fuse_quantized(linears, column_order) or (None, None)))
        self.input_perm: torch.Tensor | None = None
        if HOIST_ACT_ORDER and self.qweight is not None and self.qweight.perm is not None:
            self.input_perm = self.qweight.perm
            self.qweight = self.qweight.presorted()

    def input_order(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The permutation an input of `dtype` must be given in (act-order GPTQ weights run fused only
        for fp16/bf16 inputs; others take the modules, which gather for themselves), or None."""
        return self.input_perm if dtype in _HALF else None

    def fused_output(self, x: torch.Tensor, linear=torch.nn.functional.linear) -> torch.Tensor | None:
        """All projections' outputs side by side from one matmul (`linear` for a plain fused matrix, the
        W4A16 kernel for a fused GPTQ weight, `x` then in `input_order`), or None when the projections
        are not fused."""
        if self.weight is not None:
            return linear(x, self.weight, self.bias)
        if self.qweight is not None and x.dtype in _HALF:
            from ..kernels.w4a16 import w4a16_matmul

            return w4a16_matmul(x, self.qweight, self.qbias)
        return None

    def __call__(self, x: torch.Tensor, linear=torch.nn.functional.linear) -> list[torch.Tensor]:
        out = self.fused_output(x, linear)
        if out is not None:
            return list(out.split(self.sizes, dim=-1))
        return [m(x) for m in self.modules]


@dataclass
class DecodeFusions:
    """Which fused paths `PagedDecoder.forward` takes. All on by default; benchmarks turn them off one
    by one to measure what each buys (benchmarks/decode_step.py).

    rope_cache: rotary of q and k and the paged K/V write in one kernel (instead of two).
    silu_mul: SiLU(gate) * up in one pass over the fused gate/up output (instead of two kernels).
    skinny_gemm: our Triton matmul for steps of few tokens, where `skinny_max_m` allows it on this GPU
        family (a per-family table: off where it does not beat the vendor BLAS).
    decode_splits: key-range splits of decode attention (flash-decoding) for one-token-per-sequence
        steps: None = the attention kernel's split rule (`_paged_attention_triton.choose_num_splits`);
        0 = no split; n = n splits.
    act_gemm: with the skinny GEMM, SiLU(gate) * up is formed inside the down projection's GEMM
        (one launch fewer per layer). Off by default until it measures faster (benchmarks/RESULTS.md).
    fused_reduce: split decode attention combines its splits in the same launch (the last split to
        finish does it) instead of a second kernel per layer. Off by default: on an H100 the batch-1 step
        took 5.88 ms with it against 5.80 without (32 fewer launches, but a slower attention); on an H200 under
        PDL, GPTQ Llama-3-8B 1.903 against 1.768 ms, and 1.810 against 1.750 with every split read in one trip
        (benchmarks/RESULTS.md round31).
    norm_gemm: with the skinny GEMM, the residual add + RMSNorm before q/k/v and before gate/up run
        inside those GEMMs (`skinny_gemm_norm`). Off by default: on an H200 every GEMM program
        re-reading the rows for the norm cost more than the launches it saved (benchmarks/RESULTS.md).
    accumulate: a GPTQ projection of up to `w4a16.ACCUMULATE_MAX_ROWS` rows that an accumulating W4A16
        route serves leaves its float32 sums in an accumulator (`w4a16.w4a16_accumulate`), which the kernel
        after it reads and zeroes (the rotary + cache write after q/k/v, the norm after o_proj and down,
        SiLU * up after gate/up): the matmul ends without its split-K flush (on an H100 1.1-3.3 us a call;
        benchmarks/RESULTS.md round 13). Not for q/k/v with a q/k norm (Qwen3) or without `rope_cache`.
    paired: where such a projection takes one fp16 row on the W4A16 one-row kernel (`w4a16.takes_pairs`), the
        kernel before it (the RMSNorm before q/k/v and gate/up, SiLU * up before down) writes its input in the
        kernel's pair order, so the matmul loads its activation pairs as plain words (on an H100 0.1-0.8 us
        less per call; benchmarks/RESULTS.md round 19).
    """

    rope_cache: bool = True
    silu_mul: bool = True
    skinny_gemm: bool = True
    decode_splits: int | None = None
    act_gemm: bool = False
    norm_gemm: bool = False
    fused_reduce: bool = False
    accumulate: bool = True
    paired: bool = True


class _Accumulated(NamedTuple):
    """A projection's result still in its float32 W4A16 accumulator (`PagedDecoder._accumulate`): only its
    reader right after may take it, once (the rotary + cache write, `PagedDecoder._add_norm` or SiLU * up,
    which zero it for the next matmul)."""

    acc: torch.Tensor


def _plain_embedding(embed: nn.Module) -> bool:
    """Whether an embedding's forward is nothing but a row lookup of its weight (an `nn.Embedding` itself, no
    max_norm, no hooks): scaled embeddings (Gemma 3) and hooked or offloaded modules keep their own forward."""
    return (type(embed) is nn.Embedding and embed.max_norm is None and not embed._forward_hooks
            and not embed._forward_pre_hooks and not hasattr(embed, "_hf_hook"))


def _is_silu(act: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


class _CheckpointFused(_Projection):
    """One linear that the checkpoint already fused (Phi-3 `qkv_proj` / `gate_up_proj`), split by `sizes`."""

    def __init__(self, module: nn.Module, sizes: list[int], column_order: torch.Tensor | None = None) -> None:
        super().__init__([module], column_order)
        self.sizes = sizes

    def fused_output(self, x: torch.Tensor, linear=torch.nn.functional.linear) -> torch.Tensor:
        out = super().fused_output(x, linear)
        return self.modules[0](x) if out is None else out

    def __call__(self, x: torch.Tensor, linear=torch.nn.functional.linear) -> list[torch.Tensor]:
        return list(self.fused_output(x, linear).split(self.sizes, dim=-1))


def _projection(modules: list[nn.Module], sizes: list[int], column_order: torch.Tensor | None = None) -> _Projection:
    if len(modules) == 1 and len(sizes) > 1:
        return _CheckpointFused(modules[0], sizes, column_order)
    return _Projection(modules, column_order)


class _NoProjection:
    """Stands in for gate/up on a sparse-MoE layer (no dense MLP): nothing to fuse."""

    weight = bias = None
    sizes: list[int] = []

    def input_order(self, dtype: torch.dtype) -> None:
        return None


def _act_order_weight(module: nn.Module | None):
    """The kernel weight of a 4-bit act-order GPTQ linear (`W4A16Weight` with a permutation), else None."""
    if module is None or not callable(getattr(module, "kernel_weight", None)):
        return None
    w = module.kernel_weight()
    return w if w.kernel_ready and w.perm is not None else None


class _Layer:
    """Handles on one decoder layer's weights, with its family's departures from Llama (`families.LayerParts`)."""

    def __init__(self, parts: LayerParts, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.parts = parts
        self.qkv = _projection(parts.qkv_modules, parts.qkv_sizes)
        self.o_proj = parts.o_proj
        self.moe = moe_runner(parts.moe) if parts.moe is not None else None
        self.down_proj = parts.down_proj
        # An act-order down projection reads its input through its permutation; SiLU(gate) * up is
        # elementwise, so a fused GPTQ gate/up weight built with its columns in that order hands it
        # the input already sorted, and the down projection runs without its gather (`down_sorted`).
        down_w = _act_order_weight(parts.down_proj) if self.moe is None and HOIST_ACT_ORDER else None
        inter = down_w.in_features if down_w is not None else None
        order = None
        if down_w is not None and parts.gate_up_sizes == [inter, inter]:  # gate/up, or Phi-3's gate_up_proj
            perm = down_w.perm.long()
            order = torch.cat([perm, perm + inter])
        self.gate_up = (_projection(parts.gate_up_modules, parts.gate_up_sizes, order) if self.moe is None
                        else _NoProjection())
        self.down_sorted = None
        """The down projection's weight without its permutation, when the fused gate/up weight emits
        its columns in that order (then used for every fp16/bf16 input, see `PagedDecoder._apply_down`)."""
        if order is not None and self.gate_up.qweight is not None:
            self.down_sorted = down_w.presorted()
        # An act-order o_proj reads its input through its permutation; the attention that produces the input
        # stores each column at its sorted position instead (`o_cols`), and o_proj runs presorted (`o_sorted`).
        o_w = _act_order_weight(parts.o_proj) if HOIST_ACT_ORDER else None
        if o_w is not None and tensor_family(o_w.qweight) in O_COLS_SKIP_FAMILIES:
            o_w = None
        self.o_sorted = o_w.presorted() if o_w is not None else None
        self.o_cols: torch.Tensor | None = None
        """int32: where the attention stores each column of a token's row for `o_sorted` (the inverse of its
        permutation), for fp16/bf16 steps of up to `O_COLS_MAX_TOKENS` tokens (see `PagedDecoder._o_proj_sorted`);
        larger steps run the module, which gathers its input."""
        if o_w is not None:
            self.o_cols = torch.argsort(o_w.perm).to(torch.int32)  # o_cols[perm[k]] = k
        self.act: Callable[[torch.Tensor], torch.Tensor] | None = parts.act
        self.act_is_silu = parts.act is not None and _is_silu(parts.act)
        self.ln1_w, self.ln1_eps = parts.input_norm.weight, parts.input_norm.eps
        self.ln2_w, self.ln2_eps = parts.mlp_norm.weight, parts.mlp_norm.eps
        self.cos, self.sin = cos, sin


class PagedDecoder:
    """Runs a transformers causal LM of a supported family over packed tokens and a paged KV cache."""

    def __init__(self, hf_model: nn.Module, max_model_len: int) -> None:
        config = hf_model.config
        parts = decoder_parts(hf_model, max_model_len)  # raises UnsupportedModelError for other families
        self.family = parts.spec
        self.hf_model = hf_model
        self.config = config
        base = hf_model.model
        self.embed = base.embed_tokens
        self.embed_scale = parts.embed_scale
        self.final_softcap = parts.final_softcap
        self.layers = [_Layer(p, *parts.rope[p.rope_key]) for p in parts.layers]
        self.norm_w, self.norm_eps = parts.final_norm.weight, parts.final_norm.eps
        self.lm_head = hf_model.lm_head
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.max_model_len = max_model_len
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.cos, self.sin = self.layers[0].cos, self.layers[0].sin
        self.fusions = DecodeFusions()

    def cache_layout(self, block_size: int, dtype: torch.dtype | None = None) -> CacheLayout:
        """The paged-pool layout this model needs."""
        return CacheLayout(num_layers=len(self.layers), num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           block_size=block_size, dtype=dtype or self.dtype)

    def decode_splits(self, max_query_len: int) -> int | None:
        """Key-range splits of decode attention for a step whose longest query has `max_query_len`
        tokens: the `DecodeFusions.decode_splits` switch for one-token-per-sequence steps (0 = no split);
        None (the default, and for every other step) leaves it to the attention kernel's split rule."""
        choice = self.fusions.decode_splits
        if max_query_len != 1 or choice is None:
            return None
        return max(1, choice)

    def _linear_fn(self, tokens: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]:
        """The matmul for a step of `tokens` rows: our skinny GEMM where this GPU family takes it, else F.linear."""
        if self.fusions.skinny_gemm and tokens <= skinny_max_m(self.embed.weight):
            return skinny_gemm
        return torch.nn.functional.linear

    @staticmethod
    def _dense(proj: _Projection) -> bool:
        """Whether the projection is one fused plain floating-point matrix (the fused-norm GEMM needs one)."""
        return isinstance(proj.weight, torch.Tensor) and proj.weight.is_floating_point()

    def _project(self, proj: _Projection, x: torch.Tensor, linear) -> list[torch.Tensor]:
        return proj(x, linear if self._dense(proj) else torch.nn.functional.linear)

    @staticmethod
    def _apply(module: nn.Module, x: torch.Tensor, linear) -> torch.Tensor:
        if type(module) is nn.Linear:
            return linear(x, module.weight, module.bias)
        return module(x)

    @staticmethod
    def _into_residual(module: nn.Module, a: torch.Tensor, residual: torch.Tensor | None, linear) -> bool:
        """`residual += a @ W^T` inside the BLAS GEMM (beta = 1), for a plain bias-free nn.Linear on the BLAS
        path; True if done. The RMSNorm after it then reads and writes one tensor instead of two each (with
        the residual add in the norm, a 512-token Llama prompt's norm moved 16 MB per call;
        benchmarks/RESULTS.md round 12). Steps that take the skinny GEMM (small decode batches on a GPU) keep
        the norm's add."""
        if (residual is None or linear is not torch.nn.functional.linear or type(module) is not nn.Linear
                or module.bias is not None or module.weight.dtype != a.dtype or residual.dtype != a.dtype):
            return False
        residual.addmm_(a, module.weight.t())
        return True

    def _accumulate(self, x: torch.Tensor, w, bias: torch.Tensor | None, paired: bool = False) -> _Accumulated | None:
        """``x @ W`` left in the shared float32 accumulator of W's N (`DecodeFusions.accumulate`), when the
        fusion is on, there is no bias and an accumulating W4A16 route takes `x`; else None. Its reader must be
        the next kernel to touch that accumulator (`w4a16.accumulator`): see `_Accumulated`. `paired`: x is in the
        W4A16 pair order (its producer was told so by `_pairs`, which promises this call runs)."""
        if not self.fusions.accumulate or w is None or bias is not None:
            route = None
        else:
            from ..kernels.w4a16 import accumulating_route

            route = accumulating_route(x, w)
        if route is None:
            if paired:
                raise RuntimeError("an input was written in the W4A16 pair order for a matmul that does not read it")
            return None
        from ..kernels.w4a16 import accumulator, w4a16_accumulate

        acc = accumulator(x.device, w.out_features, x.shape[0])
        return _Accumulated(w4a16_accumulate(x, w, acc, route, paired=paired))

    @staticmethod
    def _kernel_weight(module: nn.Module | None):
        """The ready W4A16 weight of a 4-bit GPTQ linear module (`kernel_weight`), else None."""
        if module is None or not callable(getattr(module, "kernel_weight", None)):
            return None
        w = module.kernel_weight()
        return w if w.kernel_ready else None

    def _accumulate_module(self, module: nn.Module, x: torch.Tensor, paired: bool = False) -> _Accumulated | None:
        """`_accumulate` for a 4-bit GPTQ linear module (`kernel_weight`), else None."""
        w = self._kernel_weight(module)
        return self._accumulate(x, w, module.bias if w is not None else None, paired)

    def _pairs(self, w, bias: torch.Tensor | None, rows: int, dtype: torch.dtype) -> bool:
        """Whether an input of `rows` rows of `dtype` for weight `w` is written in the W4A16 pair order
        (`DecodeFusions.paired`): only where `_accumulate` then runs it on the one-row kernel that reads it so."""
        if not (self.fusions.paired and self.fusions.accumulate) or w is None or bias is not None:
            return False
        from ..kernels.w4a16 import takes_pairs

        return takes_pairs(rows, dtype, w)

    def _qkv_pairs(self, layer: _Layer, rows: int, dtype: torch.dtype) -> bool:
        """`_pairs` for the q/k/v input (accumulated only when the rotary + cache kernel reads it, `_queries`)."""
        return (self.fusions.rope_cache and layer.parts.q_norm is None
                and self._pairs(layer.qkv.qweight, layer.qkv.qbias, rows, dtype))

    def _gate_up_pairs(self, layer: _Layer, rows: int, dtype: torch.dtype) -> bool:
        """`_pairs` for the gate/up input (accumulated only on the fused SiLU * up path of `_mlp`)."""
        act_gemm = self.fusions.act_gemm and type(layer.down_proj) is nn.Linear  # skips the accumulated gate/up
        return (layer.moe is None and self.fusions.silu_mul and layer.act_is_silu and not act_gemm
                and self._pairs(layer.gate_up.qweight, layer.gate_up.qbias, rows, dtype))

    def _down_pairs(self, layer: _Layer, rows: int, dtype: torch.dtype) -> bool:
        """`_pairs` for the down projection's input, the weight `_apply_down` accumulates with."""
        if layer.down_sorted is not None:
            return self._pairs(layer.down_sorted, getattr(layer.down_proj, "bias", None), rows, dtype)
        w = self._kernel_weight(layer.down_proj)
        return w is not None and self._pairs(w, layer.down_proj.bias, rows, dtype)

    @staticmethod
    def _add_norm(h: torch.Tensor | _Accumulated | None, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                  perm: torch.Tensor | None = None, paired: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm of h + residual, h + residual); h None: the last projection was already added into
        `residual` (`_into_residual`), so only the norm runs; an `_Accumulated` h is read (and zeroed) there.
        `paired`: the norm's output in the W4A16 pair order (`_pairs`)."""
        if h is None:
            return rms_norm(residual, weight, eps, perm=perm, paired=paired), residual
        if isinstance(h, _Accumulated):
            return rms_norm(h.acc, weight, eps, residual=residual, perm=perm, accumulated=True, paired=paired)
        return rms_norm(h, weight, eps, residual=residual, perm=perm, paired=paired)

    def _mlp(self, layer: _Layer, x: torch.Tensor, linear, residual: torch.Tensor | None = None,
             paired: bool = False) -> torch.Tensor | _Accumulated | None:
        """The MLP of `x`; None when its down projection was added into `residual` (`_into_residual`); an
        `_Accumulated` down projection (only when `residual` is given: its reader is the next norm). `paired`: x
        is in the W4A16 pair order (`_gate_up_pairs`)."""
        if layer.moe is not None:
            return layer.moe(x)
        proj = layer.gate_up
        if self.fusions.silu_mul and layer.act_is_silu:  # one pass of SiLU(gate) * up over the fused output
            act_gemm = self.fusions.act_gemm and linear is skinny_gemm and type(layer.down_proj) is nn.Linear
            gate_up = None if act_gemm else self._accumulate(x, proj.qweight, proj.qbias, paired)
            if gate_up is not None:
                pairs = residual is not None and self._down_pairs(layer, x.shape[0], x.dtype)
                a = silu_and_mul(gate_up.acc, accumulated_dtype=x.dtype, paired=pairs)
                return self._apply_down(layer, a, linear, residual, pairs)
            fused = proj.fused_output(x, linear)
            if fused is not None:
                return self._down(layer, fused, linear, residual)
        gate, up = self._project(proj, x, linear)
        return self._apply_down(layer, layer.act(gate) * up, linear, residual)

    def _down(self, layer: _Layer, gate_up: torch.Tensor, linear,
              residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """down(silu(gate) * up) from the fused gate/up output (None: added into `residual`)."""
        down = layer.down_proj
        if self.fusions.act_gemm and linear is skinny_gemm and type(down) is nn.Linear:  # SiLU * up in the GEMM
            return skinny_gemm(gate_up, down.weight, down.bias, act_mul=True)
        return self._apply_down(layer, silu_and_mul(gate_up), linear, residual)

    def _apply_down(self, layer: _Layer, a: torch.Tensor, linear, residual: torch.Tensor | None = None,
                    paired: bool = False) -> torch.Tensor | _Accumulated | None:
        """The down projection of `a` = act(gate) * up. An fp16/bf16 `a` came from the fused gate/up
        weight (the only path for those dtypes when `down_sorted` exists), so it is already in the act-order
        down projection's sorted order and takes `down_sorted`; any other input takes the module, added
        into `residual` when given and `_into_residual` can (then None). With `residual` given the next
        kernel is the norm that adds it, so a GPTQ down projection may stay `_Accumulated`. `paired`: `a` is in the
        W4A16 pair order (`_down_pairs`), so it must be."""
        if layer.down_sorted is not None and a.dtype in _HALF:
            from ..kernels.w4a16 import w4a16_matmul

            bias = getattr(layer.down_proj, "bias", None)
            acc = self._accumulate(a, layer.down_sorted, bias, paired) if residual is not None else None
            return acc if acc is not None else w4a16_matmul(a, layer.down_sorted, bias)
        if self._into_residual(layer.down_proj, a, residual, linear):
            return None
        acc = self._accumulate_module(layer.down_proj, a, paired) if residual is not None else None
        return acc if acc is not None else self._apply(layer.down_proj, a, linear)

    def _o_proj_sorted(self, layer: _Layer, attn: torch.Tensor, accumulate: bool) -> torch.Tensor | _Accumulated:
        """An act-order o_proj of the attention's result stored in its sorted order (`_Layer.o_cols`): the presorted
        weight, left `_Accumulated` when `accumulate` (the next kernel is the norm that reads it) and a route takes
        it."""
        from ..kernels.w4a16 import w4a16_matmul

        bias = getattr(layer.o_proj, "bias", None)
        acc = self._accumulate(attn, layer.o_sorted, bias) if accumulate else None
        return acc if acc is not None else w4a16_matmul(attn, layer.o_sorted, bias)

    def _queries(self, layer: _Layer, i: int, x: torch.Tensor | None, linear, batch: BatchInputs, cache: PagedKVCache,
                 qkv: torch.Tensor | None = None, paired: bool = False) -> torch.Tensor:
        """Layer `i`'s rotated queries ``[tokens, heads, head_dim]``, with its rotated keys and values written into
        the cache: from the normed input `x` through the q/k/v projection (left in an accumulator that the rotary
        kernel reads, `_accumulate`, where one serves), or from `qkv` already projected (x None). `paired`: x is in
        the W4A16 pair order (`_qkv_pairs`)."""
        if x is not None and self.fusions.rope_cache and layer.parts.q_norm is None:
            acc = self._accumulate(x, layer.qkv.qweight, layer.qkv.qbias, paired)
            if acc is not None:
                return rotary_and_cache_accumulated(acc.acc, self.num_heads, self.num_kv_heads, layer.cos, layer.sin,
                                                    batch.positions, cache.k[i], cache.v[i], batch.slot_mapping,
                                                    x.dtype)
        q, k, v = self._project(layer.qkv, x, linear) if x is not None else qkv.split(layer.qkv.sizes, dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if layer.parts.q_norm is not None:
            q = rms_norm(q, layer.parts.q_norm.weight, layer.parts.q_norm.eps)
            k = rms_norm(k, layer.parts.k_norm.weight, layer.parts.k_norm.eps)
        if self.fusions.rope_cache:
            rotary_and_cache_(q, k, v, layer.cos, layer.sin, batch.positions, cache.k[i], cache.v[i],
                              batch.slot_mapping)
        else:
            rotary_embedding_(q, k, layer.cos, layer.sin, batch.positions)
            reshape_and_cache(k, v, cache.k[i], cache.v[i], batch.slot_mapping)
        return q

    @torch.inference_mode()
    def forward(self, batch: BatchInputs, cache: PagedKVCache) -> torch.Tensor:
        """Logits [seqs, vocab] for the rows named by `batch.logits_indices`; writes K/V into the cache."""
        # a plain nn.Embedding is a row gather (`gather_rows`: torch's index_select took 13.5 us for 16 tokens);
        # asked each call, so a hook added after the decoder was built still runs
        ids = batch.input_ids
        h = gather_rows(self.embed.weight, ids) if _plain_embedding(self.embed) else self.embed(ids)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        tokens = h.shape[0]
        linear = self._linear_fn(tokens)
        splits = self.decode_splits(batch.max_query_len)
        residual = None
        q_size = self.num_heads * self.head_dim
        fuse_norm = self.fusions.norm_gemm and linear is skinny_gemm
        rows = batch.logits_indices
        # After the last layer's attention only the sampled rows matter (every row's K/V is in the cache by
        # then): a prompt step runs that layer's o_proj, norms and MLP on those rows alone.
        trim_at = len(self.layers) - 1 if rows.shape[0] < tokens else -1
        act_dtype = h.dtype
        # From here h is None whenever the last projection was already added into residual (`_into_residual`)
        for i, layer in enumerate(self.layers):
            qkv_order = layer.qkv.input_order(act_dtype)  # act-order GPTQ q/k/v: the norm gathers their input
            qkv_pairs = self._qkv_pairs(layer, tokens, act_dtype)
            if residual is None:
                residual = h
                x = rms_norm(h, layer.ln1_w, layer.ln1_eps, perm=qkv_order, paired=qkv_pairs)
                q = self._queries(layer, i, x, linear, batch, cache, paired=qkv_pairs)
            elif isinstance(h, torch.Tensor) and fuse_norm and self._dense(layer.qkv):
                qkv, residual = skinny_gemm_norm(h, residual, layer.ln1_w, layer.ln1_eps, layer.qkv.weight,
                                                 layer.qkv.bias)
                q = self._queries(layer, i, None, linear, batch, cache, qkv)
            else:
                x, residual = self._add_norm(h, residual, layer.ln1_w, layer.ln1_eps, qkv_order, qkv_pairs)
                q = self._queries(layer, i, x, linear, batch, cache, paired=qkv_pairs)
            # stored in o_proj's sorted order (small steps, `O_COLS_MAX_TOKENS`)
            o_sorted = layer.o_sorted is not None and q.dtype in _HALF and tokens <= O_COLS_MAX_TOKENS
            attn = unified_attention(q, cache.k[i], cache.v[i], batch.block_tables, batch.seq_lens,
                                     batch.query_start_loc, batch.max_query_len, batch.max_seq_len,
                                     softmax_scale=layer.parts.scale, sliding_window=layer.parts.window,
                                     num_splits=splits, softcap=layer.parts.softcap,
                                     fused_reduce=self.fusions.fused_reduce, first_pages=batch.first_pages,
                                     out_cols=layer.o_cols if o_sorted else None)
            attn = attn.reshape(tokens, q_size)
            if i == trim_at:
                attn, residual = gather_rows(attn, rows), gather_rows(residual, rows)
                linear = self._linear_fn(rows.shape[0])
                fuse_norm = self.fusions.norm_gemm and linear is skinny_gemm
            post_attn, post_mlp = layer.parts.post_attn_norm, layer.parts.post_mlp_norm
            if o_sorted:
                h = self._o_proj_sorted(layer, attn, post_attn is None)
                if post_attn is not None:
                    h = rms_norm(h, post_attn.weight, post_attn.eps)
            elif post_attn is None and self._into_residual(layer.o_proj, attn, residual, linear):
                h = None
            elif post_attn is None and (acc := self._accumulate_module(layer.o_proj, attn)) is not None:
                h = acc  # read by the norm just below
            else:
                h = self._apply(layer.o_proj, attn, linear)
                if post_attn is not None:
                    h = rms_norm(h, post_attn.weight, post_attn.eps)
            gu = layer.gate_up
            if isinstance(h, torch.Tensor) and fuse_norm and self.fusions.silu_mul and layer.act_is_silu and self._dense(gu):
                gate_up, residual = skinny_gemm_norm(h, residual, layer.ln2_w, layer.ln2_eps, gu.weight, gu.bias)
                h = self._down(layer, gate_up, linear)
            else:
                mlp_pairs = self._gate_up_pairs(layer, residual.shape[0], act_dtype)
                x, residual = self._add_norm(h, residual, layer.ln2_w, layer.ln2_eps, gu.input_order(act_dtype),
                                             mlp_pairs)
                h = self._mlp(layer, x, linear, residual if post_mlp is None else None, mlp_pairs)
            if post_mlp is not None:
                h = rms_norm(h, post_mlp.weight, post_mlp.eps)
        # Untrimmed (at least as many sampled rows as tokens: a decode step, or a graph's padded slots), the norm
        # runs on every token, then the sampled rows are picked (an accumulator is read whole, and zeroed, by it)
        x, _ = self._add_norm(h, residual, self.norm_w, self.norm_eps)
        if trim_at < 0:
            x = gather_rows(x, rows)
        logits = self._apply(self.lm_head, x, self._linear_fn(x.shape[0]))
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
