"""Triton kernels for AMD (and NVIDIA) GPUs, each with a plain PyTorch reference beside it.

Every op has the same shape (new kernels follow it):

- ``<op>.py``, the front: the public functions (argument checks, then dispatch) and the PyTorch
  reference ``<op>_reference``. It imports no triton, so the core install (no `kernels` extra)
  imports it and runs the reference on CPU. It dispatches with ``runtime.use_triton(*tensors)``
  and imports ``._<op>_triton`` inside the function, only when a kernel runs.
- ``_<op>_triton.py``: the ``@triton.jit`` kernels, their launch configs (functions of the arch
  family from ``runtime.arch_family``), the launchers the front calls, and a module-level
  ``AMD_COMPILE_SPECS: list[CompileSpec]`` (one entry per shipped config, built from those same
  config functions). That list is the registration: ``compile_spec.spec_modules()`` finds every
  ``_*_triton`` module by name, and the compile check
  (``python -m optimum_amdx.devtools.amd_compile``) compiles each spec for gfx90a, gfx942, gfx950
  and gfx1100.
- Every launch passes ``**triton_compat.PINNED_COMPILE_OPTIONS`` (compile defaults that differ
  between Triton releases); the compile check adds the same options to every spec.
- Imports point one way: ``_<op>_triton`` may import ``compile_spec``, ``runtime`` and its front's
  pure helpers; a front never imports a ``_*_triton`` module at module level. No circles.

Shared modules: ``runtime`` (when to use Triton, arch family, launch-option helpers),
``compile_spec`` (the spec type and its discovery), ``triton_compat`` (differences between the
supported Triton releases: today only interpreter defects). Ops: ``flash_attention`` (dense
FlashAttention-2; its reference is also the paged one's core), ``paged_attention`` (KV write,
unified paged attention, split-K, soft-capping), ``rmsnorm``, ``rotary``, ``w4a16``, ``fused_moe``
(top-k routing, expert-sorted grouped GEMMs), ``argmax`` (each row's first maximum: greedy sampling), ``gather``
(rows of a table by index: the token embedding, the pick of sampled rows).
Triton helpers that are not ops of their own (``_pdl``: programmatic dependent launch; ``_pairs``: the W4A16
one-row pair order its producers write) are called from the ``_<op>_triton`` modules and compiled in their specs.

This subpackage uses nothing of ours beyond ``errors`` and the torch-free GPU fact table
``hardware.gpu_facts``.
"""
