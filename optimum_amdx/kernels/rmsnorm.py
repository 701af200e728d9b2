"""Fused RMSNorm (optionally with the residual add that sits between decoder layers).

Semantics follow transformers' LlamaRMSNorm exactly: the input is upcast to float32, normalized
by ``rsqrt(mean(x**2) + eps)``, cast back to the input dtype, then multiplied by the weight
(in the promoted dtype of weight and input). With a residual, ``h = x + residual`` is formed in
the input dtype first (as the decoder layer does) and both ``rms_norm(h)`` and ``h`` are returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from ..errors import InvalidArgumentError
from .runtime import use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["rms_norm", "rms_norm_reference"]


def rms_norm_reference(
    x: "torch.Tensor", weight: "torch.Tensor", eps: float, residual: Optional["torch.Tensor"] = None
) -> Union["torch.Tensor", tuple["torch.Tensor", "torch.Tensor"]]:
    """PyTorch reference: LlamaRMSNorm, with the residual add first when `residual` is given."""
    import torch

    h = x if residual is None else x + residual
    hf = h.to(torch.float32)
    var = hf.pow(2).mean(-1, keepdim=True)
    y = weight * (hf * torch.rsqrt(var + eps)).to(h.dtype)
    return y if residual is None else (y, h)


def rms_norm(
    x: "torch.Tensor", weight: "torch.Tensor", eps: float, residual: Optional["torch.Tensor"] = None
) -> Union["torch.Tensor", tuple["torch.Tensor", "torch.Tensor"]]:
    """RMSNorm over the last dim of ``x [..., hidden]``; with `residual`, returns ``(norm(x + r), x + r)``.

    Runs the Triton kernel when `use_triton` holds for the inputs, else `rms_norm_reference`.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise InvalidArgumentError(f"RMSNorm weight has shape {tuple(weight.shape)}; expected ({hidden},) for x {tuple(x.shape)}.")
    if residual is not None and residual.shape != x.shape:
        raise InvalidArgumentError(f"residual shape {tuple(residual.shape)} must equal x shape {tuple(x.shape)}.")
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if not use_triton(*tensors) or x.numel() == 0:
        return rms_norm_reference(x, weight, eps, residual)
    from ._rmsnorm_triton import rms_norm_triton

    return rms_norm_triton(x, weight, eps, residual)
