"""Triton kernels for AMD (and NVIDIA) GPUs, each with a plain PyTorch reference beside it.

This subpackage depends on nothing else of ours. Triton is imported only when a kernel runs.
"""
