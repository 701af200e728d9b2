"""Every model family the paged engine runs (modeling/families.py), token for token against transformers.

Tiny seeded random configs in fp32 on CPU: a batch of prompts of different lengths with chunked prefill
(a 16-token step budget), a pool so tight that sequences are preempted and recomputed, and
`pipeline("text-generation", accelerator="rocm")`. Each config switches on what makes its family differ
from Llama (sliding-window layers, soft-capping, `query_pre_attn_scalar`, local/global rope bases, partial
rotary with LongRoPE, fused checkpoint projections, experts), so a wrong departure changes the tokens.
"""

from __future__ import annotations

import functools

import pytest
import torch

from optimum_amdx.errors import UnsupportedModelError
from optimum_amdx.modeling import AMDModelForCausalLM, LLMEngine, SamplingParams
from optimum_amdx.modeling.families import FAMILIES, family_for, supported_model_types

from .conftest import TINY, hf_greedy, random_prompts

_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILY_CONFIGS: dict[str, tuple[str, dict]] = {
    "qwen3": ("qwen3", dict(head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "gemma": ("gemma", dict(head_dim=16, hidden_act="gelu_pytorch_tanh")),
    "gemma2": ("gemma2", dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                              final_logit_softcapping=3.0)),
    "gemma3_text": ("gemma3_text", dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
                                        layer_types=["sliding_attention", "full_attention"],
                                        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                                         "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                            "rope_theta": 20000.0}})),
    "phi3": ("phi3", dict(original_max_position_embeddings=256, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
        short_factor=[1.0, 1.3, 1.6, 1.9], long_factor=[2.0, 2.5, 3.0, 3.5]), **_IDS)),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=24)),
    "qwen3_moe": ("qwen3_moe", dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])),
}
FAMILY_NAMES = list(FAMILY_CONFIGS)


def build(model_type: str, seed: int = 0, **overrides):
    """A random fp32 model with larger-than-default weights (logits far from ties), eager attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **dict(TINY, **overrides))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
            else:
                p.add_(torch.randn_like(p) * 0.05)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


@functools.lru_cache(maxsize=None)
def family_model(name: str):
    model_type, overrides = FAMILY_CONFIGS[name]
    return build(model_type, **overrides)


@functools.lru_cache(maxsize=None)
def reference(name: str, prompt: tuple[int, ...], max_new: int) -> list[int]:
    return hf_greedy(family_model(name), list(prompt), max_new)


def test_every_family_has_a_config_here_and_a_spec_there():
    tested = {FAMILY_CONFIGS[n][0] for n in FAMILY_NAMES} | {"llama", "mistral", "qwen2"}  # test_generate covers those
    assert tested == set(supported_model_types())
    assert len({s.name for s in FAMILIES}) == len(FAMILIES)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_batch_of_different_lengths_with_chunked_prefill_equals_transformers(name):
    model = family_model(name)
    am = AMDModelForCausalLM(model, block_size=4, max_num_seqs=3, max_num_batched_tokens=16, max_model_len=128)
    assert am.decoder.family is family_for(model.config)
    prompts = random_prompts(4, 2, 40, seed=1)
    outs = am.generate(prompts, max_new_tokens=16)
    assert outs == [reference(name, tuple(p), 16) for p in prompts]
    assert am.engine.num_free_blocks == am.engine.num_blocks


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_tight_pool_preempts_and_recomputes_to_transformers_tokens(name):
    am = AMDModelForCausalLM(family_model(name), max_model_len=128)
    engine = LLMEngine(am.decoder, block_size=4, num_blocks=10, max_num_seqs=4, max_num_batched_tokens=64)
    prompts = [[(7 * i + j) % 250 + 3 for j in range(10 + 3 * i)] for i in range(4)]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=12))
    assert engine.scheduler.num_preemptions > 0
    assert engine.num_free_blocks == engine.num_blocks
    assert outs == [reference(name, tuple(p), 12) for p in prompts]


@functools.lru_cache(maxsize=None)
def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 256)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_rocm_pipeline_runs_the_family_in_the_paged_engine(name):
    from optimum_amdx import pipeline

    model = family_model(name)
    tok = _tokenizer()
    pipe = pipeline("text-generation", model=model, tokenizer=tok, accelerator="rocm")
    assert isinstance(pipe.model, AMDModelForCausalLM)
    texts = ["w5 w17 w99 w4 w200", "w42 w43"]
    outs = pipe(texts, max_new_tokens=8, do_sample=False, return_tensors=True)
    for text, out in zip(texts, outs):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert list(out[0]["generated_token_ids"]) == ids + reference(name, tuple(ids), 8)


def test_phi3_longrope_beyond_the_original_context_uses_the_long_factors():
    """max_model_len past original_max_position_embeddings: tables with the long factors and LongRoPE's
    attention scaling, equal to transformers for prompts past the original length (where it switches)."""
    model_type, overrides = FAMILY_CONFIGS["phi3"]
    model = build(model_type, seed=5, **dict(overrides, original_max_position_embeddings=48))
    am = AMDModelForCausalLM(model, block_size=8, max_model_len=128, max_num_seqs=2, max_num_batched_tokens=32)
    assert am.decoder.layers[0].cos.shape == (128, 4)  # partial rotary: 8 of 16 head features
    assert float(model.model.rotary_emb.attention_scaling) > 1.0
    prompts = random_prompts(2, 50, 60, seed=9)
    assert am.generate(prompts, max_new_tokens=8) == [hf_greedy(model, p, 8) for p in prompts]


def test_gemma_family_parts_read_from_the_model():
    model = family_model("gemma2")
    layer = AMDModelForCausalLM(model, num_blocks=8).decoder.layers[0]
    assert layer.parts.scale == pytest.approx(24 ** -0.5) and layer.parts.softcap == 2.0
    assert layer.parts.window == 8  # layer_types: sliding, full, ...
    hf = model.model.layers[0]
    torch.testing.assert_close(layer.ln1_w, 1.0 + hf.input_layernorm.weight)
    assert layer.parts.post_attn_norm is not None and layer.parts.post_mlp_norm is not None
    assert AMDModelForCausalLM(model, num_blocks=8).decoder.layers[1].parts.window is None


def test_unsupported_families_name_themselves_and_the_fallback():
    from transformers import AutoConfig

    with pytest.raises(UnsupportedModelError, match=r"Qwen2-MoE.*attn_implementation='amdx'"):
        family_for(AutoConfig.for_model("qwen2_moe"))
    with pytest.raises(UnsupportedModelError, match=r"'gptj'.*Gemma 2 \(gemma2\).*patch"):
        family_for(AutoConfig.for_model("gptj"))
    with pytest.raises(UnsupportedModelError, match="bidirectional"):
        family_for(AutoConfig.for_model("gemma3_text", use_bidirectional_attention=True))


@pytest.mark.parametrize("name", ["gemma2", "phi3", "mixtral"])
def test_gptq_checkpoint_of_the_family_runs_in_the_engine(name, tmp_path):
    """A 4-bit RTN checkpoint (GPT-QModel layout: quantized q/k/v/o and MLP linears; Phi-3's fused qkv_proj and
    gate_up_proj; Mixtral's experts one by one) loads through our W4A16 linears and equals the same checkpoint
    run by transformers."""
    import copy

    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, QuantLinear, load_gptq_model

    model = copy.deepcopy(family_model(name))
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=32), method="rtn", device="cpu", verbose=False)
    quantizer.quantize(model)
    quantizer.save_pretrained(model, tmp_path / "q")
    am = AMDModelForCausalLM.from_pretrained(tmp_path / "q", device="cpu", dtype="fp32", num_blocks=64, max_model_len=128)
    assert any(isinstance(m, QuantLinear) for m in am.model.modules())
    assert am.decoder.layers[0].qkv.weight is None  # quantized: called module by module
    ref = load_gptq_model(tmp_path / "q", "cpu", torch.float32)
    am.generation_config.eos_token_id = ref.generation_config.eos_token_id = None  # full-length outputs
    prompts = random_prompts(2, 5, 20, seed=41)
    assert am.generate(prompts, max_new_tokens=10) == [hf_greedy(ref, p, 10) for p in prompts]



def test_gemma3_layers_take_their_layer_type_rotary_table():
    dec = AMDModelForCausalLM(family_model("gemma3_text"), num_blocks=8, max_model_len=64).decoder
    local, glob = dec.layers[0], dec.layers[1]  # layer_types: sliding, full
    half = local.cos.shape[1]
    inv = lambda theta: 1.0 / theta ** (torch.arange(0, 2 * half, 2, dtype=torch.float32) / (2 * half))  # noqa: E731
    pos = torch.arange(64, dtype=torch.float32)[:, None]
    torch.testing.assert_close(local.cos, torch.cos(pos * inv(500.0)))
    torch.testing.assert_close(glob.cos, torch.cos(pos * inv(20000.0) / 4.0))  # linear scaling, factor 4
    assert local.parts.window == 8 and glob.parts.window is None


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_gptq_checkpoint_with_quantized_experts_runs_in_the_engine(name, tmp_path):
    """Experts quantized one linear at a time (GPT-QModel's `mlp.experts.<e>.gate_proj/up_proj/down_proj`)
    load as per-expert W4A16 linears and equal the same checkpoint run by transformers."""
    import copy

    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, QuantLinear, load_gptq_model
    from optimum_amdx.quantization.moe_experts import ExpertLinears
    from safetensors import safe_open

    model = copy.deepcopy(family_model(name))
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=16), method="rtn", device="cpu", verbose=False)
    quantizer.quantize(model)
    quantizer.save_pretrained(model, tmp_path / "q")
    with safe_open(str(next((tmp_path / "q").glob("*.safetensors"))), framework="pt") as f:
        assert "model.layers.0.mlp.experts.3.down_proj.qweight" in f.keys()
    am = AMDModelForCausalLM.from_pretrained(tmp_path / "q", device="cpu", dtype="fp32", num_blocks=64, max_model_len=128)
    experts = am.model.model.layers[0].mlp.experts
    assert isinstance(experts, ExpertLinears) and isinstance(experts[0].gate_proj, QuantLinear)
    ref = load_gptq_model(tmp_path / "q", "cpu", torch.float32)
    am.generation_config.eos_token_id = ref.generation_config.eos_token_id = None
    prompts = random_prompts(2, 5, 20, seed=43)
    assert am.generate(prompts, max_new_tokens=8) == [hf_greedy(ref, p, 8) for p in prompts]
    runner = am.decoder.layers[0].moe
    assert runner.stack_error is None and runner._stacked is not None  # decode steps ran the stacked experts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_experts_stacked_equal_the_expert_loop_without_it(dtype, tmp_path, monkeypatch):
    """The stacked path (all experts in two W4A16 weights, no host loop: what decode graphs capture) against
    transformers' expert loop over the same per-expert linears; small token counts never enter the loop."""
    import copy

    from optimum_amdx.modeling import moe as moe_mod
    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer
    from optimum_amdx.quantization.moe_experts import ExpertLinears

    model = copy.deepcopy(family_model("qwen3_moe"))
    GPTQQuantizer(GPTQConfig(bits=4, group_size=16), method="rtn", device="cpu", verbose=False).quantize(model)
    block = model.model.layers[0].mlp
    block.gate.weight.data = block.gate.weight.data.to(dtype)  # the router in the activation dtype
    runner = moe_mod.moe_runner(block)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(moe_mod.STACKED_MAX_TOKENS + 1, model.config.hidden_size, generator=g).to(dtype)
    loop = runner(x)  # above the threshold: the expert loop
    assert runner._stacked is None
    monkeypatch.setattr(ExpertLinears, "forward", lambda *a, **k: pytest.fail("the host loop ran"))
    for rows in (1, 7, moe_mod.STACKED_MAX_TOKENS):
        got = runner(x[:rows])
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), loop[:rows].float(), atol=tol, rtol=tol)
    assert runner.stack_error is None


def test_mixtral_gptq_checkpoint_with_legacy_expert_names_loads(tmp_path):
    """AutoGPTQ-era Mixtral checkpoints name experts `block_sparse_moe.experts.<e>.w1/w2/w3` (gate/down/up) and
    the router `block_sparse_moe.gate`: the same tensors under those names give the same model and tokens."""
    import copy
    import re
    import shutil

    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, load_gptq_model
    from safetensors.torch import load_file, save_file

    model = copy.deepcopy(family_model("mixtral"))
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=16), method="rtn", device="cpu", verbose=False)
    quantizer.quantize(model)
    quantizer.save_pretrained(model, tmp_path / "q")
    legacy = tmp_path / "legacy"
    shutil.copytree(tmp_path / "q", legacy)
    names = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    for f in legacy.glob("*.safetensors"):
        state = load_file(str(f))
        renamed = {}
        for key, tensor in state.items():
            key = re.sub(r"\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.",
                         lambda m: f".block_sparse_moe.experts.{m.group(1)}.{names[m.group(2)]}.", key)
            renamed[key.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = tensor
        assert "model.layers.0.block_sparse_moe.experts.1.w3.qweight" in renamed
        assert "model.layers.0.block_sparse_moe.gate.weight" in renamed
        assert not any(".mlp." in k for k in renamed)
        save_file(renamed, str(f), metadata={"format": "pt"})
    ref = load_gptq_model(tmp_path / "q", "cpu", torch.float32)
    got = load_gptq_model(legacy, "cpu", torch.float32)
    ref_state, got_state = ref.state_dict(), got.state_dict()
    assert ref_state.keys() == got_state.keys()
    for key in ref_state:
        torch.testing.assert_close(got_state[key], ref_state[key], rtol=0, atol=0)
    am = AMDModelForCausalLM.from_pretrained(legacy, device="cpu", dtype="fp32", num_blocks=64, max_model_len=128)
    am.generation_config.eos_token_id = ref.generation_config.eos_token_id = None
    prompts = random_prompts(2, 5, 20, seed=44)
    assert am.generate(prompts, max_new_tokens=8) == [hf_greedy(ref, p, 8) for p in prompts]


def test_only_a_plain_embedding_becomes_a_row_gather():
    """The engine replaces the embedding's forward by `gather_rows` of its weight only where that forward is a plain
    lookup: a subclass (Gemma 3 scales inside its own), max_norm (renormalizes rows) or a hook keep the module."""
    from torch import nn

    from optimum_amdx.modeling.paged_model import _plain_embedding

    plain = nn.Embedding(10, 4)
    assert _plain_embedding(plain)
    assert not _plain_embedding(nn.Embedding(10, 4, max_norm=1.0))

    class Scaled(nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) * 2.0

    assert not _plain_embedding(Scaled(10, 4))
    handle = plain.register_forward_hook(lambda module, args, out: out)
    assert not _plain_embedding(plain)
    handle.remove()
    assert _plain_embedding(plain)
