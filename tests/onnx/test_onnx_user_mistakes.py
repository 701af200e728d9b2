"""Issue 12's ONNX findings: no data loss, the README's export commands as written, clear errors."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from optimum_amdx.cli.main import main
from optimum_amdx.errors import ExportValidationError, HardwareError, InvalidArgumentError, OutputExistsError
from optimum_amdx.exporters.validate import ValidationReport, check, record
from optimum_amdx.onnxruntime import ORTModelForCausalLM, ORTModelForSequenceClassification

ROOT = Path(__file__).resolve().parents[2]


def test_export_with_cache_dir_never_touches_the_cache_root(tmp_path, tiny_qwen2_dir, folder_snapshot):
    hub = tmp_path / "hub-cache"  # what a user would pass: the shared Hugging Face cache root
    (hub / "models--someone--model" / "snapshots").mkdir(parents=True)
    (hub / "models--someone--model" / "snapshots" / "weights.safetensors").write_bytes(b"precious")
    (hub / "version.txt").write_text("1")
    before = folder_snapshot(hub)
    model = ORTModelForCausalLM.from_pretrained(tiny_qwen2_dir, export=True, cache_dir=hub, provider="cpu")
    after = folder_snapshot(hub)
    assert {k: v for k, v in after.items() if k in before} == before  # every file of the user's is still there
    assert model.model_path.parent == (hub / "optimum_amdx_onnx").resolve()
    # Loading again reuses the export; a foreign, incomplete folder in our subfolder is refused, not replaced.
    again = ORTModelForCausalLM.from_pretrained(tiny_qwen2_dir, export=True, cache_dir=hub, provider="cpu")
    assert again.model_path == model.model_path
    for f in model.model_path.iterdir():
        f.unlink()
    (model.model_path / "someone-elses.txt").write_text("keep")
    with pytest.raises(OutputExistsError, match="not a complete optimum-amdx export"):
        ORTModelForCausalLM.from_pretrained(tiny_qwen2_dir, export=True, cache_dir=hub, provider="cpu")
    assert (model.model_path / "someone-elses.txt").read_text() == "keep"


def test_save_pretrained_adds_to_a_folder(tmp_path, bert_cls_onnx):
    target = tmp_path / "project"
    target.mkdir()
    (target / "notes.md").write_text("mine")
    (target / "model.onnx").write_bytes(b"old export")
    model = ORTModelForSequenceClassification.from_pretrained(bert_cls_onnx)
    with pytest.raises(OutputExistsError, match="model.onnx"):
        model.save_pretrained(target, overwrite=False)
    assert (target / "model.onnx").read_bytes() == b"old export"
    model.save_pretrained(target)
    assert (target / "notes.md").read_text() == "mine"
    assert (target / "model.onnx").read_bytes() == (bert_cls_onnx / "model.onnx").read_bytes()
    assert not [p for p in target.iterdir() if p.name.startswith(".")]
    ids = torch.randint(10, 3000, (2, 6), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(ORTModelForSequenceClassification.from_pretrained(target)(ids).logits,
                               model(ids).logits)


def test_loaded_model_export_leaves_no_temp_folder(tiny_llama_dir, tmp_path, monkeypatch):
    import tempfile

    from transformers import AutoModelForCausalLM

    from optimum_amdx import pipeline

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pt = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    from transformers import AutoTokenizer

    pipe = pipeline("text-generation", model=pt, tokenizer=AutoTokenizer.from_pretrained(tiny_llama_dir),
                    accelerator="ort")
    assert isinstance(pipe.model, ORTModelForCausalLM) and str(tmp_path) in str(pipe.model.model_path)
    assert pipe("Once upon", max_new_tokens=2, do_sample=False)[0]["generated_text"].startswith("Once upon")
    del pipe
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_static_shapes_argument_forms():
    from optimum_amdx.cli.commands.export import parse_static_shapes

    one = parse_static_shapes(["batch=1,8,sequence=128,512"])
    assert (one.batch_sizes, one.sequence_lengths, one.capacity) == ((1, 8), (128, 512), None)
    assert parse_static_shapes(["batch=1,8", "sequence=128,512"]) == one  # repeated flags
    dec = parse_static_shapes(["batch=1,4,seq=64,capacity=512"])
    assert (dec.batch_sizes, dec.sequence_lengths, dec.capacity) == ((1, 4), (64,), 512)
    for bad, msg in ((["batch=1"], "both batch"), (["rows=1,sequence=8"], "unknown key 'rows'"),
                     (["batch=a,sequence=8"], "integers"), (["8,batch=1,sequence=8"], "has no key"),
                     (["batch=1,sequence=8,capacity=64,128"], "one size"),
                     (["batch=1,batch=2,sequence=8"], "twice")):
        with pytest.raises(InvalidArgumentError, match=msg):
            parse_static_shapes(bad)


def test_readme_static_shapes_command_order(tmp_path, tiny_bert_dir, capsys):
    # The README's order: flags first, the output path last (it was swallowed by --static-shapes before).
    out = tmp_path / "minilm"
    assert main(["export", "--model", str(tiny_bert_dir), "--optimize", "--static-shapes", "batch=1,2,sequence=8,16",
                 str(out)]) == 0
    assert "4 bucket" in capsys.readouterr().out or (out / "model_b2_s16.onnx").is_file()
    assert sorted(p.name for p in out.glob("model_b*")) == ["model_b1_s16.onnx", "model_b1_s8.onnx",
                                                             "model_b2_s16.onnx", "model_b2_s8.onnx"]


def test_export_allow_pickle_flag(tmp_path, tiny_bert_cls_dir, capsys):
    from transformers import AutoModelForSequenceClassification

    src = tmp_path / "pickled"
    src.mkdir()
    for f in tiny_bert_cls_dir.iterdir():
        if f.suffix != ".safetensors":
            (src / f.name).write_bytes(f.read_bytes())
    state = AutoModelForSequenceClassification.from_pretrained(tiny_bert_cls_dir).state_dict()
    torch.save(state, src / "pytorch_model.bin")
    assert main(["export", "--model", str(src), str(tmp_path / "refused")]) == 2
    assert "--allow-pickle" in capsys.readouterr().err and not (tmp_path / "refused").exists()
    assert main(["export", "--model", str(src), "--allow-pickle", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "model.onnx").is_file()


def test_no_torchvision_notices_on_export(tmp_path, tiny_bert_cls_dir):
    proc = subprocess.run([sys.executable, "-m", "optimum_amdx", "export", "--model", str(tiny_bert_cls_dir),
                           "--no-validate", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torchvision is not installed" not in proc.stderr + proc.stdout


def test_missing_onnx_packages_name_the_extra(monkeypatch, tiny_bert_cls_dir, bert_cls_onnx, tmp_path):
    from optimum_amdx.exporters import export_model

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript -> ImportError
    with pytest.raises(HardwareError, match=r'onnxscript.*pip install "optimum-amdx\[onnx\]"'):
        export_model(tiny_bert_cls_dir, tmp_path / "out")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(HardwareError, match=r'onnxruntime.*pip install "optimum-amdx\[onnx\]"'):
        ORTModelForSequenceClassification.from_pretrained(bert_cls_onnx)
    assert not (tmp_path / "out").exists()


def test_fp16_is_judged_against_fp32():
    # SmolLM2-135M on the CPU, measured: ONNX fp16 is 0.04 from fp32, PyTorch fp16 0.12 (they differ by 0.10-0.21).
    ref32 = np.zeros((2, 4), np.float32)
    torch16 = torch.full((2, 4), 0.12)
    report = ValidationReport(atol=0.05)
    record(report, "prefill.logits", np.full((2, 4), 0.043, np.float16), torch16, torch.from_numpy(ref32))
    assert check(report, "model.onnx", optimized=True).to_dict()["reference"] == "fp32"
    report = ValidationReport(atol=0.05)
    record(report, "prefill.logits", np.full((2, 4), 0.5, np.float16), torch16, torch.from_numpy(ref32))
    with pytest.raises(ExportValidationError, match=r"max abs diff 0.5 > bound 0.18 = 1.5x PyTorch fp16's own 0.12.*export in fp32") as err:
        check(report, "model.onnx", optimized=False)
    assert "--optimize" not in str(err.value)  # only suggested when it was used


def test_fp16_export_validates_on_cpu(tmp_path, tiny_llama_dir):
    from optimum_amdx.exporters import export_model

    meta = export_model(tiny_llama_dir, tmp_path / "fp16", dtype="fp16").metadata
    val = meta["validation"]
    assert meta["dtype"] == "fp16" and val["reference"] == "fp32"
    assert all(val["per_output"][k] <= val["bound"][k] for k in val["per_output"])
