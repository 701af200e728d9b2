"""`patch(model)` / `unpatch(model)`: put our attention and fused RMSNorm into a loaded transformers model.

`patch` switches the model to `attn_implementation="amdx"` and replaces every RMSNorm module
(any module class named `*RMSNorm` with a `weight` and an epsilon) by `FusedRMSNorm`, which shares
the same weight Parameter and calls our kernel. `unpatch` puts the original modules and attention
implementation back, so the model is exactly what it was.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import InvalidArgumentError
from ..kernels.rmsnorm import rms_norm
from .attention import register_attention

_STATE_ATTR = "_amdx_patch_state"


class FusedRMSNorm(nn.Module):
    """Drop-in RMSNorm backed by our kernel; keeps the replaced module to restore it."""

    def __init__(self, original: nn.Module, eps: float) -> None:
        super().__init__()
        self.weight = original.weight
        self.variance_epsilon = eps
        self._amdx_original = [original]

    @property
    def original(self) -> nn.Module:
        return self._amdx_original[0]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


def _rmsnorm_eps(module: nn.Module) -> float | None:
    if not type(module).__name__.endswith("RMSNorm") or isinstance(module, FusedRMSNorm):
        return None
    if not isinstance(getattr(module, "weight", None), nn.Parameter) or module.weight.dim() != 1:
        return None
    for name in ("variance_epsilon", "eps", "epsilon"):
        if isinstance(getattr(module, name, None), float):
            return getattr(module, name)
    return None


def is_patched(model: nn.Module) -> bool:
    return hasattr(model, _STATE_ATTR)


def patch(model: nn.Module) -> nn.Module:
    """Use our attention and fused RMSNorm in `model` (in place, reversible); returns the model."""
    if is_patched(model):
        return model
    if not hasattr(model, "config"):
        raise InvalidArgumentError(f"patch() expects a transformers PreTrainedModel; got {type(model).__name__}.")
    register_attention()
    previous_attn = model.config._attn_implementation
    replaced: list[tuple[nn.Module, str]] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            eps = _rmsnorm_eps(child)
            if eps is not None:
                setattr(parent, name, FusedRMSNorm(child, eps))
                replaced.append((parent, name))
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("amdx")
    else:
        model.config._attn_implementation = "amdx"
    setattr(model, _STATE_ATTR, {"attn": previous_attn, "norms": replaced})
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo `patch`: original RMSNorm modules and attention implementation; returns the model."""
    state = getattr(model, _STATE_ATTR, None)
    if state is None:
        return model
    for parent, name in state["norms"]:
        fused = getattr(parent, name)
        setattr(parent, name, fused.original)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(state["attn"])
    else:
        model.config._attn_implementation = state["attn"]
    delattr(model, _STATE_ATTR)
    return model
