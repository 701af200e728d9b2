"""The GPTQ and round-to-nearest algorithms for one weight matrix.

GPTQ (Frantar et al., 2022) quantizes a weight W [N, K] column by column and, after each column,
spreads the rounding error over the not-yet-quantized columns using the inverse Hessian of the
layer's inputs (H = 2/n * sum x x^T). The inverse enters through its upper Cholesky factor, and
updates are applied lazily in blocks of `block_size` columns so most of the work is one matmul
per block. Rows are independent given H, so linears that read the same input (q/k/v, gate/up)
are quantized together as one stacked matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InvalidArgumentError
from .config import PER_ROW, GPTQConfig, group_rows


@dataclass
class QuantResult:
    """Integer codes [N, K], scales/zeros [n_groups, N], g_idx [K], the dequantized weight [N, K] and its error."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    dequantized: torch.Tensor
    error: float


class HessianAccumulator:
    """Running H = 2/n * sum over tokens of x x^T (float32), fed batch by batch."""

    def __init__(self, columns: int, device: torch.device) -> None:
        self.H = torch.zeros(columns, columns, dtype=torch.float32, device=device)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).to(self.H.device, torch.float32)
        tokens = x.shape[0]
        self.H.mul_(self.n / (self.n + tokens))
        self.n += tokens
        x = x * math.sqrt(2.0 / self.n)
        self.H.addmm_(x.t(), x)


def grid_params(w: torch.Tensor, bits: int, sym: bool, keep_v1_zero: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row scale and integer zero of the min/max grid for the columns in `w` [rows, cols].

    The range always includes 0. Scales are rounded to float16 (how they are stored) so that the
    codes chosen here dequantize exactly as the checkpoint will. With `keep_v1_zero` an asymmetric
    zero of 0 is raised to 1, because the v1 format stores zero - 1 and cannot hold -1.
    """
    maxq = 2**bits - 1
    xmin = torch.clamp(w.min(dim=1).values, max=0)
    xmax = torch.clamp(w.max(dim=1).values, min=0)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -torch.ones_like(xmin), xmin)
    xmax = torch.where(empty, torch.ones_like(xmax), xmax)
    scale = ((xmax - xmin) / maxq).to(torch.float16).float()
    scale = torch.where(scale == 0, torch.full_like(scale, 2.0**-14), scale)
    if sym:
        zero = torch.full_like(scale, (maxq + 1) // 2)
    else:
        zero = torch.clamp(torch.round(-xmin / scale), 1 if keep_v1_zero else 0, maxq)
    return scale, zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes clamp(round(w / scale) + zero, 0, 2**bits - 1); scale/zero broadcast over columns."""
    return torch.clamp(torch.round(w / scale.unsqueeze(1)) + zero.unsqueeze(1), 0, 2**bits - 1)


def rtn_quantize(weight: torch.Tensor, cfg: GPTQConfig, order: torch.Tensor | None = None) -> QuantResult:
    """Round-to-nearest baseline with the same grid, groups and packing as GPTQ (no data needed).

    `order` (a permutation of the K input columns) forms the groups over the columns taken in that
    order, i.e. the act-order checkpoint layout (non-monotone `g_idx`) without a Hessian to choose it."""
    W = weight.detach().float()
    n_out, k = W.shape
    gs = group_rows(cfg.group_size, k)
    keep = cfg.checkpoint_format == "gptq"
    if order is not None:
        order = order.to(device=W.device, dtype=torch.long)
        if order.shape != (k,) or not torch.equal(torch.sort(order).values, torch.arange(k, device=W.device)):
            raise InvalidArgumentError(f"order must be a permutation of the {k} input columns.")
        W = W[:, order]
    codes, scales, zeros = [], [], []
    for g0 in range(0, k, gs):
        block = W[:, g0 : g0 + gs]
        s, z = grid_params(block, cfg.bits, cfg.sym, keep)
        codes.append(quantize_codes(block, s, z, cfg.bits))
        scales.append(s)
        zeros.append(z)
    q = torch.cat(codes, dim=1)
    S = torch.stack(scales)
    Z = torch.stack(zeros)
    g_idx = torch.arange(k, device=W.device) // gs
    if order is not None:  # back to the original column order; g_idx records each column's group
        inv = torch.argsort(order)
        q, W = q[:, inv], W[:, inv]
        g_idx = g_idx[inv]
    deq = (q - Z[g_idx].t()) * S[g_idx].t()
    err = float(((deq - W) ** 2).sum())
    return QuantResult(q.to(torch.int32), S, Z.to(torch.int32), g_idx.to(torch.int32), deq, err)


def gptq_quantize(weight: torch.Tensor, H: torch.Tensor, cfg: GPTQConfig) -> QuantResult:
    """Quantize `weight` [N, K] with GPTQ given the input Hessian `H` [K, K] (both on one device).

    Returns codes in the original column order, one scale/zero per group and `g_idx` (the group of
    each input column; with desc_act it is not monotone unless static_groups). `error` is the GPTQ
    loss: sum over columns of (w - q)^2 / d^2 / 2 with d the inverse-Hessian Cholesky diagonal.
    """
    W = weight.detach().float().clone()
    H = H.detach().float().clone()
    n_out, k = W.shape
    if H.shape != (k, k):
        raise InvalidArgumentError(f"Hessian has shape {tuple(H.shape)}; expected ({k}, {k}) for a weight of {k} inputs.")
    bits, gs = cfg.bits, group_rows(cfg.group_size, k)
    keep = cfg.checkpoint_format == "gptq"

    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0

    static: list[tuple[torch.Tensor, torch.Tensor]] = []
    if cfg.static_groups or cfg.group_size == PER_ROW:
        static = [grid_params(W[:, g : g + gs], bits, cfg.sym, keep) for g in range(0, k, gs)]

    perm = None
    # group starts in processing order: position -> (stored group, rows); contiguous unless reordered
    starts = {p: (p // gs, min(gs, k - p)) for p in range(0, k, gs)}
    group_aware = cfg.act_group_aware and not cfg.desc_act and not static
    if cfg.desc_act:
        perm = torch.argsort(torch.diag(H), descending=True)
    elif group_aware:
        perm, starts = _group_aware_order(torch.diag(H), gs)
    if perm is not None:
        W = W[:, perm]
        H = H[perm][:, perm]

    damp = cfg.damp_percent * torch.mean(torch.diag(H))
    H.diagonal().add_(damp)
    Hinv = _inverse_cholesky_upper(H)

    codes = torch.zeros_like(W)
    losses = torch.zeros(n_out, device=W.device)
    n_groups = -(-k // gs)
    scales = torch.zeros(n_groups, n_out, device=W.device)
    zeros = torch.zeros(n_groups, n_out, device=W.device)
    orig_col = perm if perm is not None else torch.arange(k, device=W.device)
    orig_col_list = orig_col.tolist()
    if static or group_aware:
        group_of_pos = orig_col // gs  # stored groups stay contiguous in the original order
    else:
        group_of_pos = torch.arange(k, device=W.device) // gs
    scale = zero = None
    for i1 in range(0, k, cfg.block_size):
        i2 = min(i1 + cfg.block_size, k)
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if static:
                g = orig_col_list[col] // gs
                scale, zero = static[g]
            elif col in starts:
                g, rows = starts[col]
                window = torch.cat([W1[:, i : i + rows], W[:, i2 : col + rows]], dim=1)
                scale, zero = grid_params(window, bits, cfg.sym, keep)
                scales[g], zeros[g] = scale, zero
            w = W1[:, i]
            d = Hinv1[i, i]
            q = torch.clamp(torch.round(w / scale) + zero, 0, 2**bits - 1)
            codes[:, col] = q
            dq = (q - zero) * scale
            Q1[:, i] = dq
            err = (w - dq) / d
            W1[:, i:] -= err.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, i1:i2] = Q1
        losses += (Err1**2).sum(dim=1) / 2
        if i2 < k:
            W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]

    if static:
        scales = torch.stack([s for s, _ in static])
        zeros = torch.stack([z for _, z in static])
    dequant = W
    g_idx = torch.empty(k, dtype=torch.long, device=W.device)
    if perm is not None:
        inv = torch.argsort(perm)
        codes = codes[:, inv]
        dequant = dequant[:, inv]
        g_idx[perm] = group_of_pos
    else:
        g_idx = group_of_pos
    return QuantResult(
        codes.to(torch.int32), scales, zeros.to(torch.int32), g_idx.to(torch.int32), dequant, float(losses.sum())
    )


def _group_aware_order(diag: torch.Tensor, gs: int) -> tuple[torch.Tensor, dict[int, tuple[int, int]]]:
    """Group-aware reordering (GPT-QModel's act_group_aware): groups in decreasing order of their
    largest Hessian diagonal, columns inside each group by decreasing diagonal. Groups stay whole, so
    the checkpoint keeps a monotone g_idx (no act-order gather at inference) while the solver still
    handles the most sensitive columns first."""
    k = diag.numel()
    bounds = list(range(0, k, gs))
    scores = torch.stack([diag[b : b + gs].max() for b in bounds])
    order: list[torch.Tensor] = []
    starts: dict[int, tuple[int, int]] = {}
    pos = 0
    for g in torch.argsort(scores, descending=True).tolist():
        b = bounds[g]
        inner = torch.argsort(diag[b : b + gs], descending=True) + b
        starts[pos] = (g, inner.numel())
        order.append(inner)
        pos += inner.numel()
    return torch.cat(order), starts


def _inverse_cholesky_upper(H: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor of H^-1, raising the damping if H is not positive definite."""
    eye_mean = torch.mean(torch.diag(H))
    for attempt in range(6):
        L, info = torch.linalg.cholesky_ex(H)
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)
            U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
            if int(info) == 0:
                return U
        H = H.clone()
        H.diagonal().add_(eye_mean * 0.01 * (10**attempt))
    raise InvalidArgumentError(
        "The layer's Hessian is not positive definite even after extra damping; use more calibration samples "
        "or a larger damp_percent (e.g. 0.1)."
    )
