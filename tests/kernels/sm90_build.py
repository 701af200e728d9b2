"""Compile kernels for sm_90 on a machine without a GPU (Triton's bundled ptxas), for the tests that check a build's
structure: inline PTX that assembles, register caps, stack bytes."""

from __future__ import annotations

import pytest


def sm90_build_stdout(script: str, timeout: int = 900) -> str:
    """Stdout of `script` run in a fresh process with the interpreter off (under it `@triton.jit` gives
    interpreter functions), where it compiles kernels for sm_90 with Triton's bundled ptxas; skips the
    test when this Triton build ships no ptxas, fails it with the script's stderr otherwise."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("this Triton build ships no ptxas")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
