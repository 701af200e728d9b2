"""When to run a Triton kernel, on which architecture family, and shared launch-config helpers.

Kernels run through Triton when their tensors live on a GPU, or on the CPU when
`TRITON_INTERPRET=1` (the interpreter, used by CI). Otherwise callers get the PyTorch reference.
Imports neither torch nor triton at module level (fronts import this in the core install).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING, Any

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
        from .triton_compat import fix_interpreter

        fix_interpreter()  # cached: repairs the interpreter defects of this Triton once per process
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


def kernel_arch(t: "torch.Tensor") -> str:
    """The arch string the kernels' configs are keyed on for tensor `t`'s device: "cpu" under the interpreter
    (asked on every call: `device_arch` caches per device, and tests switch the interpreter on), else
    `device_arch` of t's GPU."""
    return "cpu" if interpret_mode() else device_arch(t.device.index or 0)


def arch_family(arch: str) -> str:
    """The family launch configs are keyed by, from the GPU fact table (`hardware.gpu_facts`).

    "cdna2" (gfx90a), "cdna3" (gfx940-942), "cdna4" (gfx950), "rdna3" (gfx110x/115x), "rdna4" (gfx12xx),
    "hopper" (sm_90), "nvidia" (other known sm_XY), "cpu" (interpreter or no GPU), "unknown" otherwise
    (an unknown sm_XY is still "nvidia": every NVIDIA GPU is wave32 and takes the NVIDIA defaults).
    """
    from optimum_amdx.hardware.gpu_facts import arch_facts

    if arch == "cpu":
        return "cpu"
    facts = arch_facts(arch)
    if facts is not None:
        return facts.tuning_family
    return "nvidia" if arch.startswith("sm_") else "unknown"


@functools.lru_cache(maxsize=None)
def _compute_units_of(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def compute_units(device: "torch.device", on_cpu: int = 1) -> int:
    """Compute units (CUs on AMD, SMs on NVIDIA) of a GPU device, cached per device; `on_cpu` for a CPU
    device (the interpreter), where a caller may want more than one to exercise its grid splitting."""
    if device.type != "cuda":
        return on_cpu
    if device.index is None:
        import torch

        return _compute_units_of(torch.cuda.current_device())
    return _compute_units_of(device.index)


def tensor_family(t: "torch.Tensor") -> str:
    """The config family of the device a tensor lives on ("cpu" for CPU tensors and the interpreter)."""
    index = t.device.index if t.device.type == "cuda" and t.device.index is not None else 0
    return arch_family(device_arch(index))


PDL_KERNELS = ("rmsnorm", "silu_mul", "rope_cache", "attention", "split_reduce", "skinny", "w4a16", "w4a16_rows")
"""The kernels that take part in programmatic dependent launch (`pdl_enabled`; "w4a16" is the one-row
stream kernel and the launch that prepares its act-order activation pairs, "w4a16_rows" the pipelined GEMM, which
never serves one row)."""
PDL_CHAIN_ROWS = 64
"""The row limit of the W4A16 decode chain's kernels in `PDL_MAX_ROWS` (every other kernel has one row)."""
PDL_MAX_ROWS: dict[str, int] = {"rmsnorm": PDL_CHAIN_ROWS, "silu_mul": PDL_CHAIN_ROWS, "w4a16_rows": PDL_CHAIN_ROWS,
                                "rope_cache": 1, "attention": 1, "split_reduce": 1, "skinny": 1, "w4a16": 1}
"""Per kernel of `PDL_KERNELS`, the most rows (tokens) a launch takes programmatic dependent launch for.

One row: every kernel. Decode step on an H200 (RESULTS.md round10), off -> on: one row 2.6-3.9 % faster in fp16
and 7.3-8.8 % with GPTQ weights (Llama-3-8B, Llama-2-7B shapes). Above one row, with every kernel taking part and
dependents launched as each kernel starts, it was mixed (rounds 10, 16, 26: fp16 up to 4 % slower at 16 rows), and
the pipelined W4A16 GEMM, which serves 2-256 rows, did not take part, so each layer's chain broke at its
projections.

Up to `PDL_CHAIN_ROWS` rows, the W4A16 chain: the pipelined GEMM asks L2 for its first weight tiles before it waits,
and lets the next kernel launch after its K loop (`_w4a16_pipelined_triton`); the norms and SiLU * up that feed it
and read its accumulators launch early too (RESULTS.md round28). Decode step, H100, one process, against every
kernel at one row: GPTQ Llama-2-7B at 2 / 8 / 16 / 64 sequences 1.4-2.7 % less time, Llama-3-8B 2.1-3.7 %. The
rotary + cache kernel added nothing there (within 0.5 %) and stays at one row with the decode attention, its split
reduce and the skinny GEMM: above one row those cost fp16 steps up to 5.3 % (rounds 10, 16, 26, 28), and the attention
cost GPTQ Llama-3-8B its gain at 64 sequences (RESULTS.md round28, 3)."""
_PDL: dict[str, Any] = {"on": os.environ.get("OPTIMUM_AMDX_PDL", "1") not in ("", "0"), "off": frozenset()}


def set_pdl(enabled: bool, off: tuple[str, ...] = ()) -> None:
    """Switch programmatic dependent launch on or off for launches from now on, and leave out the
    `PDL_KERNELS` named in `off` (benchmarks compare; `OPTIMUM_AMDX_PDL=0` starts with it off). Graphs
    captured earlier keep what they were captured with."""
    unknown = set(off) - set(PDL_KERNELS)
    if unknown:
        raise ValueError(f"unknown PDL kernels {sorted(unknown)}; expected some of {PDL_KERNELS}")
    _PDL["on"] = bool(enabled)
    _PDL["off"] = frozenset(off)


def pdl_enabled(arch: str) -> bool:
    """Whether kernels on `arch` use programmatic dependent launch: an NVIDIA GPU of sm_90 or later (the
    ``griddepcontrol`` instructions; AMD has no counterpart, and the interpreter runs no PTX), unless
    switched off. Used by the decode step's kernels (`PDL_KERNELS`), each launched with the attribute: as
    it starts it lets the next kernel launch, then waits for the previous one to finish (`_pdl.pdl_begin`);
    the one-row W4A16 kernel loads its first weight tile before waiting (RESULTS.md round10)."""
    if not _PDL["on"] or not arch.startswith("sm_"):
        return False
    digits = arch[3:]
    return digits.isdigit() and int(digits) >= 90


def pdl_for(t: "torch.Tensor", kernel: str, rows: int) -> bool:
    """`pdl_enabled` for a launch of `kernel` (one of `PDL_KERNELS`) over `rows` rows (tokens) on the GPU
    tensor `t` lives on: False on the CPU, under the interpreter and above the kernel's `PDL_MAX_ROWS` rows."""
    if kernel not in PDL_KERNELS:
        raise ValueError(f"unknown PDL kernel {kernel!r}; expected one of {PDL_KERNELS}")
    if interpret_mode() or t.device.type != "cuda" or kernel in _PDL["off"] or rows > PDL_MAX_ROWS[kernel]:
        return False
    return pdl_enabled(device_arch(t.device.index or 0))


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


LAUNCH_OPTION_KEYS = frozenset({"num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack", "maxnreg"})
"""Keys of a launch config that are compile options rather than constexpr tile sizes."""


def amd_launch_options(family: str, num_warps: int, waves_per_eu: int) -> dict[str, Any]:
    """Base launch options on AMD: one pipeline stage, and on CDNA `waves_per_eu` + 16x16 MFMA."""
    opts: dict[str, Any] = {"num_warps": num_warps, "num_stages": 1}
    if family in ("cdna2", "cdna3", "cdna4"):
        opts.update(waves_per_eu=waves_per_eu, matrix_instr_nonkdim=16)
    return opts


def split_launch_options(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate a config into (constexpr tile sizes, launch options)."""
    consts = {k: v for k, v in cfg.items() if k not in LAUNCH_OPTION_KEYS}
    launch = {k: v for k, v in cfg.items() if k in LAUNCH_OPTION_KEYS}
    return consts, launch
