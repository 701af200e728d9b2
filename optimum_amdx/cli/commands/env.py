"""`optimum-amdx env`: what this machine has, and what is wrong with it."""

from __future__ import annotations

import argparse
import json

NAME = "env"
HELP = "Report the GPU backend, devices, ONNX Runtime and Triton setup, with each problem found and its fix."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="Print the report as JSON (schema optimum-amdx.env/1).")


def run(args: argparse.Namespace) -> int:
    from ..output import data_stdout

    with data_stdout() as out:  # library warnings printed while probing go to stderr
        from ...hardware import format_report, hardware_report

        report = hardware_report()
        out.write((json.dumps(report, indent=2) if args.json else format_report(report)) + "\n")
    return 0
