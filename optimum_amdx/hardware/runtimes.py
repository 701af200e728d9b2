"""The ONNX Runtime and Triton installs: which build, which providers, and what is broken."""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import importlib.util
import re
from pathlib import Path

from .triton_range import triton_validation

ORT_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-rocm",
    "onnxruntime-migraphx",
    "onnxruntime-training",
    "onnxruntime-openvino",
    "onnxruntime-directml",
)

# Execution provider -> the shared library onnxruntime loads for it (inside onnxruntime/capi).
PROVIDER_LIBRARIES = {
    "ROCMExecutionProvider": "libonnxruntime_providers_rocm.so",
    "MIGraphXExecutionProvider": "libonnxruntime_providers_migraphx.so",
    "CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
}

_MISSING_LIB = re.compile(r"(lib[\w.+-]+\.so[\w.]*)\s*:\s*cannot open shared object file")


def installed_ort_distributions() -> dict[str, str]:
    """Installed onnxruntime wheels (name -> version). More than one is a broken install."""
    found = {}
    for name in ORT_DISTRIBUTIONS:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return found


def _capi_dir() -> Path | None:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "capi"


def provider_library_problem(provider: str) -> str | None:
    """Why ONNX Runtime cannot load `provider`'s shared library here, naming the missing library; None if it loads.

    onnxruntime-rocm lists ROCMExecutionProvider as available even when the ROCm libraries are absent,
    then silently runs on the CPU; loading the provider library ourselves reveals the real cause.
    """
    lib_name = PROVIDER_LIBRARIES.get(provider)
    capi = _capi_dir()
    if lib_name is None or capi is None:
        return None
    lib = capi / lib_name
    if not lib.exists():
        return f"{lib_name} is not part of this onnxruntime build ({capi})."
    shared = capi / "libonnxruntime_providers_shared.so"
    try:
        if shared.exists():
            ctypes.CDLL(str(shared), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(lib))
    except OSError as err:
        text = str(err)
        match = _MISSING_LIB.search(text)
        missing = match.group(1) if match else text
        return f"{lib_name} cannot be loaded: missing {missing}"
    return None


def onnxruntime_info() -> dict:
    """The installed ONNX Runtime: version, build distribution(s), providers, and provider load problems."""
    dists = installed_ort_distributions()
    info: dict = {"distributions": dists, "installed": bool(dists)}
    if not dists:
        return info
    try:
        import onnxruntime as ort

        info["version"] = ort.__version__
        info["device"] = ort.get_device()
        info["providers"] = list(ort.get_available_providers())
    except Exception as err:  # noqa: BLE001 - a broken install is itself the finding
        info["import_error"] = f"{type(err).__name__}: {err}"
        info["providers"] = []
    info["provider_problems"] = {
        p: problem for p in info["providers"] if p in PROVIDER_LIBRARIES and (problem := provider_library_problem(p))
    }
    return info


def triton_info() -> dict:
    """The Triton version, whether it is in the validated range (with the fix if not), and the GPU
    target it compiles for (None without a usable GPU)."""
    if importlib.util.find_spec("triton") is None:
        return {"installed": False}
    info: dict = {"installed": True}
    try:
        info["version"] = md.version("triton")
    except md.PackageNotFoundError:
        for name in ("pytorch-triton-rocm", "pytorch-triton"):
            try:
                info["version"] = md.version(name)
                info["distribution"] = name
                break
            except md.PackageNotFoundError:
                continue
    try:
        torch_version = md.version("torch")
    except md.PackageNotFoundError:
        torch_version = None
    info.update(triton_validation(info.get("version"), torch_version))
    try:
        import torch

        if torch.cuda.is_available():
            from triton.runtime import driver

            target = driver.active.get_current_target()
            info["target"] = {"backend": target.backend, "arch": str(target.arch), "warp_size": target.warp_size}
        else:
            info["target"] = None
            info["note"] = "no GPU visible: kernels run through their PyTorch references (or TRITON_INTERPRET=1)"
    except Exception as err:  # noqa: BLE001
        info["target"] = None
        info["error"] = f"{type(err).__name__}: {err}"
    return info
