"""Execution-provider choice, option validation and verification for ONNX Runtime sessions.

AMD has two providers: `MIGraphXExecutionProvider` (current ONNX Runtime, package
onnxruntime-migraphx) and `ROCMExecutionProvider` (onnxruntime-rocm <= 1.22, removed in 1.23).
A provider listed by `get_available_providers()` is only compiled in: its shared library and the
ROCm/CUDA libraries behind it may still be missing, in which case ONNX Runtime silently runs on
the CPU. `verify_session` reads `session.get_providers()` after creation and turns such a
fallback into a `ProviderError` naming the library that failed to load.
"""

from __future__ import annotations

import ctypes
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidArgumentError, ProviderError

logger = logging.getLogger(__name__)

MIGRAPHX = "MIGraphXExecutionProvider"
ROCM = "ROCMExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

PROVIDER_PRIORITY: tuple[str, ...] = (MIGRAPHX, ROCM, CUDA, CPU)
GPU_PROVIDERS: frozenset[str] = frozenset({MIGRAPHX, ROCM, CUDA})

_ALIASES: dict[str, str] = {
    "migraphx": MIGRAPHX, "rocm": ROCM, "cuda": CUDA, "cpu": CPU,
    **{p.lower(): p for p in PROVIDER_PRIORITY},
}

# The provider's own library inside onnxruntime/capi, and the runtime libraries it needs.
_PROVIDER_LIBRARIES: dict[str, tuple[str, tuple[str, ...]]] = {
    ROCM: ("libonnxruntime_providers_rocm.so", ("libamdhip64.so", "libMIOpen.so", "librocblas.so", "libhipblaslt.so")),
    MIGRAPHX: ("libonnxruntime_providers_migraphx.so", ("libamdhip64.so", "libmigraphx_c.so")),
    CUDA: ("libonnxruntime_providers_cuda.so", ("libcudart.so", "libcublas.so", "libcudnn.so")),
}

_INSTALL_HINT: dict[str, str] = {
    MIGRAPHX: "install onnxruntime-migraphx (it replaces onnxruntime) on a machine with ROCm and MIGraphX",
    ROCM: "install onnxruntime-rocm <= 1.22 (it replaces onnxruntime; ROCm EP was removed in 1.23) on a machine with ROCm",
    CUDA: "install onnxruntime-gpu with a matching CUDA/cuDNN",
    CPU: "install onnxruntime",
}

_BOOL_KEYS: dict[str, frozenset[str]] = {
    ROCM: frozenset({"tunable_op_enable", "tunable_op_tuning_enable", "do_copy_in_default_stream",
                     "miopen_conv_exhaustive_search", "enable_hip_graph", "miopen_conv_use_max_workspace"}),
    MIGRAPHX: frozenset({"migraphx_fp16_enable", "migraphx_int8_enable", "migraphx_fp8_enable",
                         "migraphx_bf16_enable", "migraphx_exhaustive_tune", "migraphx_save_compiled_model",
                         "migraphx_load_compiled_model", "migraphx_use_native_calibration_table",
                         "migraphx_int8_use_native_calibration_table"}),
    CUDA: frozenset({"do_copy_in_default_stream", "enable_cuda_graph", "cudnn_conv_use_max_workspace",
                     "use_tf32", "enable_skip_layer_norm_strict_mode"}),
    CPU: frozenset(),
}
_OTHER_KEYS: dict[str, frozenset[str]] = {
    ROCM: frozenset({"device_id", "tunable_op_max_tuning_duration_ms", "gpu_mem_limit", "arena_extend_strategy",
                     "gpu_external_alloc", "gpu_external_free", "gpu_external_empty_cache"}),
    MIGRAPHX: frozenset({"device_id", "migraphx_model_cache_dir", "migraphx_save_model_path",
                         "migraphx_load_model_path", "migraphx_int8_calibration_table_name",
                         "migraphx_mem_limit", "migraphx_arena_extend_strategy", "migraphx_external_alloc",
                         "migraphx_external_free", "migraphx_external_empty_cache"}),
    CUDA: frozenset({"device_id", "gpu_mem_limit", "arena_extend_strategy", "cudnn_conv_algo_search",
                     "tunable_op_enable", "tunable_op_tuning_enable"}),
    CPU: frozenset({"arena_extend_strategy"}),
}
# Defaults that suit AMD: use TunableOp results (tuning itself is opt-in: it is slow the first run).
_DEFAULTS: dict[str, dict[str, str]] = {
    ROCM: {"device_id": "0", "tunable_op_enable": "1", "tunable_op_tuning_enable": "0"},
    MIGRAPHX: {"device_id": "0", "migraphx_fp16_enable": "0", "migraphx_exhaustive_tune": "0"},
    CUDA: {"device_id": "0"},
    CPU: {},
}


def available_providers() -> list[str]:
    """Providers compiled into the installed onnxruntime (not a promise that they can load)."""
    import onnxruntime

    return list(onnxruntime.get_available_providers())


def normalize_provider(name: str) -> str:
    """`"rocm"`, `"ROCMExecutionProvider"`... -> the canonical provider name, or a clear error."""
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ProviderError(
            f"Unknown execution provider {name!r}. Valid providers: {', '.join(PROVIDER_PRIORITY)} "
            "(or the short names migraphx, rocm, cuda, cpu)."
        )
    return _ALIASES[key]


def choose_provider(requested: str | None = None, available: list[str] | None = None) -> str:
    """The requested provider if the installed onnxruntime has it; else the first of MIGraphX, ROCm, CUDA, CPU."""
    available = available_providers() if available is None else available
    if requested is None:
        for name in PROVIDER_PRIORITY:
            if name in available:
                return name
        raise ProviderError(f"The installed onnxruntime offers none of {', '.join(PROVIDER_PRIORITY)} (it has {available}).")
    name = normalize_provider(requested)
    if name not in available:
        import onnxruntime

        raise ProviderError(
            f"{name} is not available in the installed onnxruntime {onnxruntime.__version__} "
            f"(it offers: {', '.join(available)}). To use it, {_INSTALL_HINT[name]}; or pass provider='CPUExecutionProvider'."
        )
    return name


def _as_flag(provider: str, key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return "1"
    if text in ("0", "false", "no", "off"):
        return "0"
    raise InvalidArgumentError(f"{provider} option {key}={value!r}: expected a boolean (True/False or 1/0).")


def provider_options(provider: str, options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Validated options for `provider`, with AMD-friendly defaults filled in, as strings."""
    provider = normalize_provider(provider)
    merged = dict(_DEFAULTS[provider])
    known = _BOOL_KEYS[provider] | _OTHER_KEYS[provider]
    for key, value in (options or {}).items():
        if key not in known:
            raise InvalidArgumentError(
                f"Unknown {provider} option {key!r}. Known options: {', '.join(sorted(known)) or '(none)'}."
            )
        if key in _BOOL_KEYS[provider]:
            merged[key] = _as_flag(provider, key, value)
        elif key == "device_id":
            if not str(value).isdigit():
                raise InvalidArgumentError(f"{provider} option device_id={value!r}: expected a non-negative integer.")
            merged[key] = str(int(value))
        else:
            merged[key] = str(value)
    if provider == MIGRAPHX:
        _check_migraphx(merged)
    return merged


def _check_migraphx(options: dict[str, str]) -> None:
    """MIGraphX options that fail late (or silently) inside ONNX Runtime, checked up front.

    `migraphx_model_cache_dir` is where MIGraphX saves each compiled program (one per graph of a
    static export) and loads it on the next run instead of compiling again: it must be a
    writable folder. It is made absolute and created here.
    """
    cache = options.get("migraphx_model_cache_dir")
    if cache is not None:
        folder = Path(cache).expanduser().resolve()
        if folder.exists() and not folder.is_dir():
            raise InvalidArgumentError(f"MIGraphX option migraphx_model_cache_dir={cache!r} is a file; give a folder.")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InvalidArgumentError(f"MIGraphX option migraphx_model_cache_dir={cache!r}: cannot create it ({err}).") from err
        if not os.access(folder, os.W_OK | os.X_OK):
            raise InvalidArgumentError(
                f"MIGraphX option migraphx_model_cache_dir={cache!r} is not writable; compiled programs could not be saved."
            )
        options["migraphx_model_cache_dir"] = str(folder)
    limit = options.get("migraphx_mem_limit")
    if limit is not None and not limit.isdigit():
        raise InvalidArgumentError(f"MIGraphX option migraphx_mem_limit={limit!r}: expected a number of bytes.")
    if options.get("migraphx_fp16_enable") == "1" and options.get("migraphx_bf16_enable") == "1":
        raise InvalidArgumentError("MIGraphX options migraphx_fp16_enable and migraphx_bf16_enable exclude each other.")


def missing_libraries(provider: str) -> list[str]:
    """Why `provider` cannot load here: the loader errors for its library and runtime dependencies."""
    import onnxruntime

    if provider not in _PROVIDER_LIBRARIES:
        return []
    own, deps = _PROVIDER_LIBRARIES[provider]
    capi = Path(onnxruntime.__file__).parent / "capi"
    problems: list[str] = []
    own_path = capi / own
    if not own_path.exists():
        problems.append(f"{own} (not in {capi})")
    else:
        try:
            ctypes.CDLL(str(own_path))
        except OSError as err:
            problems.append(str(err))
    for dep in deps:
        found = False
        for candidate in (dep, *(f"{dep}.{v}" for v in range(7, 0, -1))):
            try:
                ctypes.CDLL(candidate)
                found = True
                break
            except OSError:
                continue
        if not found:
            problems.append(f"{dep} (not found by the dynamic loader)")
    return problems


def verify_session(session, requested: str, allow_fallback: bool = False) -> str:
    """Return the provider that really runs `session`; raise if a requested GPU provider fell back to CPU."""
    active = list(session.get_providers())
    actual = active[0] if active else CPU
    if requested == actual or requested == CPU:
        return actual
    missing = missing_libraries(requested)
    reason = "; ".join(missing) if missing else "the provider failed to initialize (see onnxruntime's log above)"
    message = (
        f"{requested} was requested but ONNX Runtime is running on {actual} (session providers: {active}). "
        f"Missing or unloadable: {reason}. Fix: install ROCm / the provider's runtime so these libraries load "
        f"(check LD_LIBRARY_PATH), or ask for provider='CPUExecutionProvider'"
        + (" or pass allow_fallback=True." if not allow_fallback else ".")
    )
    if allow_fallback:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return actual
    raise ProviderError(message)
