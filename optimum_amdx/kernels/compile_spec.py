"""How a kernel declares itself to the ahead-of-time AMD compile check.

Each kernel module lists `AMD_COMPILE_SPECS`: the Triton function, a concrete signature and
the constexprs of one shipped configuration per architecture. `optimum_amdx.kernels.amd_compile`
compiles every spec for gfx90a, gfx942, gfx950 and gfx1100 on a CPU-only machine and records
registers, scratch, LDS and occupancy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

AMD_ARCHS: tuple[str, ...] = ("gfx90a", "gfx942", "gfx950", "gfx1100")
"""The AMD targets every kernel must compile for."""

WAVE_SIZE: dict[str, int] = {"gfx90a": 64, "gfx942": 64, "gfx950": 64, "gfx1100": 32}


@dataclass(frozen=True)
class CompileSpec:
    """One kernel in one shipped configuration, as the AMD compile check sees it.

    name: row label in the compile table, e.g. "paged_attention[decode,d128,fp16]".
    kernel: the `@triton.jit` function itself (not an autotuner wrapper).
    signature: argument name -> Triton type ("*fp16", "*i32", "i32", "fp32", "constexpr").
    constexprs: values of the constexpr arguments for this configuration.
    options: arch -> compile options (num_warps, num_stages, waves_per_eu, matrix_instr_nonkdim, kpack).
    hot: a hot kernel must not spill to scratch on gfx942 and gfx90a.
    uses_dot: the kernel has a `tl.dot`, so MFMA (CDNA) or WMMA (RDNA3) instructions must appear.
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
