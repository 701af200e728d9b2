"""Triton kernels, launch configs and AMD compile specs behind `optimum_amdx.kernels.paged_attention`.

Over 400 lines on purpose: the three kernels of the op (KV write, unified attention, split-K
reduce) share their launch configs and compile specs, which stay beside the code they configure.
Imported only when a kernel runs (or by the compile check).

Unified attention grid: (query blocks of all sequences, KV heads, key-range splits), with the first two
swapped for prompt and mixed steps (HEADS_FIRST: programs go out query block by query block across all
heads, so a captured graph's empty sequence slots do not hold back the next head's work). A program owns
BLOCK_Q query tokens of one sequence times the NUM_QPK query heads that share one KV head; those
BLOCK_M = BLOCK_Q * NUM_QPK (padded) rows form the M side of every `tl.dot`, so each KV tile is read
once per KV head. Which sequence a query block belongs to is found on the device (query block b of
sequence s has global index query_start_loc[s] // BLOCK_Q + s + b): in a decode step block i is sequence i
(ONE_TOKEN); otherwise one vector load of query_start_loc and a count (SEQS_PAD), or a binary search for
very many sequences and on RDNA. So the launch needs no host synchronization and the grid size is known
from shapes alone.
With NUM_SPLITS > 1 each program covers one slice of the key range and writes a normalized partial
output plus its log2-sum-exp (flash-decoding); the last program of a (query block, KV head) to
arrive (an atomic counter) combines the slices in the same launch (FUSED_REDUCE), or
`_split_reduce_kernel` does in a second one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from optimum_amdx.kernels._pdl import pdl_begin
from optimum_amdx.kernels.compile_spec import CompileSpec, grouped_specs
from optimum_amdx.kernels.runtime import (
    amd_launch_options,
    arch_family,
    compute_units,
    next_pow2,
    pdl_for,
    split_launch_options,
)
from optimum_amdx.kernels.triton_compat import PINNED_COMPILE_OPTIONS

LOG2E = 1.4426950408889634


# ---- launch configs, keyed by arch family (runtime.arch_family). AMD (CDNA, wave64, 64 KiB LDS per
# workgroup on gfx90a/gfx942) wants num_stages=1 for attention, `waves_per_eu` to keep two waves per
# SIMD and `matrix_instr_nonkdim=16` (16x16 MFMA); RDNA3 is wave32 with WMMA and a smaller register
# budget per tile, so it gets smaller tiles; Hopper gets deeper software pipelining; "cpu" (the
# interpreter in CI) uses small tiles so tests stay fast.

_AMD_FAMILIES = ("cdna2", "cdna3", "cdna4", "rdna3", "rdna4")


def unified_config(family: str, head_dim_pad: int, num_qpk: int, max_query_len: int) -> dict[str, Any]:
    """Tile sizes and launch options for `unified_attention` (see `_base_unified_config`).

    head_dim 256 (Gemma 2, Gemma 3 4B/12B) holds twice the accumulator and key/value tile per program: on
    AMD the key tile is halved (and the prefill M tile), which keeps gfx90a/gfx942 free of scratch spills; gfx1100
    (wave32, 256 VGPRs a lane) takes 16-row prefill tiles (32-row ones spilled 8-68 B on 3.7-3.8, and 388-560 B
    with 4 warps; RESULTS.md round30) and 16 warps, the one count that spills on none of Triton 3.6-3.9 as
    launched (round31).
    """
    cfg = _base_unified_config(family, head_dim_pad, num_qpk, max_query_len)
    if head_dim_pad >= 256 and family in _AMD_FAMILIES:
        cfg["BLOCK_N"] = max(16, cfg["BLOCK_N"] // 2)
        if max_query_len > 8:
            cfg["BLOCK_M"] = (max(16, next_pow2(num_qpk)) if family == "rdna3"
                              else max(32, next_pow2(num_qpk), cfg["BLOCK_M"] // 2))
        if family == "rdna3":  # 16 x 16 tiles at 8 warps spill 132 B on Triton 3.9 (4 warps 260); 16 none (round31)
            cfg["num_warps"] = 16
    return cfg


RUNS_MAX_HEAD_DIM: dict[str, int] = {"rdna3": 128}
"""The widest (padded) head a family reads in the run form (`RUNS`: a sequence's blocks computed from its first one, not
looked up): gfx1100 spills 48-464 B of scratch a lane on 256-wide heads in that form whatever the tiles (16/32 rows,
4/8/16 warps; RESULTS.md round30), and none through the table."""


def runs_form(family: str, head_dim_pad: int) -> bool:
    """Whether `unified_attention` takes a sequence's blocks as one run where the caller says they are
    (``first_pages``) on `family` at this head width, instead of reading the block table (which is always valid)."""
    return head_dim_pad <= RUNS_MAX_HEAD_DIM.get(family, head_dim_pad)


def _base_unified_config(family: str, head_dim_pad: int, num_qpk: int, max_query_len: int) -> dict[str, Any]:
    """Tile sizes and launch options for `unified_attention` up to head_dim 128.

    The M tile packs query heads of one KV head (num_qpk of them) x query tokens, so each KV tile is
    read once per KV head. Decode-heavy batches (few query tokens per sequence) use a 16-row M tile
    (the smallest matrix-instruction tile); prefill chunks use larger M tiles for compute efficiency.
    """
    decode = max_query_len <= 8
    if family == "cpu":
        block_m = max(16, next_pow2(num_qpk)) if decode else max(32, next_pow2(num_qpk))
        return {"BLOCK_M": block_m, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if decode:
        block_m = max(16, next_pow2(num_qpk))
        if family == "rdna3":
            # gfx1100 (wave32): 16-key tiles (32-key ones spilled 20-56 B with Triton 3.6-3.8, the act-order form
            # too; round30) with 4 warps: compiled as launched (strides multiples of 16), 8 warps spill 28 B on
            # Triton 3.9 and 4 warps spill on none of 3.6-3.9, d64 to d128, split or not (round31)
            cfg = amd_launch_options(family, 4, 0)
            cfg.update(BLOCK_M=block_m, BLOCK_N=16)
            return cfg
        if family in _AMD_FAMILIES:
            cfg = amd_launch_options(family, 4, 2)
            cfg.update(BLOCK_M=block_m, BLOCK_N=64)
            return cfg
        # H100 sweep at the decode step's shape (512 keys, benchmarks/attention_decode_sweep.py): 64-key
        # tiles, 2 stages: 80% of copy bandwidth for 512 programs (Llama-2-7B x 16, Llama-3-8B x 64)
        # against 69-71% with 128-key tiles (74 KB of shared memory and 168 registers: 3 programs
        # per SM), and 8 us against 10 per layer for one sequence split by 64 keys.
        return {"BLOCK_M": block_m, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    if family in ("rdna3", "rdna4"):
        # 32- and 64-key tiles spill to scratch on gfx1100 at d=128; 16-key tiles do not.
        cfg = amd_launch_options(family, 8, 0)
        cfg.update(BLOCK_M=max(64, next_pow2(num_qpk)), BLOCK_N=16)
        return cfg
    if family in _AMD_FAMILIES:
        # 8 waves: with 4 waves the two-loop (unmasked + diagonal) body spills on gfx942/gfx90a.
        cfg = amd_launch_options(family, 8, 2)
        cfg.update(BLOCK_M=max(128, next_pow2(num_qpk)), BLOCK_N=64)
        return cfg
    # Hopper prompt tiles: two stages, not three (one 512-token prompt, H100, two calls of
    # attention_decode_sweep.py --prefill 512, RESULTS.md round 12: Llama-3-8B 23.2-23.6 -> 21.2-21.4 us per
    # layer, Llama-2-7B 21.5-21.8 -> 20.9)
    return {"BLOCK_M": max(64, next_pow2(num_qpk)), "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}


def split_reduce_config(family: str) -> dict[str, Any]:
    """Launch options of the split-K reduce kernel (tiny, memory-light)."""
    if family in _AMD_FAMILIES:
        return {"num_warps": 2 if family in ("rdna3", "rdna4") else 1, "num_stages": 1}
    return {"num_warps": 2, "num_stages": 1}


DECODE_SPLIT_KEYS = 64
"""Keys per decode-attention split where the family has no `DECODE_SPLITS` entry: one 64-key tile per
split, up to `DECODE_PROGRAMS_PER_CU` programs per compute unit, measured 0.47 -> 0.24 ms per step at
batch 1 and 512 tokens of context on an H200 (128-key tiles then), and 64-key tiles took another 10 ->
8 us per layer on an H100 (benchmarks/RESULTS.md)."""
DECODE_PROGRAMS_PER_CU = 4
DECODE_SPLITS: dict[str, tuple[int, int]] = {}
"""Per family: (keys per split, programs per compute unit the splits may fill), where it differs from the
defaults. Hopper had 32 keys per split (round 11: 16 splits for one Llama-3-8B sequence took 6.7 us per layer
against 8.1 with 8), but a split holds whole 64-key decode tiles, so at 513 keys 17 splits left 8 of them empty.
One tile per split (9 splits) made the H200's batch-1 decode step 0.3-0.65 % faster than 16-17 on both Llama
shapes, GPTQ and fp16 (RESULTS.md round31); Llama-2-7B's 32 KV heads at 17 splits even spill into a second wave
(544 programs, 4.5 % slower). Letting the splits fill 8 programs per SM made the step 1.5-2.6 % slower at 4 and
16 sequences (round 11)."""


def split_rule(family: str) -> tuple[int, int]:
    """(keys per split, programs per compute unit) of the decode split rule on `family`."""
    return DECODE_SPLITS.get(family, (DECODE_SPLIT_KEYS, DECODE_PROGRAMS_PER_CU))


def choose_num_splits(family: str, num_seqs: int, num_kv_heads: int, max_seq_len: int, max_query_len: int,
                      num_sms: int) -> int:
    """How many key-range splits (flash-decoding) a launch should use; 1 = no split. The one rule (the
    paged engine's decode steps take it too, `PagedDecoder.decode_splits`).

    Only short-query batches whose (sequence x KV-head) programs fill less than one wave of the GPU
    split: into splits of `split_rule` keys, up to its programs per compute unit, at most 64. A graph
    captured for `max_seq_len` stays right for shorter contexts (the kernel sizes each split from the
    actual lengths; empty splits write nothing).
    """
    programs = num_seqs * num_kv_heads
    if family == "cpu" or max_query_len > 16 or programs >= num_sms:
        return 1
    keys, per_cu = split_rule(family)
    return max(1, min(64, per_cu * num_sms // programs, -(-max_seq_len // keys)))


DECODE_FEW_PROGRAMS: dict[str, dict[str, Any]] = {"hopper": {"num_stages": 1, "maxnreg": 128}}
"""Per family: launch options of a decode launch (one query token per sequence) of at most the split
rule's programs per compute unit (`split_rule`). Hopper, H200 sweep at a 513-token context
(benchmarks/RESULTS.md round11): one stage and 128 registers took Llama-3-8B at 1 / 4 / 16 sequences to
6.7 / 10.1 / 17.8 us per layer (16 / 16 / 8 splits) against 7.6 / 11.0 / 18.0 with two stages (each at
its best split count), and 512 programs of Llama-2-7B x 16 to 41.6 against 42.3; with 2048 programs
(Llama-2-7B x 64) two stages stay faster (142.7 against 146.2)."""


def decode_launch_options(family: str, launch: dict[str, Any], programs: int, cus: int) -> dict[str, Any]:
    """`launch` with the family's `DECODE_FEW_PROGRAMS` options for a decode launch of `programs`
    programs (sequences x KV heads x splits) on `cus` compute units; unchanged otherwise."""
    few = DECODE_FEW_PROGRAMS.get(family)
    if few is None or programs > split_rule(family)[1] * cus:
        return launch
    return {**launch, **few}


def kv_ahead(pdl: bool, one_token: bool, num_qpk: int) -> bool:
    """Whether a launch reads its first tile's keys and values of earlier steps before its PDL wait (`KV_AHEAD`): a
    decode step (one query token per sequence) under PDL, with grouped queries. H200, batch-1 decode step, two calls
    in opposite orders (RESULTS.md round31): Llama-3-8B (4 query heads a KV head) 0.5-1.3 % faster in GPTQ and fp16;
    Llama-2-7B (one query head a KV head: 4x the programs, each reading as many bytes) 0.7 % slower in fp16 in both
    calls and within 0.8 % in GPTQ, so it keeps the read after the wait."""
    return pdl and one_token and num_qpk > 1


def reshape_cache_config(family: str) -> dict[str, Any]:
    """Launch options of `reshape_and_cache`: one program per token, a pure copy, same on every family."""
    del family
    return {"num_warps": 4, "num_stages": 1}


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    tok = token.to(tl.int64)
    k = tl.load(key_ptr + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    k_dst = k_cache_ptr + page * stride_kcb + offset * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :]
    v_dst = v_cache_ptr + page * stride_vcb + offset * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :]
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _find_sequence(qsl_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Index of the sequence owning global query block `q_block` (binary search over query_start_loc)."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _find_sequence_vec(qsl_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr, SEQS_PAD: tl.constexpr):
    """`_find_sequence` with one vector load of query_start_loc instead of log2(num_seqs) + 1 dependent
    ones: the sequences whose first query block is at or before `q_block`, counted (first blocks rise
    strictly with the sequence index)."""
    idx = tl.arange(0, SEQS_PAD)
    valid = idx < num_seqs
    first_block = tl.load(qsl_ptr + idx, mask=valid, other=0) // BLOCK_Q + idx
    return tl.sum(((first_block <= q_block) & valid).to(tl.int32), 0) - 1


@triton.jit
def _tanh(x):
    """tanh without libdevice (portable across HIP/CUDA/interpreter): odd Taylor series near 0, where
    1 - exp(-2|x|) would cancel, else sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|) (saturates cleanly)."""
    ax = tl.abs(x)
    e = tl.exp2(ax * (-2.0 * 1.4426950408889634))
    big = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    small = ax * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0))))
    t = tl.where(ax < 0.125, small, big)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def _tile_pages(table, offs_n, n_valid, first_page, PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr,
                RUNS: tl.constexpr):
    """The cache blocks of keys `offs_n` (int64): from the block table (MASKED: only keys `n_valid`), or computed in the
    run form (`_paged_tile`)."""
    if RUNS:
        page = (first_page + offs_n // PAGE_SIZE).to(tl.int64)
    elif MASKED:
        page = tl.load(table + offs_n // PAGE_SIZE, mask=n_valid, other=0).to(tl.int64)
    else:
        page = tl.load(table + offs_n // PAGE_SIZE).to(tl.int64)
    return page


@triton.jit
def _tile_kv(k_head, v_head, page, offs_n, n_valid, k_other, v_other, stride_kb, stride_ks, stride_vb, stride_vs,
             PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, MASKED: tl.constexpr):
    """The tile's keys ``[HEAD_DIM_PAD, BLOCK_N]`` and values ``[BLOCK_N, HEAD_DIM_PAD]``; MASKED: only keys
    `n_valid` are read, the others are `k_other` / `v_other` (zero, or the tile's keys read earlier: a masked load
    into the registers that hold them, no second copy)."""
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    in_page = offs_n % PAGE_SIZE
    k_ptrs = k_head + (page * stride_kb + in_page * stride_ks)[None, :] + offs_d[:, None]
    v_ptrs = v_head + (page * stride_vb + in_page * stride_vs)[:, None] + offs_d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=n_valid[None, :] & d_mask[:, None], other=k_other)
        v = tl.load(v_ptrs, mask=n_valid[:, None] & d_mask[None, :], other=v_other)
    elif HEAD_DIM == HEAD_DIM_PAD:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_mask[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    return k, v


@triton.jit
def _tile_softmax(acc, l_i, m_i, q, k, v, offs_n, q_pos, sliding_window, qk_scale, softcap_log2,
                  MASKED: tl.constexpr, USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr):
    """The online-softmax update of (acc, l_i, m_i) by one key/value tile; MASKED tiles check causality and the
    window (see `_paged_tile`)."""
    scores = tl.dot(q, k) * qk_scale
    if USE_SOFTCAP:
        scores = softcap_log2 * _tanh(scores)
    if MASKED:
        visible = offs_n[None, :] <= q_pos[:, None]
        if USE_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - sliding_window)
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    p = tl.exp2(scores - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def _paged_tile(
    acc, l_i, m_i, q, table, k_head, v_head, tile_start, q_pos, kv_end, sliding_window, qk_scale, softcap_log2,
    stride_kb, stride_ks, stride_vb, stride_vs,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    MASKED: tl.constexpr, USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, first_page, RUNS: tl.constexpr,
):
    """One key/value tile read through the block table; MASKED tiles check length, causality, window.

    RUNS: the sequence's blocks are one ascending run from block `first_page`, so a key's block is
    first_page + key // PAGE_SIZE, computed instead of loaded from the table (no dependent load ahead of
    the K/V loads). With USE_SOFTCAP, qk_scale is scale / cap and the scores become cap * tanh(.) in log2
    units (softcap_log2 = cap * log2(e)).
    """
    offs_n = tile_start + tl.arange(0, BLOCK_N)
    n_valid = offs_n < kv_end
    page = _tile_pages(table, offs_n, n_valid, first_page, PAGE_SIZE, MASKED, RUNS)
    k, v = _tile_kv(k_head, v_head, page, offs_n, n_valid, 0.0, 0.0, stride_kb, stride_ks, stride_vb, stride_vs,
                    PAGE_SIZE, HEAD_DIM, HEAD_DIM_PAD, MASKED)
    return _tile_softmax(acc, l_i, m_i, q, k, v, offs_n, q_pos, sliding_window, qk_scale, softcap_log2, MASKED,
                         USE_WINDOW, USE_SOFTCAP)


@triton.jit
def _out_col(cols_ptr, head, d, stride_oh, mask, HEAD_DIM: tl.constexpr, OUT_COLS: tl.constexpr):
    """Offset within a token's row of the result of `head`, dim `d` (broadcast alike): ``head * stride_oh + d``, or
    with OUT_COLS ``cols[head * HEAD_DIM + d]`` (``out_cols`` of `paged_attention.unified_attention`)."""
    if OUT_COLS:
        return tl.load(cols_ptr + head * HEAD_DIM + d, mask=mask, other=0)
    return head * stride_oh + d


@triton.jit
def _unified_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    counter_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    qsl_ptr,
    first_pages_ptr,
    out_cols_ptr,
    qk_scale,
    softcap_log2,
    sliding_window,
    num_seqs,
    num_heads,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_QPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr = False,
    FUSED_REDUCE: tl.constexpr = False,
    SPLITS_PAD: tl.constexpr = 1,
    PDL: tl.constexpr = False,
    ONE_TOKEN: tl.constexpr = False,
    SEQS_PAD: tl.constexpr = 0,
    HEADS_FIRST: tl.constexpr = False,
    RUNS: tl.constexpr = False,
    OUT_COLS: tl.constexpr = False,
    KV_AHEAD: tl.constexpr = False,
):
    # PDL (programmatic dependent launch, `runtime.pdl_enabled`): let the next kernel launch, then wait for the last,
    # just before the first load of what the kernel before wrote (q). The sequence boundaries and lengths are the
    # step's inputs, written before the graph runs: their dependent trips come before the wait.
    # KV_AHEAD (`kv_ahead`: a decode step under PDL): the first tile's blocks and its keys and values from earlier
    # steps come before the wait too, so after it only q and this step's keys are a trip away.
    # HEADS_FIRST (prompt and mixed steps): grid axis 0 is the KV head, so programs are dispatched query
    # block by query block across all heads; with axis 0 the query block, each head's programs for empty
    # sequence slots (a captured graph has room for every slot) came before the next head's real ones
    if HEADS_FIRST:
        kv_head = tl.program_id(0)
        q_block = tl.program_id(1)
    else:
        q_block = tl.program_id(0)
        kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # ONE_TOKEN (every sequence has one query token, a decode step): query block i is sequence i, with no
    # binary search, whose chain of dependent loads (log2(num_seqs) + 1) came before the first K/V load
    if ONE_TOKEN:
        seq = q_block
    elif SEQS_PAD > 0:
        seq = _find_sequence_vec(qsl_ptr, q_block, num_seqs, BLOCK_Q, SEQS_PAD)
    else:
        seq = _find_sequence(qsl_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if ONE_TOKEN:
        q_block_local = 0
    else:
        q_block_local = q_block - (q_start // BLOCK_Q + seq)
    if q_block_local * BLOCK_Q >= q_len:
        if PDL:  # every program waits, so this kernel never ends before the one it follows (later kernels rely on it)
            pdl_begin()
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_before = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    q_tok = q_block_local * BLOCK_Q + offs_m // NUM_QPK
    head = kv_head * NUM_QPK + offs_m % NUM_QPK
    row_valid = (offs_m < BLOCK_Q * NUM_QPK) & (q_tok < q_len)
    q_pos = context_before + q_tok
    token = (q_start + q_tok).to(tl.int64)

    kv_end = context_before + tl.minimum((q_block_local + 1) * BLOCK_Q, q_len)
    kv_start = 0
    if USE_WINDOW:
        first_pos = context_before + q_block_local * BLOCK_Q
        kv_start = (tl.maximum(first_pos - sliding_window + 1, 0) // BLOCK_N) * BLOCK_N
    num_tiles = tl.cdiv(kv_end - kv_start, BLOCK_N)
    tile_lo = 0
    tile_hi = num_tiles
    if NUM_SPLITS > 1:
        per_split = tl.cdiv(num_tiles, NUM_SPLITS)
        tile_lo = split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, num_tiles)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head = k_cache_ptr + kv_head * stride_kh
    v_head = v_cache_ptr + kv_head * stride_vh
    first_page = 0
    if RUNS:  # every sequence's blocks are one ascending run: its keys' blocks are computed, not looked up
        first_page = tl.load(first_pages_ptr + seq)
    if KV_AHEAD:
        # The first tile's blocks, and its keys and values before this step's (positions below context_before,
        # written by earlier steps): no kernel of this step writes them, so they are read before the wait. This
        # step's keys (written by the rotary + cache kernel before this one) are read after it.
        offs_a = kv_start + tile_lo * BLOCK_N + tl.arange(0, BLOCK_N)
        page_a = _tile_pages(table, offs_a, offs_a < kv_end, first_page, PAGE_SIZE, True, RUNS)
        old_a = offs_a < context_before
        k_a, v_a = _tile_kv(k_head, v_head, page_a, offs_a, old_a, 0.0, 0.0, stride_kb, stride_ks, stride_vb,
                            stride_vs, PAGE_SIZE, HEAD_DIM, HEAD_DIM_PAD, True)

    if PDL:
        pdl_begin()
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_valid[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    loop_lo = tile_lo
    if KV_AHEAD:  # the first tile, completed with this step's keys
        if tile_lo < tile_hi:
            new_a = (offs_a >= context_before) & (offs_a < kv_end)
            k_a, v_a = _tile_kv(k_head, v_head, page_a, offs_a, new_a, k_a, v_a, stride_kb, stride_ks, stride_vb,
                                stride_vs, PAGE_SIZE, HEAD_DIM, HEAD_DIM_PAD, True)
            acc, l_i, m_i = _tile_softmax(acc, l_i, m_i, q, k_a, v_a, offs_a, q_pos, sliding_window, qk_scale,
                                          softcap_log2, True, USE_WINDOW, USE_SOFTCAP)
        loop_lo = tile_lo + 1

    # Tiles wholly at or before the block's first query position are visible to every row: no masks.
    full_end = loop_lo
    if not USE_WINDOW:
        first_pos = context_before + q_block_local * BLOCK_Q
        full_end = tl.minimum(tl.maximum((first_pos + 1) // BLOCK_N, loop_lo), tl.maximum(tile_hi, loop_lo))
    for tile in range(loop_lo, full_end):
        acc, l_i, m_i = _paged_tile(
            acc, l_i, m_i, q, table, k_head, v_head, kv_start + tile * BLOCK_N, q_pos, kv_end, sliding_window,
            qk_scale, softcap_log2, stride_kb, stride_ks, stride_vb, stride_vs,
            BLOCK_N, PAGE_SIZE, HEAD_DIM, HEAD_DIM_PAD, False, USE_WINDOW, USE_SOFTCAP, first_page, RUNS,
        )
    for tile in range(full_end, tile_hi):
        acc, l_i, m_i = _paged_tile(
            acc, l_i, m_i, q, table, k_head, v_head, kv_start + tile * BLOCK_N, q_pos, kv_end, sliding_window,
            qk_scale, softcap_log2, stride_kb, stride_ks, stride_vb, stride_vs,
            BLOCK_N, PAGE_SIZE, HEAD_DIM, HEAD_DIM_PAD, True, USE_WINDOW, USE_SOFTCAP, first_page, RUNS,
        )

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    result = acc / l_safe[:, None]
    store_mask = row_valid[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        o_ptrs = out_ptr + token[:, None] * stride_ot + _out_col(out_cols_ptr, head[:, None], offs_d[None, :],
                                                                 stride_oh, store_mask, HEAD_DIM, OUT_COLS)
        tl.store(o_ptrs, result.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        row = token * num_heads + head
        p_ptrs = part_out_ptr + ((row * NUM_SPLITS + split) * HEAD_DIM_PAD)[:, None] + offs_d[None, :]
        tl.store(p_ptrs, result, mask=store_mask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + row * NUM_SPLITS + split, lse, mask=row_valid)
        if FUSED_REDUCE:
            # The last split of this (query block, KV head) to finish combines all of them: no second
            # launch. The barrier puts every thread's partial stores before the release of the counter
            # increment; the acquire of the last one makes them visible to it. It resets the counter,
            # so the next launch (or graph replay) starts from zero.
            tl.debug_barrier()
            slot = q_block * (num_heads // NUM_QPK) + kv_head
            arrived = tl.atomic_add(counter_ptr + slot, 1, sem="acq_rel")
            if arrived == NUM_SPLITS - 1:
                offs_s = tl.arange(0, SPLITS_PAD)
                lse_all = tl.load(part_lse_ptr + (row * NUM_SPLITS)[:, None] + offs_s[None, :],
                                  mask=row_valid[:, None] & (offs_s[None, :] < NUM_SPLITS), other=float("-inf"))
                m_all = tl.max(lse_all, 1)
                m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
                denom = tl.sum(tl.exp2(lse_all - m_all[:, None]), 1)
                denom = tl.where(denom == 0.0, 1.0, denom)
                total = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
                for s in range(NUM_SPLITS):
                    lse_s = tl.load(part_lse_ptr + row * NUM_SPLITS + s, mask=row_valid, other=float("-inf"))
                    part = tl.load(part_out_ptr + ((row * NUM_SPLITS + s) * HEAD_DIM_PAD)[:, None] + offs_d[None, :],
                                   mask=store_mask, other=0.0)
                    total += part * tl.exp2(lse_s - m_all)[:, None]
                o_ptrs = out_ptr + token[:, None] * stride_ot + _out_col(
                    out_cols_ptr, head[:, None], offs_d[None, :], stride_oh, store_mask, HEAD_DIM, OUT_COLS)
                tl.store(o_ptrs, (total / denom[:, None]).to(out_ptr.dtype.element_ty), mask=store_mask)
                tl.atomic_xchg(counter_ptr + slot, 0, sem="relaxed")  # the launch's end orders it


@triton.jit
def _split_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    out_cols_ptr,
    num_heads,
    stride_ot,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PDL: tl.constexpr = False,
    OUT_COLS: tl.constexpr = False,
):
    if PDL:
        pdl_begin()
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = token * num_heads + head
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_mask = offs_s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    denom = tl.where(denom == 0.0, 1.0, denom)
    parts = tl.load(
        part_out_ptr + ((row * NUM_SPLITS + offs_s) * HEAD_DIM_PAD)[:, None] + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )
    o = tl.sum(parts * w[:, None], 0) / denom
    d_mask = offs_d < HEAD_DIM
    o_ptrs = out_ptr + token * stride_ot + _out_col(out_cols_ptr, head, offs_d, stride_oh, d_mask, HEAD_DIM, OUT_COLS)
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=d_mask)


def reshape_and_cache_triton(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    family: str,
) -> None:
    """Launch `_reshape_and_cache_kernel`: one program per token."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    for t in (key, value, k_cache, v_cache):
        if t.stride(-1) != 1:
            raise ValueError("reshape_and_cache: the last dimension of key/value/caches must be contiguous")
    opts = reshape_cache_config(family)
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEADS_PAD=next_pow2(num_kv_heads),
        HEAD_DIM_PAD=next_pow2(head_dim), PAGE_SIZE=k_cache.shape[1], **opts, **PINNED_COMPILE_OPTIONS,
    )


SEQS_VECTOR_MAX: dict[str, int] = {"rdna3": 0, "rdna4": 0}
"""Per family (default 1024): steps of up to this many sequences find each query block's sequence with one
vector load of query_start_loc (`_find_sequence_vec`); larger ones keep the binary search. RDNA keeps the
search: with Triton 3.9.0 the vector form made the gfx1100 d128 prompt kernel spill 12 bytes (and cost
3.8.0 a wave)."""


def seqs_vector_max(family: str) -> int:
    """The most sequences a launch on `family` looks up with one vector load (`SEQS_VECTOR_MAX`)."""
    return SEQS_VECTOR_MAX.get(family, 1024)


_COUNTER_SLOTS = 1 << 14
_counters: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device, slots: int) -> torch.Tensor | None:
    """Zeroed int32 arrival counters for the fused split reduce, one buffer per device, reused by every
    launch (the kernel leaves them at zero). None (use the reduce kernel) when more slots are needed
    than the buffer holds, or when the buffer would first be made during graph capture."""
    if slots > _COUNTER_SLOTS:
        return None
    buf = _counters.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _counters[device] = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=device)
    return buf


def unified_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    softmax_scale: float | None,
    sliding_window: int | None,
    out: torch.Tensor | None,
    num_splits: int | None,
    family: str,
    config: dict | None = None,
    softcap: float | None = None,
    fused_reduce: bool | None = None,
    first_pages: torch.Tensor | None = None,
    out_cols: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch unified attention (and the split-K reduce when splitting). `config` overrides the tuned one.

    first_pages, out_cols: see `paged_attention.unified_attention`.

    fused_reduce: with splits, the last split program of each (query block, KV head) combines them in
    the same launch (when `split_counters` can serve it) instead of a second kernel. Off unless asked:
    on an H100 it made a Llama-3-8B batch-1 step 86 us slower, and on gfx942 with Triton 3.8 its code made
    the split kernel spill 20 bytes per lane. The combining program's walk over the splits is serial, but
    not the whole cost: reading every split in one trip instead still left the H200's batch-1 step 3-4 %
    slower than the reduce kernel (benchmarks/RESULTS.md round31), so the counter's handshake costs more
    than the launch it saves.
    """
    total_q, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_qpk = num_heads // num_kv_heads
    num_seqs = seq_lens.shape[0]
    head_dim_pad = next_pow2(head_dim)
    if out is None:
        out = torch.empty_like(q)
    if total_q == 0:
        return out
    for t in (q, k_cache, v_cache, out):
        if t.stride(-1) != 1:
            raise ValueError("unified_attention: the last dimension of q/caches/out must be contiguous")
    cfg = dict(config) if config is not None else unified_config(family, head_dim_pad, num_qpk, max_query_len)
    consts, launch = split_launch_options(cfg)
    if first_pages is not None and not runs_form(family, head_dim_pad):
        first_pages = None
    block_m = consts["BLOCK_M"]
    block_q = max(1, block_m // num_qpk)
    one_token = max_query_len == 1 and total_q == num_seqs  # a decode step: one query block per sequence
    num_q_blocks = num_seqs if one_token else total_q // block_q + num_seqs
    if num_splits is None:
        num_splits = choose_num_splits(family, num_seqs, num_kv_heads, max_seq_len, max_query_len,
                                       compute_units(q.device))
    num_splits = max(1, int(num_splits))
    if config is None and one_token:
        launch = decode_launch_options(family, launch, num_seqs * num_kv_heads * num_splits, compute_units(q.device))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    pdl = pdl_for(q, "attention", total_q)
    counters = None
    if num_splits > 1:
        part_out = torch.empty(total_q * num_heads * num_splits * head_dim_pad, device=q.device, dtype=torch.float32)
        part_lse = torch.empty(total_q * num_heads * num_splits, device=q.device, dtype=torch.float32)
        if fused_reduce:
            counters = split_counters(q.device, num_q_blocks * num_kv_heads)
    else:
        part_out = part_lse = out
    seqs_pad = next_pow2(num_seqs) if not one_token and num_seqs <= seqs_vector_max(family) else 0
    grid = (num_kv_heads, num_q_blocks, num_splits) if not one_token else (num_q_blocks, num_kv_heads, num_splits)
    _unified_attention_kernel[grid](
        q, k_cache, v_cache, out, part_out, part_lse, counters if counters is not None else seq_lens,
        block_tables, seq_lens, query_start_loc, first_pages if first_pages is not None else seq_lens,
        out_cols if out_cols is not None else seq_lens,
        scale / softcap if softcap else scale * LOG2E, float(softcap or 0.0) * LOG2E, int(sliding_window or 0),
        num_seqs, num_heads,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), block_tables.stride(0),
        NUM_QPK=num_qpk, BLOCK_M=block_m, BLOCK_Q=block_q, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_N=consts["BLOCK_N"], PAGE_SIZE=k_cache.shape[1], USE_WINDOW=sliding_window is not None,
        NUM_SPLITS=num_splits, USE_SOFTCAP=bool(softcap), FUSED_REDUCE=counters is not None,
        SPLITS_PAD=next_pow2(num_splits), PDL=pdl, ONE_TOKEN=one_token, SEQS_PAD=seqs_pad, HEADS_FIRST=not one_token,
        RUNS=first_pages is not None, OUT_COLS=out_cols is not None, KV_AHEAD=kv_ahead(pdl, one_token, num_qpk),
        launch_pdl=pdl, **launch,
        **PINNED_COMPILE_OPTIONS,
    )
    if num_splits > 1 and counters is None:
        reduce_pdl = pdl_for(q, "split_reduce", total_q)
        _split_reduce_kernel[(total_q, num_heads)](
            part_out, part_lse, out, out_cols if out_cols is not None else seq_lens, num_heads, out.stride(0),
            out.stride(1), NUM_SPLITS=num_splits, SPLITS_PAD=next_pow2(num_splits), HEAD_DIM=head_dim,
            HEAD_DIM_PAD=head_dim_pad, PDL=reduce_pdl, OUT_COLS=out_cols is not None, launch_pdl=reduce_pdl, **split_reduce_config(family), **PINNED_COMPILE_OPTIONS,
        )
    return out


# ---- AMD compile specs (see compile_spec.py)

_DTYPE = {"fp16": "*fp16", "bf16": "*bf16"}


def _unified_spec(mode: str, head_dim: int, dtype: str, num_qpk: int, num_splits: int,
                  window: bool = False, softcap: bool = False, runs: bool = False,
                  out_cols: bool = False) -> list[CompileSpec]:
    ptr = _DTYPE[dtype]
    signature = {
        "q_ptr": ptr, "k_cache_ptr": ptr, "v_cache_ptr": ptr, "out_ptr": ptr,
        "part_out_ptr": "*fp32" if num_splits > 1 else ptr, "part_lse_ptr": "*fp32" if num_splits > 1 else ptr,
        "counter_ptr": "*i32", "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32",
        "first_pages_ptr": "*i32", "out_cols_ptr": "*i32",
        "qk_scale": "fp32", "softcap_log2": "fp32", "sliding_window": "i32", "num_seqs": "i32", "num_heads": "i32",
        **{s: "i32" for s in ("stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb",
                              "stride_vs", "stride_vh", "stride_ot", "stride_oh", "stride_bt")},
    }
    max_query_len = 1 if mode in ("decode", "splitk") else 512

    def make(arch: str) -> tuple[dict, dict]:
        consts, launch = split_launch_options(unified_config(arch_family(arch), head_dim, num_qpk, max_query_len))
        consts = {
            "NUM_QPK": num_qpk, "BLOCK_M": consts["BLOCK_M"], "BLOCK_Q": max(1, consts["BLOCK_M"] // num_qpk),
            "HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim, "BLOCK_N": consts["BLOCK_N"], "PAGE_SIZE": 16,
            "USE_WINDOW": window, "NUM_SPLITS": num_splits, "USE_SOFTCAP": softcap,
            "FUSED_REDUCE": False, "SPLITS_PAD": next_pow2(num_splits),  # AMD keeps the reduce kernel
            "ONE_TOKEN": max_query_len == 1,  # decode steps: one query token per sequence
            # prompt steps: the vector sequence lookup over 64 slots (the engine's default max_num_seqs), grid by head
            "SEQS_PAD": 0 if max_query_len == 1 or seqs_vector_max(arch_family(arch)) < 64 else 64,
            "HEADS_FIRST": max_query_len != 1,
            "RUNS": runs,  # each sequence one run of blocks (`paged_attention.unified_attention`, first_pages)
            "OUT_COLS": out_cols,  # the result's columns in a consumer's order (an act-order GPTQ o_proj)
        }
        return consts, launch

    signature.update({k: "constexpr" for k in make("gfx942")[0]})
    extra = ((",window" if window else "") + (",softcap" if softcap else "") + (",runs" if runs else "")
             + (",out_cols" if out_cols else ""))
    # strides of q / caches / out are multiples of 16 in every launch (head_dim is), and Triton specializes on that
    divisible = ("stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs", "stride_vh",
                 "stride_ot", "stride_oh")
    return grouped_specs(f"unified_attention[{mode},d{head_dim},{dtype}{extra}]", _unified_attention_kernel, signature,
                         make, True, True, divisible)


def _reduce_spec(head_dim: int, dtype: str, num_splits: int, out_cols: bool = False) -> list[CompileSpec]:
    consts = {"NUM_SPLITS": num_splits, "SPLITS_PAD": num_splits, "HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim,
              "OUT_COLS": out_cols}
    signature = {
        "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": _DTYPE[dtype], "out_cols_ptr": "*i32",
        "num_heads": "i32",
        "stride_ot": "i32", "stride_oh": "i32", **{k: "constexpr" for k in consts},
    }
    return grouped_specs(
        f"unified_attention_split_reduce[d{head_dim},{dtype}{',out_cols' if out_cols else ''}]", _split_reduce_kernel,
        signature,
        lambda arch: (consts, split_reduce_config(arch_family(arch))), False, False, ("stride_ot", "stride_oh"),
    )


def _reshape_spec(head_dim: int, dtype: str, num_kv_heads: int) -> list[CompileSpec]:
    ptr = _DTYPE[dtype]
    consts = {"NUM_KV_HEADS": num_kv_heads, "HEAD_DIM": head_dim, "HEADS_PAD": num_kv_heads,
              "HEAD_DIM_PAD": head_dim, "PAGE_SIZE": 16}
    strides = ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_kcb", "stride_kcs", "stride_kch",
               "stride_vcb", "stride_vcs", "stride_vch")
    signature = {"key_ptr": ptr, "value_ptr": ptr, "k_cache_ptr": ptr, "v_cache_ptr": ptr, "slot_ptr": "*i64",
                 **{s: "i32" for s in strides}, **{k: "constexpr" for k in consts}}
    return grouped_specs(
        f"reshape_and_cache[d{head_dim},{dtype}]", _reshape_and_cache_kernel, signature,
        lambda arch: (consts, reshape_cache_config(arch_family(arch))), False, False, strides,
    )


AMD_COMPILE_SPECS: list[CompileSpec] = [
    # shipped configs: decode, prefill, split-K + reduce, reshape_and_cache
    *_unified_spec("decode", 128, "fp16", 4, 1),
    *_unified_spec("decode", 64, "bf16", 3, 1),
    *_unified_spec("prefill", 128, "fp16", 4, 1),
    *_unified_spec("prefill", 128, "fp16", 4, 1, runs=True),  # the one-slot prefill graphs of a lone prompt
    *_unified_spec("splitk", 128, "fp16", 4, 4),
    # Gemma 2 (head_dim 256, query_pre_attn_scalar, soft-capping, alternating windows) and Gemma 3 (windows)
    *_unified_spec("decode", 256, "bf16", 2, 1, window=True, softcap=True),
    *_unified_spec("prefill", 256, "bf16", 2, 1, window=True, softcap=True),
    *_unified_spec("prefill", 256, "bf16", 2, 1, window=True),
    *[s for s in _unified_spec("prefill", 256, "bf16", 2, 1, window=True, softcap=True, runs=True)
      if all(runs_form(arch_family(a), 256) for a in s.archs)],  # gfx1100 reads the table there (`runs_form`)
    *_reduce_spec(128, "fp16", 4),
    # act-order GPTQ o_proj (`paged_model`): the result's columns in its sorted order, on both store paths
    *_unified_spec("decode", 128, "fp16", 4, 1, out_cols=True),
    *_unified_spec("prefill", 128, "fp16", 4, 1, out_cols=True),
    *_reduce_spec(128, "fp16", 4, out_cols=True),
    *_reshape_spec(128, "fp16", 8),
]
