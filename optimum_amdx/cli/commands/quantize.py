"""`optimum-amdx quantize gptq|rtn`: quantize a causal LM and save a standard GPTQ checkpoint."""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from ..output import json_data_command

NAME = "quantize"
HELP = "Quantize a causal LM to a standard GPTQ checkpoint (GPTQ with calibration data, or RTN)."


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model id, local folder, or 'default' (bundled SmolLM2-135M)")
    p.add_argument("output", help="output folder (written atomically)")
    p.add_argument("--allow-pickle", action="store_true", help="Allow loading .bin/.pt weights (runs pickle; only for sources you trust).")
    p.add_argument("--bits", type=int, default=4, help="2, 3, 4 or 8 (4 runs on the fast W4A16 kernel)")
    p.add_argument("--group-size", type=int, default=128, help="input columns per scale/zero group; -1 for per-row")
    p.add_argument("--asym", action="store_true", help="asymmetric grid (default: symmetric)")
    p.add_argument("--checkpoint-format", default="gptq", choices=("gptq", "gptq_v2"),
                   help="'gptq' (v1, read by every tool) or 'gptq_v2'")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard, e.g. 2GB")
    p.add_argument("--device", default=None, help="where the algorithm runs: cuda or cpu (default: the GPU if any)")
    p.add_argument("--dtype", default="auto", help="model dtype while quantizing: auto (fp16 on GPU, fp32 on CPU), fp16, bf16, fp32")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    p.add_argument("--lm-head", action="store_true",
                   help="quantize the output head too (GPT-QModel's lm_head=True; a tied head is untied)")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of text")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="quantize_method", metavar="METHOD", required=True)
    gptq = sub.add_parser("gptq", help="GPTQ with calibration data", description="GPTQ with calibration data.")
    _common(gptq)
    gptq.add_argument("--desc-act", action="store_true", help="act-order: quantize columns by decreasing Hessian diagonal")
    gptq.add_argument("--damp-percent", type=float, default=0.01, help="Hessian dampening, fraction of its mean diagonal")
    gptq.add_argument("--no-true-sequential", action="store_true", help="collect all Hessians of a block in one pass")
    gptq.add_argument("--no-act-group-aware", action="store_true",
                      help="plain column order (default without --desc-act: solve groups by Hessian importance, "
                           "storage stays in order)")
    gptq.add_argument("--static-groups", action="store_true", help="group scales from the original weights (before updates)")
    gptq.add_argument("--dataset", default="pydoc",
                      help="pydoc (offline default), wikitext2, c4 (online), or a .txt/.json/.jsonl/.parquet/.csv file")
    gptq.add_argument("--samples", type=int, default=None,
                      help="number of calibration samples (default: 128 on a GPU, 32 on a CPU)")
    gptq.add_argument("--seqlen", type=int, default=None,
                      help="tokens per calibration sample (default: 2048 on a GPU, 512 on a CPU)")
    gptq.add_argument("--seed", type=int, default=0, help="seed for choosing the calibration windows")
    rtn = sub.add_parser("rtn", help="round-to-nearest baseline (no data)", description="Round-to-nearest baseline.")
    _common(rtn)


def _check_causal(folder) -> None:  # noqa: ANN001 - a ModelFolder
    """Refuse a non-causal model from its config.json, before loading any weights."""
    from ...errors import UnsupportedModelError

    archs = folder.architectures
    if archs and not any(a.endswith("ForCausalLM") for a in archs):
        raise UnsupportedModelError(
            f"{folder.path.name} is a {', '.join(archs)}; GPTQ quantizes decoder-only causal language models "
            "(architectures ending in ForCausalLM)."
        )


def _calibration_size(args: argparse.Namespace, device: str) -> tuple[int, int]:
    """--samples/--seqlen, or the defaults for the device (a CPU gets a size that runs in minutes, and says so)."""
    import sys

    from ...quantization.estimate import CPU_DEFAULT_SAMPLES, CPU_DEFAULT_SEQLEN

    gpu = not str(device).startswith("cpu")
    samples = args.samples if args.samples is not None else (128 if gpu else CPU_DEFAULT_SAMPLES)
    seqlen = args.seqlen if args.seqlen is not None else (2048 if gpu else CPU_DEFAULT_SEQLEN)
    if not gpu and (args.samples is None or args.seqlen is None) and not args.json:
        print(f"note: quantizing on the CPU with {samples} calibration samples x {seqlen} tokens (the GPU default, "
              "128 x 2048, takes hours on a CPU); pass --samples/--seqlen to choose", file=sys.stderr)
    return samples, seqlen


@json_data_command
def run(args: argparse.Namespace, stdout: TextIO) -> int:
    """Check everything that can be checked (output folder, sizes, model type, calibration text) before the
    model loads; then quantize and save atomically."""
    from ...io import check_output_dir, parse_size
    from ...models import default_device, load_causal_lm, load_tokenizer, open_model, parse_dtype
    from ...quantization import GPTQConfig, GPTQQuantizer
    from ...quantization.calibration import get_calibration_data

    check_output_dir(args.output, args.overwrite)
    parse_size(args.max_shard_size)
    method = args.quantize_method
    device = args.device or default_device()
    common = dict(bits=args.bits, group_size=args.group_size, sym=not args.asym, checkpoint_format=args.checkpoint_format,
                  lm_head=args.lm_head)
    if method == "gptq":
        samples, seqlen = _calibration_size(args, device)
        cfg = GPTQConfig(**common, desc_act=args.desc_act, damp_percent=args.damp_percent,
                         true_sequential=not args.no_true_sequential, static_groups=args.static_groups,
                         act_group_aware=not args.no_act_group_aware,
                         dataset=args.dataset, n_samples=samples, seqlen=seqlen, seed=args.seed)
    else:
        cfg = GPTQConfig(**common)
    folder = open_model(args.model, allow_pickle=args.allow_pickle)
    _check_causal(folder)
    tokenizer = load_tokenizer(folder)
    calibration = None
    if method == "gptq":  # a missing or unreadable dataset fails here, before the model loads
        calibration = get_calibration_data(cfg.dataset, tokenizer, cfg.n_samples, cfg.seqlen, cfg.seed)
    model = load_causal_lm(folder, dtype=parse_dtype(args.dtype, device), device="cpu")
    quantizer = GPTQQuantizer(cfg, method=method, device=device, verbose=not args.json)
    quantizer.quantize(model, tokenizer, dataset=calibration)
    out = quantizer.save_pretrained(model, args.output, tokenizer, max_shard_size=args.max_shard_size,
                                    overwrite=args.overwrite)
    total_error = sum(s.error for s in quantizer.stats)
    if args.json:
        print(json.dumps({"output": str(out), "method": method, "seconds": round(quantizer.seconds, 2),
                          "total_error": total_error, "quantization_config": cfg.to_quantization_config()}), file=stdout)
    else:
        print(f"saved {method.upper()} {cfg.bits}-bit checkpoint to {out} ({quantizer.seconds:.1f} s)")
    return 0
