"""Which architectures and tasks the ONNX exporter supports, and how a task is inferred.

Kept free of torch so the CLI and error paths can use it cheaply.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError, UnsupportedModelError

TEXT_GENERATION = "text-generation"
FEATURE_EXTRACTION = "feature-extraction"
TEXT_CLASSIFICATION = "text-classification"

TASKS: tuple[str, ...] = (TEXT_GENERATION, FEATURE_EXTRACTION, TEXT_CLASSIFICATION)

_TASK_ALIASES: dict[str, str] = {
    "text-generation": TEXT_GENERATION,
    "text-generation-with-past": TEXT_GENERATION,
    "causal-lm": TEXT_GENERATION,
    "causal-lm-with-past": TEXT_GENERATION,
    "feature-extraction": FEATURE_EXTRACTION,
    "sentence-similarity": FEATURE_EXTRACTION,
    "text-classification": TEXT_CLASSIFICATION,
    "sequence-classification": TEXT_CLASSIFICATION,
}

# Decoder families: one graph with past key/values in and present key/values out.
DECODER_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "mistral")
# Encoder families (BERT-like): feature extraction and sequence classification.
ENCODER_MODEL_TYPES: tuple[str, ...] = ("bert", "roberta", "xlm-roberta", "distilbert", "electra")

SUPPORTED: dict[str, tuple[str, ...]] = {
    TEXT_GENERATION: DECODER_MODEL_TYPES,
    FEATURE_EXTRACTION: ENCODER_MODEL_TYPES,
    TEXT_CLASSIFICATION: ENCODER_MODEL_TYPES,
}


def normalize_task(task: str) -> str:
    """Map a task name or alias to one of `TASKS`; raise listing the valid names otherwise."""
    key = task.strip().lower()
    if key not in _TASK_ALIASES:
        raise InvalidArgumentError(
            f"Unknown task {task!r}. Valid tasks: {', '.join(TASKS)} "
            f"(aliases: {', '.join(sorted(set(_TASK_ALIASES) - set(TASKS)))})."
        )
    return _TASK_ALIASES[key]


def infer_task(config: Any) -> str:
    """Pick the task for a transformers config from its model type and architectures."""
    model_type = getattr(config, "model_type", None)
    architectures = list(getattr(config, "architectures", None) or [])
    if model_type in DECODER_MODEL_TYPES:
        return TEXT_GENERATION
    if model_type in ENCODER_MODEL_TYPES:
        if any(a.endswith("ForSequenceClassification") for a in architectures):
            return TEXT_CLASSIFICATION
        return FEATURE_EXTRACTION
    raise UnsupportedModelError(_unsupported_message(model_type, None))


def check_supported(config: Any, task: str) -> None:
    """Raise `UnsupportedModelError` if `config`'s architecture cannot be exported for `task`."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED[task]:
        raise UnsupportedModelError(_unsupported_message(model_type, task))
    if task == TEXT_GENERATION:
        text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        layer_types = getattr(text_config, "layer_types", None) or []
        window = getattr(text_config, "sliding_window", None)
        uses_window = any(t != "full_attention" for t in layer_types) or (
            model_type == "mistral" and window is not None
        )
        max_pos = getattr(text_config, "max_position_embeddings", 0) or 0
        if uses_window and window is not None and window < max_pos:
            raise UnsupportedModelError(
                f"{model_type} model uses sliding-window attention (window {window} < max positions {max_pos}); "
                "the ONNX decoder graph keeps the full KV cache. Export a checkpoint without sliding window "
                "(e.g. set `sliding_window` to null or >= max_position_embeddings in config.json)."
            )


def _unsupported_message(model_type: str | None, task: str | None) -> str:
    if task is None:
        pairs = "; ".join(f"{t}: {', '.join(types)}" for t, types in SUPPORTED.items())
    else:
        pairs = f"{task}: {', '.join(SUPPORTED[task])}"
    return (
        f"Model type {model_type!r} is not supported by the optimum-amdx ONNX exporter"
        + (f" for task {task!r}" if task else "")
        + f". Supported model types: {pairs}. Use one of those architectures, or run the model with "
        "accelerator='rocm' (PyTorch)."
    )
