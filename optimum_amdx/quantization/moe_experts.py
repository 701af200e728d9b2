"""MoE experts as one set of linears per expert: the layout GPTQ checkpoints of MoE models use.

transformers 5 stores a sparse-MoE block's experts stacked (`experts.gate_up_proj [E, 2I, H]`,
`experts.down_proj [E, H, I]`); GPT-QModel quantizes experts one linear at a time and names them
`mlp.experts.<e>.gate_proj / up_proj / down_proj` (Qwen3-MoE's own naming). Mixtral's older names
(AutoGPTQ and earlier GPT-QModel: `block_sparse_moe.experts.<e>.w1/w3/w2` and `block_sparse_moe.gate`)
are read too: `legacy_expert_key` renames them to that layout on load. `ExpertLinears` is that layout as a module:
a ModuleList of experts whose `forward(hidden, top_k_index, top_k_weights)` is transformers' expert
loop, so the block's router and the rest of the model are unchanged. `split_stacked_experts` swaps it
in (weights become views of the stacked tensors, nothing is copied), before quantizing or before
loading a checkpoint in that layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

if TYPE_CHECKING:
    from ..kernels.w4a16 import W4A16Weight

__all__ = ["ExpertLinears", "split_stacked_experts", "has_per_expert_keys", "legacy_expert_key", "stack_quantized_experts",
           "PerExpertGateUp"]

_PER_EXPERT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj)$")
_LEGACY_EXPERT = re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w([123])\.")
_LEGACY_ROUTER = re.compile(r"\.block_sparse_moe\.gate\.")
_LEGACY_PROJ = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}  # Mixtral: w2(silu(w1 x) * w3 x)


def legacy_expert_key(key: str) -> str:
    """A checkpoint tensor name in transformers 5's layout: Mixtral's `block_sparse_moe.experts.<e>.w1/w2/w3.*`
    become `mlp.experts.<e>.gate_proj/down_proj/up_proj.*` and `block_sparse_moe.gate.*` becomes `mlp.gate.*`;
    every other name is returned unchanged."""
    key = _LEGACY_EXPERT.sub(lambda m: f".mlp.experts.{m.group(1)}.{_LEGACY_PROJ[m.group(2)]}.", key)
    return _LEGACY_ROUTER.sub(".mlp.gate.", key)


class _Expert(nn.Module):
    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj


class ExpertLinears(nn.ModuleList):
    """Experts `[e].gate_proj/up_proj/down_proj` (nn.Linear or QuantLinear) with transformers' expert loop."""

    def __init__(self, experts: list[_Expert], act_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__(experts)
        self.act_fn = act_fn
        self.num_experts = len(experts)

    @classmethod
    def from_stacked(cls, stacked: nn.Module) -> "ExpertLinears":
        """Per-expert nn.Linear views of a transformers stacked-experts module's tensors."""
        gate_up, down = stacked.gate_up_proj, stacked.down_proj
        inter = gate_up.shape[1] // 2
        experts = []
        for e in range(gate_up.shape[0]):
            lins = []
            for weight in (gate_up[e, :inter], gate_up[e, inter:], down[e]):
                lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
                lin.weight = nn.Parameter(weight.detach(), requires_grad=False)
                lins.append(lin)
            experts.append(_Expert(*lins))
        return cls(experts, stacked.act_fn)

    def expert_output(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """down(act(gate(x)) * up(x)) of expert `e`."""
        expert = self[e]
        return expert.down_proj(self.act_fn(expert.gate_proj(x)) * expert.up_proj(x))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """transformers' expert loop: each expert's output scaled by its routing weight, summed per token."""
        out = torch.zeros_like(hidden_states)
        flat_ids = top_k_index.reshape(-1)
        tokens = torch.arange(hidden_states.shape[0], device=hidden_states.device).repeat_interleave(top_k_index.shape[1])
        flat_w = top_k_weights.reshape(-1)
        for e in torch.unique(flat_ids).tolist():
            sel = (flat_ids == e).nonzero(as_tuple=True)[0]
            rows = tokens[sel]
            h = self.expert_output(e, hidden_states[rows])
            out.index_add_(0, rows, (h * flat_w[sel, None]).to(out.dtype))
        return out


def _is_stacked(module: nn.Module) -> bool:
    gate_up = getattr(module, "gate_up_proj", None)
    return isinstance(gate_up, torch.Tensor) and gate_up.dim() == 3 and hasattr(module, "down_proj")


def split_stacked_experts(model: nn.Module) -> int:
    """Replace every stacked-experts module of `model` by `ExpertLinears` (views, no copy); returns how many."""
    names = [name for name, m in model.named_modules() if name.endswith("experts") and _is_stacked(m)]
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, ExpertLinears.from_stacked(getattr(parent, attr)))
    return len(names)


def has_per_expert_keys(linear_names: list[str]) -> bool:
    """Whether a checkpoint's quantized linears include per-expert ones (`...experts.<e>.gate_proj`)."""
    return any(_PER_EXPERT.search(n) for n in linear_names)


@dataclass
class PerExpertGateUp:
    """gate/up of act-order experts whose permutations differ (GPTQ takes each expert's Hessian from the tokens
    routed to it, so each gets its own order): one W4A16 weight per expert, without its permutation and with
    its columns in the order of that expert's down projection, and every expert's input order side by side,
    so a step gathers the input for all experts in one launch and runs one matmul per expert."""

    weights: list["W4A16Weight"]
    """Per expert: [H, 2I], gate columns then up columns, each in the down projection's order."""
    perms: torch.Tensor
    """int64 [E * H]: expert e reads input column ``perms[e * H + k]`` as its row k."""


def _per_expert_gate_up(members: list) -> tuple[PerExpertGateUp, list[torch.Tensor]] | str:
    """`PerExpertGateUp` for experts whose gate/up permutations differ between experts but not within one, and
    the down projections' orders it put the columns in; or why not."""
    from ..kernels.w4a16 import concat_weights
    from .quant_linear import share_columns

    weights, perms, down_orders = [], [], []
    for e in members:
        gate, down = e.gate_proj.kernel_weight(), e.down_proj.kernel_weight()
        inter, hidden = down.in_features, gate.in_features
        order = (down.perm.long() if down.perm is not None
                 else torch.arange(inter, device=down.qweight.device))
        columns = torch.cat([order, order + inter])
        w = concat_weights([gate, e.up_proj.kernel_weight()], columns)
        if w is None:
            return "an expert's gate and up weights cannot share one launch (their act-order orders or groups differ)"
        share_columns([e.gate_proj, e.up_proj], w, columns)  # w holds their codes from now on
        perms.append(w.perm.long() if w.perm is not None else torch.arange(hidden, device=order.device))
        weights.append(w.presorted())
        down_orders.append(order)
    return PerExpertGateUp(weights, torch.cat(perms)), down_orders


def stack_quantized_experts(experts: ExpertLinears) -> tuple[object, object] | str:
    """All experts of a block as two W4A16 weights, for a decode step with no host loop: gate/up of every expert
    side by side (``[H, E * 2I]``, columns gate_0, up_0, gate_1, ...) and down of every expert stacked along the
    input (``[E * I, H]``), so `x @ gate_up`, SiLU * up, scaling each expert's slice by its routing weight (zero for
    experts not routed to) and one `@ down` give the block's output in three launches whose shapes depend only on
    the token count (capturable in a device graph). Every expert is read each step: 4-bit weights of all E
    experts against the k routed ones. Act-order experts whose permutations differ from expert to expert (as
    GPTQ gives them) cannot share one gate/up weight: gate/up is then a `PerExpertGateUp` (one gather and E
    matmuls, still no host loop) whose outputs come in the down projections' order, so the stacked down
    projection reads them without a permutation. Returns the reason as a string when the experts cannot be
    stacked (not all 4-bit kernel-ready linears, groups that straddle experts). The gate/up weights then hold the
    experts' gate/up codes (`quant_linear.share_columns`); the stacked down projection is a copy.
    """
    from ..kernels.w4a16 import concat_weights, prepare_gptq_weight
    from .config import group_rows
    from .quant_linear import QuantLinear, share_columns

    members = [experts[i] for i in range(experts.num_experts)]  # (iterating the ModuleList would meet act_fn too)
    lins = [lin for e in members for lin in (e.gate_proj, e.up_proj, e.down_proj)]
    if not all(isinstance(lin, QuantLinear) for lin in lins):
        return "not every expert linear is a GPTQ QuantLinear"
    first = members[0].down_proj
    if any(lin.bits != 4 or lin.checkpoint_format != first.checkpoint_format for lin in lins):
        return "the experts are not all 4-bit linears of one checkpoint format"
    gate_up = concat_weights([w.kernel_weight() for e in members for w in (e.gate_proj, e.up_proj)])
    if gate_up is not None:  # it holds the experts' gate/up codes from now on
        share_columns([w for e in members for w in (e.gate_proj, e.up_proj)], gate_up)
    down_orders = None
    if gate_up is None:
        per_expert = _per_expert_gate_up(members)
        if isinstance(per_expert, str):
            return per_expert
        gate_up, down_orders = per_expert
    downs = [e.down_proj for e in members]
    inter = first.in_features
    rows = group_rows(first.group_size, inter)
    if inter % rows or any(d.in_features != inter or d.group_size != first.group_size for d in downs):
        return f"the experts' down projections have groups of {rows} rows that do not tile {inter} inputs"
    groups = inter // rows
    g_idx = torch.cat([d.g_idx.to(torch.int32) + e * groups for e, d in enumerate(downs)])
    down = prepare_gptq_weight(torch.cat([d.checkpoint_qweight() for d in downs]),
                               torch.cat([d.qzeros for d in downs]), torch.cat([d.scales for d in downs]), g_idx, 4,
                               rows, first.checkpoint_format)
    if not down.kernel_ready:
        return "the stacked down projection is not kernel-ready"
    if down_orders is not None:  # the per-expert gate/up already emit each expert's slice in its down order
        expected = torch.cat([o + e * inter for e, o in enumerate(down_orders)]).to(down.qweight.device)
        got = down.perm.long() if down.perm is not None else torch.arange(len(expected), device=expected.device)
        if not torch.equal(got, expected):
            return "the stacked down projection's order is not the experts' own orders side by side"
        down = down.presorted()
    return gate_up, down
