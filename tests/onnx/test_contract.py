"""The torch-free ONNX contract shared by exporter and runtime, and what the runtime imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optimum_amdx.errors import ExportValidationError
from optimum_amdx.exporters import contract

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_contract_imports_neither_torch_nor_onnx():
    out = _python("import sys; import optimum_amdx.exporters.contract, optimum_amdx.exporters.static, "
                  "optimum_amdx.exporters.tasks; print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', "
                  "'transformers') if m in sys.modules))")
    assert out.strip() == "[]"


def test_runtime_loads_an_export_without_the_exporter(bert_cls_onnx):
    out = _python(
        "import sys; from optimum_amdx.onnxruntime import ORTModelForSequenceClassification as C; "
        f"m = C.from_pretrained({str(bert_cls_onnx)!r}, provider='cpu'); "
        "print(sorted(n for n in sys.modules if n.startswith(('optimum_amdx.exporters.', 'onnxscript'))))")
    loaded = eval(out.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's repr of a list of str
    assert "optimum_amdx.exporters.contract" in loaded
    assert not [m for m in loaded if m.endswith(("convert", "wrappers", "validate", "optimize")) or "onnxscript" in m]


def test_names_and_graph_roles():
    assert contract.decoder_input_names(2)[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert contract.decoder_input_names(1, static=True) == [
        "input_ids", "attention_mask", "position_ids", "cache_position", "past_key_values.0.key",
        "past_key_values.0.value"]
    assert contract.decoder_output_names(1) == ["logits", "present.0.key", "present.0.value"]
    assert contract.prefill_file(1, 64) == "prefill_b1_s64.onnx" and contract.decode_file(8) == "decode_b8.onnx"
    meta = {"graphs": [{"file": "model.onnx", "role": "main"},
                       {"file": "decode_b1.onnx", "role": "decode", "batch": 1, "sequence": 1}]}
    assert contract.graph_for(meta, contract.ROLE_DECODE, 1).file == "decode_b1.onnx"
    assert contract.graph_for(meta, contract.ROLE_DECODE, 2) is None
    # Exports written before "graphs" existed still list their encoder buckets.
    old = {"static_shapes": {"batch_sizes": [1], "sequence_lengths": [8, 16]}}
    assert [g.file for g in contract.graphs(old)] == ["model.onnx", "model_b1_s8.onnx", "model_b1_s16.onnx"]


def test_metadata_round_trip_and_damage(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"x")
    (tmp_path / "user-notes.txt").write_text("not ours")
    contract.write_metadata(tmp_path, {"task": "text-generation"})
    meta = contract.read_metadata(tmp_path)
    assert meta["contract_version"] == contract.CONTRACT_VERSION and meta["task"] == "text-generation"
    assert "amdx_export.json" in meta["files"] and "model.onnx" in meta["files"]
    assert contract.read_metadata(tmp_path / "nowhere") is None
    (tmp_path / contract.METADATA_FILE).write_text("{broken")
    with pytest.raises(ExportValidationError, match="not valid JSON"):
        contract.read_metadata(tmp_path)
    (tmp_path / contract.METADATA_FILE).write_text(json.dumps({"tokenizer_files": ["tokenizer.json"]}))
    assert contract.export_files(tmp_path) == ["amdx_export.json", "model.onnx"]
