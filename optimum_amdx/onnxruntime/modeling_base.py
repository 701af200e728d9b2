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

from ..errors import (
    ExportValidationError, InvalidArgumentError, ModelNotFoundError, OutputExistsError, UnsupportedModelError,
)
from ..exporters.contract import METADATA_FILE, ONNX_FILE, read_metadata, require_onnx_packages
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
        require_onnx_packages("onnxruntime")
        import onnxruntime as ort

        self.model_path = folder
        self._provider_args = (provider, provider_opts, session_options, allow_fallback)
        self._graph_sessions: dict[str, Any] = {}
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

    def graph_session(self, onnx_file: str):
        """A session (same provider and options, verified the same way) for another graph file of the export.

        Created on first use and kept: MIGraphX compiles each fixed-shape graph once.
        """
        if onnx_file not in self._graph_sessions:
            sibling = object.__new__(type(self))
            provider, opts, sess_opts, allow = self._provider_args
            sibling._init_session(self.model_path, provider, opts, sess_opts, False, allow, onnx_file=onnx_file)
            self._graph_sessions[onnx_file] = sibling.session
        return self._graph_sessions[onnx_file]

    @property
    def providers(self) -> list[str]:
        """Providers of the live session, as ONNX Runtime reports them."""
        return list(self.session.get_providers())

    def save_pretrained(self, save_directory: str | os.PathLike, overwrite: bool = True) -> Path:
        """Copy the export's own files (graphs, weights, config, tokenizer, metadata) into `save_directory`.

        Like transformers, this adds to the folder: files that are not part of the export are never
        touched. Each file is written to a temporary name and renamed, so an interrupted save leaves
        no half-written file. With `overwrite=False`, existing files of the same names are an error.
        """
        from ..errors import OutputExistsError
        from ..exporters.contract import export_files

        target = Path(save_directory).expanduser().resolve()
        if target == self.model_path.resolve():
            return target
        if target.exists() and not target.is_dir():
            raise OutputExistsError(f"save_pretrained target {target} is a file; give a folder path.")
        names = export_files(self.model_path, self.metadata)
        clash = [n for n in names if (target / n).exists()]
        if clash and not overwrite:
            raise OutputExistsError(
                f"{target} already has {', '.join(clash)}; pass overwrite=True to replace those files (others are kept)."
            )
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            staged = target / f".{name}.tmp-{os.getpid()}"
            try:
                shutil.copyfile(self.model_path / name, staged)
                os.replace(staged, target / name)
            except BaseException:
                staged.unlink(missing_ok=True)
                raise
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

        `model_id` may also be a loaded transformers model with `export=True`: it is exported into a
        temporary folder removed when the returned object is garbage-collected. On-the-fly exports
        of ids/folders are cached in our cache, or in `cache_dir/optimum_amdx_onnx/` when given
        (never in `cache_dir` itself, which may be a shared cache root).

        `provider` is one of MIGraphX, ROCm, CUDA, CPU (full or short name); when None the first
        available in that order is used. `allow_fallback=True` turns a GPU provider's silent
        fallback to CPU into a warning instead of an error. Other keyword arguments go to the class
        (e.g. `use_static_shapes` for the encoders).
        """
        init_args = (provider, provider_options, session_options, use_io_binding, allow_fallback)
        if hasattr(model_id, "config") and hasattr(model_id, "state_dict"):
            if not export:
                raise InvalidArgumentError(
                    f"from_pretrained got a loaded {type(model_id).__name__}; pass export=True to export it to ONNX."
                )
            return cls._from_model_object(model_id, export_kwargs, init_args, kwargs)
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
        out = _export_cache_dir(src, cls.task, export_kwargs, cache_dir)
        with file_lock(out.with_name(out.name + ".lock")):
            if (out / ONNX_FILE).is_file() and (out / METADATA_FILE).is_file():
                return out
            if out.is_dir() and any(out.iterdir()):
                raise OutputExistsError(
                    f"{out} exists but is not a complete optimum-amdx export, so it is left alone. Delete it (or pass "
                    "another cache_dir) to export again."
                )
            export_model(src, out, task=cls.task, **dict(export_kwargs or {}))
        return out

    @classmethod
    def _from_model_object(cls, model: Any, export_kwargs: Mapping[str, Any] | None, init_args: tuple,
                           kwargs: Mapping[str, Any]):
        """Export a loaded transformers model into a temporary folder that lives as long as the returned object."""
        import tempfile
        import weakref

        from ..exporters import export_model

        tmp = Path(tempfile.mkdtemp(prefix="amdx-onnx-"))
        try:
            export_model(model, tmp / "model", task=cls.task, **dict(export_kwargs or {}))
            instance = cls(tmp / "model", *init_args, **kwargs)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        weakref.finalize(instance, shutil.rmtree, str(tmp), True)
        return instance


EXPORT_SUBFOLDER = "optimum_amdx_onnx"


def _export_cache_dir(src: Path, task: str, export_kwargs: Mapping[str, Any] | None,
                      root: str | os.PathLike | None = None) -> Path:
    """The folder of an on-the-fly export, keyed by source folder (and its files), task and options.

    It lies in our own cache, or with `cache_dir=D` in `D/optimum_amdx_onnx/`: a subfolder we own,
    so a shared cache root (such as the Hugging Face hub cache) is never replaced or cleaned.
    """
    import hashlib

    from ..models.cache import cache_dir

    stamps = sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in src.glob("*") if p.is_file())
    key = json.dumps([str(src.resolve()), task, sorted((export_kwargs or {}).items(), key=str), stamps], default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    base = cache_dir() / "onnx" if root is None else Path(root).expanduser().resolve() / EXPORT_SUBFOLDER
    return base / f"{src.name}-{task}-{digest}"
