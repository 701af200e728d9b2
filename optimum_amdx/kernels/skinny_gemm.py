"""Skinny GEMM for decode: ``y = x @ W^T (+ bias)`` with few rows of x (M <= 16) and an nn.Linear weight.

Why: at decode batch sizes a linear layer is a matrix-vector product that should stream its weight
at memory bandwidth. hipBLASLt is weak for M <= 8 on MI300 (vLLM ships its own skinny kernels for
ROCm for that reason); cuBLAS on NVIDIA is good but adds a split-K reduce launch per matmul. Whether
this kernel replaces the vendor BLAS is decided per architecture family by `skinny_max_m` (a tuned
table in `_skinny_gemm_triton`): 0 means "never" for that family.

This module imports no Triton; the kernel and its configs live in `_skinny_gemm_triton`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..errors import InvalidArgumentError
from .runtime import arch_family, device_arch, use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["skinny_gemm", "skinny_gemm_norm", "skinny_gemm_norm_reference", "skinny_gemm_reference", "skinny_max_m",
           "MAX_M"]

MAX_M = 16
"""The most rows the kernel handles; larger inputs go to the vendor BLAS."""


def skinny_gemm_reference(x: "torch.Tensor", weight: "torch.Tensor", bias: Optional["torch.Tensor"] = None,
                          act_mul: bool = False) -> "torch.Tensor":
    """PyTorch reference: ``torch.nn.functional.linear``, of ``silu(gate) * up`` when `act_mul`."""
    import torch

    if act_mul:
        gate, up = x.chunk(2, dim=-1)
        x = torch.nn.functional.silu(gate) * up
    return torch.nn.functional.linear(x, weight, bias)


def _family(t: "torch.Tensor") -> str:
    index = t.device.index if t.device.type == "cuda" and t.device.index is not None else 0
    return arch_family(device_arch(index))


def skinny_max_m(t: "torch.Tensor") -> int:
    """Most rows for which `skinny_gemm` should replace the vendor BLAS on `t`'s device (0 = never)."""
    if not use_triton(t):
        return 0
    from ._skinny_gemm_triton import family_max_m

    return family_max_m(_family(t))


def skinny_gemm(
    x: "torch.Tensor", weight: "torch.Tensor", bias: Optional["torch.Tensor"] = None,
    config: Optional[dict[str, Any]] = None, act_mul: bool = False,
) -> "torch.Tensor":
    """``x [..., K] @ weight[N, K]^T (+ bias[N])`` -> ``[..., N]`` in x's dtype.

    With `act_mul`, x is a fused gate/up output ``[..., 2K]`` and the product is taken of
    ``silu(gate) * up`` formed while loading (the gated MLP's down projection in one kernel).
    Runs the Triton kernel for up to `MAX_M` rows where Triton runs and this GPU family takes the
    shape (`_skinny_gemm_triton.has_config`); otherwise `F.linear` (after `silu_and_mul` when
    `act_mul`). `config` forces the kernel with those tile sizes (benchmarks).
    """
    k_in = 2 * weight.shape[-1] if act_mul else weight.shape[-1]
    if weight.dim() != 2 or x.shape[-1] != k_in:
        raise InvalidArgumentError(
            f"skinny_gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply (weight is [N, K]"
            f"{'; x must be [..., 2K] with act_mul' if act_mul else ''})."
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise InvalidArgumentError(f"skinny_gemm: bias {tuple(bias.shape)} must be [{weight.shape[0]}].")
    m = x.numel() // max(x.shape[-1], 1)
    eligible = m > 0 and m <= MAX_M and x.dtype == weight.dtype and weight.stride(-1) == 1 and use_triton(x, weight)
    if eligible:
        from ._skinny_gemm_triton import has_config, skinny_gemm_triton

        family = _family(x)
        if config is not None or has_config(family, m, weight.shape[0], weight.shape[1]):
            return skinny_gemm_triton(x, weight, bias, family, config, act_mul)
    if act_mul:
        from .act_mul import silu_and_mul

        x = silu_and_mul(x)
    return torch_linear(x, weight, bias)


def skinny_gemm_norm_reference(
    x: "torch.Tensor", residual: "torch.Tensor", norm_weight: "torch.Tensor", eps: float, weight: "torch.Tensor",
    bias: Optional["torch.Tensor"] = None,
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """PyTorch reference of `skinny_gemm_norm`: h = x + residual; (linear(RMSNorm(h)), h), rounded
    as transformers' LlamaRMSNorm and decoder layer round."""
    import torch

    h = x + residual
    hf = h.to(torch.float32)
    normed = norm_weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return torch.nn.functional.linear(normed, weight, bias), h


def skinny_gemm_norm(
    x: "torch.Tensor", residual: "torch.Tensor", norm_weight: "torch.Tensor", eps: float, weight: "torch.Tensor",
    bias: Optional["torch.Tensor"] = None, config: Optional[dict[str, Any]] = None,
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Residual add + RMSNorm feeding a projection, in one kernel: returns ``(RMSNorm(x + residual) @
    weight^T (+ bias), x + residual)``.

    Each program computes the row norms itself (the rows are a few KiB, read from L2) and the first
    one also writes ``x + residual``; so the separate add + RMSNorm launch before the projection
    disappears. Falls back to our `rms_norm` + `F.linear` where `skinny_gemm` would (shape not taken
    on this family, too many rows, no Triton) or when the norm weight's dtype differs from x's.
    """
    if residual.shape != x.shape or norm_weight.shape != (x.shape[-1],) or weight.dim() != 2 \
            or weight.shape[1] != x.shape[-1]:
        raise InvalidArgumentError(
            f"skinny_gemm_norm: x {tuple(x.shape)}, residual {tuple(residual.shape)}, norm weight "
            f"{tuple(norm_weight.shape)} and weight {tuple(weight.shape)} do not fit (x, residual [..., K]; "
            "norm weight [K]; weight [N, K])."
        )
    m = x.numel() // max(x.shape[-1], 1)
    same = x.dtype == weight.dtype == norm_weight.dtype == residual.dtype
    if same and 0 < m <= MAX_M and weight.stride(-1) == 1 and use_triton(x, residual, norm_weight, weight):
        from ._skinny_gemm_triton import has_config, skinny_gemm_triton

        family = _family(x)
        if config is not None or has_config(family, m, weight.shape[0], weight.shape[1]):
            return skinny_gemm_triton(x, weight, bias, family, config, norm=(residual, norm_weight, eps))
    from .rmsnorm import rms_norm

    normed, h = rms_norm(x, norm_weight, eps, residual=residual)
    return torch_linear(normed, weight, bias), h


def torch_linear(x: "torch.Tensor", weight: "torch.Tensor", bias: Optional["torch.Tensor"] = None) -> "torch.Tensor":
    """The vendor BLAS path (`torch.nn.functional.linear`)."""
    import torch

    return torch.nn.functional.linear(x, weight, bias)
