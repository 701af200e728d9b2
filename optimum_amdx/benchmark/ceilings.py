"""What the machine is and what it can do at best: device facts, profile lookup, measured ceilings.

The roofline needs a memory bandwidth (decode) and a matmul rate (prefill). They come from, in
order of preference: a measurement in this run (`--measure-ceilings`: a large device copy, and a
large half-precision matmul), the GPU profile table (datasheet peaks, or a recorded measured copy
bandwidth), or nothing (on a CPU with no measurement: the roofline is left out, not guessed).
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from typing import Any

from ..hardware.profiles import GPUProfile, lookup_profile, profile_for_device

_GIB = 1 << 30


def environment(device: str) -> dict[str, Any]:
    """Versions and device facts recorded with every result (so figures always name their machine)."""
    import torch
    import transformers

    from .. import __version__
    from ..kernels.runtime import device_arch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "optimum_amdx": __version__,
        "hip": torch.version.hip,
        "cuda": torch.version.cuda,
        "device_type": "cuda" if device.startswith("cuda") else "cpu",
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        env.update(
            device_name=props.name,
            arch=device_arch(index),
            device_memory_bytes=int(props.total_memory),
            device_count=torch.cuda.device_count(),
        )
    else:
        env.update(device_name=platform.processor() or platform.machine(), arch="cpu",
                   device_memory_bytes=None, device_count=0)
    return env


def pick_profile(env: dict[str, Any], gpu: str | None) -> GPUProfile | None:
    """The profile named by `--gpu`, else the one matching the device, else None (CPU, unknown GPU)."""
    if gpu:
        return lookup_profile(gpu)
    if env["device_type"] != "cuda":
        return None
    return profile_for_device(env["device_name"])


def measure_copy_bandwidth(device: str, nbytes: int | None = None, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    from .timing import Clock

    gpu = device.startswith("cuda")
    nbytes = nbytes or (_GIB if gpu else 128 << 20)
    repeats = repeats if gpu else max(3, repeats // 4)
    gen = torch.Generator(device=device).manual_seed(0)
    src = torch.rand(nbytes // 2, dtype=torch.float16, device=device, generator=gen)
    dst = torch.empty_like(src)
    clock = Clock(device)
    for _ in range(3):
        dst.copy_(src)
    clock.synchronize()
    start = clock.mark()
    for _ in range(repeats):
        dst.copy_(src)
    end = clock.mark()
    clock.synchronize()
    seconds = clock.seconds(start, end)
    return 2.0 * src.numel() * src.element_size() * repeats / seconds


def measure_matmul_flops(device: str, dtype: Any = None, size: int | None = None, repeats: int = 20) -> float:
    """Dense matmul rate in FLOP/s (2*n^3 per n x n product), half precision on a GPU, fp32 on the CPU."""
    import torch

    from .timing import Clock

    gpu = device.startswith("cuda")
    dtype = dtype or (torch.float16 if gpu else torch.float32)
    n = size or (8192 if gpu else 1024)
    repeats = repeats if gpu else 5
    gen = torch.Generator(device=device).manual_seed(1)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=gen)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=gen)
    clock = Clock(device)
    for _ in range(3):
        a @ b
    clock.synchronize()
    start = clock.mark()
    for _ in range(repeats):
        a @ b
    end = clock.mark()
    clock.synchronize()
    return 2.0 * n**3 * repeats / clock.seconds(start, end)


def ceilings(env: dict[str, Any], device: str, gpu: str | None, measure: bool) -> dict[str, Any]:
    """The bandwidth and matmul rate the roofline uses, each with where it came from."""
    profile = pick_profile(env, gpu)
    out: dict[str, Any] = {
        "profile": profile.to_dict() if profile else None,
        "bandwidth_bytes_per_s": None,
        "bandwidth_source": None,
        "matmul_flops_per_s": None,
        "matmul_source": None,
        "measured_copy_bytes_per_s": None,
        "measured_matmul_flops_per_s": None,
    }
    if profile is not None:
        out["bandwidth_bytes_per_s"] = profile.effective_bandwidth_tbs * 1e12
        kind = "measured copy (recorded)" if profile.measured_bandwidth_tbs else "datasheet peak"
        out["bandwidth_source"] = f"profile {profile.key}: {kind}"
        out["matmul_flops_per_s"] = profile.fp16_tflops * 1e12
        out["matmul_source"] = f"profile {profile.key}: datasheet fp16 dense peak"
    if measure:
        if gpu and env["device_type"] == "cuda" and profile is not None and profile_for_device(env["device_name"]) != profile:
            out["note"] = f"--gpu {gpu} differs from the device in use: measured ceilings describe {env['device_name']}"
        bw = measure_copy_bandwidth(device)
        flops = measure_matmul_flops(device)
        out.update(measured_copy_bytes_per_s=bw, measured_matmul_flops_per_s=flops)
        if not gpu:
            out.update(bandwidth_bytes_per_s=bw, bandwidth_source="measured copy in this run (read + write)",
                       matmul_flops_per_s=flops, matmul_source="measured matmul in this run")
    return out


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (never resets: it bounds, not isolates, one run)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
