"""`optimum-amdx benchmark`: TTFT, TPOT, decode throughput and memory against the roofline, with plots."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys

NAME = "benchmark"
HELP = "Measure prefill latency, decode latency, decode throughput and memory of backends, against the roofline."


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,8,32, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _words(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default",
                        help="hub id, local folder, 'default' (bundled SmolLM2-135M) or a named shape with random "
                             "weights (llama-2-7b, llama-3-8b, mistral-7b, qwen2-7b, llama-1b, tiny-llama, ...)")
    parser.add_argument("--backends", type=_words, default=None,
                        help="comma list of transformers, transformers-compile, rocm, ort "
                             "(default: those available; on a CPU just transformers)")
    parser.add_argument("--dtypes", type=_words, default=["auto"],
                        help="comma list of auto, fp16, bf16, fp32 (auto: fp16 on GPU, fp32 on CPU)")
    parser.add_argument("--quantization", type=_words, default=["none"],
                        help="comma list of none, gptq-4bit, gptq-4bit-act-order, gptq-4bit-lm-head (RTN weights in "
                             "the GPTQ layout; act-order: desc_act's permuted groups; lm-head: the output head too)")
    parser.add_argument("--batch-sizes", type=_ints, default=None, help="default: 1 on CPU, 1,8,32 on GPU")
    parser.add_argument("--prompt-lengths", type=_ints, default=None, help="prompt tokens (default: 32 CPU, 128 GPU)")
    parser.add_argument("--new-tokens", type=_ints, default=None, help="generated tokens, >= 2 (default: 16 CPU, 64 GPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs per point (default: 1 CPU, 2 GPU)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per point (default: 3 CPU, 5 GPU)")
    parser.add_argument("--seed", type=int, default=0, help="seed of random weights and prompts")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (ROCm GPUs are cuda in PyTorch); default: GPU if any")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice; 1 avoids oversubscription on a busy CPU)")
    parser.add_argument("--gpu", default=None,
                        help="GPU profile for the roofline (mi300x, mi250, h200, ...), default: detected")
    parser.add_argument("--measure-ceilings", action="store_true",
                        help="measure copy bandwidth and matmul rate first and use them for the roofline")
    parser.add_argument("--tunable-op", action="store_true",
                        help="enable PyTorch TunableOp; tunings are kept per GPU arch and reused")
    parser.add_argument("--tunable-op-dir", default=None,
                        help="folder of tunableop_results_<arch>.csv (default: <cache>/tunableop)")
    parser.add_argument("-o", "--output-dir", default=None,
                        help="where results.json, table.txt and the PNGs go (default: benchmark-results/<model>-<time>)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="allow a checkpoint folder with only .bin/.pt weights (runs pickle; only for sources you trust)")
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                        help="compare two results.json files and print before/after deltas (runs nothing)")
    parser.add_argument("--merge", nargs="+", metavar="RESULTS", default=None,
                        help="combine results.json files of one model and device (e.g. one run per backend) into "
                             "one report in --output-dir (runs nothing)")


def _default_output(model: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-") or "model"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"benchmark-results/{slug}-{stamp}"


def _run_compare(args: argparse.Namespace, out) -> int:  # noqa: ANN001 - a text stream
    from ...benchmark.report import compare, format_compare
    from ...benchmark.schema import load

    result = compare(load(args.compare[0]), load(args.compare[1]))
    out.write((json.dumps(result, indent=2) if args.json else format_compare(result)) + "\n")
    return 0


def _check_writable(out_path: str, overwrite: bool) -> None:
    """Refuse an output folder that cannot be written before any measuring starts."""
    import os

    from ...errors import InvalidArgumentError
    from ...io import check_output_dir

    import tempfile

    out = check_output_dir(out_path, overwrite)
    existing = next(p for p in (out, *out.parents) if p.exists())
    try:  # a real probe: os.access says yes to root on read-only disks and /proc
        os.rmdir(tempfile.mkdtemp(prefix=".amdx-write-probe-", dir=existing))
    except OSError as err:
        raise InvalidArgumentError(f"-o {out_path}: cannot write in {existing} ({err.strerror}), so the results could "
                                   "not be saved; choose another --output-dir.") from None


def _plots_available(args: argparse.Namespace) -> bool:
    """matplotlib is optional: without it the results are still written, without PNGs (said before the sweep)."""
    if args.no_plots:
        return False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("warning: matplotlib is not installed, so no plots (results.json and table.txt are still written); "
              "pip install 'optimum-amdx[benchmark]' for them, or pass --no-plots.", file=sys.stderr)
        return False
    return True


def _write_outputs(doc: dict, out_path: str, args: argparse.Namespace, out) -> None:  # noqa: ANN001 - a text stream
    """results.json and table.txt first (atomically), then the plots next to them: a plot failure loses no data."""
    from ...benchmark.report import format_results
    from ...benchmark.schema import dump
    from ...io import atomic_output_dir

    table = format_results(doc)
    with atomic_output_dir(out_path, args.overwrite) as tmp:
        dump(doc, tmp / "results.json")
        (tmp / "table.txt").write_text(table + "\n", encoding="utf-8")
    plots = []
    if _plots_available(args):
        from pathlib import Path

        from ...benchmark.plots import write_plots

        try:
            plots = write_plots(doc, Path(out_path))
        except Exception as err:  # noqa: BLE001 - the measurements are saved; a plot is a nicety
            print(f"warning: plotting failed ({type(err).__name__}: {err}); the results are saved.", file=sys.stderr)
    out.write((json.dumps(doc, indent=2, sort_keys=True) if args.json else table) + "\n")
    ok = sum(r["status"] == "ok" for r in doc["results"])
    names = ", ".join(["results.json", "table.txt"] + [p.name for p in plots])
    print(f"{ok}/{len(doc['results'])} points measured; wrote {names} to {out_path}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from ..output import data_stdout

    with data_stdout() as out:  # only the table or JSON on stdout; library logs go to stderr
        return _run(args, out)


def _check_gpu(name: str | None) -> None:
    if name is None:
        return
    from ...errors import InvalidArgumentError
    from ...hardware.profiles import PROFILES, lookup_profile

    try:
        lookup_profile(name)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"Unknown GPU {name!r} for --gpu. Known: {', '.join(sorted(PROFILES))}. Pick the closest, or leave --gpu "
            "out and pass --measure-ceilings to measure this GPU's bandwidth and matmul rate."
        ) from None


def _run(args: argparse.Namespace, out) -> int:  # noqa: ANN001 - a text stream
    from ...errors import InvalidArgumentError

    if args.compare and args.merge:
        raise InvalidArgumentError("--compare and --merge are separate actions; give one of them.")
    if args.compare:
        return _run_compare(args, out)
    if args.merge:
        from ...benchmark.report import merge
        from ...benchmark.schema import load

        doc = merge([load(path) for path in args.merge])
        out_path = args.output_dir or _default_output(f"{doc['model']['name']}-merged")
        _check_writable(out_path, args.overwrite)
        _write_outputs(doc, out_path, args, out)
        return 0
    for flag, value, low in (("--warmup", args.warmup, 0), ("--repeats", args.repeats, 1), ("--threads", args.threads, 1)):
        if value is not None and value < low:
            raise InvalidArgumentError(f"{flag} must be at least {low}, got {value}.")
    _check_gpu(args.gpu)
    out_path = args.output_dir or _default_output(args.model)
    _check_writable(out_path, args.overwrite)
    _plots_available(args)  # say it before the sweep, not after
    from ...benchmark.harness import BenchmarkSpec, run_benchmark

    spec = BenchmarkSpec(
        model=args.model, backends=args.backends, dtypes=args.dtypes, quantizations=args.quantization,
        batch_sizes=args.batch_sizes, prompt_lengths=args.prompt_lengths, new_tokens=args.new_tokens,
        warmup=args.warmup, repeats=args.repeats, seed=args.seed, device=args.device, gpu=args.gpu,
        measure_ceilings=args.measure_ceilings, tunable_op=args.tunable_op, tunable_op_dir=args.tunable_op_dir,
        threads=args.threads, allow_pickle=args.allow_pickle,
    )
    _quiet_transformers()
    doc = run_benchmark(spec, log=lambda line: print(line, file=sys.stderr, flush=True))
    args.no_plots = args.no_plots or not _plots_available_quiet()
    _write_outputs(doc, out_path, args, out)
    return 0 if any(r["status"] == "ok" for r in doc["results"]) else 1


def _plots_available_quiet() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _quiet_transformers() -> None:
    """Generation warnings (pad token, static cache notices) would bury the table."""
    from transformers.utils import logging

    logging.set_verbosity_error()
