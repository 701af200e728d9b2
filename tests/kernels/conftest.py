"""Kernel tests run Triton kernels in the CPU interpreter unless a GPU is present.

Triton 3.6's interpreter stores bfloat16 as raw uint16 bits, and two of its paths get bf16 wrong:
`tl.dot` hands those bits to numpy.matmul unchanged, and float32 -> bfloat16 casts truncate where
the GPU rounds to nearest even. The patches below fix both (test-only), so bf16 kernels are checked
for what they compute on a GPU.
"""

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def _patch_interpreter_bf16_dot() -> None:
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder_cls = interpreter.InterpreterBuilder
    if getattr(builder_cls, "_amdx_bf16_dot", False):
        return
    original = builder_cls.create_dot

    def _as_float32(handle):
        if handle.dtype.scalar == tl.bfloat16:
            bits = handle.data.astype(np.uint32) << 16
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, _as_float32(a), _as_float32(b), d, input_precision, max_num_imprecise_acc)

    original_cast = builder_cls.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
            return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return original_cast(self, src, dst_type)

    builder_cls.create_dot = create_dot
    builder_cls.cast_impl = cast_impl
    builder_cls.create_fp_trunc = cast_impl
    builder_cls._amdx_bf16_dot = True


_patch_interpreter_bf16_dot()
