"""`optimum-amdx launch`: torchrun on the best-linked GPUs, with the visible-device variables set."""

from __future__ import annotations

import argparse
import sys

NAME = "launch"
HELP = "Run a script on N GPUs with torchrun, choosing the best-connected GPUs (usage: launch --gpus N -- script.py)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, required=True, help="number of processes (one per GPU)")
    parser.add_argument("--devices", default=None, help="use exactly these GPU indices, e.g. 2,3 (skips the choice)")
    parser.add_argument("--topology-file", action="append", default=None,
                        help="amd-smi/rocm-smi/nvidia-smi topology output to use instead of running the tool "
                             "(repeatable, e.g. --showtopo and --shownodesbw outputs)")
    parser.add_argument("--cpu", action="store_true", help="CPU processes over gloo (no GPUs; for tests)")
    parser.add_argument("--dry-run", action="store_true", help="print the GPUs, environment and command; run nothing")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- script.py [args...]")


def _check_script(script: list[str], must_exist: bool = True) -> None:
    """A script to run must be named and, unless only planning (--dry-run), exist (torchrun would fail later,
    once per process, with tracebacks)."""
    import os

    from ...errors import InvalidArgumentError

    if not script:
        raise InvalidArgumentError("No script to run; name it after --, e.g. optimum-amdx launch --gpus 2 -- train.py")
    first = script[0]
    if first == "-m":
        if len(script) < 2:
            raise InvalidArgumentError("-m needs a module name, e.g. optimum-amdx launch --gpus 2 -- -m my_package.train")
        return
    if first.startswith("-"):
        return  # torchrun options before the script: torchrun checks them
    if must_exist and not os.path.isfile(first):
        raise InvalidArgumentError(f"Script {first} does not exist (looked in {os.getcwd()}); check the path.")


def run(args: argparse.Namespace) -> int:
    from ...distributed.launch import parse_device_list, plan_launch
    from ...distributed.topology import parse_topology
    from ...errors import InvalidArgumentError

    script = list(args.script)
    if script and script[0] == "--":
        script = script[1:]
    _check_script(script, must_exist=not args.dry_run)
    if args.gpus < 1:
        raise InvalidArgumentError(f"--gpus must be at least 1, got {args.gpus}.")
    topology = None
    for path in args.topology_file or []:
        try:
            with open(path) as f:
                part = parse_topology(f.read())
        except OSError as err:
            raise InvalidArgumentError(f"Cannot read topology file {path}: {err}") from err
        topology = part if topology is None else topology.merge(part)
    devices = parse_device_list(args.devices) if args.devices else None
    if args.devices and devices is None:
        raise InvalidArgumentError(f"--devices {args.devices!r}: expected comma-separated GPU indices such as 0,1.")
    plan = plan_launch(script, args.gpus, devices=devices, topology=topology, cpu=args.cpu)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(plan.explanation, file=sys.stderr)
    env_text = " ".join(f"{k}={v}" for k, v in plan.env_updates.items())
    unset_text = "".join(f" -u {k}" for k in plan.env_removed)
    print(f"env{unset_text} {env_text} {' '.join(plan.command)}", file=sys.stderr)
    if args.dry_run:
        return 0
    import subprocess

    return subprocess.run(plan.command, env=plan.environment(), check=False).returncode
