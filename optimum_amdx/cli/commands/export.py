"""`optimum-amdx export` (also `optimum-cli export rocm` and `optimum-cli amdx export`): model -> ONNX folder."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "export"
HELP = "Export a transformers model to ONNX for ONNX Runtime on AMD GPUs (MIGraphX / ROCm EP) or the CPU."


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
    parser.add_argument("--static-shapes", nargs="+", default=None, metavar="KEY=SIZES",
                        help="Fixed-shape graphs for MIGraphX (encoders): e.g. batch=1,8 sequence=128,512.")
    parser.add_argument("--external-data", action="store_true",
                        help="Store weights in model.onnx.data (automatic above 2 GB).")
    parser.add_argument("--atol", type=float, default=None,
                        help="Validation tolerance: max abs diff vs PyTorch (default 1e-3 fp32, 5e-2 fp16).")
    parser.add_argument("--no-validate", dest="validate", action="store_false", help="Skip validation against PyTorch.")
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty output folder.")
    parser.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the Hub.")
    parser.add_argument("--json", action="store_true", help="Print the export metadata as JSON.")


def _static_shapes(items: list[str] | None):
    from optimum_amdx.errors import InvalidArgumentError
    from optimum_amdx.exporters.static import StaticShapes, parse_buckets

    if not items:
        return None
    values: dict[str, list[int]] = {}
    for item in items:
        key, sep, sizes = item.partition("=")
        key = {"batch": "batch", "batch_size": "batch", "batch_sizes": "batch", "seq": "sequence",
               "sequence": "sequence", "sequence_length": "sequence", "sequence_lengths": "sequence"}.get(key.strip())
        if not sep or key is None:
            raise InvalidArgumentError(f"--static-shapes entry {item!r}: expected batch=1,8 or sequence=128,512.")
        values[key] = parse_buckets(sizes)
    if set(values) != {"batch", "sequence"}:
        raise InvalidArgumentError("--static-shapes needs both batch=... and sequence=... (e.g. batch=1,8 sequence=128,512).")
    return StaticShapes(tuple(values["batch"]), tuple(values["sequence"]))


def run(args: argparse.Namespace) -> int:
    """Export, validate and write the folder; print a one-line summary (or JSON)."""
    import time

    from optimum_amdx.exporters import export_model

    start = time.perf_counter()
    result = export_model(
        args.model, args.output, task=args.task, dtype=args.dtype, opset=args.opset, optimize=args.optimize,
        static_shapes=_static_shapes(args.static_shapes), external_data=True if args.external_data else None,
        atol=args.atol, validate=args.validate, overwrite=args.overwrite, trust_remote_code=args.trust_remote_code,
    )
    meta = result.metadata
    if args.json:
        print(json.dumps({"output_dir": str(result.output_dir), **meta}, indent=2))
    else:
        val = meta.get("validation")
        check = f"max abs diff {val['max_abs_diff']:.2e} <= atol {val['atol']:g}" if val else "not validated"
        print(f"Exported {meta['model_type']} ({meta['task']}, {meta['dtype']}, opset {meta['opset']}) to "
              f"{result.output_dir} in {time.perf_counter() - start:.0f}s; {check}; "
              f"MIGraphX-compatible ops: {'yes' if meta['migraphx_compatible'] else 'no'}.", file=sys.stdout)
    return 0
