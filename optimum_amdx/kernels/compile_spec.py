"""How a kernel registers itself with the ahead-of-time AMD compile check (one mechanism for all ops).

The rule: every `optimum_amdx/kernels/_<op>_triton.py` module defines a module-level
``AMD_COMPILE_SPECS: list[CompileSpec]``, one entry per shipped configuration, built from the same
config functions that pick the launch config at run time. `spec_modules()` finds those modules by
name (nothing else is imported), so a new op registers by following the file name and defining the
list; no central list to edit. The compile tool (`python -m optimum_amdx.devtools.amd_compile`)
compiles every spec for gfx90a, gfx942, gfx950 and gfx1100 on a CPU-only machine and records
registers, scratch, LDS and occupancy per Triton version.

This module imports neither torch nor triton.
"""

from __future__ import annotations

import pkgutil
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from optimum_amdx.hardware.gpu_facts import ARCHS

AMD_ARCHS: tuple[str, ...] = ("gfx90a", "gfx942", "gfx950", "gfx1100")
"""The AMD targets every kernel must compile for."""

WAVE_SIZE: dict[str, int] = {a: ARCHS[a].wave_size for a in AMD_ARCHS}
"""Wave size per compile target, read from the GPU fact table."""

SPEC_MODULE_PATTERN = re.compile(r"^_[a-z0-9_]+_triton$")
"""Module names (inside `optimum_amdx.kernels`) that hold kernels and their `AMD_COMPILE_SPECS`."""


@dataclass(frozen=True)
class CompileSpec:
    """One kernel in one shipped configuration, as the AMD compile check sees it.

    name: row label in the compile table, e.g. "unified_attention[decode,d128,fp16]".
    kernel: the `@triton.jit` function itself (not an autotuner wrapper).
    signature: argument name -> Triton type ("*fp16", "*i32", "i32", "fp32", "constexpr").
    constexprs: values of the constexpr arguments for this configuration.
    options: arch -> compile options (num_warps, num_stages, waves_per_eu, matrix_instr_nonkdim, kpack).
    hot: a hot kernel must not spill to scratch on gfx942 and gfx90a.
    uses_dot: the kernel has a `tl.dot`, so MFMA (CDNA) or WMMA (RDNA3) instructions must appear.
    archs: the targets this spec is compiled for (archs with different tiles get their own spec).
    divisible_by_16: integer arguments compiled as multiples of 16, as Triton specializes them at
        launch for the shipped shapes (pointers are always taken as 16-byte aligned).
    """

    name: str
    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: Callable[[str], dict[str, Any]]
    hot: bool = True
    uses_dot: bool = False
    archs: tuple[str, ...] = field(default=AMD_ARCHS)
    divisible_by_16: tuple[str, ...] = ()


def spec_modules() -> list[str]:
    """Full names of the `_<op>_triton` modules of `optimum_amdx.kernels`, sorted (not imported)."""
    from optimum_amdx import kernels

    return sorted(f"optimum_amdx.kernels.{m.name}" for m in pkgutil.iter_modules(kernels.__path__)
                  if SPEC_MODULE_PATTERN.match(m.name))


def grouped_specs(
    name: str,
    kernel: Any,
    signature: dict[str, str],
    make: Callable[[str], tuple[dict[str, Any], dict[str, Any]]],
    hot: bool,
    uses_dot: bool,
    divisible_by_16: tuple[str, ...] = (),
) -> list[CompileSpec]:
    """One spec per group of archs that share constexprs; `make(arch)` -> (constexprs, options).

    The first group keeps `name`; later groups (archs with other tile sizes, e.g. RDNA3) get the
    family of their first arch appended inside the brackets, "name[...,rdna3]".
    """
    from optimum_amdx.kernels.runtime import arch_family

    groups: dict[tuple, list[str]] = {}
    for arch in AMD_ARCHS:
        consts, _ = make(arch)
        groups.setdefault(tuple(sorted(consts.items())), []).append(arch)
    specs = []
    for i, (key, archs) in enumerate(groups.items()):
        label = name if i == 0 else f"{name[:-1]},{arch_family(archs[0])}]"
        specs.append(CompileSpec(
            name=label, kernel=kernel, signature=signature, constexprs=dict(key),
            options=lambda arch, make=make: make(arch)[1], hot=hot, uses_dot=uses_dot, archs=tuple(archs),
            divisible_by_16=divisible_by_16,
        ))
    return specs
