"""A real onnxruntime wheel unpacked into its own folder, run in a subprocess where it shadows the
installed onnxruntime (as a second environment would). Shared by the ROCm and MIGraphX wheel tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest


def wheel_folder(request: pytest.FixtureRequest, name: str) -> Path:
    """A folder for one wheel: in pytest's cache (kept between runs) when the cache plugin is on,
    else a fresh temporary folder (`-p no:cacheprovider`: the wheel is fetched again)."""
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir(name))
    return request.getfixturevalue("tmp_path_factory").mktemp(name)


def ensure_unpacked(site: Path, marker: str, fetch: Callable[[Path], None]) -> Path:
    """Run `fetch(site)` unless `site/onnxruntime/capi/<marker>` (the provider library) is already there."""
    if not (site / "onnxruntime" / "capi" / marker).is_file():
        fetch(site)
    return site


def run_shadowed(site: Path, code: str, timeout: int) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter whose onnxruntime is the one in `site` (and this checkout first)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(Path(__file__).resolve().parents[2])]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=timeout)
