"""Two CPU processes over gloo, started by `optimum-amdx launch --cpu`: TP generation and a DeepSpeed fine-tune."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def launch(args: list[str], env_extra: dict[str, str] | None = None, timeout: int = 400):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "optimum_amdx", "launch", "--cpu", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    from optimum_amdx.models.shapes import shape_config

    torch.manual_seed(1234)
    out = tmp_path_factory.mktemp("tiny")
    AutoModelForCausalLM.from_config(shape_config("tiny-llama"), dtype=torch.float32).save_pretrained(out)
    return out


def test_transformers_tp2_over_gloo_equals_one_process(tiny_model, tmp_path, monkeypatch):
    from optimum_amdx.distributed import tp

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OPTIMUM_AMDX_DEVICE", "cpu")
    reference = tp.run(tiny_model, backend="none", dtype="float32", batch=[2], prompt_len=12, max_new_tokens=16,
                       repeats=0, seed=5)
    out = tmp_path / "tp2.json"
    proc = launch(["--gpus", "2", "--", "examples/tp_generate.py", "--model", str(tiny_model), "--backend",
                   "transformers", "--dtype", "float32", "--batch", "2", "--prompt-len", "12", "--max-new-tokens",
                   "16", "--repeats", "1", "--seed", "5", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["backend"] == "transformers"
    assert len(set(map(tuple, reference["tokens"]))) == 2  # two different random prompts
    assert result["tokens"] == reference["tokens"]


@pytest.mark.slow  # about 2 minutes on a fresh machine: DeepSpeed JIT-builds its CPU shared-memory comm op
def test_deepspeed_zero2_finetune_on_two_cpu_processes(tmp_path):
    pytest.importorskip("deepspeed")
    out = tmp_path / "ft.json"
    proc = launch(["--gpus", "2", "--", "examples/deepspeed_finetune.py", "--tiny", "--zero-stage", "2",
                   "--steps", "6", "--out", str(out)], {"DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["zero_stage_run"] == 2 and result["world_size"] == 2
    assert result["config"]["zero_optimization"]["stage"] == 2
    losses = result["losses"]
    assert len(losses) == 6 and all(x == x for x in losses)  # finite
    assert min(losses[-2:]) < max(losses[:2])  # the repeated-motif data is learnable: loss goes down
