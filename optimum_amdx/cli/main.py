"""Entry point of `optimum-amdx`: discovers the subcommand modules and dispatches to them.

Errors become one line: a user mistake (`AMDXError`, a missing optional package, a bad --device) prints
`error: ...` naming the fix and exits 2; anything else is a bug and says so, with where to report it.
`--debug` or OPTIMUM_AMDX_DEBUG=1 adds the traceback. SIGTERM is handled like Ctrl-C, so outputs being
written are cleaned up the same way.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import sys
import traceback
from contextlib import contextmanager
from types import ModuleType
from typing import Iterator, Sequence

from . import commands as _commands_pkg

_DEST = "amdx_command"
DEBUG_ENV = "OPTIMUM_AMDX_DEBUG"
ISSUES = "the optimum-amdx issue tracker"
# optional module -> the extra that installs it
EXTRA_OF = {"onnx": "onnx", "onnxruntime": "onnx", "onnxscript": "onnx", "onnx_ir": "onnx", "triton": "kernels",
            "datasets": "data", "deepspeed": "deepspeed", "matplotlib": "benchmark"}


def version() -> str:
    """The installed optimum-amdx version."""
    from .. import __version__

    return __version__


def command_modules() -> list[ModuleType]:
    """Every subcommand module under `optimum_amdx.cli.commands`, sorted by name."""
    modules = []
    for info in sorted(pkgutil.iter_modules(_commands_pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        modules.append(importlib.import_module(f"{_commands_pkg.__name__}.{info.name}"))
    return modules


def add_global_options(parser: argparse.ArgumentParser, prog: str = "optimum-amdx") -> None:
    """--version and --debug (on `optimum-amdx` and on `optimum-cli amdx`)."""
    parser.add_argument("--version", action="version", version=f"{prog} {version()}")
    parser.add_argument("--debug", action="store_true", default=False,
                        help=f"show the Python traceback of an error (or set {DEBUG_ENV}=1)")


def add_commands(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """Attach every subcommand to `parser` (used by `optimum-amdx` and `optimum-cli amdx`)."""
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in command_modules():
        if module.NAME in skip:
            continue
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        _add_debug(p)
        p.set_defaults(**{_DEST: module})


def _add_debug(parser: argparse.ArgumentParser) -> None:
    """--debug after the command name too (and after a sub-command such as `quantize rtn`)."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=f"show the Python traceback of an error (or set {DEBUG_ENV}=1)")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_debug(child)


def _debug(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM (what `kill` and schedulers send) raises KeyboardInterrupt like Ctrl-C."""
    def handler(signum, frame):  # noqa: ANN001, ARG001 - signal handler signature
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _missing_extra(err: ImportError) -> str | None:
    name = (getattr(err, "name", None) or "").split(".")[0]
    if name in EXTRA_OF:
        return (f"this needs the optional package '{name}', which is not installed. "
                f"Fix: pip install 'optimum-amdx[{EXTRA_OF[name]}]'")
    return None


def _check_device(args: argparse.Namespace) -> None:
    device = getattr(args, "device", None)
    if isinstance(device, str) and device:
        from .checks import check_device

        check_device(device)


def run_parsed(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the subcommand chosen in `args`; turn errors into one line and an exit code."""
    from ..errors import AMDXError

    module = getattr(args, _DEST, None)
    if module is None:
        if parser is not None:
            parser.print_help()
        return 1
    debug = _debug(args)
    try:
        with _sigterm_as_interrupt():
            _check_device(args)
            return int(module.run(args) or 0)
    except AMDXError as err:
        if debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        if debug:
            traceback.print_exc()
        signalled = str(err).startswith("signal ")
        print("terminated" if signalled else "interrupted", file=sys.stderr)
        return 128 + signal.SIGTERM if signalled else 130
    except BrokenPipeError:
        # the reader of our stdout went away (e.g. `| head`): not an error of ours, and nothing left to say
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush stays quiet
        except OSError:
            pass
        return 141
    except ImportError as err:
        hint = _missing_extra(err)
        if hint is None:
            return _internal_error(err, debug)
        if debug:
            traceback.print_exc()
        print(f"error: {hint}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - the last line of defence: one message, not a traceback
        return _internal_error(err, debug)


def _internal_error(err: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    print(f"error: internal error ({type(err).__name__}{': ' + detail if detail else ''}). This is a bug in "
          f"optimum-amdx {version()}: please report it to {ISSUES} with the command and `optimum-amdx env` output"
          f"{'' if debug else f'; re-run with --debug (or {DEBUG_ENV}=1) for the traceback'}.", file=sys.stderr)
    return 3


def build_parser() -> argparse.ArgumentParser:
    """The full `optimum-amdx` parser."""
    parser = argparse.ArgumentParser(
        prog="optimum-amdx",
        description="The AMD GPU backend for the Hugging Face stack (also reachable as `optimum-cli amdx`).",
    )
    add_global_options(parser)
    add_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_parsed(args, parser)


if __name__ == "__main__":
    sys.exit(main())
