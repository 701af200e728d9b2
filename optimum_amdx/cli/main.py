"""Entry point of `optimum-amdx`: discovers the subcommand modules and dispatches to them."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType
from typing import Sequence

from . import commands as _commands_pkg

_DEST = "amdx_command"


def command_modules() -> list[ModuleType]:
    """Every subcommand module under `optimum_amdx.cli.commands`, sorted by name."""
    modules = []
    for info in sorted(pkgutil.iter_modules(_commands_pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        modules.append(importlib.import_module(f"{_commands_pkg.__name__}.{info.name}"))
    return modules


def add_commands(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """Attach every subcommand to `parser` (used by `optimum-amdx` and `optimum-cli amdx`)."""
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in command_modules():
        if module.NAME in skip:
            continue
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(**{_DEST: module})


def run_parsed(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the subcommand chosen in `args`; turn our errors into a message and exit code 2."""
    from ..errors import AMDXError

    module = getattr(args, _DEST, None)
    if module is None:
        if parser is not None:
            parser.print_help()
        return 1
    try:
        return int(module.run(args) or 0)
    except AMDXError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The full `optimum-amdx` parser."""
    parser = argparse.ArgumentParser(
        prog="optimum-amdx",
        description="The AMD GPU backend for the Hugging Face stack (also reachable as `optimum-cli amdx`).",
    )
    add_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_parsed(args, parser)


if __name__ == "__main__":
    sys.exit(main())
