"""Kernel tests run Triton kernels in the CPU interpreter unless a GPU is present.

The interpreter's defects on some Triton versions (bf16 dot and casts, 3.6's scalar indexing under
NumPy 2.4) are repaired by `optimum_amdx.kernels.triton_compat.fix_interpreter`, which
`runtime.use_triton` applies whenever it picks the interpreter; tests need no patches of their own.
Only the tests under tests/kernels run in the interpreter; tests/conftest.py keeps the others on the
PyTorch path even when one xdist worker collected both.
"""

import os

import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    os.environ["TRITON_INTERPRET"] = "1"
    # tests/conftest.py removes it again for the tests outside tests/kernels (see there).
    os.environ["OPTIMUM_AMDX_TESTS_SET_TRITON_INTERPRET"] = "1"
