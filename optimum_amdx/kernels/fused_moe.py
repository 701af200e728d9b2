"""Fused mixture-of-experts feed-forward: top-k routing, tokens sorted by expert, grouped expert GEMMs.

`fused_moe(x, w_gate_up, w_down, topk_weights, topk_ids)` computes, for every token t and each of its
top-k experts e (weight r):  out[t] += r * down_e(silu(gate_e(x[t])) * up_e(x[t])), with the expert
weights stacked as transformers 5 stores them: ``w_gate_up [E, 2I, H]`` (gate rows then up rows) and
``w_down [E, H, I]``.

The Triton path (`_fused_moe_triton`) never loops over experts on the host and never synchronizes:
`moe_align` sorts the (token, slot) pairs by expert on the device and pads every expert's run to a
multiple of the GEMM's row tile into a buffer of fixed worst-case size, so each row tile of the
grouped GEMM belongs to exactly one expert (tiles past the end are skipped by the kernel). One
grouped GEMM makes gate/up for all pairs, `silu_and_mul` forms the middle, a second grouped GEMM
applies down and the routing weight, and the k partial outputs of each token are summed. Shapes are
fixed by the token count, so the step can be captured in a device graph. Up to `SMALL_TOKENS` tokens
(decode) can take two matrix-vector kernels instead (method="small"; not yet the default), with no sorting: gate/up + SiLU * up per (token, slot)
pair, then down summed over each token's k experts (`_fused_moe_triton.fused_moe_small`).

This module imports no Triton; the kernel lives in `_fused_moe_triton`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .runtime import arch_family, device_arch, use_triton

if TYPE_CHECKING:
    import torch

__all__ = ["fused_moe", "fused_moe_reference", "moe_align", "route_topk", "SMALL_TOKENS"]

SMALL_TOKENS = 0
"""Token counts up to this take the few-token kernels under method="auto". 0 (off) until they are timed on a GPU:
they are correct against the reference (interpreter tests; the full-size GPU tests cover them), but the device
budget ran out before `benchmarks/bench_fused_moe.py` measured them; the intended value is 8 (each (token,
expert) pair reads its expert's weights on its own: at 8 tokens x top-8 of 128 experts a few experts are read
twice, against the grouped path's ~20 launches and 16-row padding per expert). Set it from that benchmark's
in-graph "small" and "grouped" columns."""


def route_topk(router_logits: "torch.Tensor", top_k: int, renormalize: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Softmax over experts (float32), the top-k probabilities and expert ids, renormalized to sum 1 if asked.

    Returns (weights float32 [T, k], ids int64 [T, k]); ties resolve as `torch.topk` does (as transformers).
    """
    import torch

    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _check(x, w_gate_up, w_down, topk_weights, topk_ids) -> None:
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise InvalidArgumentError(
            f"fused_moe expects x [tokens, hidden], w_gate_up [experts, 2 * inter, hidden], w_down [experts, hidden, "
            f"inter]; got {tuple(x.shape)}, {tuple(w_gate_up.shape)}, {tuple(w_down.shape)}."
        )
    experts, two_inter, hidden = w_gate_up.shape
    if hidden != x.shape[1] or two_inter % 2 or tuple(w_down.shape) != (experts, hidden, two_inter // 2):
        raise InvalidArgumentError(
            f"fused_moe: w_gate_up {tuple(w_gate_up.shape)} and w_down {tuple(w_down.shape)} do not fit x "
            f"{tuple(x.shape)} (expected [E, 2I, {x.shape[1]}] and [E, {x.shape[1]}, I])."
        )
    if topk_ids.dim() != 2 or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise InvalidArgumentError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be "
            f"[{x.shape[0]}, top_k]."
        )


def fused_moe_reference(
    x: "torch.Tensor", w_gate_up: "torch.Tensor", w_down: "torch.Tensor", topk_weights: "torch.Tensor",
    topk_ids: "torch.Tensor",
) -> "torch.Tensor":
    """PyTorch reference, rounding like transformers' expert loop: each expert's output is rounded to x's
    dtype, scaled by its routing weight (float32), rounded again and accumulated in x's dtype."""
    import torch

    out = torch.zeros_like(x)
    flat_ids = topk_ids.reshape(-1)
    tokens = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_w = topk_weights.reshape(-1)
    for e in torch.unique(flat_ids).tolist():
        sel = (flat_ids == e).nonzero(as_tuple=True)[0]
        rows = tokens[sel]
        gate, up = torch.nn.functional.linear(x[rows], w_gate_up[e]).chunk(2, dim=-1)
        h = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w_down[e])
        out.index_add_(0, rows, (h * flat_w[sel, None]).to(out.dtype))
    return out


def moe_align(topk_ids: "torch.Tensor", num_experts: int, block_m: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(token, slot) pairs sorted by expert, each expert's run padded to a multiple of `block_m`.

    Returns sorted_ids int32 [T*k + E*(block_m-1) rounded up to block_m] holding pair indices
    (t * k + slot; padding = T*k) and expert_ids int32 [that / block_m], the expert of each row tile
    (= num_experts for tiles past the last expert's run). Device-side only: no host synchronization.
    """
    import torch

    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    device = flat.device
    capacity = -(-(pairs + num_experts * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    count_start = torch.cumsum(counts, 0) - counts
    order = torch.sort(flat, stable=True).indices
    experts_sorted = flat[order]
    rank = torch.arange(pairs, device=device) - count_start[experts_sorted]
    dest = (padded_end - padded)[experts_sorted] + rank
    sorted_ids = torch.full((capacity,), pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    tile_starts = torch.arange(0, capacity, block_m, device=device)
    expert_ids = torch.searchsorted(padded_end, tile_starts, right=True).to(torch.int32)
    return sorted_ids, expert_ids


def fused_moe(
    x: "torch.Tensor", w_gate_up: "torch.Tensor", w_down: "torch.Tensor", topk_weights: "torch.Tensor",
    topk_ids: "torch.Tensor", method: str = "auto",
) -> "torch.Tensor":
    """The MoE feed-forward of x [T, H] (SiLU-gated experts), one grouped-GEMM pair where Triton runs.

    method: "auto" (the few-token kernels up to `SMALL_TOKENS` tokens (0 for now), else the grouped GEMMs), "small" or
    "grouped" (either one, for tests and benchmarks)."""
    if method not in ("auto", "small", "grouped"):
        raise InvalidArgumentError(f"fused_moe method={method!r}: expected 'auto', 'small' or 'grouped'.")
    _check(x, w_gate_up, w_down, topk_weights, topk_ids)
    tensors = (x, w_gate_up, w_down, topk_weights, topk_ids)
    if x.shape[0] == 0 or not use_triton(*tensors) or any(t.stride(-1) != 1 for t in (x, w_gate_up, w_down)):
        return fused_moe_reference(x, w_gate_up, w_down, topk_weights, topk_ids)
    from ._fused_moe_triton import fused_moe_small, fused_moe_triton

    index = x.device.index if x.device.type == "cuda" and x.device.index is not None else 0
    family = arch_family(device_arch(index))
    if method == "small" or (method == "auto" and x.shape[0] <= SMALL_TOKENS):
        return fused_moe_small(x, w_gate_up, w_down, topk_weights, topk_ids, family)
    return fused_moe_triton(x, w_gate_up, w_down, topk_weights, topk_ids, family)
