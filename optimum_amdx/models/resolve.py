"""Turn what a user typed (a bundled name, a local folder, a hub id) into a local model folder.

Weights are loaded from safetensors only: a folder holding nothing but pickle files (.bin/.pt)
is refused unless the caller opts in, because unpickling runs arbitrary code.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelNotFoundError, UnsafeWeightsError
from . import bundled

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]


def resolve_model(name_or_path: str | os.PathLike, allow_pickle: bool = False, revision: str | None = None) -> Path:
    """Return a local folder with config.json and safetensors weights for `name_or_path`.

    `name_or_path` is "default" (alias "smollm2-135m"), "all-minilm-l6-v2", a local folder, or a
    Hugging Face Hub id (downloaded to the Hub cache, or found there when offline).
    """
    text = str(name_or_path)
    key = bundled.bundled_key(text)
    if key is not None and not Path(text).exists():
        return bundled.materialize(bundled.BUNDLED[key])
    path = Path(text).expanduser()
    if path.exists():
        return check_model_dir(path, allow_pickle)
    if _looks_like_path(text):
        raise ModelNotFoundError(
            f"Model folder {text!r} does not exist. Give an existing folder, a Hub id such as "
            f"'HuggingFaceTB/SmolLM2-135M-Instruct', or 'default' for the bundled SmolLM2-135M."
        )
    return check_model_dir(_download(text, revision, allow_pickle), allow_pickle)


def check_model_dir(path: Path, allow_pickle: bool = False) -> Path:
    """Validate a local model folder: config.json present, weights in safetensors (or pickle if allowed)."""
    path = path.resolve()
    if not path.is_dir():
        raise ModelNotFoundError(f"{path} is a file, not a model folder. Pass the folder that holds config.json.")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"Model folder {path} has no config.json. Point at a folder written by save_pretrained(), "
            "or use 'default' for the bundled model."
        )
    has_safetensors = any(path.glob("*.safetensors"))
    pickles = [p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES]
    if not has_safetensors and pickles and not allow_pickle:
        raise UnsafeWeightsError(
            f"Model folder {path} has only pickle weights ({', '.join(sorted(pickles)[:3])}); loading them can run "
            "arbitrary code. Convert them to safetensors (model.save_pretrained(dir, safe_serialization=True)), "
            "or pass --allow-pickle / allow_pickle=True if you trust the source."
        )
    return path


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep in text and text.count("/") != 1


def _download(repo_id: str, revision: str | None, allow_pickle: bool) -> Path:
    from huggingface_hub import snapshot_download

    patterns = list(_HUB_PATTERNS) + (["*.bin", "*.pt"] if allow_pickle else [])
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except Exception as err:  # noqa: BLE001 - every hub failure becomes one clear message
        try:
            return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True))
        except Exception:  # noqa: BLE001
            pass
        raise ModelNotFoundError(
            f"Could not find model {repo_id!r}: it is not a local folder, not a bundled name "
            f"({', '.join(sorted(set(bundled.ALIASES) | set(bundled.BUNDLED)))}), and the Hugging Face Hub did not "
            f"provide it ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). "
            "Fix: check the id, log in for gated models, or pass a local folder."
        ) from None
