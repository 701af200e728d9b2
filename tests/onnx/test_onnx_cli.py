"""`optimum-cli export rocm` and `optimum-amdx export`: wiring, output, exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optimum_amdx.cli.main import main


def _optimum_cli() -> list[str]:
    exe = Path(sys.executable).with_name("optimum-cli")
    return [str(exe)] if exe.exists() else [shutil.which("optimum-cli") or "optimum-cli"]


def test_optimum_cli_export_rocm_help():
    proc = subprocess.run([*_optimum_cli(), "export", "rocm", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--model", "--task", "--dtype", "--static-shapes", "--optimize", "--overwrite", "--external-data"):
        assert flag in proc.stdout


def test_optimum_amdx_export_writes_folder_and_json(tmp_path, tiny_bert_cls_dir, capsys):
    out = tmp_path / "cls"
    code = main(["export", "--model", str(tiny_bert_cls_dir), str(out), "--optimize", "--static-shapes", "batch=1,2",
                 "--static-shapes", "sequence=8", "--json"])
    assert code == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["task"] == "text-classification" and meta["optimization"]["level"] == "extended"
    assert sorted(meta["static_bucket_files"]) == ["model_b1_s8.onnx", "model_b2_s8.onnx"]
    assert (out / "model.onnx").is_file() and (out / "amdx_export.json").is_file()


def test_cli_errors_exit_2_and_keep_existing_output(tmp_path, tiny_bert_cls_dir, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["export", "--model", str(tiny_bert_cls_dir), str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert main(["export", "--model", str(tiny_bert_cls_dir), str(tmp_path / "x"), "--static-shapes", "batch=0"]) == 2
    assert "static-shapes" in capsys.readouterr().err or not (tmp_path / "x").exists()


@pytest.mark.parametrize("bad", [["batch=1"], ["rows=1,sequence=8"], ["batch=a,sequence=8"]])
def test_static_shapes_parsing_errors(tmp_path, tiny_bert_cls_dir, capsys, bad):
    assert main(["export", "--model", str(tiny_bert_cls_dir), str(tmp_path / "x"), "--static-shapes", *bad]) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
