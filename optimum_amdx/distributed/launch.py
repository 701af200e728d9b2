"""Start a script on N GPUs with torchrun, on the best-linked GPUs, with the right environment.

`launch(["script.py", "--arg"], gpus=2)` picks the GPUs (topology-aware, see `topology`), sets
the visible-device variables for the launched processes, warns when NUMA balancing is on, and
runs `python -m torch.distributed.run --standalone --nproc-per-node N script.py --arg`.

Visible devices: on AMD we filter once, at the lowest level: ROCR_VISIBLE_DEVICES gets the
physical indices (as amd-smi/rocm-smi number them) and HIP_VISIBLE_DEVICES the renumbered
0..N-1, and an inherited CUDA_VISIBLE_DEVICES is dropped (ROCm honours it too, and a second
filter with physical numbers would select the wrong GPUs). An inherited ROCR_VISIBLE_DEVICES
(as set by SLURM) limits the GPUs we choose from. On NVIDIA, CUDA_VISIBLE_DEVICES gets the
physical indices with CUDA_DEVICE_ORDER=PCI_BUS_ID, the order nvidia-smi uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..errors import HardwareError, InvalidArgumentError
from .topology import Topology, choose_devices, detect_topology, explain_choice

NUMA_WARNING = (
    "NUMA balancing is on (/proc/sys/kernel/numa_balancing = 1). On multi-GPU AMD nodes it can migrate "
    "pages under running kernels and cost throughput; turn it off for the run with "
    "`sudo sysctl kernel.numa_balancing=0`."
)


@dataclass
class LaunchPlan:
    """What `launch` will run: the command, the environment changes and why these GPUs."""

    command: list[str]
    env_updates: dict[str, str]
    env_removed: list[str]
    devices: list[int] | None
    warnings: list[str] = field(default_factory=list)
    explanation: str = ""

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        for key in self.env_removed:
            env.pop(key, None)
        env.update(self.env_updates)
        return env


def parse_device_list(text: str | None) -> list[int] | None:
    """'0,1,3' -> [0, 1, 3]; None or '' -> None; UUIDs or other forms -> None (not ours to reinterpret)."""
    if not text:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def visible_devices_env(devices: Sequence[int], vendor: str) -> tuple[dict[str, str], list[str]]:
    """Environment variables (to set, to remove) that make exactly `devices` visible, in that order."""
    physical = ",".join(str(d) for d in devices)
    if vendor == "nvidia":
        return {"CUDA_VISIBLE_DEVICES": physical, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, []
    if vendor == "amd":
        renumbered = ",".join(str(k) for k in range(len(devices)))
        return {"ROCR_VISIBLE_DEVICES": physical, "HIP_VISIBLE_DEVICES": renumbered}, ["CUDA_VISIBLE_DEVICES"]
    raise InvalidArgumentError(f"vendor={vendor!r}: expected 'amd' or 'nvidia'.")


def numa_warning() -> str | None:
    """The NUMA-balancing warning when the kernel has it on, else None."""
    from ..hardware.system import numa_balancing

    return NUMA_WARNING if numa_balancing() == 1 else None


def _gpu_vendor() -> tuple[str, int]:
    """('amd' | 'nvidia', visible device count) from torch, for machines without an SMI tool."""
    import torch

    if not torch.cuda.is_available():
        return "none", 0
    return ("amd" if torch.version.hip else "nvidia"), torch.cuda.device_count()


def plan_launch(
    script_args: Sequence[str],
    gpus: int,
    devices: Sequence[int] | None = None,
    topology: Topology | None = None,
    cpu: bool = False,
    environ: Mapping[str, str] | None = None,
    python: str | None = None,
) -> LaunchPlan:
    """Decide GPUs, environment and command without running anything (what `--dry-run` prints)."""
    if not script_args:
        raise InvalidArgumentError("No script given. Usage: optimum-amdx launch --gpus N -- script.py [args].")
    if not isinstance(gpus, int) or gpus < 1:
        raise InvalidArgumentError(f"--gpus {gpus!r}: expected a positive number of processes.")
    env = dict(os.environ if environ is None else environ)
    command = [python or sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={gpus}", *script_args]
    warnings: list[str] = []
    warn = numa_warning()
    if warn:
        warnings.append(warn)
    if cpu:
        return LaunchPlan(command, {"OPTIMUM_AMDX_DEVICE": "cpu"}, [], None, warnings,
                          f"{gpus} CPU processes (gloo backend); no GPUs used.")

    topo = topology if topology is not None else detect_topology()
    if topo is not None:
        vendor, count = topo.vendor, topo.num_devices
    else:
        vendor, count = _gpu_vendor()
    if count == 0:
        raise HardwareError(
            "No GPU is visible (no amd-smi/rocm-smi/nvidia-smi output and torch sees none). "
            "Check the driver and the *_VISIBLE_DEVICES variables, or pass --cpu to run on CPU processes."
        )
    inherited = parse_device_list(env.get("ROCR_VISIBLE_DEVICES" if vendor == "amd" else "CUDA_VISIBLE_DEVICES"))
    pool = list(range(count)) if inherited is None else [d for d in inherited if d < count]
    if devices is not None:
        chosen = list(devices)
        if len(chosen) != gpus:
            raise InvalidArgumentError(f"--devices names {len(chosen)} GPUs but --gpus is {gpus}; make them agree.")
        missing = [d for d in chosen if d not in pool]
        if missing:
            raise HardwareError(f"GPUs {missing} are not visible here (visible: {pool}).")
        explanation = f"GPUs {','.join(map(str, chosen))} as given."
    elif topo is not None:
        chosen = choose_devices(topo, gpus, pool)
        explanation = explain_choice(topo, chosen)
    else:
        if gpus > len(pool):
            raise HardwareError(
                f"Asked for {gpus} GPUs but only {len(pool)} are visible. Lower --gpus to at most {len(pool)}."
            )
        chosen = pool[:gpus]
        explanation = f"GPUs {','.join(map(str, chosen))} (no topology tool found; first visible GPUs)."
    updates, removed = visible_devices_env(chosen, vendor)
    return LaunchPlan(command, updates, removed, chosen, warnings, explanation)


def launch(script_args: Sequence[str], gpus: int, **kwargs) -> int:
    """Plan (see `plan_launch`), print the choice and warnings to stderr, run torchrun; its exit code."""
    plan = plan_launch(script_args, gpus, **kwargs)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(plan.explanation, file=sys.stderr)
    return subprocess.run(plan.command, env=plan.environment(), check=False).returncode
