"""Triton kernel behind `optimum_amdx.kernels.rope_cache` (rotary + paged K/V cache write).

Grid (tokens, 2): program (t, 0) rotates token t's query heads in place; program (t, 1) rotates its
key heads and stores them with its value heads at the token's cache slot. Each thread loads a
feature pair ``(i, i + rot_dim / 2)`` and stores both halves itself, so the in-place update of q
has no cross-thread dependency. Features past rot_dim (partial rotary) are copied unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ._pdl import pdl_begin
from .compile_spec import CompileSpec
from .runtime import pdl_for

AMD_FAMILIES = ("cdna2", "cdna3", "cdna4", "rdna3", "rdna4")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@triton.jit
def _rotate_pairs(ptr, tok_stride, head_stride, t, n_heads, c, s, offs_h, offs_p, HALF: tl.constexpr, round_ty,
                  ACCUM: tl.constexpr):
    """(a cos - b sin, b cos + a sin) of every head's pairs in float32: returns (new_a, new_b, mask). ACCUM:
    the pairs are float32 sums of a W4A16 accumulator, rounded to `round_ty` first (as the matmul's own
    store would have) and zeroed behind the load (the same thread reads and clears each element)."""
    mask = (offs_h[:, None] < n_heads) & (offs_p[None, :] < HALF)
    pa = ptr + t * tok_stride + offs_h[:, None] * head_stride + offs_p[None, :]
    a = tl.load(pa, mask=mask, other=0.0)
    b = tl.load(pa + HALF, mask=mask, other=0.0)
    if ACCUM:
        a = a.to(round_ty)
        b = b.to(round_ty)
        tl.store(pa, tl.zeros_like(a).to(tl.float32), mask=mask)
        tl.store(pa + HALF, tl.zeros_like(b).to(tl.float32), mask=mask)
    a = a.to(tl.float32)
    b = b.to(tl.float32)
    return a * c - b * s, b * c + a * s, mask


@triton.jit
def _take_rows(ptr, tok_stride, head_stride, t, offs_h, offs_d, mask, round_ty, ACCUM: tl.constexpr):
    """Head rows ``[heads, BLOCK_D]`` of token t (masked); ACCUM: rounded to `round_ty` and zeroed behind the load."""
    ptrs = ptr + t * tok_stride + offs_h[:, None] * head_stride + offs_d[None, :]
    x = tl.load(ptrs, mask=mask)
    if ACCUM:
        x = x.to(round_ty)
        tl.store(ptrs, tl.zeros_like(x).to(tl.float32), mask=mask)
    return x


@triton.jit
def _rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, kc_ptr, vc_ptr,
    q_tok_stride, q_head_stride, k_tok_stride, k_head_stride, v_tok_stride, v_head_stride,
    kc_block_stride, kc_slot_stride, kc_head_stride, vc_block_stride, vc_slot_stride, vc_head_stride,
    table_stride, n_q_heads, qo_ptr, qo_tok_stride, qo_head_stride,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False, ACCUM: tl.constexpr = False,
):
    # The rotated q goes to qo (q itself, in place, unless ACCUM: then q, k, v are a float32 W4A16
    # accumulator, read in qo's dtype and left zeroed for the next matmul, padding tokens included).
    # PDL (programmatic dependent launch, `runtime.pdl_enabled`): let the next kernel launch, then wait for the
    # last. The positions and slots are the step's inputs, written before the graph runs, and the tables are the
    # model's: their two dependent trips are made before the wait, while the kernel before still runs.
    t = tl.program_id(0).to(tl.int64)
    role = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs_p = tl.arange(0, BLOCK_P)
    pmask = offs_p < HALF
    c = tl.load(cos_ptr + pos * table_stride + offs_p, mask=pmask, other=0.0)[None, :]
    s = tl.load(sin_ptr + pos * table_stride + offs_p, mask=pmask, other=0.0)[None, :]
    if PDL:
        pdl_begin()
    out_ty = qo_ptr.dtype.element_ty
    if role == 0:
        offs_h = tl.arange(0, BLOCK_HQ)
        new_a, new_b, mask = _rotate_pairs(q_ptr, q_tok_stride, q_head_stride, t, n_q_heads, c, s, offs_h, offs_p,
                                           HALF, out_ty, ACCUM)
        if ACCUM:
            pa = qo_ptr + t * qo_tok_stride + offs_h[:, None] * qo_head_stride + offs_p[None, :]
        else:  # in place: the very pointers of the load (one address computation, as before qo existed)
            pa = q_ptr + t * q_tok_stride + offs_h[:, None] * q_head_stride + offs_p[None, :]
        tl.store(pa, new_a.to(out_ty), mask=mask)
        tl.store(pa + HALF, new_b.to(out_ty), mask=mask)
        if ACCUM and 2 * HALF < HEAD_DIM:  # partial rotary: q's tail moves to qo unchanged (in place it stays)
            offs_d = tl.arange(0, BLOCK_D)
            tmask = (offs_h[:, None] < n_q_heads) & (offs_d[None, :] >= 2 * HALF) & (offs_d[None, :] < HEAD_DIM)
            tail = _take_rows(q_ptr, q_tok_stride, q_head_stride, t, offs_h, offs_d, tmask, out_ty, ACCUM)
            tl.store(qo_ptr + t * qo_tok_stride + offs_h[:, None] * qo_head_stride + offs_d[None, :], tail, mask=tmask)
    else:
        if slot >= 0:
            page = slot // PAGE_SIZE
            offset = slot % PAGE_SIZE
            offs_hk = tl.arange(0, BLOCK_HK)
            new_a, new_b, mask = _rotate_pairs(k_ptr, k_tok_stride, k_head_stride, t, NUM_KV_HEADS, c, s, offs_hk,
                                               offs_p, HALF, out_ty, ACCUM)
            kc = kc_ptr + page * kc_block_stride + offset * kc_slot_stride + offs_hk[:, None] * kc_head_stride
            tl.store(kc + offs_p[None, :], new_a.to(kc_ptr.dtype.element_ty), mask=mask)
            tl.store(kc + HALF + offs_p[None, :], new_b.to(kc_ptr.dtype.element_ty), mask=mask)
            offs_d = tl.arange(0, BLOCK_D)
            hmask = offs_hk[:, None] < NUM_KV_HEADS
            if 2 * HALF < HEAD_DIM:  # partial rotary: the tail of each key head goes through unchanged
                tmask = hmask & (offs_d[None, :] >= 2 * HALF) & (offs_d[None, :] < HEAD_DIM)
                tail = _take_rows(k_ptr, k_tok_stride, k_head_stride, t, offs_hk, offs_d, tmask, out_ty, ACCUM)
                tl.store(kc + offs_d[None, :], tail.to(kc_ptr.dtype.element_ty), mask=tmask)
            vmask = hmask & (offs_d[None, :] < HEAD_DIM)
            v = _take_rows(v_ptr, v_tok_stride, v_head_stride, t, offs_hk, offs_d, vmask, out_ty, ACCUM)
            vc = vc_ptr + page * vc_block_stride + offset * vc_slot_stride + offs_hk[:, None] * vc_head_stride
            tl.store(vc + offs_d[None, :], v.to(vc_ptr.dtype.element_ty), mask=vmask)
        elif ACCUM:  # a padding token writes no cache, but its sums must still leave the accumulator
            offs_hk = tl.arange(0, BLOCK_HK)
            offs_d = tl.arange(0, BLOCK_D)
            zmask = (offs_hk[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
            zero = tl.zeros([BLOCK_HK, BLOCK_D], dtype=tl.float32)
            tl.store(k_ptr + t * k_tok_stride + offs_hk[:, None] * k_head_stride + offs_d[None, :], zero, mask=zmask)
            tl.store(v_ptr + t * v_tok_stride + offs_hk[:, None] * v_head_stride + offs_d[None, :], zero, mask=zmask)


def _num_warps(elems: int) -> int:
    return max(1, min(8, elems // 1024))


def launch_options(family: str, block_hq: int, block_p: int) -> dict[str, Any]:
    """num_warps from the q tile (pairs per program); one stage everywhere (no loop to pipeline)."""
    del family
    return {"num_warps": _num_warps(block_hq * block_p), "num_stages": 1}


def rotary_and_cache_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, family: str,
    q_out: torch.Tensor | None = None,
) -> None:
    """Launch `_rope_cache_kernel` over (tokens, 2) programs. `q_out`: q, k, v are views of a float32 W4A16
    accumulator (read in q_out's dtype and left zeroed) and the rotated q goes there; else q is rotated in place."""
    half = cos.shape[-1]
    cos_c = cos if cos.dtype == torch.float32 and cos.is_contiguous() else cos.to(torch.float32).contiguous()
    sin_c = sin if sin.dtype == torch.float32 and sin.is_contiguous() else sin.to(torch.float32).contiguous()
    block_hq, block_p = _next_pow2(q.shape[1]), _next_pow2(half)
    pdl = pdl_for(q, "rope_cache", q.shape[0])
    qo = q if q_out is None else q_out
    _rope_cache_kernel[(q.shape[0], 2)](
        q, k, v, cos_c, sin_c, positions, slot_mapping, k_cache, v_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), cos_c.stride(0), q.shape[1], qo, qo.stride(0), qo.stride(1),
        NUM_KV_HEADS=k.shape[1], HEAD_DIM=q.shape[2], HALF=half, PAGE_SIZE=k_cache.shape[1],
        BLOCK_HQ=block_hq, BLOCK_HK=_next_pow2(k.shape[1]), BLOCK_P=block_p, BLOCK_D=_next_pow2(q.shape[2]),
        PDL=pdl, ACCUM=q_out is not None, launch_pdl=pdl, **launch_options(family, block_hq, block_p),
    )


def _spec(hq: int, hk: int, d: int, dtype: str, page: int, accum: bool = False) -> CompileSpec:
    half = d // 2
    src = "fp32" if accum else dtype
    sig = {
        "q_ptr": f"*{src}", "k_ptr": f"*{src}", "v_ptr": f"*{src}", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
        "pos_ptr": "*i64", "slot_ptr": "*i64", "kc_ptr": f"*{dtype}", "vc_ptr": f"*{dtype}",
        "q_tok_stride": "i32", "q_head_stride": "i32", "k_tok_stride": "i32", "k_head_stride": "i32",
        "v_tok_stride": "i32", "v_head_stride": "i32",
        "kc_block_stride": "i32", "kc_slot_stride": "i32", "kc_head_stride": "i32",
        "vc_block_stride": "i32", "vc_slot_stride": "i32", "vc_head_stride": "i32",
        "table_stride": "i32", "n_q_heads": "i32", "qo_ptr": f"*{dtype}", "qo_tok_stride": "i32",
        "qo_head_stride": "i32",
        "NUM_KV_HEADS": "constexpr", "HEAD_DIM": "constexpr", "HALF": "constexpr", "PAGE_SIZE": "constexpr",
        "BLOCK_HQ": "constexpr", "BLOCK_HK": "constexpr", "BLOCK_P": "constexpr", "BLOCK_D": "constexpr",
        "ACCUM": "constexpr",
    }
    bq, bp = _next_pow2(hq), _next_pow2(half)
    return CompileSpec(
        name=f"rope_cache[hq{hq},hkv{hk},d{d},{dtype},page{page}{',accum' if accum else ''}]",
        kernel=_rope_cache_kernel,
        signature=sig,
        constexprs={"NUM_KV_HEADS": hk, "HEAD_DIM": d, "HALF": half, "PAGE_SIZE": page, "BLOCK_HQ": bq,
                    "BLOCK_HK": _next_pow2(hk), "BLOCK_P": bp, "BLOCK_D": _next_pow2(d), "ACCUM": accum},
        options=lambda arch: launch_options("cdna3", bq, bp),
        hot=True,
        uses_dot=False,
        divisible_by_16=("q_tok_stride", "q_head_stride", "k_tok_stride", "k_head_stride", "v_tok_stride",
                         "v_head_stride", "kc_block_stride", "kc_slot_stride", "kc_head_stride", "vc_block_stride",
                         "vc_slot_stride", "vc_head_stride", "table_stride", "qo_tok_stride", "qo_head_stride"),
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [
    _spec(32, 8, 128, "fp16", 16),   # Llama-3-8B
    _spec(32, 32, 128, "bf16", 16),  # Llama-2-7B
    _spec(32, 8, 128, "fp16", 16, accum=True),  # a one-row GPTQ q/k/v accumulator's reader
]
