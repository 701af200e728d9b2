"""Mistakes in quantize / eval-ppl are found before the model loads; CPU runs get a size that runs in minutes."""

from __future__ import annotations

import argparse
import warnings

import pytest
import torch

import optimum_amdx.models as models
from optimum_amdx.cli.main import main
from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer
from optimum_amdx.quantization.estimate import cpu_cost_warning, gptq_flops

from .conftest import make_llama


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a command gets as far as loading model weights."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was noticed")
    import optimum_amdx.quantization as quantization

    for module, name in [(models, "load_causal_lm"), (models, "load_model"), (quantization, "load_gptq_model")]:
        monkeypatch.setattr(module, name, refuse, raising=False)


def _run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("method", ["gptq", "rtn"])
def test_quantize_output_problems_are_found_before_loading(tmp_path, tiny_dir, capsys, no_model_load, method):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    (tmp_path / "afile").write_text("x")
    for output, extra, match in [
        (busy, [], "not empty"),
        (busy, ["--overwrite"], "not written by optimum-amdx"),
        (tmp_path / "afile" / "q", [], "is a file, not a folder"),
        ("/proc/amdx-q", [], "not writable"),
        (tmp_path / "q", ["--max-shard-size", "5 gigs"], "--max-shard-size"),
        (tmp_path / "q", ["--max-shard-size", "0"], "larger than zero"),
    ]:
        code, err = _run(capsys, "quantize", method, "--model", str(tiny_dir), *extra, str(output))
        assert code == 2 and match in err, err
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "busy", "tiny_fp"]


def test_quantize_missing_calibration_file_is_found_before_loading(tmp_path, tiny_dir, capsys, no_model_load):
    code, err = _run(capsys, "quantize", "gptq", "--model", str(tiny_dir), "--dataset", str(tmp_path / "none.txt"),
                     "--samples", "2", "--seqlen", "32", str(tmp_path / "q"))
    assert code == 2 and "does not exist" in err


def test_python_save_checks_the_shard_size(tokenizer, tmp_path):
    model = make_llama()
    quantizer = GPTQQuantizer(GPTQConfig(), method="rtn", verbose=False)
    quantizer.quantize(model, tokenizer)
    with pytest.raises(InvalidArgumentError, match="max_shard_size"):
        quantizer.save_pretrained(model, tmp_path / "q", max_shard_size="lots")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra,match", [
    (["--seqlen", "0"], "at least 2 tokens"),
    (["--seqlen", "1"], "at least 2 tokens"),
    (["--seqlen", "-5"], "at least 2 tokens"),
    (["--max-windows", "0"], "max-windows"),
    (["--seqlen", "1024"], "longer than the model's context length \\(512\\)"),
])
def test_eval_ppl_invalid_sizes_error_up_front(tiny_dir, capsys, no_model_load, extra, match):
    code, err = _run(capsys, "eval-ppl", "--model", str(tiny_dir), *extra)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and __import__("re").search(match, err), err


def test_perplexity_function_checks_sizes():
    from optimum_amdx.quantization import perplexity

    model = make_llama()
    with pytest.raises(InvalidArgumentError, match="at least 2 tokens"):
        perplexity(model, torch.arange(100), seqlen=0)
    with pytest.raises(InvalidArgumentError, match="context length"):
        perplexity(model, torch.arange(2000), seqlen=1024)


def test_calibration_past_the_context_length_warns(tokenizer):
    model = make_llama()  # max_position_embeddings 512
    samples = [torch.randint(0, 256, (1, 600)) for _ in range(2)]
    with pytest.warns(UserWarning, match="longer than the model's context length \\(512\\)"):
        GPTQQuantizer(GPTQConfig(), verbose=False).quantize(model, tokenizer, samples)


def test_cpu_defaults_are_small_and_announced(capsys):
    from optimum_amdx.cli.commands.quantize import _calibration_size

    args = argparse.Namespace(samples=None, seqlen=None, json=False)
    assert _calibration_size(args, "cpu") == (32, 512)
    assert "128 x 2048, takes hours on a CPU" in capsys.readouterr().err
    assert _calibration_size(args, "cuda") == (128, 2048)
    assert _calibration_size(argparse.Namespace(samples=8, seqlen=64, json=False), "cpu") == (8, 64)


def test_long_cpu_runs_are_announced_with_a_cheaper_setting():
    model = make_llama(hidden=256, layers=4)
    assert gptq_flops(model, 128, 2048) > 10 * gptq_flops(model, 32, 512)
    message = cpu_cost_warning(model, 128, 2048, threshold_s=0.0)
    assert "will take about" in message and "--samples 32 --seqlen 512" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu_cost_warning(model, 2, 32) is None  # a small run: no warning, nothing measured


def test_python_overwrite_never_removes_a_users_files(tokenizer, tmp_path):
    from optimum_amdx.errors import OutputExistsError

    model = make_llama()
    quantizer = GPTQQuantizer(GPTQConfig(), method="rtn", verbose=False)
    quantizer.quantize(model, tokenizer)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('mine')")
    with pytest.raises(OutputExistsError, match="not written by optimum-amdx.*train.py"):
        quantizer.save_pretrained(model, project, tokenizer, overwrite=True)
    assert [p.name for p in project.iterdir()] == ["train.py"]
    first = quantizer.save_pretrained(model, tmp_path / "q", tokenizer)
    again = quantizer.save_pretrained(model, tmp_path / "q", tokenizer, overwrite=True)  # our own output: replaced
    assert first == again and (again / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "q"]


def test_sigterm_while_quantize_writes_leaves_nothing(tmp_path, tiny_dir):
    """A real `optimum-amdx quantize rtn` process gets SIGTERM while it writes its shards."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent("""
        import sys, time
        import safetensors.torch as st
        real = st.save_file
        def slow_save(*args, **kwargs):
            real(*args, **kwargs)
            print("writing", flush=True)
            time.sleep(60)
        st.save_file = slow_save
        from optimum_amdx.cli.main import main
        sys.exit(main(sys.argv[1:]))
    """)
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "work" / "q"
    out.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", script, "quantize", "rtn", "--model", str(tiny_dir), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:  # the RTN summary comes first
        if line.strip() == "writing":
            break
    else:
        raise AssertionError(proc.stderr.read())
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    assert code in (130, 143), proc.stderr.read()
    assert "Traceback" not in proc.stderr.read()
    assert list(out.parent.iterdir()) == []  # neither the output nor a hidden .q.tmp-* folder


def test_readme_quantize_steps_run_in_order():
    """Every README step that writes a quantized folder either writes a new one or passes --overwrite /
    overwrite=True for one an earlier step wrote (the snippet used to fail after 98 s on an existing folder)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    written: set[str] = set()
    steps = 0
    for line in readme.splitlines():
        line = line.split("#")[0].strip()
        cli = re.match(r"optimum-amdx quantize (gptq|rtn) (.*)", line)
        py = re.search(r"save_pretrained\(model, \"([^\"]+)\"(.*)\)", line)
        if cli:
            folder, again_ok = cli.group(2).split()[-1].rstrip("/"), "--overwrite" in cli.group(2)
        elif py:
            folder, again_ok = py.group(1).rstrip("/"), "overwrite=True" in py.group(2)
        else:
            continue
        steps += 1
        assert folder not in written or again_ok, f"README step writes {folder!r} again without overwrite: {line}"
        written.add(folder)
    assert steps >= 4
