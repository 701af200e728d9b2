"""A GPTQ layer holds its 4-bit codes once: the standard `qweight` until it is repacked for the kernels, then the
repacked copy only, or, in the paged engine, its columns of the fused q/k/v or gate/up weight. Whatever holds them,
`state_dict()` gives back the checkpoint's tensors bit for bit, and the layer computes the same outputs."""

from __future__ import annotations

import copy

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.w4a16 import TILE_N, gptq_qweight, pack_gptq_int32, prepare_gptq_weight, select_columns
from optimum_amdx.quantization import QuantLinear


def _g_idx(k: int, group: int, act_order: bool, seed: int) -> torch.Tensor:
    rows = (torch.arange(k) // group).to(torch.int32)
    if not act_order:
        return rows
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[torch.randperm(k, generator=torch.Generator().manual_seed(seed))] = rows
    return g_idx


def _layer(k: int, n: int, group: int, act_order: bool, fmt: str = "gptq", seed: int = 0) -> QuantLinear:
    """A 4-bit layer whose words are random over all 32 bits (every nibble value, the sign bit included)."""
    g = torch.Generator().manual_seed(seed)
    n_groups = -(-k // group)
    words = lambda *shape: torch.randint(-2**31, 2**31, shape, generator=g, dtype=torch.int64).to(torch.int32)  # noqa: E731
    tensors = {"qweight": words(k // 8, n), "qzeros": words(n_groups, n // 8),
               "scales": (torch.rand(n_groups, n, generator=g) * 0.02 + 0.001).half(),
               "g_idx": _g_idx(k, group, act_order, seed)}
    return QuantLinear.from_packed(tensors, k, n, 4, group if group < k else -1, fmt)


def _saved(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in module.state_dict().items()}


def _assert_same_state(before: dict[str, torch.Tensor], module: torch.nn.Module) -> None:
    after = module.state_dict()
    assert list(after) == list(before)
    for name, t in before.items():
        assert after[name].dtype == t.dtype and torch.equal(after[name], t), name


@pytest.mark.parametrize("k,n,group,act_order,fmt", [
    (256, 384, 32, False, "gptq"),
    (256, 384, 32, True, "gptq_v2"),
    (200, 72, 200, False, "gptq"),   # K and N off the 128 x 128 tiles: padded tiles
    (384, 136, 128, True, "gptq"),
])
def test_a_repacked_layer_keeps_one_copy_and_saves_the_checkpoint_tensors(k, n, group, act_order, fmt):
    layer = _layer(k, n, group, act_order, fmt)
    before = _saved(layer)
    dense = layer.dequantize()
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1)).half()
    expected = x.float() @ dense.t()
    out = layer(x)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    # the repacked copy is the only one: the standard qweight buffer is empty and no buffer lists it
    assert layer._buffers["qweight"] is None
    buffers = dict(layer.named_buffers())
    assert "qweight" not in buffers and buffers[QuantLinear.HELD_BUFFER] is layer.kernel_weight().qweight
    _assert_same_state(before, layer)
    assert layer._buffers["qweight"] is None  # saving rebuilt it without keeping it
    assert torch.equal(layer.dequantize(), dense)
    # reading qweight gives the checkpoint tensor back and makes it the layer's copy again
    assert torch.equal(layer.qweight, before["qweight"]) and layer._prepared is None
    assert torch.equal(layer(x), out)


def test_assigning_moving_and_loading_a_repacked_layer_keep_its_codes():
    layer = _layer(256, 256, 64, True)
    before = _saved(layer)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(2)).half()
    out = layer(x)
    layer.scales = layer.scales * 2  # a new tensor for one of the others: the codes go back into qweight first
    assert torch.equal(layer.qweight, before["qweight"])
    torch.testing.assert_close(layer(x), out * 2, rtol=1e-2, atol=1e-3)

    layer.load_state_dict(before)  # loading into a repacked layer (strict: every key has its place)
    assert torch.equal(layer(x), out)
    moved = copy.deepcopy(layer).to(torch.device("cpu"), torch.float32)
    assert torch.equal(moved.qweight, before["qweight"]) and moved.scales.dtype == torch.float32

    layer(x)
    other = _layer(256, 256, 64, True, seed=5)
    layer.qweight = other.qweight.clone()  # new codes replace the repacked ones
    assert layer._prepared is None and torch.equal(layer.qweight, other.qweight)


def test_gptq_qweight_inverts_the_repacking_and_select_columns_reads_blocks_in_place():
    layer = _layer(256, 3 * TILE_N + 40, 32, True)
    w = prepare_gptq_weight(layer.qweight, layer.qzeros, layer.scales, layer.g_idx, 4, 32)
    assert torch.equal(gptq_qweight(w), layer.qweight)
    cols = torch.tensor([5, 300, 17, 128])
    assert torch.equal(gptq_qweight(w, cols), layer.qweight[:, cols])

    whole = select_columns(w, slice(TILE_N, 3 * TILE_N + 40))  # whole blocks to the end: the same words
    assert whole.qweight.untyped_storage().data_ptr() == w.qweight.untyped_storage().data_ptr()
    assert torch.equal(gptq_qweight(whole), layer.qweight[:, TILE_N:])
    torch.testing.assert_close(whole.dequantize(), w.dequantize()[:, TILE_N:], rtol=0, atol=0)
    part = select_columns(w, slice(10, 2 * TILE_N))  # off a block boundary: a repacked copy
    assert part.qweight.untyped_storage().data_ptr() != w.qweight.untyped_storage().data_ptr()
    torch.testing.assert_close(part.dequantize(), w.dequantize()[:, 10:2 * TILE_N], rtol=0, atol=0)
    picked = select_columns(w, cols)
    torch.testing.assert_close(picked.dequantize(), w.dequantize()[:, cols], rtol=0, atol=0)
    with pytest.raises(InvalidArgumentError, match="step-1"):
        select_columns(w, slice(0, TILE_N, 2))
    q8 = pack_gptq_int32(torch.zeros(64, 32, dtype=torch.int32), 8, dim=0)
    raw = prepare_gptq_weight(q8, torch.zeros(1, 8, dtype=torch.int32), torch.ones(1, 32).half(), None, 8, -1)
    with pytest.raises(InvalidArgumentError, match="kernel-ready"):
        gptq_qweight(raw)


def _quantized_llama(act_order: bool):
    """A tiny Llama whose linears are 4-bit QuantLinears with random codes, in fp16; q/k/v (128 columns each) and
    gate/up (256 each) are whole 128-column blocks. With `act_order`, the linears of one input share a
    permutation (as GPTQ gives them), so the engine puts gate/up's columns in the down projection's order."""
    from ..modeling.conftest import tiny_model

    model = copy.deepcopy(tiny_model("llama", seed=4, hidden_size=128, intermediate_size=256,
                                     num_attention_heads=4, num_key_value_heads=4))
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for j, (parent, names) in enumerate([(attn, ("q_proj", "k_proj", "v_proj")), (attn, ("o_proj",)),
                                             (mlp, ("gate_proj", "up_proj")), (mlp, ("down_proj",))]):
            k = getattr(parent, names[0]).in_features
            g_idx = _g_idx(k, 32, act_order, seed=10 * i + j)
            for t, name in enumerate(names):
                n = getattr(parent, name).out_features
                g = torch.Generator().manual_seed(100 * i + 10 * j + t)
                tensors = {"qweight": pack_gptq_int32(torch.randint(0, 16, (k, n), generator=g), 4, dim=0),
                           "qzeros": pack_gptq_int32(torch.randint(0, 15, (k // 32, n), generator=g), 4, dim=1),
                           "scales": (torch.rand(k // 32, n, generator=g) * 0.05 + 0.05).half(), "g_idx": g_idx}
                setattr(parent, name, QuantLinear.from_packed(tensors, k, n, 4, 32, "gptq"))
    return model.half()


@pytest.mark.parametrize("act_order", [False, True])
def test_the_engine_fused_weights_hold_their_members_codes(act_order):
    from optimum_amdx.modeling import AMDModelForCausalLM

    from ..modeling.conftest import hf_greedy, random_prompts

    model = _quantized_llama(act_order)
    before = _saved(model)
    prompts = random_prompts(2, 4, 12, seed=3, vocab=model.config.vocab_size)
    expected = [hf_greedy(model, p, 4) for p in prompts]  # repacks every layer (one copy each)

    am = AMDModelForCausalLM(model, num_blocks=16, max_model_len=64)
    held: dict[int, int] = {}  # every storage that holds 4-bit codes: the model's and the engine's
    for layer, engine_layer in zip(model.model.layers, am.decoder.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for proj, members in ((engine_layer.qkv, (attn.q_proj, attn.k_proj, attn.v_proj)),
                              (engine_layer.gate_up, (mlp.gate_proj, mlp.up_proj))):
            fused_words = proj.qweight.qweight
            held[fused_words.untyped_storage().data_ptr()] = fused_words.untyped_storage().nbytes()
            for m in members:
                assert m._buffers["qweight"] is None
                assert m._shared[0].qweight.untyped_storage().data_ptr() == fused_words.untyped_storage().data_ptr()
        for m in (attn.o_proj, mlp.down_proj):
            assert m._buffers["qweight"] is None and m._prepared is not None
            words = m._prepared.qweight
            held[words.untyped_storage().data_ptr()] = words.untyped_storage().nbytes()
    own = sum(prepare_gptq_weight(before[f"{name}.qweight"], before[f"{name}.qzeros"], before[f"{name}.scales"],
                                  before[f"{name}.g_idx"], 4, 32).qweight.nbytes
              for name, module in model.named_modules() if isinstance(module, QuantLinear))
    assert sum(held.values()) == own  # one repacked copy of every layer's codes, no more
    # and the modules' buffers name exactly that (memory accounting, the benchmark's weight bytes), never saved
    named = [b.nbytes for name, b in model.named_buffers() if name.endswith("." + QuantLinear.HELD_BUFFER)]
    assert sum(named) == own and not any(k.endswith(QuantLinear.HELD_BUFFER) for k in model.state_dict())

    _assert_same_state(before, model)
    am.generation_config.eos_token_id = None
    assert am.generate(prompts, max_new_tokens=4) == expected
    assert [hf_greedy(model, p, 4) for p in prompts] == expected  # the modules run from their fused columns
    # q/k/v are whole column blocks of their fused weight: they run from its words in place; act-order gate/up
    # columns come in the down projection's order, so gate_proj repacks its own copy when it runs alone
    first, mlp = am.decoder.layers[0], model.model.layers[0].mlp
    q_words = model.model.layers[0].self_attn.q_proj.kernel_weight().qweight
    assert q_words.untyped_storage().data_ptr() == first.qkv.qweight.qweight.untyped_storage().data_ptr()
    gate_words = mlp.gate_proj.kernel_weight().qweight
    shares = gate_words.untyped_storage().data_ptr() == first.gate_up.qweight.qweight.untyped_storage().data_ptr()
    assert shares != act_order


@pytest.mark.parametrize("act_order", [False, True])
def test_stacked_experts_hold_their_gate_up_codes(act_order):
    """The engine's stacked expert weights (decode steps) hold the experts' gate/up codes; the per-expert linears
    (long prefill chunks, transformers' loop) read their columns of them and still save the checkpoint's tensors."""
    from optimum_amdx.modeling import AMDModelForCausalLM
    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer

    from ..modeling.conftest import hf_greedy, random_prompts
    from ..modeling.test_act_order import act_order_experts_model
    from ..modeling.test_families import family_model

    if act_order:  # every expert with permutations of its own: gate/up as one weight per expert
        model = act_order_experts_model("qwen3_moe")
    else:
        model = copy.deepcopy(family_model("qwen3_moe"))
        GPTQQuantizer(GPTQConfig(bits=4, group_size=16), method="rtn", device="cpu", verbose=False).quantize(model)
    before = _saved(model)
    prompts = random_prompts(2, 5, 12, seed=7)
    expected = [hf_greedy(model, p, 4) for p in prompts]
    am = AMDModelForCausalLM(model, num_blocks=64, max_model_len=128)
    am.generation_config.eos_token_id = None
    assert am.generate(prompts, max_new_tokens=4) == expected  # the decode steps stack the experts
    moe_layers = [layer for layer in am.decoder.layers if layer.moe is not None]
    assert moe_layers
    for layer in moe_layers:
        assert layer.moe.stack_error is None and layer.moe._stacked is not None
        experts = layer.moe.per_expert
        for e in range(experts.num_experts):
            for linear in (experts[e].gate_proj, experts[e].up_proj):
                assert linear._buffers["qweight"] is None and linear._shared is not None
    _assert_same_state(before, model)
    assert [hf_greedy(model, p, 4) for p in prompts] == expected


def test_the_memory_benchmark_counts_one_copy_through_the_engine(tmp_path):
    """`benchmarks/gptq_memory.py` (the figures of RESULTS.md, round 35) on one layer of a 1B shape (the tiny shapes'
    weights are smaller than one 128 x 128 tile, so padding and the engine's own int32 tables would dominate): one
    copy of the codes plus the small zeros and index tensors, after the first forward and in the engine."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gptq_memory.py"
    out = tmp_path / "memory.json"
    run = subprocess.run([sys.executable, str(script), "--shape", "llama-1b", "--layers", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["phase"].split(" (")[0] for r in rows] == ["quantized", "after the first forward",
                                                         "in the paged engine, after generate"]
    assert all(1.0 <= r["copies"] < 1.02 for r in rows), rows


def test_joining_whole_column_blocks_skips_the_unpacking_and_gives_the_same_weight():
    """`concat_weights` joins parts of whole 128-column blocks (the last may be partial) by their words one after
    another; the result is the weight the unpack-and-repack path builds."""
    from optimum_amdx.kernels.w4a16 import concat_weights, tile_pack

    parts = [_layer(256, n, 32, True, seed=s).kernel_weight() for s, n in enumerate((128, 2 * TILE_N, 72))]
    for p in parts[1:]:
        p.perm = parts[0].perm  # one input's linears share their permutation
    joined = concat_weights(parts)
    assert torch.equal(joined.qweight, tile_pack(torch.cat([p.codes() for p in parts], dim=1)))
    assert torch.equal(joined.scales, torch.cat([p.scales for p in parts], dim=1))
    torch.testing.assert_close(joined.dequantize(), torch.cat([p.dequantize() for p in parts], dim=1), rtol=0, atol=0)
    assert joined.out_features == 128 + 2 * TILE_N + 72 and joined.n_blocks == 4


@pytest.mark.parametrize("k,n", [(256, 384), (200, 72), (8, 128), (384, 136)])
def test_repacking_words_in_order_is_the_nibble_transpose_of_the_unpacked_codes(k, n):
    """Without act-order, `prepare_gptq_weight` repacks the standard words directly (`tile_pack_gptq_words`); the
    words equal `tile_pack` of the unpacked codes, padding included, for every nibble value and the sign bit, and
    `gptq_qweight` gives them back by the inverse transpose (`untile_gptq_words`)."""
    from optimum_amdx.kernels.w4a16 import tile_pack, tile_pack_gptq_words, unpack_codes_u8, unpack_gptq_int32

    words = _layer(k, n, k, False, seed=k + n).qweight
    codes = unpack_gptq_int32(words, 4, dim=0)
    assert torch.equal(tile_pack_gptq_words(words), tile_pack(codes))
    assert torch.equal(unpack_codes_u8(words), codes.to(torch.uint8))  # act-order's one byte a code
    assert torch.equal(tile_pack(codes.to(torch.uint8)), tile_pack(codes))
    w = prepare_gptq_weight(words, torch.zeros(1, n // 8, dtype=torch.int32), torch.ones(1, n).half(), None, 4, -1)
    assert w.perm is None and torch.equal(gptq_qweight(w), words)  # and back, by the inverse transpose
    assert torch.equal(w.codes(torch.uint8), w.codes().to(torch.uint8)) and torch.equal(w.codes(), codes)
    if n > TILE_N:
        assert torch.equal(gptq_qweight(w, slice(TILE_N, n)), words[:, TILE_N:])
