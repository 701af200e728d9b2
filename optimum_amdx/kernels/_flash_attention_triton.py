"""Triton kernel, launch configs and AMD compile specs behind `optimum_amdx.kernels.flash_attention`.

Imported only when a kernel runs (or by the compile check).

FlashAttention-2 forward: grid (query blocks, batch x query heads). Each program keeps its query tile
in registers and streams key/value tiles with an online softmax in fp32 (exp2 with the scale folded
in). Causal launches split the key loop in two: tiles every row of the block fully sees run without
any mask, and only the few tiles on the diagonal are masked; tiles past the diagonal are never
visited. Causal programs are issued longest-first so the tail of the grid is short work. Varlen
packing reads each sequence's offsets from cu_seqlens on the device (no host synchronization).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from optimum_amdx.kernels.compile_spec import CompileSpec, grouped_specs
from optimum_amdx.kernels.runtime import (
    amd_launch_options,
    arch_family,
    next_pow2,
    split_launch_options,
)
from optimum_amdx.kernels.triton_compat import PINNED_COMPILE_OPTIONS

LOG2E = 1.4426950408889634


# ---- launch configs, keyed by arch family (runtime.arch_family). AMD (CDNA, wave64, 64 KiB LDS per
# workgroup on gfx90a/gfx942) wants num_stages=1 for attention, `waves_per_eu` to keep two waves per
# SIMD and `matrix_instr_nonkdim=16` (16x16 MFMA); RDNA3 is wave32 with WMMA and a smaller register
# budget per tile, so it gets smaller tiles; Hopper gets deeper software pipelining; "cpu" (the
# interpreter in CI) uses small tiles so tests stay fast.

def flash_config(family: str, head_dim_pad: int, causal: bool) -> dict[str, Any]:
    """Tile sizes and launch options for the dense FlashAttention-2 forward."""
    if family == "cpu":
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if family in ("cdna2", "cdna3", "cdna4"):
        # 8 waves of 16 rows: with 4 waves the 128x128 fp32 accumulator plus the Q tile spill on gfx942.
        cfg = amd_launch_options(family, 8, 2)
        cfg.update(BLOCK_M=128, BLOCK_N=64)
        return cfg
    if family in ("rdna3", "rdna4"):
        # wave32 with a 256-VGPR budget: 64-row tiles of d=128 spill on gfx1100, and 32-row ones with 4 warps
        # (48-64 B on Triton 3.8-3.9); with 8 warps they spill on none of 3.6-3.9 (RESULTS.md round30).
        cfg = amd_launch_options(family, 8, 0)
        cfg.update(BLOCK_M=32, BLOCK_N=32)
        return cfg
    # H200 sweep (causal 8x32x2048x128 fp16): 64x64 tiles, 4 warps, 3 stages beat 128-row tiles by ~10%.
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


@triton.jit
def _flash_tile(
    acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, seqlen_k, diag, qk_scale, stride_ks, stride_vs,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):
    """One key/value tile of the online softmax; MASKED tiles check key bounds and causality."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    k_ptrs = k_base + offs_n[None, :] * stride_ks + offs_d[:, None]
    v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_d[None, :]
    if MASKED:
        n_ok = offs_n < seqlen_k
        k = tl.load(k_ptrs, mask=n_ok[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
        v = tl.load(v_ptrs, mask=n_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    elif HEAD_DIM == HEAD_DIM_PAD:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
        v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    qk = tl.dot(q, k)
    if MASKED:
        visible = offs_n[None, :] < seqlen_k
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + diag)
        qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def _flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, cu_k_ptr,
    qk_scale, seqlen_q, seqlen_k, num_heads,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    NUM_QPK: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    batch_head = tl.program_id(1)
    batch = batch_head // num_heads
    head = batch_head % num_heads
    kv_head = head // NUM_QPK
    if VARLEN:
        q_off = tl.load(cu_q_ptr + batch)
        k_off = tl.load(cu_k_ptr + batch)
        seqlen_q = tl.load(cu_q_ptr + batch + 1) - q_off
        seqlen_k = tl.load(cu_k_ptr + batch + 1) - k_off
        if pid_m * BLOCK_M >= seqlen_q:
            return
        q_base = q_ptr + q_off.to(tl.int64) * stride_qs + head * stride_qh
        o_base = o_ptr + q_off.to(tl.int64) * stride_os + head * stride_oh
        k_base = k_ptr + k_off.to(tl.int64) * stride_ks + kv_head * stride_kh
        v_base = v_ptr + k_off.to(tl.int64) * stride_vs + kv_head * stride_vh
    else:
        b64 = batch.to(tl.int64)
        q_base = q_ptr + b64 * stride_qb + head * stride_qh
        o_base = o_ptr + b64 * stride_ob + head * stride_oh
        k_base = k_ptr + b64 * stride_kb + kv_head * stride_kh
        v_base = v_ptr + b64 * stride_vb + kv_head * stride_vh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    m_ok = offs_m < seqlen_q
    io_mask = m_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=io_mask, other=0.0)

    diag = seqlen_k - seqlen_q
    if CAUSAL:
        hi = tl.minimum(seqlen_k, (pid_m + 1) * BLOCK_M + diag)
        full_hi = tl.maximum(tl.minimum(seqlen_k, pid_m * BLOCK_M + diag + 1), 0)
    else:
        hi = seqlen_k
        full_hi = seqlen_k
    full_hi = (full_hi // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    for start_n in range(0, full_hi, BLOCK_N):
        acc, l_i, m_i = _flash_tile(
            acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, seqlen_k, diag, qk_scale, stride_ks, stride_vs,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, CAUSAL,
        )
    for start_n in range(full_hi, hi, BLOCK_N):
        acc, l_i, m_i = _flash_tile(
            acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, seqlen_k, diag, qk_scale, stride_ks, stride_vs,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, CAUSAL,
        )
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=io_mask)


def _launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    q_strides: tuple[int, int, int], k_strides: tuple[int, int, int], v_strides: tuple[int, int, int],
    o_strides: tuple[int, int, int], batch: int, num_heads: int, num_kv_heads: int, head_dim: int,
    seqlen_q: int, seqlen_k: int, cu_q: torch.Tensor | None, cu_k: torch.Tensor | None,
    causal: bool, softmax_scale: float | None, family: str, config: dict | None,
) -> None:
    head_dim_pad = next_pow2(head_dim)
    cfg = dict(config) if config is not None else flash_config(family, head_dim_pad, causal)
    consts, launch = split_launch_options(cfg)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    grid = (triton.cdiv(seqlen_q, consts["BLOCK_M"]), batch * num_heads)
    varlen = cu_q is not None
    _flash_fwd_kernel[grid](
        q, k, v, out, cu_q if varlen else q, cu_k if varlen else q,
        scale * LOG2E, seqlen_q, seqlen_k, num_heads,
        *q_strides, *k_strides, *v_strides, *o_strides,
        NUM_QPK=num_heads // num_kv_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_M=consts["BLOCK_M"], BLOCK_N=consts["BLOCK_N"], CAUSAL=causal, VARLEN=varlen,
        **launch, **PINNED_COMPILE_OPTIONS,
    )


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def flash_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None, family: str,
    config: dict | None = None,
) -> torch.Tensor:
    """Dense launch on [B, H, S, D] tensors of any strides (last dim contiguous).

    The output is a [B, Hq, Sq, D] view of a [B, Sq, Hq, D] buffer, so the usual
    `transpose(1, 2).contiguous()` after attention in transformers costs nothing.
    """
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    batch, num_heads, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    out = torch.empty(batch, seqlen_q, num_heads, head_dim, device=q.device, dtype=q.dtype).transpose(1, 2)
    if out.numel() == 0:
        return out
    _launch(
        q, k, v, out, (q.stride(0), q.stride(1), q.stride(2)), (k.stride(0), k.stride(1), k.stride(2)),
        (v.stride(0), v.stride(1), v.stride(2)), (out.stride(0), out.stride(1), out.stride(2)),
        batch, num_heads, k.shape[1], head_dim, seqlen_q, seqlen_k, None, None, causal, softmax_scale, family, config,
    )
    return out


def flash_attention_varlen_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float | None, family: str,
    config: dict | None = None,
) -> torch.Tensor:
    """Varlen launch on packed [total, H, D] tensors; rows of no sequence are left as zeros."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    out = torch.zeros_like(q)
    batch = cu_seqlens_q.shape[0] - 1
    if q.shape[0] == 0 or batch <= 0 or max_seqlen_q <= 0:
        return out
    _launch(
        q, k, v, out, (0, q.stride(1), q.stride(0)), (0, k.stride(1), k.stride(0)), (0, v.stride(1), v.stride(0)),
        (0, out.stride(1), out.stride(0)), batch, q.shape[1], k.shape[1], q.shape[2], max_seqlen_q, max_seqlen_k,
        cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, family, config,
    )
    return out


# ---- AMD compile specs (see compile_spec.py)

_DTYPE = {"fp16": "*fp16", "bf16": "*bf16"}


def _flash_spec(head_dim: int, dtype: str, causal: bool, varlen: bool, num_qpk: int) -> list[CompileSpec]:
    ptr = _DTYPE[dtype]
    strides = [f"stride_{t}{d}" for t in "qkvo" for d in "bhs"]
    signature = {"q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "o_ptr": ptr, "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
                 "qk_scale": "fp32", "seqlen_q": "i32", "seqlen_k": "i32", "num_heads": "i32",
                 **{s: "i32" for s in strides}}

    def make(arch: str) -> tuple[dict, dict]:
        consts, launch = split_launch_options(flash_config(arch_family(arch), head_dim, causal))
        return {"NUM_QPK": num_qpk, "HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim, **consts,
                "CAUSAL": causal, "VARLEN": varlen}, launch

    signature.update({k: "constexpr" for k in make("gfx942")[0]})
    mode = ("causal" if causal else "full") + (",varlen" if varlen else "")
    # every stride is a multiple of head_dim (or 0), so of 16, in every launch, and Triton specializes on that
    return grouped_specs(f"flash_attention_fwd[{mode},d{head_dim},{dtype}]", _flash_fwd_kernel, signature, make, True, True,
                         tuple(strides))


AMD_COMPILE_SPECS: list[CompileSpec] = [
    # shipped configs: causal and full d128 fp16, causal varlen d64 bf16 (GQA 3)
    *_flash_spec(128, "fp16", True, False, 4),
    *_flash_spec(128, "fp16", False, False, 1),
    *_flash_spec(64, "bf16", True, True, 3),
]
