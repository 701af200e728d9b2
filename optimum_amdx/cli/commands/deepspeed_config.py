"""`optimum-amdx deepspeed-config`: a DeepSpeed config sized for the GPU, the memory table on stderr.

Stdout carries only the JSON (DeepSpeed's own log lines go to stderr), so `> ds.json` is valid JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "deepspeed-config"
HELP = "Write a DeepSpeed config (lowest ZeRO stage that fits, offload if needed) for a model and GPU."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="shape name (llama-2-7b, ...), config.json, model folder, 'default' or Hub id")
    parser.add_argument("--gpu", default="mi300x", help="GPU profile: mi210, mi250, mi300x, mi325x, mi355x, ...")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per node")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--task", choices=["train", "finetune", "inference"], default="finetune")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp16"], default="auto")
    parser.add_argument("--zero", "--zero-stage", dest="zero_stage", type=int, choices=[0, 1, 2, 3], default=None,
                        help="force a ZeRO stage (default: the lowest that fits)")
    parser.add_argument("--micro-batch-size", type=int, default=1, help="sequences per GPU per step (for the estimate)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 4096 train, 2048 else)")
    parser.add_argument("--cpu-memory-gb", type=float, default=None, help="host memory per node (default 1024)")
    parser.add_argument("--nvme-path", default=None, help="NVMe folder; allows NVMe offload when nothing else fits")
    parser.add_argument("--output", "-o", default=None,
                        help="write the config to this file instead of stdout (it replaces only a file this command wrote)")
    parser.add_argument("--json", action="store_true", help="print config, estimate and explanation as one JSON")
    parser.add_argument("--no-validate", action="store_true", help="skip the check with DeepSpeed's own parser")


def _check_args(args: argparse.Namespace) -> None:
    """Refuse what would fail late (after the estimate) or with a library traceback."""
    from ...errors import InvalidArgumentError
    from ...hardware.profiles import PROFILES, lookup_profile
    from ...io import check_result_file

    try:
        lookup_profile(args.gpu)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"Unknown GPU {args.gpu!r} for --gpu. Known: {', '.join(sorted(PROFILES))}. Pick the one with the same "
            "memory per GPU (the config is sized from it)."
        ) from None
    for flag, value in (("--gpus", args.gpus), ("--nodes", args.nodes), ("--micro-batch-size", args.micro_batch_size)):
        if value < 1:
            raise InvalidArgumentError(f"{flag} must be at least 1, got {value}.")
    if args.seq_len is not None and args.seq_len < 1:
        raise InvalidArgumentError(f"--seq-len must be at least 1, got {args.seq_len}.")
    if args.output:
        check_result_file(args.output, "--output", example="ds_config.json")  # replaces only a config we wrote


def run(args: argparse.Namespace) -> int:
    from ...io import write_json
    from ..output import data_stdout

    _check_args(args)
    with data_stdout() as out:
        from ...distributed import deepspeed_config, validate_deepspeed_config

        plan = deepspeed_config(args.model, gpu=args.gpu, gpus=args.gpus, nodes=args.nodes, task=args.task,
                                precision=args.precision, micro_batch_size=args.micro_batch_size,
                                seq_len=args.seq_len, zero_stage=args.zero_stage, cpu_memory_gb=args.cpu_memory_gb,
                                nvme_path=args.nvme_path)
        validated = "not checked (--no-validate)"
        if not args.no_validate:
            try:
                validate_deepspeed_config(plan.config, args.gpus * args.nodes)
                validated = "accepted by deepspeed.runtime.config.DeepSpeedConfig"
            except ImportError:
                validated = "not checked (deepspeed is not installed: pip install 'optimum-amdx[deepspeed]')"
        print(plan.table(), file=sys.stderr)
        print(plan.explanation, file=sys.stderr)
        print(f"Config {validated}.", file=sys.stderr)
        doc = plan.to_dict() if args.json else plan.config
        if args.output:  # marked (`io.RESULT_MARK`, a top-level key DeepSpeed ignores), so a rerun may replace it
            write_json(args.output, doc, "--output", indent=2)
            print(f"wrote {args.output}", file=sys.stderr)
        else:
            out.write(json.dumps(doc, indent=2) + "\n")
    return 0
