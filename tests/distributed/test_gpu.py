"""Two GPUs (device machine): TP=2 greedy tokens equal TP=1, and a DeepSpeed ZeRO-3 fine-tune."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]


def launch(args: list[str], timeout: int = 300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])))
    return subprocess.run([sys.executable, "-m", "optimum_amdx", "launch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from optimum_amdx.models.shapes import shape_config

    torch.manual_seed(4321)
    out = tmp_path_factory.mktemp("small")
    config = shape_config("tiny-llama", hidden_size=256, intermediate_size=512, num_attention_heads=8,
                          num_key_value_heads=4, num_hidden_layers=4, vocab_size=1024)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return out


@pytest.mark.parametrize("backend", ["transformers", "deepspeed"])
def test_tp2_on_two_gpus_equals_one_gpu(small_model, tmp_path, backend):
    if backend == "deepspeed":
        pytest.importorskip("deepspeed")
    common = ["--model", str(small_model), "--dtype", "float32", "--batch", "3", "--prompt-len", "16",
              "--max-new-tokens", "24", "--repeats", "1", "--seed", "9"]
    ref_out, tp_out = tmp_path / "tp1.json", tmp_path / "tp2.json"
    proc = launch(["--gpus", "1", "--", "examples/tp_generate.py", "--backend", "none", *common, "--out", str(ref_out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = launch(["--gpus", "2", "--", "examples/tp_generate.py", "--backend", backend, *common, "--out", str(tp_out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref, tp = json.loads(ref_out.read_text()), json.loads(tp_out.read_text())
    assert tp["world_size"] == 2 and tp["device"] != "cpu"
    assert tp["tokens"] == ref["tokens"]


def test_deepspeed_zero3_finetune_on_two_gpus(tmp_path):
    pytest.importorskip("deepspeed")
    out = tmp_path / "ft.json"
    proc = launch(["--gpus", "2", "--", "examples/deepspeed_finetune.py", "--tiny", "--zero-stage", "3", "--steps",
                   "6", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["zero_stage_run"] == 3 and result["world_size"] == 2 and result["device"] != "cpu"
    assert min(result["losses"][-2:]) < max(result["losses"][:2])
