"""The env report on this machine, the `optimum-amdx` CLI, and its optimum-cli registration, as real subprocesses."""

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def _run(*cmd, env=None, timeout=300):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)


def test_env_json_on_this_machine():
    result = _run(str(BIN / "optimum-amdx"), "env", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["schema"] == "optimum-amdx.env/1"
    assert report["torch"]["backend"] in ("cpu", "cuda", "rocm")
    assert isinstance(report["gpus"], list)
    assert "CPUExecutionProvider" in report["onnxruntime"]["providers"]
    assert report["triton"]["installed"] is True
    assert isinstance(report["problems"], list)


def test_env_table_is_readable():
    result = _run(str(BIN / "optimum-amdx"), "env")
    assert result.returncode == 0, result.stderr
    for label in ("backend", "NUMA balancing", "onnxruntime", "triton", "HIP_VISIBLE_DEVICES"):
        assert label in result.stdout


def test_optimum_cli_lists_amdx():
    result = _run(str(BIN / "optimum-cli"), "--help")
    assert result.returncode == 0, result.stderr
    assert "amdx" in result.stdout


def test_optimum_cli_amdx_env_json():
    result = _run(str(BIN / "optimum-cli"), "amdx", "env", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["torch"]["backend"] and "providers" in report["onnxruntime"]


def test_broken_register_file_does_not_break_optimum_cli():
    code = (
        "import sys, warnings\n"
        "sys.modules['optimum_amdx.cli.main'] = None\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import optimum.commands.register.register_amdx as m\n"
        "print(m.REGISTER_COMMANDS, any('could not register' in str(w.message) for w in caught))\n"
    )
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] True"


def test_import_is_light():
    code = (
        "import sys, optimum_amdx, optimum_amdx.cli.main as m\n"
        "m.build_parser()\n"
        "heavy = [n for n in ('torch', 'onnxruntime', 'transformers', 'triton') if n in sys.modules]\n"
        "print(heavy)\n"
    )
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_unknown_model_is_a_clear_cli_error(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = _run(str(BIN / "optimum-amdx"), "generate", "--model", str(tmp_path / "nope"), "hi", env=env)
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr
