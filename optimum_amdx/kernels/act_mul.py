"""SiLU(gate) * up in one pass over the fused gate/up projection output (the gated MLP's middle).

`silu_and_mul(gate_up)` takes ``[tokens, 2 * I]`` (gate columns first, then up, as the decoder's
fused gate/up matmul writes them) and returns ``[tokens, I]``. Rounding follows transformers'
``act_fn(gate) * up`` in half precision exactly: SiLU is computed in float32 and rounded to the
input dtype, then the product is formed in float32 and rounded once. Replaces two elementwise
kernels (SiLU, multiply) and the intermediate they pass through memory.

This module imports no Triton; the kernel lives in `_act_mul_triton`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .runtime import arch_family, device_arch, use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["silu_and_mul", "silu_and_mul_reference"]


def silu_and_mul_reference(gate_up: "torch.Tensor") -> "torch.Tensor":
    """PyTorch reference: ``silu(gate) * up`` with gate = first half of the last dim."""
    import torch

    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def silu_and_mul(gate_up: "torch.Tensor", accumulated_dtype: "torch.dtype | None" = None,
                 paired: bool = False) -> "torch.Tensor":
    """``silu(gate_up[..., :I]) * gate_up[..., I:]`` as ``[..., I]``, one Triton kernel where Triton runs.

    accumulated_dtype: gate_up is a contiguous float32 accumulator of `w4a16.w4a16_accumulate`; it is read
    rounded to this dtype (as the matmul's own output would have been), the result comes out in it, and
    the accumulator is left zeroed for the next matmul (in the same kernel; the reference path afterwards).
    paired: the result in the pair order of the W4A16 one-row kernel (`w4a16.pair_order`; I a multiple of 128),
    for a down projection `w4a16_accumulate(..., paired=True)` that reads it next.
    """
    import torch

    if gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        raise InvalidArgumentError(
            f"silu_and_mul expects [..., 2 * intermediate] (gate then up); got shape {tuple(gate_up.shape)}."
        )
    if accumulated_dtype is not None and (gate_up.dtype != torch.float32 or not gate_up.is_contiguous()):
        raise InvalidArgumentError("accumulated_dtype takes a contiguous float32 accumulator.")
    if paired and (gate_up.shape[-1] // 2) % 128:
        raise InvalidArgumentError(f"paired=True needs an intermediate size that is a multiple of 128; got "
                                   f"{gate_up.shape[-1] // 2}.")
    if gate_up.numel() == 0 or gate_up.stride(-1) != 1 or not use_triton(gate_up):
        if accumulated_dtype is None:
            out = silu_and_mul_reference(gate_up)
        else:
            out = silu_and_mul_reference(gate_up.to(accumulated_dtype))
            gate_up.zero_()
        if paired:
            from .w4a16 import to_pair_order

            out = to_pair_order(out)
        return out
    from ._act_mul_triton import silu_and_mul_triton

    index = gate_up.device.index if gate_up.device.type == "cuda" and gate_up.device.index is not None else 0
    return silu_and_mul_triton(gate_up, arch_family(device_arch(index)), accumulated_dtype, paired)
