"""Atomic output folders: a command's result appears whole, or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import OutputExistsError


def check_output_dir(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse a non-empty output folder unless `overwrite`; return the resolved path."""
    out = Path(path).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"Output path {out} exists and is a file; give a folder path.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputExistsError(
            f"Output folder {out} exists and is not empty. Pass --overwrite (overwrite=True) to replace it, "
            "or choose another folder."
        )
    return out


@contextlib.contextmanager
def atomic_output_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; on success it replaces `path`.

    On any exception the temporary folder is removed and `path` is left as it was, so bad input
    never leaves a half-written output.
    """
    out = check_output_dir(path, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
