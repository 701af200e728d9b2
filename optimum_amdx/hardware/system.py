"""Host-level facts that change GPU behaviour: visible-device variables, NUMA balancing, TunableOp."""

from __future__ import annotations

import os
from pathlib import Path

VISIBLE_DEVICE_VARS: dict[str, str] = {
    "HIP_VISIBLE_DEVICES": "ROCm: which GPUs the HIP runtime (and so PyTorch) enumerates; indices are renumbered from 0.",
    "ROCR_VISIBLE_DEVICES": "ROCm: filters GPUs at the ROCr (HSA) level, below HIP; applies to every ROCm program. "
                            "Accepts indices or UUIDs. Applied before HIP_VISIBLE_DEVICES.",
    "CUDA_VISIBLE_DEVICES": "NVIDIA: which GPUs CUDA enumerates. ROCm PyTorch also honours it (as HIP does), so "
                            "on AMD prefer one variable to avoid double filtering.",
    "GPU_DEVICE_ORDINAL": "ROCm (OpenCL and HIP): an older filter of visible devices.",
}

NUMA_BALANCING_FILE = Path("/proc/sys/kernel/numa_balancing")

TUNABLEOP_VARS = (
    "PYTORCH_TUNABLEOP_ENABLED",
    "PYTORCH_TUNABLEOP_TUNING",
    "PYTORCH_TUNABLEOP_FILENAME",
    "PYTORCH_TUNABLEOP_VERBOSE",
    "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS",
    "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS",
)


def visible_device_vars(environ: dict[str, str] | None = None) -> list[dict[str, str | None]]:
    """Each visible-device variable, its value (None when unset) and what it does."""
    env = os.environ if environ is None else environ
    return [{"name": k, "value": env.get(k), "meaning": v} for k, v in VISIBLE_DEVICE_VARS.items()]


def numa_balancing(path: Path = NUMA_BALANCING_FILE) -> int | None:
    """The kernel's automatic NUMA balancing setting (0 off, 1 on), or None where it cannot be read."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def tunableop_state(environ: dict[str, str] | None = None) -> dict:
    """PyTorch TunableOp: its environment variables and, when torch has it, the live torch.cuda.tunable state."""
    env = os.environ if environ is None else environ
    state: dict = {"env": {k: env.get(k) for k in TUNABLEOP_VARS if env.get(k) is not None}}
    try:
        import torch

        if not (torch.version.hip or torch.version.cuda):
            state.update(available=False, reason="this PyTorch build has no GPU backend")
            return state
        tunable = torch.cuda.tunable
        state.update(
            available=True,
            enabled=bool(tunable.is_enabled()),
            tuning=bool(tunable.tuning_is_enabled()),
            filename=tunable.get_filename(),
        )
    except Exception as err:  # noqa: BLE001 - report, never fail the report
        state.update(available=False, reason=f"{type(err).__name__}: {err}")
    return state
