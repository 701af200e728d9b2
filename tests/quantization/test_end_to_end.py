"""Quantize + save + reload + generate on tiny seeded Llamas; sharding; CLI; bad inputs."""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import make_llama
from optimum_amdx.errors import InvalidArgumentError, ModelNotFoundError, OutputExistsError, UnsupportedModelError
from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, QuantLinear, load_gptq_model


def _quantize(calib, tokenizer, **cfg):
    model = make_llama(bias=cfg.pop("bias", False), tie=cfg.pop("tie", False))
    quantizer = GPTQQuantizer(GPTQConfig(group_size=32, n_samples=8, seqlen=64, **cfg), verbose=False)
    return model, quantizer, quantizer.quantize(model, tokenizer, calib)


def test_quantize_save_reload_generate(tmp_path, tokenizer, calib):
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    reference = make_llama(tie=True)(ids).logits
    model, quantizer, q = _quantize(calib, tokenizer, desc_act=True, tie=True)
    assert q is model
    qlinears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(qlinears) == 2 * 7
    assert not any(isinstance(m, torch.nn.Linear) for m in model.model.layers.modules())
    logits = model(ids).logits
    assert (logits - reference).abs().max() < 0.25 * reference.abs().max()  # quantized, but close to fp
    assert len(quantizer.stats) == 2 * 4 and all(s.error > 0 for s in quantizer.stats)
    steps = [s.modules for s in quantizer.stats if s.layer == 0]  # true-sequential, shared inputs stacked
    assert steps == ["q_proj+k_proj+v_proj", "o_proj", "gate_proj+up_proj", "down_proj"]

    out = quantizer.save_pretrained(model, tmp_path / "q", tokenizer)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "gptq" and cfg["bits"] == 4 and cfg["desc_act"] is True
    assert cfg["checkpoint_format"] == "gptq" and cfg["group_size"] == 32

    reloaded = load_gptq_model(out, "cpu", torch.float32)
    torch.testing.assert_close(reloaded(ids).logits, logits, rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path / "hf")  # plain transformers saving writes the same standard tensors
    torch.testing.assert_close(load_gptq_model(tmp_path / "hf", "cpu", torch.float32)(ids).logits, logits,
                               rtol=0, atol=1e-5)
    gen_a = model.generate(ids, max_new_tokens=8, do_sample=False)
    gen_b = reloaded.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(gen_a, gen_b) and gen_a.shape[1] == 32

    from optimum_amdx import pipeline

    pipe = pipeline("text-generation", model=str(out), accelerator="rocm")
    assert isinstance(pipe.model.model.model.layers[0].self_attn.q_proj, QuantLinear)
    prompt = tokenizer("hello world", return_tensors="pt").input_ids
    expected = tokenizer.decode(reloaded.generate(prompt, max_new_tokens=8, do_sample=False)[0])
    assert pipe("hello world", max_new_tokens=8, do_sample=False)[0]["generated_text"] == expected


@pytest.mark.parametrize("tie", [False, True])
def test_quantized_output_head_saves_loads_and_runs_in_the_engine(tmp_path, tokenizer, calib, tie):
    """lm_head=True (GPT-QModel's option): the head is a GPTQ QuantLinear whose Hessian comes from the final
    norm's output, a tied head is untied (embeddings stay in full precision), and the checkpoint loads in the
    loader and the paged engine."""
    from optimum_amdx import AMDModelForCausalLM

    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(2))
    reference = make_llama(tie=tie)(ids).logits
    model, quantizer, _ = _quantize(calib, tokenizer, tie=tie, lm_head=True)
    assert isinstance(model.lm_head, QuantLinear) and not isinstance(model.model.embed_tokens, QuantLinear)
    assert model.config.tie_word_embeddings is False
    assert quantizer.stats[-1].modules == "lm_head" and quantizer.stats[-1].error > 0
    logits = model(ids).logits
    assert (logits - reference).abs().max() < 0.25 * reference.abs().max()
    out = quantizer.save_pretrained(model, tmp_path / "q", tokenizer)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["lm_head"] is True
    reloaded = load_gptq_model(out, "cpu", torch.float32)
    assert isinstance(reloaded.lm_head, QuantLinear)
    torch.testing.assert_close(reloaded(ids).logits, logits, rtol=0, atol=1e-5)
    am = AMDModelForCausalLM.from_pretrained(out, device="cpu", dtype="fp32", num_blocks=16)
    assert am.decoder.lm_head is am.model.lm_head and isinstance(am.decoder.lm_head, QuantLinear)
    am.generation_config.eos_token_id = reloaded.generation_config.eos_token_id = None
    prompt = ids[0, :9].tolist()
    expected = reloaded.generate(ids[:, :9], attention_mask=torch.ones_like(ids[:, :9]), max_new_tokens=8,
                                 do_sample=False, pad_token_id=0)[0, 9:].tolist()
    assert am.generate([prompt], max_new_tokens=8)[0] == expected


def test_per_module_settings_follow_gptqmodel_dynamic():
    from optimum_amdx.quantization.checkpoint import module_settings

    base = GPTQConfig(bits=4, group_size=128)
    qc = {"dynamic": {"-:.*down.*": {}, "+:.*\\.1\\..*gate.*": {"bits": 8}, "lm_head": {"bits": 8, "group_size": 32}}}
    assert module_settings(qc, "lm_head", base) == (8, 32)
    assert module_settings(qc, "model.layers.1.mlp.gate_proj", base) == (8, 128)
    assert module_settings(qc, "model.layers.0.mlp.gate_proj", base) == (4, 128)
    assert module_settings({}, "model.layers.0.mlp.down_proj", base) == (4, 128)
    with pytest.raises(InvalidArgumentError, match="dynamic"):
        module_settings({"dynamic": ["lm_head"]}, "lm_head", base)
    # what we write: act_group_aware only where it ran (GPT-QModel refuses it beside desc_act)
    assert GPTQConfig(desc_act=True).to_quantization_config()["meta"]["act_group_aware"] is False
    assert GPTQConfig().to_quantization_config()["meta"]["act_group_aware"] is True


def test_sharded_save_with_bias_and_v2_format(tmp_path, tokenizer, calib):
    model, quantizer, _ = _quantize(calib, tokenizer, bias=True, sym=False, checkpoint_format="gptq_v2", bits=8)
    out = quantizer.save_pretrained(model, tmp_path / "q", max_shard_size=40_000)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    reloaded = load_gptq_model(out, "cpu", torch.float32)
    assert reloaded.model.layers[0].self_attn.q_proj.bias is not None
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("bits", [3, 4])
def test_rtn_and_fp16_kernel_path(tmp_path, tokenizer, bits):
    model = make_llama()
    GPTQQuantizer(GPTQConfig(bits=bits, group_size=64), method="rtn", verbose=False).quantize(model)
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(4)).half()
    expected = (x.float() @ layer.dequantize().t()).half()
    torch.testing.assert_close(layer(x), expected, rtol=1e-3, atol=1e-3)
    out = GPTQQuantizer().save_pretrained(model, tmp_path / "rtn")
    reloaded = load_gptq_model(out, "cpu", torch.float32)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)


def test_bad_inputs(tmp_path, tokenizer, calib, tiny_dir):
    with pytest.raises(InvalidArgumentError, match="bits=5"):
        GPTQConfig(bits=5)
    with pytest.raises(InvalidArgumentError, match="does not divide the 144 input features"):
        GPTQQuantizer(GPTQConfig(group_size=128), verbose=False).quantize(make_llama(hidden=144), tokenizer, calib)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        GPTQQuantizer(GPTQConfig(dataset=str(tmp_path / "missing.txt")), verbose=False).quantize(make_llama(), tokenizer)
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64))
    with pytest.raises(UnsupportedModelError, match="causal"):
        GPTQQuantizer(verbose=False).quantize(bert, tokenizer, calib)
    model, quantizer, _ = _quantize(calib, tokenizer)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("x")
    with pytest.raises(OutputExistsError):
        quantizer.save_pretrained(model, tmp_path / "busy")
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["keep.txt"]
    assert not any(p.name.startswith(".busy") for p in tmp_path.iterdir())


def test_cli_quantize_and_eval_ppl(tmp_path, tiny_dir, capsys):
    from optimum_amdx.cli.main import main

    text = tmp_path / "calib.txt"
    text.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(300)))
    out = tmp_path / "q"
    rc = main(["quantize", "gptq", "--model", str(tiny_dir), "--bits", "4", "--group-size", "32", "--desc-act",
               "--lm-head", "--dataset", str(text), "--samples", "4", "--seqlen", "64", "--device", "cpu", "--json",
               str(out)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)  # --json: stdout holds the JSON alone
    assert summary["quantization_config"]["desc_act"] is True and (out / "model.safetensors").is_file()
    assert summary["quantization_config"]["lm_head"] is True
    assert main(["quantize", "rtn", "--model", str(tiny_dir), "--device", "cpu", "--json", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["quantize", "gptq", "--model", str(tiny_dir), "--bits", "5", str(tmp_path / "x")]) == 2
    assert "bits=5" in capsys.readouterr().err
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(tmp_path / "bert")
    assert main(["quantize", "rtn", "--model", str(tmp_path / "bert"), str(tmp_path / "y")]) == 2
    assert "ForCausalLM" in capsys.readouterr().err and not (tmp_path / "y").exists()
    rc = main(["eval-ppl", "--model", str(out), "--dataset", str(text), "--seqlen", "64", "--device", "cpu", "--json"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["gptq"] is True and 1.0 < result["perplexity"] < 1000


def test_autogptq_style_zero_bias_loads(tmp_path, tokenizer, calib):
    from safetensors.torch import load_file, save_file

    model, quantizer, _ = _quantize(calib, tokenizer)
    out = quantizer.save_pretrained(model, tmp_path / "q")
    tensors = load_file(str(out / "model.safetensors"))
    for key in [k for k in tensors if k.endswith(".qweight")]:
        tensors[key[: -len("qweight")] + "bias"] = torch.zeros(tensors[key].shape[1], dtype=torch.float16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    reloaded = load_gptq_model(out, "cpu", torch.float32)
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)


def test_cli_json_stdout_is_only_the_json(tmp_path, tiny_dir):
    """`quantize --json > summary.json` and `eval-ppl --json > ppl.json` hold the JSON alone.

    Runs the real console path in a subprocess, so library output written to file descriptor 1 (not
    only Python's sys.stdout) is checked too.
    """
    import subprocess
    import sys

    def amdx(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "optimum_amdx", *args], capture_output=True, text=True, timeout=600)

    quantized = amdx("quantize", "rtn", "--model", str(tiny_dir), "--device", "cpu", "--json", str(tmp_path / "q"))
    assert quantized.returncode == 0, quantized.stderr
    assert json.loads(quantized.stdout)["method"] == "rtn"
    text = tmp_path / "eval.txt"
    text.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(200)))
    ppl = amdx("eval-ppl", "--model", str(tmp_path / "q"), "--dataset", str(text), "--device", "cpu",
               "--seqlen", "16", "--max-windows", "2", "--json")
    assert ppl.returncode == 0, ppl.stderr
    assert json.loads(ppl.stdout)["gptq"] is True
