"""Stdout that carries only data: for commands whose output is meant for a file or a pipe.

Libraries we import write to stdout on their own (DeepSpeed logs "Setting accelerator to CPU" there at
import, through a handler bound to `sys.stdout` at that moment; C code writes to file descriptor 1).
Inside `data_stdout()`, both `sys.stdout` and descriptor 1 point at stderr, and the command writes its
data to the stream it is given, which is the real stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import sys
from typing import Callable, Iterator, TextIO


@contextlib.contextmanager
def data_stdout() -> Iterator[TextIO]:
    """Route everything but the yielded stream's writes to stderr until the block ends."""
    original = sys.stdout
    try:
        fd = original.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        fd = None  # stdout is not a file (captured in-process): Python-level redirection is all there is
    if fd is None:
        sys.stdout = sys.stderr
        try:
            yield original
        finally:
            sys.stdout = original
        return
    original.flush()
    saved = os.dup(fd)
    os.dup2(sys.stderr.fileno(), fd)
    data = os.fdopen(os.dup(saved), "w", encoding="utf-8", closefd=True)
    sys.stdout = sys.stderr
    try:
        yield data
        data.flush()  # a reader that went away (`| head`) raises BrokenPipeError here, for the caller to handle
    finally:
        sys.stdout = original
        sys.stderr.flush()
        os.dup2(saved, fd)
        os.close(saved)
        try:
            data.close()
        except OSError:
            pass  # already reported by the flush above


def json_data_command(run: Callable[[argparse.Namespace, TextIO], int]) -> Callable[[argparse.Namespace], int]:
    """Give a command's `run(args, out)` the real stdout, made data-only when `--json` was asked for.

    With `--json` the command's whole run happens inside `data_stdout()`, so progress bars, library logs
    and warnings reach stderr and `> result.json` holds the JSON alone; without it `out` is plain stdout.
    """

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        if getattr(args, "json", False):
            with data_stdout() as out:
                return run(args, out)
        return run(args, sys.stdout)

    return wrapper
