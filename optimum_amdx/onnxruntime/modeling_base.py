"""`ORTModel`: an exported ONNX folder plus an ONNX Runtime session on a verified provider.

Shared by the causal-LM and encoder classes: folder checks with clear errors, provider choice,
session creation, the fallback check, `save_pretrained` and the `export=True` path.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import ExportValidationError, InvalidArgumentError, ModelNotFoundError, UnsupportedModelError
from ..exporters.contract import METADATA_FILE, ONNX_FILE, read_metadata
from ..exporters.tasks import check_supported
from .providers import CPU, GPU_PROVIDERS, choose_provider, provider_options, verify_session


def _check_folder(folder: Path, expected_task: str) -> dict[str, Any] | None:
    """Refuse folders without config.json or model.onnx, and exports of another task."""
    if not folder.is_dir():
        raise ModelNotFoundError(f"{folder} is not a folder; pass the folder written by `optimum-cli export rocm`.")
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(
            f"ONNX model folder {folder} has no config.json; expected the output of `optimum-cli export rocm` "
            "(model.onnx + config.json). Re-export the model, or pass export=True with a PyTorch model folder."
        )
    if not (folder / ONNX_FILE).is_file():
        raise ModelNotFoundError(
            f"ONNX model folder {folder} has no {ONNX_FILE}. Export it first: "
            f"`optimum-cli export rocm --model <id|dir> {folder}` (or from_pretrained(..., export=True))."
        )
    meta = read_metadata(folder)
    if meta is not None and meta.get("task") not in (None, expected_task):
        raise UnsupportedModelError(
            f"{folder} holds a {meta['task']!r} export, but this class runs {expected_task!r}. "
            f"Use the matching ORTModel class or re-export with --task {expected_task}."
        )
    return meta


def default_session_options(provider: str):
    """Session options used when the caller gives none.

    On the CPU provider, intra-op threads do not spin-wait between runs: a decode loop does
    Python work (sampling, cache bookkeeping) between graph runs, and spinning threads take the
    cores it needs (measured 2.5x slower greedy decoding on a busy 2-core machine with spinning).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if provider == CPU:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _is_pytorch_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and not (folder / ONNX_FILE).exists() and any(folder.glob("*.safetensors"))


class ORTSessionMixin:
    """Builds and verifies the ONNX Runtime session for a model folder."""

    task: str = ""

    def _init_session(
        self,
        folder: Path,
        provider: str | None,
        provider_opts: Mapping[str, Any] | None,
        session_options: Any,
        use_io_binding: bool | None,
        allow_fallback: bool,
        onnx_file: str = ONNX_FILE,
    ) -> None:
        import onnxruntime as ort

        self.model_path = folder
        self.requested_provider = choose_provider(provider)
        opts = provider_options(self.requested_provider, provider_opts)
        providers = [(self.requested_provider, opts)]
        if self.requested_provider != CPU:
            providers.append((CPU, {}))
        if session_options is None:
            session_options = default_session_options(self.requested_provider)
        try:
            self.session = ort.InferenceSession(
                str(folder / onnx_file), sess_options=session_options, providers=providers
            )
        except Exception as err:  # onnxruntime raises its own pybind exception types
            name = type(err).__name__
            if "InvalidProtobuf" in name or "INVALID_PROTOBUF" in str(err) or "Protobuf parsing failed" in str(err):
                raise ExportValidationError(
                    f"{folder / onnx_file} is not a valid ONNX file ({err}). Re-export with `optimum-cli export rocm`."
                ) from err
            if "NoSuchFile" in name or "NO_SUCHFILE" in str(err):
                raise ModelNotFoundError(f"{folder / onnx_file} or its external data is missing ({err}).") from err
            raise ExportValidationError(f"ONNX Runtime could not load {folder / onnx_file}: {err}") from err
        self.provider = verify_session(self.session, self.requested_provider, allow_fallback)
        gpu = self.provider in GPU_PROVIDERS
        if use_io_binding is None:
            use_io_binding = gpu
        self.use_io_binding = bool(use_io_binding)
        self.device_id = int(opts.get("device_id", 0))
        self._device = torch.device("cuda", self.device_id) if gpu and torch.cuda.is_available() else torch.device("cpu")
        if gpu and self._device.type == "cpu" and self.use_io_binding:
            raise InvalidArgumentError(
                f"IO binding on {self.provider} needs torch with a GPU (torch.cuda, also on ROCm) to hold the tensors; "
                "torch here sees no GPU. Install a ROCm/CUDA build of torch or pass use_io_binding=False."
            )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    @property
    def providers(self) -> list[str]:
        """Providers of the live session, as ONNX Runtime reports them."""
        return list(self.session.get_providers())

    def save_pretrained(self, save_directory: str | os.PathLike, overwrite: bool = True) -> Path:
        """Copy the exported folder (graph, weights, config, tokenizer) to `save_directory`."""
        from ..io import atomic_output_dir

        target = Path(save_directory).expanduser().resolve()
        if target == self.model_path.resolve():
            return target
        with atomic_output_dir(target, overwrite) as tmp:
            for item in self.model_path.iterdir():
                if item.is_file():
                    shutil.copy2(item, tmp / item.name)
        return target

    def _open_folder(self, model_path: str | os.PathLike) -> Path:
        """Check an exported folder against this class's task; read its metadata and config."""
        from transformers import AutoConfig

        folder = Path(model_path).expanduser().resolve()
        self.metadata = _check_folder(folder, self.task)
        self.config = AutoConfig.from_pretrained(folder)
        check_supported(self.config, self.task)
        return folder

    @classmethod
    def from_pretrained(
        cls,
        model_id: str | os.PathLike,
        provider: str | None = None,
        provider_options: Mapping[str, Any] | None = None,
        session_options: Any = None,
        use_io_binding: bool | None = None,
        export: bool = False,
        allow_fallback: bool = False,
        export_kwargs: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ):
        """Load an exported folder; with `export=True`, export a PyTorch model (id, folder, `default`) first.

        `provider` is one of MIGraphX, ROCm, CUDA, CPU (full or short name); when None the first
        available in that order is used. `allow_fallback=True` turns a GPU provider's silent
        fallback to CPU into a warning instead of an error. Other keyword arguments go to the class
        (e.g. `use_static_shapes` for the encoders).
        """
        folder = cls._resolve_folder(model_id, export, export_kwargs, cache_dir)
        return cls(folder, provider, provider_options, session_options, use_io_binding, allow_fallback, **kwargs)

    @classmethod
    def _resolve_folder(cls, model_id: str | os.PathLike, export: bool, export_kwargs: Mapping[str, Any] | None,
                        cache_dir: str | os.PathLike | None) -> Path:
        """The ONNX folder to load: given directly, or freshly exported when `export` is set."""
        from ..models import resolve_model

        path = Path(str(model_id)).expanduser()
        if not export:
            if path.is_dir():
                if _is_pytorch_folder(path):
                    raise ModelNotFoundError(
                        f"{path} holds a PyTorch model, not an ONNX export. Pass export=True to export it on the fly, "
                        f"or run `optimum-cli export rocm --model {path} <out>` first."
                    )
                return path.resolve()
            if str(model_id) == "default" or not path.exists():
                raise ModelNotFoundError(
                    f"No ONNX export found at {model_id!r}. Pass export=True to export the PyTorch model "
                    f"{model_id!r} first, or give the folder written by `optimum-cli export rocm`."
                )
        source = path if path.is_dir() and (path / ONNX_FILE).exists() else None
        if source is not None:
            return source.resolve()
        from ..exporters import export_model

        from ..models.cache import file_lock

        src = resolve_model(str(model_id))
        out = Path(cache_dir) if cache_dir else _export_cache_dir(src, cls.task, export_kwargs)
        with file_lock(out.with_name(out.name + ".lock")):
            if not ((out / ONNX_FILE).is_file() and (out / METADATA_FILE).is_file()):
                export_model(src, out, task=cls.task, overwrite=True, **dict(export_kwargs or {}))
        return out


def _export_cache_dir(src: Path, task: str, export_kwargs: Mapping[str, Any] | None) -> Path:
    """A stable cache folder for an on-the-fly export, keyed by source folder (and its files), task and options."""
    import hashlib

    from ..models.cache import cache_dir

    stamps = sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in src.glob("*") if p.is_file())
    key = json.dumps([str(src.resolve()), task, sorted((export_kwargs or {}).items(), key=str), stamps], default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "onnx" / f"{src.name}-{task}-{digest}"
