"""Suite-wide fixtures.

The kernel tests' conftest turns on Triton's CPU interpreter for the whole process when no GPU is
present (Triton decides at import time whether `@triton.jit` builds interpreter functions). Under
`pytest -n 2` every worker collects tests/kernels, so without this fixture every other test would
also route its matmuls, attention and norms through the interpreter: correct, but many times slower,
and not the CPU path a user gets. Outside tests/kernels the variable is removed for the duration of
each test, so those tests exercise the PyTorch references, as a CPU user does. A TRITON_INTERPRET
that the caller set themselves is left alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_KERNEL_TESTS = Path(__file__).parent / "kernels"
SET_BY_KERNEL_TESTS = "OPTIMUM_AMDX_TESTS_SET_TRITON_INTERPRET"


@pytest.fixture(autouse=True)
def _interpreter_only_for_kernel_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get(SET_BY_KERNEL_TESTS) != "1":
        return
    if _KERNEL_TESTS in Path(str(request.path)).parents:
        return
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
