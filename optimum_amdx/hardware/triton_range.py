"""The Triton versions our kernels are validated on, and what to do about one outside them.

Users do not choose Triton: PyTorch pins it (on ROCm through `pytorch-triton-rocm` of the same
version). So the range follows what supported PyTorch releases ship; CI runs the kernel tests and
the AMD compile check on both ends of it (`scripts/ci_triton_range.sh`). Torch- and triton-free:
it works on version strings, so `optimum-amdx env` can call it without importing either.
"""

from __future__ import annotations

import re
from typing import Optional

VALIDATED_TRITON: tuple[tuple[int, int], tuple[int, int]] = ((3, 6), (3, 9))
"""Oldest and newest validated Triton (major, minor), both included."""

TORCH_TO_TRITON: dict[str, str] = {
    "2.11": "3.6.0",
    "2.13": "3.7.1",
    "2.14": "3.8",
    "2.15": "3.9",
}
"""PyTorch release -> the Triton it pins (the CUDA wheels' requirement; ROCm wheels bring
`pytorch-triton-rocm` of the same version). Only pairings we have seen installed are listed."""


def parse_version(text: str) -> Optional[tuple[int, int]]:
    """(major, minor) of "3.7.1", "3.4.0+gitf7888497" (pytorch-triton-rocm) or "3.9.0rc1"; None if unreadable."""
    m = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def range_text() -> str:
    """The validated range as people write it, e.g. "3.6 to 3.9"."""
    (a, b), (c, d) = VALIDATED_TRITON
    return f"{a}.{b} to {c}.{d}"


def triton_validation(version: Optional[str], torch_version: Optional[str] = None) -> dict:
    """Whether `version` is in the validated range, and if not, the fix.

    Returns {"validated": bool | None, "range": "3.6 to 3.9", "fix": str | None}; validated is None
    when the version cannot be read.
    """
    out: dict = {"validated": None, "range": range_text(), "fix": None}
    parsed = parse_version(version or "")
    if parsed is None:
        return out
    low, high = VALIDATED_TRITON
    out["validated"] = low <= parsed <= high
    if out["validated"]:
        return out
    torch_mm = parse_version(torch_version or "")
    paired = [t for t, tri in TORCH_TO_TRITON.items() if low <= parse_version(tri) <= high]
    hint = f"install a PyTorch whose Triton is in range ({', '.join(f'torch {t} -> triton {TORCH_TO_TRITON[t]}' for t in paired)})"
    if torch_mm is not None and f"{torch_mm[0]}.{torch_mm[1]}" in TORCH_TO_TRITON:
        expected = TORCH_TO_TRITON[f"{torch_mm[0]}.{torch_mm[1]}"]
        out["fix"] = (f"torch {torch_version} pins triton {expected}: pip install 'triton=={expected}' (on ROCm, "
                      f"reinstall torch from the ROCm index: it brings pytorch-triton-rocm {expected}), or {hint}.")
    elif parsed < low:
        out["fix"] = f"Triton {version} is older than {low[0]}.{low[1]}: upgrade PyTorch, or {hint}."
    else:
        out["fix"] = (f"Triton {version} is newer than what the kernels were validated on; they may work, but "
                      f"run `pytest tests/kernels` before relying on them, or {hint}.")
    return out
