"""Act-order GPTQ in the paged engine: the activation gathers move into the ops that produce the inputs.

q/k/v and gate/up get their input from an RMSNorm that writes it permuted, and the down projection from a
gate/up weight whose columns were put in its order at build time (`paged_model.HOIST_ACT_ORDER`). The
engine built that way must give the tokens of the engine built without it and of transformers.
"""

from __future__ import annotations

import copy

import pytest
import torch

from optimum_amdx.modeling import AMDModelForCausalLM
from optimum_amdx.modeling import paged_model
from optimum_amdx.quantization import QuantLinear

from ..kernels.test_w4a16 import quantize_with_g_idx
from .conftest import hf_greedy, random_prompts, tiny_model
from .test_families import family_model

GROUP = 16


def _act_order_g_idx(k: int, seed: int, group: int = GROUP) -> torch.Tensor:
    """A GPTQ act-order group index: groups of `group` rows taken in a random order of the rows."""
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // group).to(torch.int32)
    return g_idx


def _inputs(model_type: str, layer) -> tuple:
    """(module, names of its linears that read one input) of a decoder layer."""
    attn, mlp = layer.self_attn, layer.mlp
    if model_type == "phi3":  # the checkpoint fuses q/k/v and gate/up itself
        return (attn, ("qkv_proj",)), (attn, ("o_proj",)), (mlp, ("gate_up_proj",)), (mlp, ("down_proj",))
    return ((attn, ("q_proj", "k_proj", "v_proj")), (attn, ("o_proj",)), (mlp, ("gate_proj", "up_proj")),
            (mlp, ("down_proj",)))


def act_order_model(model_type: str = "llama", seed: int = 3, sym: bool = False, bias: bool = False,
                    group: int = GROUP, **sizes):
    """A tiny fp32 model whose linears are 4-bit act-order QuantLinears with random codes (and the model's
    biases, with `bias`); the linears of one input (q/k/v, gate/up) share its permutation, as GPTQ gives
    them. `sizes`: Llama config overrides (hidden_size, ...)."""
    if model_type == "llama":
        biases = {"attention_bias": True, "mlp_bias": True} if bias else {}
        model = copy.deepcopy(tiny_model("llama", seed=seed, **biases, **sizes))
    else:
        model = copy.deepcopy(family_model(model_type))
    for i, layer in enumerate(model.model.layers):
        for j, (parent, members) in enumerate(_inputs(model_type, layer)):
            k = getattr(parent, members[0]).in_features
            g_idx = _act_order_g_idx(k, seed=100 * i + j, group=group)
            for t, name in enumerate(members):
                n = getattr(parent, name).out_features
                qweight, qzeros, scales, g, _ = quantize_with_g_idx(k, n, group, sym, g_idx, seed=1000 * i + 10 * j + t)
                # larger scales than the helper's so the tiny model's logits are not near-ties
                tensors = {"qweight": qweight, "qzeros": qzeros, "scales": (scales.float() * 8).half(), "g_idx": g}
                old = getattr(parent, name)
                b = old.bias.detach().clone() if old.bias is not None else None
                setattr(parent, name, QuantLinear.from_packed(tensors, k, n, 4, group, "gptq", bias=b))
    return model


def _act_order_linear(k: int, n: int, g_idx: torch.Tensor, sym: bool, seed: int, bias=None) -> QuantLinear:
    """A 4-bit act-order QuantLinear with random codes read through `g_idx`."""
    qweight, qzeros, scales, g, _ = quantize_with_g_idx(k, n, GROUP, sym, g_idx, seed=seed)
    # larger scales than the helper's so the tiny models' logits are not near-ties
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": (scales.float() * 8).half(), "g_idx": g}
    return QuantLinear.from_packed(tensors, k, n, 4, GROUP, "gptq", bias=bias)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_act_order_experts_with_orders_of_their_own_still_run_stacked(name, monkeypatch):
    """GPTQ gives every expert its own act-order permutation (its Hessian comes from the tokens routed to it),
    so the experts cannot share one gate/up weight: they run as one gather and a matmul per expert, with the
    stacked down projection reading their outputs in order, and no host loop at decode sizes."""
    from optimum_amdx.quantization.moe_experts import ExpertLinears, PerExpertGateUp

    model = act_order_experts_model(name)
    am = AMDModelForCausalLM(model, num_blocks=64, max_model_len=128)
    runner = am.decoder.layers[0].moe
    am.generation_config.eos_token_id = None
    prompts = random_prompts(2, 5, 20, seed=29)
    expected = [hf_greedy(model, p, 8) for p in prompts]  # transformers' expert loop over the same linears
    monkeypatch.setattr(ExpertLinears, "forward", lambda *a, **k: pytest.fail("the host loop ran"))
    assert am.generate(prompts, max_new_tokens=8) == expected
    assert runner.stack_error is None and isinstance(runner._stacked[0], PerExpertGateUp)
    assert runner._stacked[1].perm is None  # the per-expert outputs arrive in the down projections' order


def act_order_experts_model(name: str):
    """A tiny MoE family model, RTN-quantized, whose experts are act-order QuantLinears with random codes, each
    expert with permutations of its own (gate/up share one)."""
    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer
    from optimum_amdx.quantization.moe_experts import ExpertLinears

    model = copy.deepcopy(family_model(name))
    GPTQQuantizer(GPTQConfig(bits=4, group_size=GROUP), method="rtn", device="cpu", verbose=False).quantize(model)
    for i, layer in enumerate(model.model.layers):
        experts = getattr(layer.mlp, "experts", None)
        if not isinstance(experts, ExpertLinears):
            continue
        for e in range(experts.num_experts):
            ex = experts[e]
            hidden, inter = ex.gate_proj.in_features, ex.down_proj.in_features
            g_in = _act_order_g_idx(hidden, seed=100 * i + 2 * e)
            ex.gate_proj = _act_order_linear(hidden, inter, g_in, False, seed=1000 * i + 10 * e)
            ex.up_proj = _act_order_linear(hidden, inter, g_in, False, seed=1000 * i + 10 * e + 1)
            ex.down_proj = _act_order_linear(inter, hidden, _act_order_g_idx(inter, seed=100 * i + 2 * e + 1), False,
                                             seed=1000 * i + 10 * e + 2)
    return model


def _engine(model, hoist: bool, monkeypatch) -> AMDModelForCausalLM:
    monkeypatch.setattr(paged_model, "HOIST_ACT_ORDER", hoist)
    return AMDModelForCausalLM(copy.deepcopy(model), num_blocks=32, max_model_len=64)


@pytest.mark.parametrize("model_type,sym,bias",
                         [("llama", False, False), ("llama", True, True), ("phi3", False, False)])
def test_act_order_gathers_move_into_the_norm_and_the_gate_up_columns(model_type, sym, bias, monkeypatch):
    model = act_order_model(model_type, sym=sym, bias=bias).half()
    hoisted = _engine(model, True, monkeypatch)
    plain = _engine(model, False, monkeypatch)
    for layer in hoisted.decoder.layers:
        assert layer.qkv.input_perm is not None and layer.qkv.qweight.perm is None
        assert layer.gate_up.input_perm is not None and layer.gate_up.qweight.perm is None
        assert layer.down_sorted is not None and layer.down_sorted.perm is None
        # fed by attention heads, which store its input sorted: the presorted weight, the inverse permutation
        perm = layer.o_proj.kernel_weight().perm.long()
        assert layer.o_sorted is not None and layer.o_sorted.perm is None
        assert torch.equal(layer.o_cols.long()[perm], torch.arange(perm.numel()))
        assert isinstance(layer.gate_up, paged_model._CheckpointFused) == (model_type == "phi3")
    for layer in plain.decoder.layers:
        assert layer.qkv.input_perm is None and layer.down_sorted is None and layer.o_sorted is None
        assert layer.qkv.qweight is None or layer.qkv.qweight.perm is not None  # one module (Phi-3) runs itself

    sorted_calls = []  # steps of up to O_COLS_MAX_TOKENS tokens (decode) take o_proj from the sorted stores
    real = hoisted.decoder._o_proj_sorted
    hoisted.decoder._o_proj_sorted = lambda *a: sorted_calls.append(1) or real(*a)
    prompts = random_prompts(3, 4, 14, seed=17)
    got = hoisted.generate(prompts, max_new_tokens=8)
    assert sorted_calls
    assert got == plain.generate(prompts, max_new_tokens=8)
    assert got == [hf_greedy(model, p, 8) for p in prompts]


def test_act_order_hoisting_keeps_float32_on_the_modules(monkeypatch):
    """float32 activations never run the fused GPTQ weights: the norm must not permute their input."""
    model = act_order_model(seed=5)
    am = _engine(model, True, monkeypatch)
    layer = am.decoder.layers[0]
    assert layer.qkv.input_order(torch.float32) is None and layer.qkv.input_order(torch.float16) is not None
    prompts = random_prompts(2, 4, 10, seed=23)
    assert am.generate(prompts, max_new_tokens=6) == [hf_greedy(model, p, 6) for p in prompts]


def test_act_order_o_proj_keeps_its_gather_on_families_that_skip_the_sorted_stores(monkeypatch):
    """`paged_model.O_COLS_SKIP_FAMILIES` (gfx1100: the sorted stores cost the decode attention registers): there the
    engine keeps o_proj's own gather (no presorted weight, no column map), the other moved gathers stay."""
    monkeypatch.setattr(paged_model, "O_COLS_SKIP_FAMILIES", ("cpu",))
    engine = _engine(act_order_model("llama", sym=False, bias=False).half(), True, monkeypatch)
    for layer in engine.decoder.layers:
        assert layer.o_sorted is None and layer.o_cols is None
        assert layer.qkv.input_perm is not None and layer.down_sorted is not None
