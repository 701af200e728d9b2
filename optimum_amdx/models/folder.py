"""A model name resolved once: `open_model(name)` -> `ModelFolder` (folder, config.json, GPTQ or not).

Every entry point (CLI commands, `pipeline()`, `AMDModelForCausalLM.from_pretrained`, the benchmark)
resolves what the user typed here, once, and passes the `ModelFolder` on: the weights and the
tokenizer then come from the same folder, with the same `allow_pickle` / `trust_remote_code` choice,
and "is this a GPTQ checkpoint?" is answered in one place.

Damaged inputs are reported here in our words, naming the fix: a config.json that is not JSON, a
safetensors file whose header is unreadable or which is shorter (or longer) than its header says.
For a copy in our own cache or in the Hugging Face Hub cache the message names the folder to delete.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import ModelNotFoundError
from .resolve import resolve_model

_MAX_HEADER = 100 * 2**20
"""safetensors refuses headers above 100 MB; anything larger is a damaged length field."""


@dataclass(frozen=True)
class ModelFolder:
    """A resolved model: its local folder, parsed config.json, and the safety choices it was opened with.

    It is `os.PathLike` (the folder), so it can go wherever a path goes, e.g. to
    `AutoTokenizer.from_pretrained`.
    """

    name: str
    path: Path
    config: dict[str, Any]
    allow_pickle: bool = False
    trust_remote_code: bool = False

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def gptq(self) -> bool:
        """True when config.json declares a GPTQ `quantization_config` (loaded through our QuantLinear)."""
        from ..quantization.config import declares_gptq

        return declares_gptq(self.config)

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    def weight_files(self) -> list[Path]:
        """The safetensors files of the model (every shard when an index is present)."""
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            data = _read_json(index, self.path)
            try:
                return [self.path / f for f in sorted(set(data["weight_map"].values()))]
            except (KeyError, AttributeError, TypeError):
                raise _damaged(self.path, index, "it has no valid 'weight_map'") from None
        return sorted(self.path.glob("*.safetensors"))

    def check_weights(self) -> None:
        """Raise `ModelNotFoundError` naming the fix when a safetensors file is missing, truncated or unreadable."""
        for file in self.weight_files():
            if not file.is_file():
                raise _damaged(self.path, file, "the index names it but the file is missing")
            check_safetensors(file, self.path)


def open_model(name_or_path: "str | os.PathLike | ModelFolder", allow_pickle: bool = False,
               trust_remote_code: bool = False, revision: str | None = None) -> ModelFolder:
    """Resolve `name_or_path` (`default` / a bundled alias / a local folder / a Hub id) and read its config.

    A `ModelFolder` passed in is returned as is, with `allow_pickle` / `trust_remote_code` switched on
    when asked here (opting in twice is fine; an earlier opt-in is never taken back).
    """
    if isinstance(name_or_path, ModelFolder):
        if (allow_pickle and not name_or_path.allow_pickle) or (trust_remote_code and not name_or_path.trust_remote_code):
            return ModelFolder(name_or_path.name, name_or_path.path, name_or_path.config,
                               name_or_path.allow_pickle or allow_pickle,
                               name_or_path.trust_remote_code or trust_remote_code)
        return name_or_path
    path = resolve_model(name_or_path, allow_pickle=allow_pickle, revision=revision)
    config = _read_json(path / "config.json", path)
    if not isinstance(config, dict):
        raise _damaged(path, path / "config.json", f"it holds a JSON {type(config).__name__}, not an object")
    return ModelFolder(str(name_or_path), path, config, allow_pickle, trust_remote_code)


def check_safetensors(file: Path, folder: Path) -> None:
    """Check a safetensors file's framing without reading its tensors: header length, JSON, total size."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise _damaged(folder, file, f"it has {size} bytes, fewer than a safetensors header")
        n = int.from_bytes(head, "little")
        if n > min(size - 8, _MAX_HEADER):
            raise _damaged(folder, file, f"its header length field says {n} bytes but the file has {size}")
        try:
            header = json.loads(handle.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError):
            raise _damaged(folder, file, "its header is not valid safetensors JSON") from None
    if 8 + n + end != size:
        what = "truncated" if 8 + n + end > size else "longer than its header says"
        raise _damaged(folder, file, f"it is {what}: {size} bytes on disk, the header describes {8 + n + end}")


@contextlib.contextmanager
def translated_load_errors(folder: Path) -> Iterator[None]:
    """Turn the errors transformers / safetensors raise for damaged files of `folder` into ours."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        raise _damaged(folder, folder, f"safetensors could not read it ({err})") from None


def repair_hint(folder: Path) -> str:
    """What to do about damaged files in `folder`: which cache folder to delete, or how to rewrite it."""
    from .cache import cache_dir

    folder = Path(folder).resolve()
    ours = (cache_dir() / "models").expanduser().resolve()
    if folder.parent == ours:
        return f"delete the folder {folder} (optimum-amdx's converted copy) and run again: it is rebuilt."
    parts = folder.parts
    if "snapshots" in parts:
        repo = Path(*parts[: parts.index("snapshots")])
        if repo.name.startswith("models--"):
            return f"delete the folder {repo} (its copy in the Hugging Face Hub cache) and run again to download it afresh."
    return "save the model there again (save_pretrained) or copy the folder again from its source."


def _damaged(folder: Path, file: Path, what: str) -> ModelNotFoundError:
    where = file if file == folder else file.name
    return ModelNotFoundError(f"The model in {folder} is damaged: {where}: {what}. Fix: {repair_hint(folder)}")


def _read_json(file: Path, folder: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise _damaged(folder, file, "it is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise _damaged(folder, file, f"it is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
