"""A transformers sparse-MoE block (Mixtral, Qwen3-MoE) run over packed tokens by the fused-MoE op.

Routing follows the block's router exactly: router logits, softmax in float32, top-k, renormalized
(Mixtral always; Qwen3-MoE when `norm_topk_prob`; Qwen3-MoE then rounds the weights to the logits'
dtype). The expert weights are the block's own stacked tensors (`experts.gate_up_proj [E, 2I, H]`,
`experts.down_proj [E, H, I]`), used in place: nothing is copied. GPTQ checkpoints quantize experts one
linear at a time (`quantization.moe_experts.ExpertLinears`). Those run, up to `STACKED_MAX_TOKENS` tokens
(every decode step, and always while a device graph is being captured), through all experts stacked into two
W4A16 weights (`stack_quantized_experts`: three launches, no host loop, so decode steps are captured in
graphs); every expert is read each step, which at 4 bits costs E/(4k) of the fp16 routed bytes (Mixtral 1x,
Qwen3-30B-A3B 4x). Act-order experts with permutations of their own run gate/up as one gather and one matmul
per expert (`PerExpertGateUp`), still without a host loop. Longer prefill chunks run transformers' expert loop
over the per-expert W4A16 linears (host-side, eager), which computes routed pairs only. The stacked gate/up
weight holds the experts' gate/up codes (each linear reads its columns of it, `QuantLinear.share_kernel_weight`);
the stacked down projection is a second copy of the down projections (an expert's rows of it are not one run of
the repacked layout), so stacked experts hold 4/3 of one 4-bit copy.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..kernels.fused_moe import fused_moe, route_topk
from ..quantization.moe_experts import ExpertLinears, PerExpertGateUp, stack_quantized_experts

STACKED_MAX_TOKENS = 64
"""Token counts up to this (decode batches) run quantized experts stacked, with no host loop."""


def _is_silu(act: Callable) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


class MoERunner:
    """Callable: x [tokens, hidden] -> the block's output [tokens, hidden]."""

    def __init__(self, block: nn.Module) -> None:
        router, experts = block.gate, block.experts
        self.per_expert = experts if isinstance(experts, ExpertLinears) else None
        """GPTQ experts (one W4A16 linear per expert and projection)."""
        self._stacked: tuple | None = None
        self.stack_error: str | None = None
        """Why the quantized experts could not be stacked (they then always run the expert loop)."""
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
            capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
            if (x.shape[0] <= STACKED_MAX_TOKENS or capturing) and self._stacked_weights() is not None:
                return self._stacked_forward(x, ids, weights)
            return self.per_expert(x, ids, weights)
        return fused_moe(x, self.gate_up, self.down, weights, ids)

    def _stacked_weights(self) -> tuple | None:
        if self._stacked is None and self.stack_error is None:
            stacked = stack_quantized_experts(self.per_expert)
            if isinstance(stacked, str):
                self.stack_error = stacked
            else:
                self._stacked = stacked
        return self._stacked

    def _stacked_forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """All experts at once: x @ [gate_e | up_e]_e, act(gate) * up, each expert's slice times its routing
        weight (zero where not routed), then @ the stacked down projections (sums over experts in the GEMM)."""
        from ..kernels.w4a16 import w4a16_matmul, w4a16_matmul_reference

        gate_up, down = self._stacked
        # float32 activations (CPU evaluation): the float32 reference of the same stacked weights
        matmul = w4a16_matmul if x.dtype in (torch.float16, torch.bfloat16) else w4a16_matmul_reference
        tokens, experts = x.shape[0], self.per_expert.num_experts
        if isinstance(gate_up, PerExpertGateUp):  # act-order experts, each in its own input order
            xs = x.index_select(1, gate_up.perms).view(tokens, experts, -1)
            gu = torch.stack([matmul(xs[:, e], w) for e, w in enumerate(gate_up.weights)], dim=1)
            gu = gu.view(tokens, experts, 2, -1)
        else:
            gu = matmul(x, gate_up).view(tokens, experts, 2, -1)
        mid = self.per_expert.act_fn(gu[:, :, 0]) * gu[:, :, 1]
        route = torch.zeros(tokens, experts, dtype=torch.float32, device=x.device)
        route.scatter_(1, ids, weights.float())
        mid = (mid.float() * route[:, :, None]).to(x.dtype).reshape(tokens, -1)
        return matmul(mid, down)


def moe_runner(block: nn.Module) -> MoERunner:
    """The runner of one transformers sparse-MoE block (refuses layouts the fused op does not cover)."""
    return MoERunner(block)
