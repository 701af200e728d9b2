"""Where optimum-amdx keeps converted models, and a lock so parallel first uses don't collide."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


def cache_dir() -> Path:
    """`$OPTIMUM_AMDX_CACHE`, else `~/.cache/optimum_amdx`."""
    env = os.environ.get("OPTIMUM_AMDX_CACHE")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "optimum_amdx"
    return base


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if missing), held for the `with` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
