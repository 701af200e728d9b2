"""Programmatic dependent launch inside a kernel (NVIDIA sm_90+; `runtime.pdl_enabled` decides per launch).

A Triton helper the `_<op>_triton` modules call, not an op of its own (so no AMD compile specs here: the
kernels that call it are compiled in theirs).

A kernel launched with the attribute calls `pdl_begin` before it reads anything an earlier kernel wrote
and before it writes anything: it lets the next kernel launch now (``griddepcontrol.launch_dependents``)
and waits until the previous kernel has finished and its writes are visible (``griddepcontrol.wait``).
Reads of data no kernel writes (weights) may come first. Kernels call it only under a constexpr that is
False on AMD and under the interpreter, so neither ever sees the PTX; a Triton built without the NVIDIA
backend (a ROCm wheel) gets no-op stand-ins, so importing the kernels never depends on it.
"""

from __future__ import annotations

import triton

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # no NVIDIA backend in this Triton: PDL is never enabled there (see the docstring)

    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass


@triton.jit
def pdl_begin():
    """Let the next kernel launch, then wait for the previous one (see the module docstring)."""
    gdc_launch_dependents()
    gdc_wait()
