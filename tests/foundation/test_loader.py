"""The one loader (`optimum_amdx.models`): a name resolved once, GPTQ detected once, the folder returned
with the model, `allow_pickle` honoured end to end, and damaged inputs turned into our error naming the fix.

Every model here is a tiny seeded random Llama saved to tmp_path (and then damaged where the test says so).
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from optimum_amdx.cli.main import main as cli
from optimum_amdx.errors import InvalidArgumentError, ModelNotFoundError, UnsafeWeightsError
from optimum_amdx.models import load_causal_lm, load_model, load_tokenizer, open_model
from tests.quantization.conftest import _one_thread_per_worker, make_llama, make_tokenizer  # noqa: F401 - autouse


@pytest.fixture(scope="module")
def reference():
    return make_llama(seed=3, hidden=64)


@pytest.fixture
def tiny(tmp_path, reference):
    """A tiny Llama folder: config.json, model.safetensors, generation_config.json, tokenizer."""
    path = tmp_path / "tiny"
    reference.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def gptq_folder(tmp_path, reference):
    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer

    model = copy.deepcopy(reference)
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=32), method="rtn", device="cpu", verbose=False)
    quantizer.quantize(model)
    return quantizer.save_pretrained(model, tmp_path / "q", make_tokenizer())


def _logits(model, ids=((5, 17, 99, 3, 42),)):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _truncate(file, keep=0.5):
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def _save_pickle_only(model, folder):
    """A folder as old transformers wrote it: config.json + pytorch_model.bin (pickle), no safetensors."""
    folder.mkdir()
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    make_tokenizer().save_pretrained(folder)
    return folder


def test_open_model_resolves_once_and_detects_gptq(tiny, gptq_folder):
    plain = open_model(tiny)
    assert plain.path == tiny.resolve() and not plain.gptq and plain.architectures == ["LlamaForCausalLM"]
    assert open_model(plain) is plain
    quant = open_model(gptq_folder)
    assert quant.gptq and quant.config["quantization_config"]["group_size"] == 32


def test_load_model_returns_the_folder_and_its_tokenizer(tiny, reference):
    loaded = load_model(str(tiny), dtype="fp32", device="cpu")
    assert loaded.folder.path == tiny.resolve() and not loaded.gptq
    torch.testing.assert_close(_logits(loaded.model), _logits(reference))
    assert load_tokenizer(loaded.folder)("hi").input_ids == make_tokenizer()("hi").input_ids


def test_gptq_folder_takes_one_route_for_every_entry_point(gptq_folder):
    """load_causal_lm (the CPU path of `generate`), load_gptq_model and AMDModelForCausalLM (its GPU path)
    build the same QuantLinear model; the CLI's transformers engine generates from it."""
    from optimum_amdx.modeling import AMDModelForCausalLM
    from optimum_amdx.quantization import QuantLinear, load_gptq_model

    plain = load_causal_lm(gptq_folder, dtype="fp32", device="cpu")
    assert isinstance(plain.model.layers[0].mlp.down_proj, QuantLinear)
    torch.testing.assert_close(_logits(plain), _logits(load_gptq_model(gptq_folder, "cpu", torch.float32)))
    am = AMDModelForCausalLM.from_pretrained(gptq_folder, dtype="fp32", device="cpu", num_blocks=16)
    assert am.model_path == gptq_folder.resolve()
    torch.testing.assert_close(_logits(am.model), _logits(plain))
    assert cli(["generate", "--model", str(gptq_folder), "--engine", "transformers", "--device", "cpu",
                "--max-new-tokens", "2", "ab"]) == 0


def test_quantizing_a_gptq_folder_is_refused_clearly(tmp_path, gptq_folder, capsys):
    assert cli(["quantize", "rtn", "--model", str(gptq_folder), str(tmp_path / "again")]) == 2
    assert "is already a GPTQ checkpoint; quantize the original full-precision model" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()


def test_load_gptq_model_refuses_a_plain_folder(tiny):
    from optimum_amdx.quantization import load_gptq_model

    with pytest.raises(InvalidArgumentError, match="no GPTQ quantization_config.*load_causal_lm"):
        load_gptq_model(tiny)


def test_truncated_safetensors_names_the_fix(tmp_path, tiny, capsys):
    bad = _copy(tiny, tmp_path / "truncated")
    _truncate(bad / "model.safetensors")
    with pytest.raises(ModelNotFoundError, match=r"damaged: model.safetensors: it is truncated.*save the model there again"):
        load_causal_lm(bad, device="cpu")
    assert cli(["generate", "--model", str(bad), "--device", "cpu", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "truncated" in err and "Traceback" not in err


def test_unreadable_safetensors_header_names_the_fix(tmp_path, tiny):
    bad = _copy(tiny, tmp_path / "header")
    with open(bad / "model.safetensors", "r+b") as handle:
        handle.write(b"\xff" * 16)
    with pytest.raises(ModelNotFoundError, match="damaged: model.safetensors: its header length"):
        load_causal_lm(bad, device="cpu")
    bad = _copy(tiny, tmp_path / "header-json")
    with open(bad / "model.safetensors", "r+b") as handle:
        handle.seek(8)
        handle.write(b"\x00garbage")
    with pytest.raises(ModelNotFoundError, match="its header is not valid safetensors JSON"):
        load_causal_lm(bad, device="cpu")


def test_damaged_copy_in_our_cache_names_the_folder_to_delete(tmp_path, tiny, monkeypatch):
    """`default` resolves to our converted cache folder; a damaged copy there names that folder."""
    from optimum_amdx.models import bundled

    monkeypatch.setenv("OPTIMUM_AMDX_CACHE", str(tmp_path / "cache"))
    entry = bundled.BUNDLED[bundled.bundled_key("default")]
    _copy(tiny, entry.folder)
    (entry.folder / ".complete").write_text("test\n")
    assert load_causal_lm("default", device="cpu") is not None
    _truncate(entry.folder / "model.safetensors", keep=0.9)
    with pytest.raises(ModelNotFoundError) as info:
        load_causal_lm("default", device="cpu")
    assert f"delete the folder {entry.folder.resolve()} (optimum-amdx's converted copy)" in str(info.value)


def test_damaged_copy_in_the_hub_cache_names_the_repo_folder(tmp_path, tiny, monkeypatch):
    hub = tmp_path / "hub"
    repo = hub / "models--someone--tiny"
    _copy(tiny, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert open_model("someone/tiny").path == (repo / "snapshots" / "0123abcd").resolve()
    (repo / "snapshots" / "0123abcd" / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ModelNotFoundError) as info:
        open_model("someone/tiny")
    message = str(info.value)
    assert "config.json: it is not valid JSON (line 1" in message
    assert f"delete the folder {repo.resolve()} (its copy in the Hugging Face Hub cache)" in message


def test_corrupt_config_json_is_our_error(tmp_path, tiny, capsys):
    bad = _copy(tiny, tmp_path / "cfg")
    (bad / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,,}')
    with pytest.raises(ModelNotFoundError, match=r"config.json: it is not valid JSON \(line 1, column"):
        load_tokenizer(bad)
    from optimum_amdx.distributed.ds_config import load_model_config

    with pytest.raises(ModelNotFoundError, match="config.json: it is not valid JSON"):
        load_model_config(bad)  # deepspeed-config reads the config through the same folder check
    (bad / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelNotFoundError, match="config.json: it holds a JSON list, not an object"):
        load_causal_lm(bad, device="cpu")
    assert cli(["eval-ppl", "--model", str(bad), "--device", "cpu"]) == 2
    assert capsys.readouterr().err.startswith("error: The model in")


def test_damaged_or_missing_tokenizer_is_our_error(tmp_path, tiny):
    bad = _copy(tiny, tmp_path / "tok")
    _truncate(bad / "tokenizer.json")
    with pytest.raises(ModelNotFoundError, match=r"Could not load a tokenizer from .*DecodeError.*save the model there"):
        load_tokenizer(bad)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bad / name).unlink()
    with pytest.raises(ModelNotFoundError, match="Could not load a tokenizer.*tokenizer.save_pretrained"):
        load_tokenizer(bad)


def test_config_without_weights_is_our_error(tmp_path, tiny):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny / "config.json", bare / "config.json")
    with pytest.raises(ModelNotFoundError, match="has config.json but no weights"):
        load_causal_lm(bare, device="cpu")


def test_pickle_only_folder_is_refused_then_works_end_to_end_when_allowed(tmp_path, reference, capsys):
    from optimum_amdx import pipeline
    from optimum_amdx.modeling import AMDModelForCausalLM

    folder = _save_pickle_only(reference, tmp_path / "pickled")
    with pytest.raises(UnsafeWeightsError, match="--allow-pickle / allow_pickle=True"):
        load_causal_lm(folder, device="cpu")
    assert cli(["generate", "--model", str(folder), "--device", "cpu", "hi"]) == 2
    assert "--allow-pickle" in capsys.readouterr().err
    torch.testing.assert_close(_logits(load_causal_lm(folder, device="cpu", allow_pickle=True)), _logits(reference))
    assert load_tokenizer(folder, allow_pickle=True)("ab").input_ids == make_tokenizer()("ab").input_ids
    am = AMDModelForCausalLM.from_pretrained(folder, device="cpu", dtype="fp32", allow_pickle=True, num_blocks=16)
    torch.testing.assert_close(_logits(am.model), _logits(reference))
    for engine in ("transformers", "amdx"):
        assert cli(["generate", "--model", str(folder), "--allow-pickle", "--engine", engine, "--device", "cpu",
                    "--max-new-tokens", "2", "ab"]) == 0, capsys.readouterr().err
    pipe = pipeline("text-generation", model=str(folder), accelerator="rocm", allow_pickle=True)
    assert pipe("ab", max_new_tokens=2, do_sample=False)[0]["generated_text"].startswith("ab")


def test_allow_pickle_flag_on_quantize_and_eval_ppl(tmp_path, reference, capsys):
    """Every command whose refusal recommends --allow-pickle accepts it."""
    folder = _save_pickle_only(reference, tmp_path / "pickled")
    assert cli(["quantize", "rtn", "--model", str(folder), str(tmp_path / "q")]) == 2
    assert "--allow-pickle" in capsys.readouterr().err and not (tmp_path / "q").exists()
    assert cli(["quantize", "rtn", "--model", str(folder), "--allow-pickle", "--json", str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "quantize_config.json").exists() or (tmp_path / "q" / "config.json").exists()
    capsys.readouterr()
    args = ["eval-ppl", "--model", str(folder), "--device", "cpu", "--seqlen", "16", "--max-windows", "1", "--json"]
    assert cli(args) == 2 and "--allow-pickle" in capsys.readouterr().err
    assert cli(args + ["--allow-pickle"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    bench = ["benchmark", "--model", str(folder), "--backends", "rocm", "--device", "cpu", "--batch-sizes", "1",
             "--prompt-lengths", "4", "--new-tokens", "2", "--warmup", "0", "--repeats", "1", "--no-plots", "--json",
             "-o", str(tmp_path / "bench")]
    assert cli(bench) == 2 and "--allow-pickle" in capsys.readouterr().err
    assert cli(bench + ["--allow-pickle"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["results"][0]["status"] == "ok"


def test_allow_pickle_still_prefers_safetensors(tmp_path, tiny, reference):
    """With both files present, allow_pickle=True must not switch to the pickle (here: other weights)."""
    other = make_llama(seed=99, hidden=64)
    torch.save(other.state_dict(), tiny / "pytorch_model.bin")
    torch.testing.assert_close(_logits(load_causal_lm(tiny, device="cpu", allow_pickle=True)), _logits(reference))


def test_pipeline_refuses_options_of_the_other_accelerator(tiny):
    from optimum_amdx import pipeline

    with pytest.raises(InvalidArgumentError, match=r"does not use provider: provider applies to accelerator='ort'"):
        pipeline("text-generation", model=str(tiny), accelerator="rocm", provider="cpu")
    with pytest.raises(InvalidArgumentError, match=r"does not use dtype, allow_pickle: dtype applies to "
                                                   r"accelerator='rocm' / None"):
        pipeline("text-generation", model=str(tiny), accelerator="ort", dtype="fp16", allow_pickle=True)
    with pytest.raises(InvalidArgumentError, match="use_io_binding, export_kwargs"):
        pipeline("text-generation", model=str(tiny), accelerator=None, use_io_binding=False, export_kwargs={})


def test_attn_implementation_amdx_through_the_loader(tiny, reference):
    model = load_causal_lm(tiny, dtype="fp32", device="cpu", attn_implementation="amdx")
    assert model.config._attn_implementation == "amdx"
    torch.testing.assert_close(_logits(model), _logits(reference), atol=1e-4, rtol=1e-4)
