"""Kernel tests run Triton kernels in the CPU interpreter unless a GPU is present.

The interpreter's defects on some Triton versions (bf16 dot and casts, 3.6's scalar indexing under
NumPy 2.4) are repaired by `optimum_amdx.kernels.triton_compat.fix_interpreter`, which
`runtime.use_triton` applies whenever it picks the interpreter; tests need no patches of their own.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
