"""A transformers sparse-MoE block (Mixtral, Qwen3-MoE) run over packed tokens by the fused-MoE op.

Routing follows the block's router exactly: router logits, softmax in float32, top-k, renormalized
(Mixtral always; Qwen3-MoE when `norm_topk_prob`; Qwen3-MoE then rounds the weights to the logits'
dtype). The expert weights are the block's own stacked tensors (`experts.gate_up_proj [E, 2I, H]`,
`experts.down_proj [E, H, I]`), used in place: nothing is copied. GPTQ checkpoints quantize experts one
linear at a time (`quantization.moe_experts.ExpertLinears`); those run transformers' expert loop over our
W4A16 linears (a host-side loop: such layers decode eagerly, without a captured graph).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..kernels.fused_moe import fused_moe, route_topk
from ..quantization.moe_experts import ExpertLinears


def _is_silu(act: Callable) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


class MoERunner:
    """Callable: x [tokens, hidden] -> the block's output [tokens, hidden]."""

    def __init__(self, block: nn.Module) -> None:
        router, experts = block.gate, block.experts
        self.per_expert = experts if isinstance(experts, ExpertLinears) else None
        """GPTQ experts (one W4A16 linear per expert and projection): transformers' expert loop over them."""
        self._set_router(router)
        if self.per_expert is not None:
            return
        gate_up = getattr(experts, "gate_up_proj", None)
        down = getattr(experts, "down_proj", None)
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) or gate_up.dim() != 3:
            raise UnsupportedModelError(
                f"{type(block).__name__}: the paged engine runs MoE experts stored as stacked float tensors "
                "(transformers' gate_up_proj [E, 2I, H] / down_proj [E, H, I]); these experts are "
                f"{type(gate_up).__name__}. Use the transformers model (optimum_amdx.modeling.patch) instead."
            )
        if not _is_silu(experts.act_fn):
            raise UnsupportedModelError(
                f"{type(block).__name__}: the fused-MoE op implements SiLU-gated experts; this one uses "
                f"{type(experts.act_fn).__name__}. Use the transformers model (optimum_amdx.modeling.patch) instead."
            )
        self.gate_up = gate_up
        self.down = down

    def _set_router(self, router: nn.Module) -> None:
        self.router_weight = router.weight
        self.top_k = int(router.top_k)
        norm = getattr(router, "norm_topk_prob", None)
        self.renormalize = True if norm is None else bool(norm)
        self.weights_in_logit_dtype = norm is not None  # Qwen3-MoE's router casts the weights back

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(x, self.router_weight)
        weights, ids = route_topk(logits, self.top_k, self.renormalize)
        if self.weights_in_logit_dtype:
            weights = weights.to(logits.dtype)
        if self.per_expert is not None:
            return self.per_expert(x, ids, weights)
        return fused_moe(x, self.gate_up, self.down, weights, ids)


def moe_runner(block: nn.Module) -> MoERunner:
    """The runner of one transformers sparse-MoE block (refuses layouts the fused op does not cover)."""
    return MoERunner(block)
