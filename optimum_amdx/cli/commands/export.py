"""`optimum-amdx export` (also `optimum-cli export rocm` and `optimum-cli amdx export`): model -> ONNX folder."""

from __future__ import annotations

import argparse
import json
from typing import TextIO
import sys

from ..output import json_data_command

NAME = "export"
HELP = "Export a transformers model to ONNX for ONNX Runtime on AMD GPUs (MIGraphX / ROCm EP) or the CPU."

_SHAPE_KEYS = {"batch": "batch", "batch_size": "batch", "batch_sizes": "batch", "seq": "sequence",
               "sequence": "sequence", "sequence_length": "sequence", "sequence_lengths": "sequence",
               "capacity": "capacity", "kv_capacity": "capacity", "max_length": "capacity"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of the export command (no heavy imports here)."""
    parser.add_argument("--model", "-m", required=True,
                        help="Model id on the Hugging Face Hub, a local folder, or 'default' (bundled SmolLM2-135M).")
    parser.add_argument("output", help="Output folder (must be empty or absent unless --overwrite).")
    parser.add_argument("--task", default=None,
                        help="text-generation, feature-extraction or text-classification (inferred when omitted).")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32", help="Weight/activation precision.")
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (17-23).")
    parser.add_argument("--optimize", nargs="?", const="extended", default=None, choices=("basic", "extended"),
                        help="Apply ONNX Runtime graph optimization, keeping MIGraphX-runnable ops (default level: extended).")
    parser.add_argument("--static-shapes", action="append", default=None, metavar="KEY=SIZES[,KEY=SIZES]",
                        help="Fixed-shape graphs for MIGraphX, one value or repeated: e.g. "
                             "--static-shapes batch=1,8,sequence=128,512 (encoders); decoders add the KV cache "
                             "capacity: --static-shapes batch=1,4,sequence=64,256,capacity=1024.")
    parser.add_argument("--external-data", action="store_true",
                        help="Store weights in model.onnx.data (automatic above 2 GB).")
    parser.add_argument("--atol", type=float, default=None,
                        help="Validation tolerance: max abs diff vs PyTorch (default 1e-3 fp32; fp16 is compared "
                             "with PyTorch's own fp16 error, see the README).")
    parser.add_argument("--no-validate", dest="validate", action="store_false", help="Skip validation against PyTorch.")
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty output folder.")
    parser.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the Hub.")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="Allow loading .bin/.pt weights (runs pickle: trusted sources only).")
    parser.add_argument("--json", action="store_true", help="Print the export metadata as JSON.")


def parse_static_shapes(items: list[str] | None):
    """`["batch=1,8,sequence=128,512"]` (or the pairs spread over several values) -> `StaticShapes`.

    A comma-separated token with `=` starts a new key; tokens without one add sizes to the last key.
    """
    from optimum_amdx.errors import InvalidArgumentError
    from optimum_amdx.exporters.static import StaticShapes, parse_buckets

    if not items:
        return None
    example = "e.g. --static-shapes batch=1,8,sequence=128,512 (decoders: add ,capacity=1024)"
    values: dict[str, list[str]] = {}
    key = None
    for token in ",".join(items).replace(" ", ",").split(","):
        if not token.strip():
            continue
        if "=" in token:
            name, _, token = token.partition("=")
            key = _SHAPE_KEYS.get(name.strip().lower())
            if key is None:
                raise InvalidArgumentError(f"--static-shapes: unknown key {name!r}; expected batch, sequence or "
                                           f"capacity ({example}).")
            if key in values:
                raise InvalidArgumentError(f"--static-shapes: {key} is given twice ({example}).")
            values[key] = []
        if key is None:
            raise InvalidArgumentError(f"--static-shapes: {token!r} has no key; {example}.")
        values[key].append(token)
    if not {"batch", "sequence"} <= set(values):
        raise InvalidArgumentError(f"--static-shapes needs both batch=... and sequence=... ({example}).")
    capacity = None
    if "capacity" in values:
        sizes = parse_buckets(values["capacity"])
        if len(sizes) != 1:
            raise InvalidArgumentError(f"--static-shapes: capacity takes one size, got {values['capacity']}.")
        capacity = sizes[0]
    return StaticShapes(tuple(parse_buckets(values["batch"])), tuple(parse_buckets(values["sequence"])), capacity)


@json_data_command
def run(args: argparse.Namespace, stdout: TextIO) -> int:
    """Export, validate and write the folder; print a one-line summary (or JSON)."""
    import time

    from optimum_amdx.exporters import export_model

    start = time.perf_counter()
    result = export_model(
        args.model, args.output, task=args.task, dtype=args.dtype, opset=args.opset, optimize=args.optimize,
        static_shapes=parse_static_shapes(args.static_shapes), external_data=True if args.external_data else None,
        atol=args.atol, validate=args.validate, overwrite=args.overwrite, trust_remote_code=args.trust_remote_code,
        allow_pickle=args.allow_pickle,
    )
    meta = result.metadata
    if args.json:
        print(json.dumps({"output_dir": str(result.output_dir), **meta}, indent=2), file=stdout)
    else:
        val = meta.get("validation")
        if not val:
            check = "not validated"
        elif val.get("reference") == "fp32":
            torch16 = max(val["torch_fp16_vs_fp32"].values())
            check = (f"max abs diff vs the fp32 model {val['max_abs_diff']:.2e} (PyTorch fp16: {torch16:.2e}; "
                     f"bound: atol {val['atol']:g} or {val['fp16_slack']:g}x PyTorch fp16's)")
        else:
            check = f"max abs diff {val['max_abs_diff']:.2e} <= atol {val['atol']:g}"
        graphs = meta.get("graphs") or []
        extra = f", {len(graphs)} graphs" if len(graphs) > 1 else ""
        print(f"Exported {meta['model_type']} ({meta['task']}, {meta['dtype']}, opset {meta['opset']}{extra}) to "
              f"{result.output_dir} in {time.perf_counter() - start:.0f}s; {check}; "
              f"MIGraphX-compatible ops: {'yes' if meta['migraphx_compatible'] else 'no'}.", file=sys.stdout)
    return 0
