"""Triton grouped-GEMM kernel, launch configs and AMD compile specs behind `optimum_amdx.kernels.fused_moe`.

Grid (row tiles of the expert-sorted pair list, column tiles of N). Every row tile belongs to one
expert (`moe_align` pads each expert's run to BLOCK_M), so a program loads that expert's weight tile
once and multiplies it with up to BLOCK_M gathered activation rows: rows are pairs (token, slot);
the first GEMM (gate/up) reads x[pair // TOP_K], the second (down) reads the middle activation of
the pair itself and scales by the pair's routing weight. Padding pairs (index >= num_pairs) load
zeros and store nothing; tiles past the last expert return at once.

Few tokens (decode) take a second path with no sorting at all (`fused_moe_small`): the first kernel gives
every (token, slot) pair its own programs, which read the pair's gate and up rows once and write
silu(gate) * up; the second gives every token its own programs, which loop over the token's k experts and
write the routing-weighted sum. Both stream `[BLOCK_N, BLOCK_K]` weight tiles into an elementwise float32
accumulator reduced once (a matrix-vector product: one row needs no matrix instruction). Four kernels
fewer than the grouped path's align + GEMM + SiLU + GEMM + sum, and no 16-row padding per expert.
"""


from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .compile_spec import CompileSpec, grouped_specs
from .fused_moe import moe_align
from .runtime import amd_launch_options, arch_family, split_launch_options
from .triton_compat import PINNED_COMPILE_OPTIONS

__all__ = ["fused_moe_triton", "moe_gemm_config", "AMD_COMPILE_SPECS"]


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, weights_ptr,
    N, K, num_pairs, num_experts,
    stride_am, stride_we, stride_wn, stride_cm,
    TOP_K: tl.constexpr, A_ROW_IS_TOKEN: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(expert_ids_ptr + pid_m)
    if expert >= num_experts:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    valid = pair < num_pairs
    if A_ROW_IS_TOKEN:
        a_row = pair // TOP_K
    else:
        a_row = pair
    a_row = tl.where(valid, a_row, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[None, :], other=0.0)
        else:
            k_mask = offs_k + k0 < K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[None, :] & k_mask[:, None], other=0.0)
        acc += tl.dot(a, w)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ty = c_ptr.dtype.element_ty
    if MUL_WEIGHT:
        # Round the expert output to the activation dtype first, then scale (as transformers does).
        r = tl.load(weights_ptr + pair, mask=valid, other=0.0).to(tl.float32)
        acc = acc.to(out_ty).to(tl.float32) * r[:, None]
    c_ptrs = c_ptr + tl.where(valid, pair, 0).to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(out_ty), mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _silu_f32(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _moe_gate_up_small_kernel(
    x_ptr, w_ptr, mid_ptr, ids_ptr, I, K, stride_xm, stride_we, stride_wn, stride_mm,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    token = (pair // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    offs_k = tl.arange(0, BLOCK_K)
    g_ptrs = w_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    u_ptrs = g_ptrs + I.to(tl.int64) * stride_wn
    x_ptrs = x_ptr + token * stride_xm + offs_k
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            xk = tl.load(x_ptrs).to(tl.float32)
            g = tl.load(g_ptrs, mask=n_mask[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = offs_k + k0 < K
            xk = tl.load(x_ptrs, mask=k_mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc_g += g.to(tl.float32) * xk[None, :]
        acc_u += u.to(tl.float32) * xk[None, :]
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    out_ty = mid_ptr.dtype.element_ty
    # round as the reference does: each linear's output, then SiLU, then the product, each in the activation dtype
    gate = tl.sum(acc_g, axis=1).to(out_ty).to(tl.float32)
    up = tl.sum(acc_u, axis=1).to(out_ty).to(tl.float32)
    mid = _silu_f32(gate).to(out_ty).to(tl.float32) * up
    tl.store(mid_ptr + pair.to(tl.int64) * stride_mm + offs_n, mid.to(out_ty), mask=n_mask)


@triton.jit
def _moe_down_small_kernel(
    mid_ptr, w_ptr, out_ptr, ids_ptr, weights_ptr, N, K, stride_mm, stride_we, stride_wn, stride_om,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    token = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    out_ty = out_ptr.dtype.element_ty
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(TOP_K):
        pair = token * TOP_K + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        r = tl.load(weights_ptr + pair).to(tl.float32)
        w_ptrs = w_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
        m_ptrs = mid_ptr + pair.to(tl.int64) * stride_mm + offs_k
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                m = tl.load(m_ptrs).to(tl.float32)
                w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
            else:
                k_mask = offs_k + k0 < K
                m = tl.load(m_ptrs, mask=k_mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            acc += w.to(tl.float32) * m[None, :]
            m_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        # the expert's output rounded, scaled by its weight, rounded, added in the activation dtype (as the reference)
        h = tl.sum(acc, axis=1).to(out_ty).to(tl.float32)
        total = (total + (h * r).to(out_ty).to(tl.float32)).to(out_ty).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * stride_om + offs_n, total.to(out_ty), mask=n_mask)


def moe_small_config(family: str, k: int) -> dict[str, Any]:
    """Tiles of the few-token kernels: 16 output rows per program (many programs even for one token), K tiles of
    256 elements (128 where K is short or not a multiple), the skinny-GEMM one-row shape that streams best."""
    block_k = 256 if k % 256 == 0 else 128
    if family == "cpu":
        return {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    if family in ("rdna3", "rdna4", "cdna2", "cdna3", "cdna4"):
        cfg = amd_launch_options(family, 4, 2)
        cfg.update(BLOCK_N=16, BLOCK_K=block_k)
        return cfg
    return {"BLOCK_N": 16, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 3}


def fused_moe_small(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, family: str) -> torch.Tensor:
    """The few-token path: per-pair gate/up + SiLU * up, then per-token down over its k experts (no sorting)."""
    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    hidden, inter = x.shape[1], w_down.shape[2]
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    mid = torch.empty((pairs, inter), dtype=x.dtype, device=x.device)
    consts, launch = split_launch_options(moe_small_config(family, hidden))
    _moe_gate_up_small_kernel[(pairs, triton.cdiv(inter, consts["BLOCK_N"]))](
        x, w_gate_up, mid, ids, inter, hidden, x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), mid.stride(0),
        TOP_K=top_k, EVEN_K=hidden % consts["BLOCK_K"] == 0, **consts, **launch, **PINNED_COMPILE_OPTIONS,
    )
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    consts, launch = split_launch_options(moe_small_config(family, inter))
    _moe_down_small_kernel[(tokens, triton.cdiv(hidden, consts["BLOCK_N"]))](
        mid, w_down, out, ids, weights, hidden, inter, mid.stride(0), w_down.stride(0), w_down.stride(1), out.stride(0),
        TOP_K=top_k, EVEN_K=inter % consts["BLOCK_K"] == 0, **consts, **launch, **PINNED_COMPILE_OPTIONS,
    )
    return out


def moe_gemm_config(family: str, num_pairs: int) -> dict[str, Any]:
    """Tiles of the grouped GEMM. Few pairs (decode) take 16-row tiles, the smallest matrix-instruction M, so
    padding each expert's run wastes little; prefill takes 64-row tiles. On CDNA 16x16 MFMA, 8 waves per EU
    targeted lightly (the K loop is a plain stream); RDNA3 (wave32, WMMA) gets narrower N tiles."""
    block_m = 16 if num_pairs <= 256 else 64
    if family == "cpu":
        return {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    if family in ("rdna3", "rdna4"):
        cfg = amd_launch_options(family, 4, 0)
        cfg.update(BLOCK_M=block_m, BLOCK_N=32, BLOCK_K=64)
        return cfg
    if family in ("cdna2", "cdna3", "cdna4"):
        cfg = amd_launch_options(family, 4, 2)
        cfg.update(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64)
        return cfg
    return {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, sorted_ids: torch.Tensor,
                  expert_ids: torch.Tensor, weights: torch.Tensor, top_k: int, a_row_is_token: bool,
                  mul_weight: bool, cfg: dict[str, Any]) -> None:
    consts, launch = split_launch_options(cfg)
    n, k = w.shape[1], w.shape[2]
    grid = (expert_ids.shape[0], triton.cdiv(n, consts["BLOCK_N"]))
    _moe_gemm_kernel[grid](
        a, w, out, sorted_ids, expert_ids, weights,
        n, k, weights.numel(), w.shape[0],
        a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        TOP_K=top_k, A_ROW_IS_TOKEN=a_row_is_token, MUL_WEIGHT=mul_weight,
        BLOCK_M=consts["BLOCK_M"], BLOCK_N=consts["BLOCK_N"], BLOCK_K=consts["BLOCK_K"],
        EVEN_K=k % consts["BLOCK_K"] == 0, **launch, **PINNED_COMPILE_OPTIONS,
    )


def fused_moe_triton(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, family: str, cfg: dict[str, Any] | None = None) -> torch.Tensor:
    """Align pairs by expert, gate/up grouped GEMM, SiLU * up, down grouped GEMM with routing weights, sum over k.
    `cfg` replaces `moe_gemm_config`'s tiles (benchmark sweeps)."""
    from .act_mul import silu_and_mul

    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    cfg = cfg or moe_gemm_config(family, pairs)
    sorted_ids, expert_ids = moe_align(topk_ids, w_gate_up.shape[0], cfg["BLOCK_M"])
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    gate_up = torch.empty((pairs, w_gate_up.shape[1]), dtype=x.dtype, device=x.device)
    _grouped_gemm(x, w_gate_up, gate_up, sorted_ids, expert_ids, weights, top_k, True, False, cfg)
    middle = silu_and_mul(gate_up)
    down = torch.empty((pairs, w_down.shape[1]), dtype=x.dtype, device=x.device)
    _grouped_gemm(middle, w_down, down, sorted_ids, expert_ids, weights, top_k, False, True, cfg)
    return down.view(tokens, top_k, -1).sum(dim=1)


# ---- AMD compile specs (see compile_spec.py): Mixtral-8x7B (H 4096, I 14336) and Qwen3-30B-A3B
# (H 2048, I 768) shapes, decode and prefill tiles, gate/up and down GEMMs.

_DT = {"fp16": "*fp16", "bf16": "*bf16"}


def _spec(name: str, dtype: str, num_pairs: int, k: int, first: bool) -> list[CompileSpec]:
    ptr = _DT[dtype]
    signature = {
        "a_ptr": ptr, "w_ptr": ptr, "c_ptr": ptr, "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
        "weights_ptr": "*fp32", "N": "i32", "K": "i32", "num_pairs": "i32", "num_experts": "i32",
        "stride_am": "i32", "stride_we": "i32", "stride_wn": "i32", "stride_cm": "i32",
    }

    def make(arch: str) -> tuple[dict, dict]:
        consts, launch = split_launch_options(moe_gemm_config(arch_family(arch), num_pairs))
        consts = {"TOP_K": 2 if "mixtral" in name else 8, "A_ROW_IS_TOKEN": first, "MUL_WEIGHT": not first,
                  **consts, "EVEN_K": k % consts["BLOCK_K"] == 0}
        return consts, launch

    signature.update({key: "constexpr" for key in make("gfx942")[0]})
    mode = "decode" if num_pairs <= 256 else "prefill"
    gemm = "gate_up" if first else "down"
    return grouped_specs(f"fused_moe[{name},{gemm},{mode},{dtype}]", _moe_gemm_kernel, signature, make, True, True,
                         divisible_by_16=("N", "K", "stride_am", "stride_we", "stride_wn", "stride_cm"))


def _small_spec(name: str, dtype: str, k: int, first: bool) -> list[CompileSpec]:
    ptr = _DT[dtype]
    if first:
        kernel = _moe_gate_up_small_kernel
        signature = {"x_ptr": ptr, "w_ptr": ptr, "mid_ptr": ptr, "ids_ptr": "*i32", "I": "i32", "K": "i32",
                     "stride_xm": "i32", "stride_we": "i32", "stride_wn": "i32", "stride_mm": "i32"}
    else:
        kernel = _moe_down_small_kernel
        signature = {"mid_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, "ids_ptr": "*i32", "weights_ptr": "*fp32",
                     "N": "i32", "K": "i32", "stride_mm": "i32", "stride_we": "i32", "stride_wn": "i32",
                     "stride_om": "i32"}

    def make(arch: str) -> tuple[dict, dict]:
        consts, launch = split_launch_options(moe_small_config(arch_family(arch), k))
        consts = {"TOP_K": 2 if "mixtral" in name else 8, **consts, "EVEN_K": k % consts["BLOCK_K"] == 0}
        return consts, launch

    signature.update({key: "constexpr" for key in make("gfx942")[0]})
    gemm = "gate_up" if first else "down"
    strides = tuple(n for n in signature if n.startswith("stride") or n in ("I", "K", "N"))
    return grouped_specs(f"fused_moe_small[{name},{gemm},{dtype}]", kernel, signature, make, True, False,
                         divisible_by_16=strides)


AMD_COMPILE_SPECS: list[CompileSpec] = [
    *_small_spec("mixtral", "fp16", 4096, True),
    *_small_spec("mixtral", "fp16", 14336, False),
    *_small_spec("qwen3moe", "bf16", 2048, True),
    *_small_spec("qwen3moe", "bf16", 768, False),
    *_spec("mixtral", "fp16", 16, 4096, True),
    *_spec("mixtral", "fp16", 16, 14336, False),
    *_spec("mixtral", "bf16", 4096, 4096, True),
    *_spec("mixtral", "bf16", 4096, 14336, False),
    *_spec("qwen3moe", "bf16", 64, 2048, True),
    *_spec("qwen3moe", "bf16", 4096, 768, False),
]
