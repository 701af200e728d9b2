"""When to run a Triton kernel and which per-architecture configs to pick.

Kernels run through Triton when their tensors live on a GPU, or on the CPU when
`TRITON_INTERPRET=1` (the interpreter, used by CI). Otherwise callers get the PyTorch reference.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def interpret_mode() -> bool:
    """True when Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def triton_installed() -> bool:
    """True when the `triton` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def use_triton(*tensors: "torch.Tensor") -> bool:
    """Whether a kernel on these tensors should run through Triton (GPU, or the CPU interpreter)."""
    if not triton_installed():
        return False
    if interpret_mode():
        return True
    return all(t.is_cuda for t in tensors)


@functools.lru_cache(maxsize=None)
def device_arch(index: int = 0) -> str:
    """The compile target of a GPU: "gfx942" on ROCm, "sm_90" on CUDA, "cpu" otherwise.

    Configs are keyed by this string so that AMD and NVIDIA each get their own tuned choices.
    """
    import torch

    if interpret_mode() or not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(index)
    gcn = getattr(props, "gcnArchName", "") or ""
    if torch.version.hip and gcn:
        return gcn.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def arch_family(arch: str) -> str:
    """Group an arch into the families our configs are keyed by.

    "cdna2" (gfx90a), "cdna3" (gfx940-942), "cdna4" (gfx950), "rdna3" (gfx11xx), "rdna4" (gfx12xx),
    "hopper" (sm_90), "nvidia" (other sm_XY), "cpu" (interpreter or no GPU), else "unknown".
    """
    if arch == "cpu":
        return "cpu"
    if arch == "gfx90a":
        return "cdna2"
    if arch in ("gfx940", "gfx941", "gfx942"):
        return "cdna3"
    if arch == "gfx950":
        return "cdna4"
    if arch.startswith("gfx11"):
        return "rdna3"
    if arch.startswith("gfx12"):
        return "rdna4"
    if arch == "sm_90":
        return "hopper"
    if arch.startswith("sm_"):
        return "nvidia"
    return "unknown"


def is_amd_arch(arch: str) -> bool:
    """True for a gfx target."""
    return arch.startswith("gfx")
