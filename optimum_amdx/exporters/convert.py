"""`export_model`: transformers model -> ONNX folder ready for ONNX Runtime on AMD providers.

Tracing uses `torch.onnx.export(..., dynamo=True)` (torch.export + onnxscript), the maintained
exporter; it handles the transformers 5.x `DynamicCache` built inside `DecoderWithPast`, so the
TorchScript exporter is not needed. Tracing runs on fake tensors, so fp16 graphs export on a
CPU-only machine; validation of fp16 runs the PyTorch model in fp16 on the CPU, which torch
supports for every op these models use.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidArgumentError, ModelNotFoundError
from ..io import atomic_output_dir, check_output_dir
from .contract import (  # noqa: F401 - METADATA_FILE and read_metadata are re-exported
    KV_DYNAMIC, KV_STATIC, METADATA_FILE, ONNX_FILE, ROLE_ENCODER_BUCKET, ROLE_MAIN, GraphEntry, read_metadata,
    require_onnx_packages, write_metadata,
)
from .optimize import (
    OPTIMIZE_LEVELS, FusionTarget, contrib_ops, migraphx_op_check, migraphx_unsupported, optimize_graph,
)
from .static import StaticShapes, bucket_file, write_static_buckets
from .static_decoder import check_capacity, static_trace_spec, validate_static, write_decoder_graphs
from .tasks import TEXT_GENERATION, check_supported, infer_task, normalize_task
from .validate import DEFAULT_ATOL, validate_export
from .wrappers import trace_spec

logger = logging.getLogger(__name__)


class _NoTorchvisionNotice(logging.Filter):
    """Drop torch.onnx's "torchvision is not installed. Skipping torchvision::nms" notices.

    torch.onnx logs one per torchvision op while building its op registry on every first export;
    our models use no torchvision ops, so the notices only alarm users.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("torchvision is not installed")


logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(_NoTorchvisionNotice())

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16}
_TWO_GB = 2 * 1024**3
DEFAULT_OPSET = 18


@dataclass
class ExportResult:
    """Where the export went and what it contains (also written as amdx_export.json)."""

    output_dir: Path
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def onnx_path(self) -> Path:
        return self.output_dir / ONNX_FILE


def _auto_class(task: str):
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    return {TEXT_GENERATION: AutoModelForCausalLM, "feature-extraction": AutoModel,
            "text-classification": AutoModelForSequenceClassification}[task]


def resolve_source(model: str | os.PathLike, allow_pickle: bool = False) -> Path:
    """A local folder for a model id, folder or the word `default` (via `optimum_amdx.models`)."""
    from ..models import resolve_model

    return Path(resolve_model(str(model), allow_pickle=allow_pickle))


def load_config(folder: Path, trust_remote_code: bool = False):
    """The transformers config of `folder`, or a clear error when it has none."""
    from transformers import AutoConfig

    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(
            f"Model folder {folder} has no config.json; expected a transformers model folder "
            "(config.json + safetensors weights). Save the model with save_pretrained() first."
        )
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError) as err:
        raise ModelNotFoundError(f"Could not read config.json in {folder}: {err}") from err


def _fusion_target(config, task: str) -> FusionTarget:
    text = config.get_text_config(decoder=True) if task == TEXT_GENERATION else config
    heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_heads", 0)
    hidden = getattr(text, "hidden_size", None) or getattr(text, "dim", 0)
    return FusionTarget("decoder" if task == TEXT_GENERATION else "encoder", int(heads), int(hidden))


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import transformers

    from .. import __version__

    return {"optimum_amdx": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def _graph_io(path: Path) -> tuple[dict, dict]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    return {v.name: dims(v) for v in graph.input}, {v.name: dims(v) for v in graph.output}


def _name_dynamic_dims(path: Path, axes: dict[str, dict[int, str]]) -> None:
    """Give the graph's dynamic input/output dims the documented names.

    torch.onnx derives output dim names from expressions ("past_sequence_length + sequence_length");
    users and MIGraphX bucket files read the plain names ("total_sequence_length").
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    changed = False
    for value in list(model.graph.input) + list(model.graph.output):
        for index, name in axes.get(value.name, {}).items():
            dim = value.type.tensor_type.shape.dim[index]
            if not dim.dim_value and dim.dim_param != name:
                dim.dim_param = name
                changed = True
    if changed:
        onnx.save(model, str(path))


def _save_extras(out: Path, model, tokenizer, source: Path | None, task: str) -> list[str]:
    """config.json, generation_config.json and tokenizer files; returns the tokenizer files written."""
    model.config.save_pretrained(out)
    if task == TEXT_GENERATION and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    before = set(os.listdir(out))
    if tokenizer is None and source is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError, TypeError) as err:
            logger.warning("No tokenizer saved: could not load one from %s (%s)", source, err)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return sorted(set(os.listdir(out)) - before)


def export_model(
    model: str | os.PathLike | torch.nn.Module,
    output: str | os.PathLike,
    task: str | None = None,
    dtype: str = "fp32",
    opset: int = DEFAULT_OPSET,
    optimize: str | None = None,
    static_shapes: StaticShapes | None = None,
    external_data: bool | None = None,
    atol: float | None = None,
    validate: bool = True,
    overwrite: bool = False,
    tokenizer: Any = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> ExportResult:
    """Export a transformers model to an ONNX folder for ONNX Runtime (MIGraphX, ROCm, CUDA or CPU).

    `model` is a model id, a local folder, the word `default`, or a loaded `PreTrainedModel`.
    The folder gets model.onnx (+ model.onnx.data when external data is used), config.json,
    generation_config.json (decoders), tokenizer files and amdx_export.json. Steps: trace with
    torch.onnx (dynamo), `onnx.checker` on the traced graph, optional optimization (`optimize` =
    "basic" | "extended"; the optimized graph holds ONNX Runtime contrib ops, so it is checked by
    loading it in ONNX Runtime during validation instead), validation against PyTorch (max abs
    diff <= `atol`), optional static shape buckets. Writing is atomic; an existing non-empty `output` needs `overwrite=True`.
    `allow_pickle=True` lets a source folder with only .bin/.pt weights load (pickle runs code: trusted sources only).
    """
    require_onnx_packages("onnx", "onnxruntime", "onnxscript")
    import onnx

    if dtype not in DTYPES:
        raise InvalidArgumentError(f"Unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}.")
    if optimize is not None and optimize not in OPTIMIZE_LEVELS:
        raise InvalidArgumentError(f"Unknown optimize level {optimize!r}; expected one of {', '.join(OPTIMIZE_LEVELS)}.")
    if not 17 <= opset <= 23:
        raise InvalidArgumentError(f"opset {opset} is outside the supported range 17-23.")
    check_output_dir(output, overwrite)
    torch_dtype = DTYPES[dtype]

    source: Path | None = None
    if isinstance(model, torch.nn.Module):
        config = model.config
    else:
        source = resolve_source(model, allow_pickle)
        config = load_config(source, trust_remote_code)
    task = normalize_task(task) if task else infer_task(config)
    check_supported(config, task)
    static_decoder = static_shapes is not None and task == TEXT_GENERATION
    if static_decoder:
        static_shapes = StaticShapes(static_shapes.batch_sizes, static_shapes.sequence_lengths,
                                     check_capacity(config, static_shapes))
    elif static_shapes is not None and static_shapes.capacity is not None:
        raise InvalidArgumentError("--static-shapes capacity=... applies to decoders (text-generation) only.")

    if source is not None:
        torch_model = _auto_class(task).from_pretrained(
            source, dtype=torch_dtype, trust_remote_code=trust_remote_code, attn_implementation="sdpa",
            use_safetensors=None if allow_pickle else True,
        )
    else:
        first = next(model.parameters(), None)
        same = first is None or first.dtype == torch_dtype
        torch_model = model if same else copy.deepcopy(model).to(torch_dtype)  # never change the caller's model
    torch_model.eval()
    if static_decoder:
        spec = static_trace_spec(torch_model, torch_dtype, static_shapes.capacity)
    else:
        spec = trace_spec(torch_model, task, torch_dtype)

    n_bytes = sum(p.numel() * p.element_size() for p in torch_model.parameters())
    use_external = bool(external_data) or n_bytes > _TWO_GB * 0.9 or static_shapes is not None
    if external_data is False and n_bytes > _TWO_GB * 0.9:
        raise InvalidArgumentError(
            f"The weights take {n_bytes / 1024**3:.2f} GiB, over protobuf's 2 GiB limit; external data is required "
            "(leave external_data unset or pass True)."
        )

    with atomic_output_dir(output, overwrite) as tmp:
        raw = tmp / ONNX_FILE
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                spec.module, spec.args, None, dynamo=True, input_names=spec.input_names,
                output_names=spec.output_names, dynamic_shapes=spec.dynamic_shapes, opset_version=opset,
                verbose=False,
            )
        program.save(str(raw), external_data=use_external)
        _name_dynamic_dims(raw, spec.dynamic_axes)
        onnx.checker.check_model(str(raw))

        opt_summary = None
        if optimize is not None:
            staged = tmp / "optimized"
            staged.mkdir()
            opt_summary = optimize_graph(raw, staged / ONNX_FILE, optimize, external_data=use_external,
                                         fp16=dtype == "fp16", target=_fusion_target(config, task))
            for f in list(tmp.iterdir()):
                if f.is_file() and f.name.startswith(ONNX_FILE):
                    f.unlink()
            for f in staged.iterdir():
                shutil.move(str(f), tmp / f.name)
            staged.rmdir()

        report = None
        tol = DEFAULT_ATOL[dtype] if atol is None else float(atol)
        if validate:
            # fp16 is judged against the fp32 model (see exporters/validate.py); a float copy, never the caller's model.
            reference = copy.deepcopy(torch_model).float().eval() if dtype == "fp16" else None
            if static_decoder:
                report = validate_static(raw, torch_model, torch_dtype, static_shapes.capacity, tol, reference,
                                         optimized=optimize is not None)
            else:
                report = validate_export(raw, torch_model, task, torch_dtype, tol, reference,
                                         optimized=optimize is not None)
            del reference

        graph_entries = [GraphEntry(ONNX_FILE, ROLE_MAIN)]
        buckets: list[str] = []
        if static_decoder:
            graph_entries += write_decoder_graphs(tmp, ONNX_FILE, static_shapes)
        elif static_shapes is not None:
            buckets = write_static_buckets(tmp, ONNX_FILE, static_shapes)
            graph_entries += [GraphEntry(bucket_file(b, s), ROLE_ENCODER_BUCKET, b, s)
                              for b in static_shapes.batch_sizes for s in static_shapes.sequence_lengths]
        op_checks = {g.file: migraphx_op_check(tmp / g.file) for g in graph_entries}
        tok_files = _save_extras(tmp, torch_model, tokenizer, source, task)
        inputs, outputs = _graph_io(raw)
        ops = contrib_ops(raw)
        metadata = {
            "task": task,
            "model_type": config.model_type,
            "architectures": list(getattr(config, "architectures", None) or [type(torch_model).__name__]),
            "dtype": dtype,
            "opset": opset,
            "exporter": "torch.onnx.export(dynamo=True)",
            "inputs": inputs,
            "outputs": outputs,
            "external_data": use_external,
            "optimization": opt_summary,
            "contrib_ops": ops,
            "migraphx_compatible": not migraphx_unsupported(ops) and not any(c["unsupported"] for c in op_checks.values()),
            "static_shapes": static_shapes.to_dict() if static_shapes is not None else None,
            "static_bucket_files": buckets,
            "kv_cache": (KV_STATIC if static_decoder else KV_DYNAMIC) if task == TEXT_GENERATION else None,
            "kv_capacity": static_shapes.capacity if static_decoder else None,
            "graphs": [dict(g.to_dict(), migraphx_unsupported_ops=op_checks[g.file]["unsupported"])
                       for g in graph_entries],
            "onnx_ops": op_checks[ONNX_FILE]["ops"],
            "validation": report.to_dict() if report is not None else None,
            "tokenizer_files": tok_files,
            "source": str(source) if source is not None else None,
            "versions": _versions(),
        }
        write_metadata(tmp, metadata)
    out = Path(output).expanduser().resolve()
    return ExportResult(out, metadata)
