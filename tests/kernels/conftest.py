"""Kernel tests run Triton kernels in the CPU interpreter unless a GPU is present.

Triton 3.6's interpreter multiplies bfloat16 `tl.dot` operands as their raw uint16 bits (it stores
bf16 as uint16 and hands them to numpy.matmul unchanged). The patch below converts such operands
to float32 first, so bf16 kernels are checked for what they compute on a GPU.
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

    builder_cls.create_dot = create_dot
    builder_cls._amdx_bf16_dot = True


_patch_interpreter_bf16_dot()
