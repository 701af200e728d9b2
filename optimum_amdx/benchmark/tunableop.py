"""PyTorch TunableOp for benchmarks: tune GEMMs once per GPU architecture, reuse the results.

TunableOp replaces rocBLAS/hipBLASLt (cuBLAS/cuBLASLt on NVIDIA) GEMM calls by the fastest
solution found for each shape. Tunings are kept in `tunableop_results_<arch>.csv` in a cache folder
(`<optimum-amdx cache>/tunableop` by default), read at the first GEMM and rewritten by PyTorch
with old and new entries when the process ends, so later runs on the same architecture start
tuned. TunableOp only exists for GPUs: on the CPU enabling it is recorded as having no effect.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def default_dir() -> Path:
    """`<optimum-amdx cache>/tunableop`."""
    from ..models.cache import cache_dir

    return cache_dir() / "tunableop"


def results_file(directory: str | os.PathLike, arch: str) -> Path:
    """The tuning file of one architecture, e.g. `tunableop_results_gfx942.csv`."""
    return Path(directory).expanduser() / f"tunableop_results_{arch}.csv"


def _count_entries(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        return sum(1 for line in fh if line.strip() and not line.startswith("Validator"))


def enable(device: str, arch: str, directory: str | os.PathLike | None = None) -> dict[str, Any]:
    """Turn TunableOp on (tuning included) with the per-arch file; return what was done, for the JSON."""
    if not device.startswith("cuda"):
        return {"enabled": False, "file": None, "reused_entries": 0,
                "note": "TunableOp tunes GPU GEMMs only; on the CPU --tunable-op has no effect"}
    path = results_file(directory or default_dir(), arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    reused = _count_entries(path)
    os.environ["PYTORCH_TUNABLEOP_ENABLED"] = "1"
    os.environ["PYTORCH_TUNABLEOP_TUNING"] = "1"
    os.environ["PYTORCH_TUNABLEOP_FILENAME"] = str(path)
    import torch

    torch.cuda.tunable.enable(True)
    torch.cuda.tunable.tuning_enable(True)
    torch.cuda.tunable.set_filename(str(path), False)
    return {"enabled": True, "file": str(path), "reused_entries": reused,
            "note": "tunings found in the file are reused; new ones are added when the process exits"}


def finish(state: dict[str, Any]) -> dict[str, Any]:
    """Record how many GEMM tunings are known at the end of the run (read plus newly tuned)."""
    if not state.get("enabled"):
        return state
    import torch

    try:
        known = len(torch.cuda.tunable.get_results())
    except RuntimeError:
        known = None
    return dict(state, known_entries=known)
