"""Fused RMSNorm (optionally with the residual add that sits between decoder layers).

Semantics follow transformers' LlamaRMSNorm exactly: the input is upcast to float32, normalized
by ``rsqrt(mean(x**2) + eps)``, cast back to the input dtype, then multiplied by the weight
(in the promoted dtype of weight and input). With a residual, ``h = x + residual`` is formed in
the input dtype first (as the decoder layer does) and both ``rms_norm(h)`` and ``h`` are returned.
With `perm`, the normalized output comes out in that column order (``out[..., j] = norm(h)[..., perm[j]]``)
while ``h`` keeps the natural order: the gather an act-order GPTQ projection would otherwise make of its
input in a launch of its own happens here, in the same pass (`modeling.paged_model`). With `paired`, the
output comes out in the pair order of the W4A16 one-row kernel (`w4a16.pair_order`), which then reads it
as plain words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from ..errors import InvalidArgumentError
from .runtime import use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["rms_norm", "rms_norm_reference"]


def rms_norm_reference(
    x: "torch.Tensor", weight: "torch.Tensor", eps: float, residual: Optional["torch.Tensor"] = None,
    perm: Optional["torch.Tensor"] = None,
) -> Union["torch.Tensor", tuple["torch.Tensor", "torch.Tensor"]]:
    """PyTorch reference: LlamaRMSNorm, with the residual add first when `residual` is given and the
    output columns gathered by `perm` when given."""
    import torch

    h = x if residual is None else x + residual
    hf = h.to(torch.float32)
    var = hf.pow(2).mean(-1, keepdim=True)
    y = weight * (hf * torch.rsqrt(var + eps)).to(h.dtype)
    if perm is not None:
        y = y.index_select(-1, perm.to(device=y.device, dtype=torch.long))
    return y if residual is None else (y, h)


def rms_norm(
    x: "torch.Tensor", weight: "torch.Tensor", eps: float, residual: Optional["torch.Tensor"] = None,
    perm: Optional["torch.Tensor"] = None, accumulated: bool = False, paired: bool = False,
) -> Union["torch.Tensor", tuple["torch.Tensor", "torch.Tensor"]]:
    """RMSNorm over the last dim of ``x [..., hidden]``; with `residual`, returns ``(norm(x + r), x + r)``;
    with `perm` (integer ``[hidden]``, a permutation), the normalized output's columns in that order.

    paired: the normalized output (after `perm`) in the W4A16 pair order (`w4a16.pair_order`; hidden a
    multiple of 128), for a `w4a16_accumulate(..., paired=True)` that reads it next.

    accumulated: x is a float32 accumulator of `w4a16.w4a16_accumulate` (a residual is required): it is
    read rounded to the residual's dtype, as the matmul's own output would have been, and left zeroed
    for the next matmul (in the same kernel; the reference path zeroes it afterwards).

    Runs the Triton kernel when `use_triton` holds for the inputs, else `rms_norm_reference`.
    """
    if paired and x.shape[-1] % 128:
        raise InvalidArgumentError(f"paired=True needs a hidden size that is a multiple of 128; got {x.shape[-1]}.")
    if accumulated:
        import torch

        if residual is None or x.dtype != torch.float32 or not x.is_contiguous():
            raise InvalidArgumentError("accumulated=True takes a contiguous float32 accumulator and a residual.")
        if not use_triton(x, weight, residual) or x.numel() == 0:
            out = _paired(rms_norm_reference(x.to(residual.dtype), weight, eps, residual, perm), paired)
            x.zero_()
            return out
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise InvalidArgumentError(f"RMSNorm weight has shape {tuple(weight.shape)}; expected ({hidden},) for x {tuple(x.shape)}.")
    if residual is not None and residual.shape != x.shape:
        raise InvalidArgumentError(f"residual shape {tuple(residual.shape)} must equal x shape {tuple(x.shape)}.")
    if perm is not None and (perm.shape != (hidden,) or perm.is_floating_point()):
        raise InvalidArgumentError(f"perm must be an integer tensor of shape ({hidden},), got {perm.dtype} "
                                   f"{tuple(perm.shape)}.")
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if not use_triton(*tensors) or x.numel() == 0:
        return _paired(rms_norm_reference(x, weight, eps, residual, perm), paired)
    from ._rmsnorm_triton import rms_norm_triton

    return rms_norm_triton(x, weight, eps, residual, perm, accumulated, paired)


def _paired(out: Union["torch.Tensor", tuple["torch.Tensor", "torch.Tensor"]],
            paired: bool) -> Union["torch.Tensor", tuple["torch.Tensor", "torch.Tensor"]]:
    """A reference result with its normalized output put in the W4A16 pair order when `paired`."""
    if not paired:
        return out
    from .w4a16 import to_pair_order

    if isinstance(out, tuple):
        return to_pair_order(out[0]), out[1]
    return to_pair_order(out)
