"""What PyTorch sees: its GPU backend (ROCm/HIP, CUDA, CPU) and each device with its profile."""

from __future__ import annotations

import os

from .arch import GPUArch, nvidia_arch, parse_gcn_arch
from .profiles import profile_for_device


def torch_backend() -> dict:
    """PyTorch's build and backend: "rocm", "cuda" or "cpu", with versions."""
    import torch

    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    backend = "rocm" if hip else ("cuda" if cuda else "cpu")
    return {
        "torch": torch.__version__,
        "backend": backend,
        "hip_version": hip,
        "cuda_version": cuda,
        "gpu_available": bool(torch.cuda.is_available()),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "kfd_present": os.path.exists("/dev/kfd"),
    }


def device_arch(props) -> GPUArch:
    """The architecture of one `torch.cuda.get_device_properties` result, ROCm or CUDA."""
    gcn = getattr(props, "gcnArchName", "") or ""
    if gcn.startswith("gfx"):
        return parse_gcn_arch(gcn)
    return nvidia_arch(props.major, props.minor)


def gpu_devices() -> list[dict]:
    """One entry per visible GPU: name, arch, memory and the matching profile ("unknown" if none)."""
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        arch = device_arch(props)
        profile = profile_for_device(props.name, arch.name)
        devices.append({
            "index": index,
            "name": props.name,
            "arch": arch.name,
            "arch_features": arch.features,
            "family": arch.family,
            "wave_size": arch.wave_size,
            "memory_gib": round(props.total_memory / 2**30, 2),
            "compute_units": props.multi_processor_count,
            "profile": profile.to_dict() if profile else "unknown",
        })
    return devices
