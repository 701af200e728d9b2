"""What differs between the Triton releases we support (3.6 to 3.9), handled in this one place.

Compiled kernels (GPU, and the AMD ahead-of-time compile): the language features the kernels use
behave the same in 3.6-3.9. One compile default moves: FP fusion (contracting a * b + c into one
FMA) is on by default through 3.9, and 3.9 warns in every process that the default turns off in
3.10. Every launch (and every compile-check spec) passes `PINNED_COMPILE_OPTIONS`, so all versions
build the kernels the way they were validated, and 3.9 stays quiet. What a release changes in the
generated code (registers, occupancy) is recorded per version by the compile check
(`optimum_amdx/devtools/compile_tables/`), not papered over.

The CPU interpreter (`TRITON_INTERPRET=1`: CI, debugging) has three defects that would make a
correct kernel look wrong. `fix_interpreter()` repairs each one only where a probe shows it, so a
Triton release that fixes one simply stops being patched:

1. `tl.dot` on bfloat16 (3.6 through 3.9): the interpreter stores bf16 as raw uint16 bits and its
   `create_dot` passes those bits to `numpy.matmul` as integers. Fix: widen bf16 operands to
   float32 (exact) before the matmul, as the GPU's bf16 MMA with fp32 accumulation does.
2. float32 -> bfloat16 casts (3.6 through 3.9) truncate the mantissa; GPUs round to nearest even.
   Fix: round through torch's float32 -> bfloat16 conversion (round to nearest even).
3. `tensor.__index__` (3.6 only) calls `int()` on a one-element 1-d array. NumPy 2.4 (2.4.6 here)
   raises "only 0-dimensional arrays can be converted to Python scalars" where 2.2 only warned,
   which failed 84 kernel tests under 3.6 (every `range(...)`/`tl.static_range` over a runtime
   scalar). Triton 3.7 squeezes the array first; the fix does the same on 3.6. With it the 3.6
   interpreter leg runs with current NumPy; without it, it would need numpy<2.3.

`runtime.use_triton` calls `fix_interpreter()` the first time it picks the interpreter, so every
interpreter user (tests included) gets results that match the GPU, with no test-only patches and no
interpreter-only branches in the kernels (the attention kernels' former UPCAST_DOT is gone).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["PINNED_COMPILE_OPTIONS", "fix_interpreter", "interpreter_defects"]

PINNED_COMPILE_OPTIONS: dict[str, Any] = {"enable_fp_fusion": True}
"""Compile options passed to every kernel launch because their default differs between releases
(accepted by 3.6-3.9 on AMD and NVIDIA; the interpreter ignores them)."""


def _builder_and_handle() -> tuple[Any, Any, Any]:
    import triton.language as tl
    from triton.runtime import interpreter

    return interpreter.InterpreterBuilder, interpreter.TensorHandle, tl


def _bf16_dot_is_wrong() -> bool:
    import numpy as np

    builder_cls, handle, tl = _builder_and_handle()
    one = handle(np.array([[0x3F80]], dtype=np.uint16), tl.bfloat16)  # bf16 1.0
    acc = handle(np.zeros((1, 1), dtype=np.float32), tl.float32)
    out = builder_cls.create_dot(builder_cls(), one, one, acc, None, None)
    return float(np.asarray(out.data).reshape(-1)[0]) != 1.0


def _bf16_cast_truncates() -> bool:
    import numpy as np

    builder_cls, handle, tl = _builder_and_handle()
    x = handle(np.array([1.0 + 2.0**-8 + 2.0**-10], dtype=np.float32), tl.float32)  # rounds up to 1 + 2^-7
    out = builder_cls.cast_impl(builder_cls(), x, tl.bfloat16)
    return int(np.asarray(out.data).reshape(-1)[0]) != 0x3F81


def _index_breaks_on_numpy() -> bool:
    import numpy as np
    from triton.runtime import interpreter

    try:
        int(np.array([1]))
    except TypeError:
        return ".squeeze()" not in inspect.getsource(interpreter._patch_lang_tensor)
    return False


def interpreter_defects() -> list[str]:
    """Which of the defects in the module docstring the installed Triton interpreter has."""
    probes = {"bf16_dot": _bf16_dot_is_wrong, "bf16_cast": _bf16_cast_truncates, "index": _index_breaks_on_numpy}
    return [name for name, probe in probes.items() if probe()]


@functools.lru_cache(maxsize=None)
def fix_interpreter() -> tuple[str, ...]:
    """Patch the interpreter defects that the installed Triton has (once per process); returns their names."""
    import numpy as np
    import torch
    from triton.runtime import interpreter

    builder_cls, handle, tl = _builder_and_handle()
    defects = interpreter_defects()
    if "bf16_dot" in defects:
        original_dot = builder_cls.create_dot

        def _as_float32(h: Any) -> Any:
            if h.dtype.scalar == tl.bfloat16:
                bits = h.data.astype(np.uint32) << 16
                return handle(bits.view(np.float32), tl.float32)
            return h

        def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
            return original_dot(self, _as_float32(a), _as_float32(b), d, input_precision, max_num_imprecise_acc)

        builder_cls.create_dot = create_dot
    if "bf16_cast" in defects:
        original_cast = builder_cls.cast_impl

        def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
            if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
                data = np.ascontiguousarray(src.data, dtype=np.float32)
                rounded = torch.from_numpy(data).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
                return handle(rounded, tl.bfloat16)
            return original_cast(self, src, dst_type)

        builder_cls.cast_impl = cast_impl
        builder_cls.create_fp_trunc = cast_impl
    if "index" in defects:
        original_patch = interpreter._patch_lang_tensor

        def _patch_lang_tensor(tensor: Any, scope: Any) -> None:
            original_patch(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

        interpreter._patch_lang_tensor = _patch_lang_tensor
    return tuple(defects)
