"""Kernel tests run Triton kernels in the CPU interpreter unless a GPU is present."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
