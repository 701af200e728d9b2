"""`pipeline(task, model, accelerator=...)`: a normal transformers Pipeline on an AMD-friendly runtime.

- accelerator="ort": the model is our ONNX Runtime class (exported on the fly when `model` is a
  PyTorch model id or folder, or the word `default`), on the best available execution provider.
- accelerator="rocm": the PyTorch path, the transformers model on the GPU (`cuda` device, which
  is also what PyTorch on ROCm calls AMD GPUs), or the CPU when there is none.
- accelerator=None: plain transformers, exactly as `transformers.pipeline` would build it.

Nothing in transformers is patched globally: the returned object is a transformers Pipeline whose
model happens to be ours.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from .errors import InvalidArgumentError

ACCELERATORS: tuple[str, ...] = ("ort", "rocm")
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


def _rocm_text_generation_model(model: Any, dtype: Any = None, trust_remote_code: bool = False):
    """The PyTorch model behind `pipeline("text-generation", accelerator="rocm")`: AMDModelForCausalLM
    (paged KV cache, graph-captured decode, continuous batching) over the transformers model, or the
    patched transformers model (our attention and RMSNorm) for architectures it does not cover."""
    from .errors import UnsupportedModelError
    from .modeling import AMDModelForCausalLM, patch
    from .models import load_causal_lm

    if isinstance(model, AMDModelForCausalLM):
        return model
    if isinstance(model, (str, os.PathLike)):
        from .models import resolve_model
        from .quantization import is_gptq_checkpoint

        path = resolve_model(model)
        if is_gptq_checkpoint(path):  # our QuantLinear on the W4A16 kernel, not transformers' GPTQ backend
            return AMDModelForCausalLM.from_pretrained(path, dtype=dtype or "auto")
        model = load_causal_lm(path, dtype=dtype or "auto", trust_remote_code=trust_remote_code)
    try:
        return AMDModelForCausalLM(model)
    except UnsupportedModelError:
        return patch(model)


def _rocm_model(task: str, model: Any, dtype: Any, trust_remote_code: bool):
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    from .models import resolve_model

    device = _rocm_device()
    if task == "text-generation":
        loaded = _rocm_text_generation_model(model, dtype=dtype, trust_remote_code=trust_remote_code)
        return loaded.to(device) if getattr(loaded, "device", device) != device else loaded
    if not isinstance(model, (str, os.PathLike)):
        return model.to(device)
    folder = resolve_model(str(model))
    cls = AutoModel if task == "feature-extraction" else AutoModelForSequenceClassification
    torch_dtype = dtype if dtype is not None else (torch.float16 if device.type == "cuda" else torch.float32)
    return cls.from_pretrained(folder, dtype=torch_dtype, trust_remote_code=trust_remote_code).to(device).eval()


def _tokenizer_for(model: Any, model_obj: Any, tokenizer: Any):
    from transformers import AutoTokenizer

    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    if tokenizer is not None:
        return AutoTokenizer.from_pretrained(tokenizer)
    folder = getattr(model_obj, "model_path", None)
    candidates = [folder] if folder is not None else []
    if isinstance(model, (str, os.PathLike)):
        from .models import resolve_model

        try:
            candidates.append(resolve_model(str(model)) if not _is_onnx_folder(model) else Path(str(model)))
        except Exception:  # noqa: BLE001 - we only look for a tokenizer here; the model itself already loaded
            pass
    name_or_path = getattr(getattr(model_obj, "config", None), "_name_or_path", None)
    if name_or_path:
        candidates.append(name_or_path)
    errors = []
    for cand in candidates:
        try:
            return AutoTokenizer.from_pretrained(cand)
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
    trust_remote_code: bool = False,
    **kwargs: Any,
):
    """Build a transformers Pipeline for `task` whose model runs on `accelerator`.

    `model`: an exported ONNX folder, a PyTorch model id/folder/`default`, or a model object.
    `provider`, `provider_options`, `session_options`, `use_io_binding` and `export_kwargs` apply to
    accelerator="ort"; `dtype` to accelerator="rocm"/None. Other keyword arguments go to
    `transformers.pipeline`.
    """
    import transformers

    task = _check_args(task, accelerator)
    if accelerator is None:
        if isinstance(model, (str, os.PathLike)):
            from .models import resolve_model

            model = str(resolve_model(str(model)))
        return transformers.pipeline(task, model=model, tokenizer=tokenizer, dtype=dtype or "auto",
                                     trust_remote_code=trust_remote_code, **kwargs)
    if accelerator == "ort":
        model_obj = _ort_model(task, model, provider, provider_options, session_options, use_io_binding, export_kwargs)
    else:
        model_obj = _rocm_model(task, model, dtype, trust_remote_code)
    tok = _tokenizer_for(model, model_obj, tokenizer)
    kwargs.setdefault("device", model_obj.device)
    with _quiet_model_type_check(model_obj):
        return transformers.pipeline(task, model=model_obj, tokenizer=tok, **kwargs)
