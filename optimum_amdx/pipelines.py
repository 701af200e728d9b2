"""`pipeline(task, model, accelerator=...)`: a normal transformers Pipeline on an AMD-friendly runtime.

- accelerator="ort": the model is our ONNX Runtime class (exported on the fly when `model` is a
  PyTorch model id or folder, or the word `default`), on the best available execution provider.
- accelerator="rocm": the PyTorch path, the transformers model on the GPU (`cuda` device, which
  is also what PyTorch on ROCm calls AMD GPUs), or the CPU when there is none.
- accelerator=None: plain transformers, exactly as `transformers.pipeline` would build it.

Nothing in transformers is replaced: the returned object is a transformers Pipeline whose model
happens to be ours. One thing is added: accelerator="rocm" imports `optimum_amdx.modeling`, and that
import (wherever it happens) registers the name "amdx" with transformers' `AttentionInterface` and
`AttentionMaskInterface`. No existing attention implementation changes; only models loaded with
`attn_implementation="amdx"` use it.

Options belong to one accelerator (`OPTION_ACCELERATORS`); passing one to another is an error that
names it, never silently ignored.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from .errors import InvalidArgumentError

ACCELERATORS: tuple[str, ...] = ("ort", "rocm")
OPTION_ACCELERATORS: dict[str, tuple[str | None, ...]] = {
    "provider": ("ort",), "provider_options": ("ort",), "session_options": ("ort",), "use_io_binding": ("ort",),
    "export_kwargs": ("ort",), "dtype": ("rocm", None), "allow_pickle": ("rocm", None),
}
"""Which accelerators read each accelerator-specific option of `pipeline()`."""
PIPELINE_TASKS: tuple[str, ...] = ("text-generation", "feature-extraction", "text-classification")
_TASK_ALIASES = {"sentiment-analysis": "text-classification"}


def _check_args(task: str, accelerator: str | None) -> str:
    task = _TASK_ALIASES.get(task, task)
    if task not in PIPELINE_TASKS:
        raise InvalidArgumentError(
            f"Unknown or unsupported task {task!r} for optimum_amdx.pipeline. Valid tasks: {', '.join(PIPELINE_TASKS)}."
        )
    if accelerator is not None and accelerator not in ACCELERATORS:
        raise InvalidArgumentError(
            f"Unknown accelerator {accelerator!r}. Valid accelerators: 'ort' (ONNX Runtime: MIGraphX/ROCm/CUDA/CPU), "
            "'rocm' (PyTorch on the GPU), or None (plain transformers)."
        )
    return task


def _ort_class(task: str):
    from .onnxruntime import ORTModelForCausalLM, ORTModelForFeatureExtraction, ORTModelForSequenceClassification

    return {"text-generation": ORTModelForCausalLM, "feature-extraction": ORTModelForFeatureExtraction,
            "text-classification": ORTModelForSequenceClassification}[task]


def _is_onnx_folder(model: Any) -> bool:
    return isinstance(model, (str, os.PathLike)) and (Path(str(model)).expanduser() / "model.onnx").is_file()


def _ort_model(task: str, model: Any, provider: str | None, provider_options: Mapping[str, Any] | None,
               session_options: Any, use_io_binding: bool | None, export_kwargs: Mapping[str, Any] | None):
    """Our ORT model for `model`: an ORT instance as is, an ONNX folder loaded, anything else exported."""
    cls = _ort_class(task)
    if isinstance(model, cls):
        return model
    kwargs = dict(provider=provider, provider_options=provider_options, session_options=session_options,
                  use_io_binding=use_io_binding)
    if _is_onnx_folder(model):
        return cls.from_pretrained(model, **kwargs)
    # A loaded model is exported into a temporary folder that the ORT model removes when it is collected.
    return cls.from_pretrained(model, export=True, export_kwargs=export_kwargs, **kwargs)


def _rocm_device():
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _rocm_model(task: str, model: Any, dtype: Any, allow_pickle: bool, trust_remote_code: bool) -> tuple[Any, Any]:
    """The PyTorch model behind accelerator="rocm", and the folder it came from (None for a model object).

    text-generation: AMDModelForCausalLM (paged KV cache, graph-captured decode, continuous batching)
    over the loaded model (GPTQ checkpoints come with our W4A16 linears), or the patched transformers
    model (our attention and RMSNorm) for architectures it does not cover.
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    from .errors import UnsupportedModelError
    from .models import load_model

    device = _rocm_device()
    if not isinstance(model, (str, os.PathLike)):
        if task != "text-generation":
            return model.to(device), None
        from .modeling import AMDModelForCausalLM

        if isinstance(model, AMDModelForCausalLM):
            return model.to(device), model.model_path
        loaded, folder = model, None
    else:
        cls = {"text-generation": None, "feature-extraction": AutoModel,
               "text-classification": AutoModelForSequenceClassification}[task]
        result = load_model(model, dtype=dtype or "auto", device=str(device), allow_pickle=allow_pickle,
                            trust_remote_code=trust_remote_code, model_class=cls)
        if task != "text-generation":
            return result.model, result.folder.path
        loaded, folder = result.model, result.folder.path
    from .modeling import AMDModelForCausalLM, patch

    try:
        wrapped = AMDModelForCausalLM(loaded)
        wrapped.model_path = folder
        return wrapped.to(device), folder
    except UnsupportedModelError:
        return patch(loaded).to(device), folder


def _tokenizer_for(model: Any, model_obj: Any, tokenizer: Any, folder: Any, trust_remote_code: bool):
    """The tokenizer argument as given, else the one in the model's folder (the loader's, or the ORT export's)."""
    from transformers import AutoTokenizer

    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    if tokenizer is not None:
        return AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=trust_remote_code)
    candidates = [c for c in (folder, getattr(model_obj, "model_path", None)) if c is not None]
    name_or_path = getattr(getattr(model_obj, "config", None), "_name_or_path", None)
    if name_or_path:
        candidates.append(name_or_path)
    errors = []
    for cand in candidates:
        try:
            return AutoTokenizer.from_pretrained(cand, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError) as err:
            errors.append(f"{cand}: {err}")
    raise InvalidArgumentError(
        f"No tokenizer found for {model!r} (tried {', '.join(str(c) for c in candidates) or 'nothing'}). "
        "Pass tokenizer=... (a tokenizer object or its folder)."
    )


class _OurModelNotListed(logging.Filter):
    """Drops transformers' "model X is not supported for <task>" error, which checks class names only.

    Our ORT and AMD model classes are not in transformers' Auto mappings (registering them there would
    change transformers globally), yet they implement what the pipelines call.
    """

    def __init__(self, class_name: str) -> None:
        super().__init__()
        self.prefix = f"The model '{class_name}' is not supported"

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefix)


@contextlib.contextmanager
def _quiet_model_type_check(model_obj: Any) -> Iterator[None]:
    logger = logging.getLogger("transformers.pipelines.base")
    flt = _OurModelNotListed(type(model_obj).__name__)
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def _check_options(accelerator: str | None, given: Mapping[str, Any]) -> None:
    """Refuse an option meant for another accelerator instead of silently ignoring it.

    `given` holds the accelerator-specific options the caller set (those not at their default)."""
    wrong = [name for name in given if accelerator not in OPTION_ACCELERATORS[name]]
    if wrong:
        owners = "; ".join(f"{name} applies to accelerator={' / '.join(repr(a) for a in OPTION_ACCELERATORS[name])}"
                           for name in wrong)
        raise InvalidArgumentError(
            f"pipeline(accelerator={accelerator!r}) does not use {', '.join(wrong)}: {owners}. "
            "Drop the option, or choose that accelerator."
        )


def pipeline(
    task: str,
    model: Any = "default",
    accelerator: str | None = "ort",
    tokenizer: Any = None,
    provider: str | None = None,
    provider_options: Mapping[str, Any] | None = None,
    session_options: Any = None,
    use_io_binding: bool | None = None,
    export_kwargs: Mapping[str, Any] | None = None,
    dtype: Any = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    **kwargs: Any,
):
    """Build a transformers Pipeline for `task` whose model runs on `accelerator`.

    `model`: an exported ONNX folder, a PyTorch model id/folder/`default`, or a model object.
    Options per accelerator (see `OPTION_ACCELERATORS`; one meant for another accelerator is an
    `InvalidArgumentError`): `provider`, `provider_options`, `session_options`, `use_io_binding`,
    `export_kwargs` for "ort"; `dtype` and `allow_pickle` for "rocm" and None; `tokenizer` and
    `trust_remote_code` for all. Other keyword arguments go to `transformers.pipeline`.
    """
    import transformers

    task = _check_args(task, accelerator)
    options = dict(provider=provider, provider_options=provider_options, session_options=session_options,
                   use_io_binding=use_io_binding, export_kwargs=export_kwargs, dtype=dtype,
                   allow_pickle=allow_pickle or None)
    _check_options(accelerator, {k: v for k, v in options.items() if v is not None})
    if accelerator is None:
        if isinstance(model, (str, os.PathLike)):
            from .models import open_model

            model = str(open_model(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code).path)
        return transformers.pipeline(task, model=model, tokenizer=tokenizer, dtype=dtype or "auto",
                                     trust_remote_code=trust_remote_code, **kwargs)
    folder = None
    if accelerator == "ort":
        if trust_remote_code:
            export_kwargs = {"trust_remote_code": True, **dict(export_kwargs or {})}
        model_obj = _ort_model(task, model, provider, provider_options, session_options, use_io_binding, export_kwargs)
    else:
        model_obj, folder = _rocm_model(task, model, dtype, allow_pickle, trust_remote_code)
    tok = _tokenizer_for(model, model_obj, tokenizer, folder, trust_remote_code)
    kwargs.setdefault("device", model_obj.device)
    with _quiet_model_type_check(model_obj):
        return transformers.pipeline(task, model=model_obj, tokenizer=tok, **kwargs)
