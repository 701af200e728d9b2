"""Launch configurations of the attention kernels, keyed by architecture family.

AMD (CDNA, wave64, 64 KiB LDS on gfx90a/gfx942) wants num_stages=1 for attention, `waves_per_eu`
to keep two waves per SIMD, and `matrix_instr_nonkdim=16` (16x16 MFMA). RDNA3 is wave32 with WMMA
and a smaller register file, so it gets smaller tiles. Hopper gets deeper software pipelining.
The "cpu" family (the Triton interpreter in CI) uses small tiles so tests stay fast.
"""

from __future__ import annotations

from typing import Any

AMD_FAMILIES = ("cdna2", "cdna3", "cdna4", "rdna3", "rdna4")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def _amd_options(family: str, num_warps: int, waves_per_eu: int) -> dict[str, Any]:
    opts: dict[str, Any] = {"num_warps": num_warps, "num_stages": 1}
    if family in ("cdna2", "cdna3", "cdna4"):
        opts.update(waves_per_eu=waves_per_eu, matrix_instr_nonkdim=16)
    return opts


def unified_config(family: str, head_dim_pad: int, num_qpk: int, max_query_len: int) -> dict[str, Any]:
    """Tile sizes and launch options for `unified_attention`.

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
            # gfx1100 (wave32): with 4 warps the split-K decode body spills 8 bytes; 8 warps do not.
            cfg = _amd_options(family, 8, 0)
            cfg.update(BLOCK_M=block_m, BLOCK_N=32)
            return cfg
        if family in AMD_FAMILIES:
            cfg = _amd_options(family, 4, 2)
            cfg.update(BLOCK_M=block_m, BLOCK_N=64)
            return cfg
        # H200 sweep: 128-key tiles, 2 stages reach ~98% of copy bandwidth at 32 seqs x 4096.
        return {"BLOCK_M": block_m, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}
    if family in ("rdna3", "rdna4"):
        # 32- and 64-key tiles spill to scratch on gfx1100 at d=128; 16-key tiles do not.
        cfg = _amd_options(family, 8, 0)
        cfg.update(BLOCK_M=max(64, next_pow2(num_qpk)), BLOCK_N=16)
        return cfg
    if family in AMD_FAMILIES:
        # 8 waves: with 4 waves the two-loop (unmasked + diagonal) body spills on gfx942/gfx90a.
        cfg = _amd_options(family, 8, 2)
        cfg.update(BLOCK_M=max(128, next_pow2(num_qpk)), BLOCK_N=64)
        return cfg
    return {"BLOCK_M": max(64, next_pow2(num_qpk)), "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def split_reduce_config(family: str) -> dict[str, Any]:
    """Launch options of the split-K reduce kernel (tiny, memory-light)."""
    if family in AMD_FAMILIES:
        return {"num_warps": 2 if family in ("rdna3", "rdna4") else 1, "num_stages": 1}
    return {"num_warps": 2, "num_stages": 1}


def choose_num_splits(
    family: str, num_seqs: int, num_kv_heads: int, max_seq_len: int, max_query_len: int, num_sms: int, block_n: int
) -> int:
    """How many key-range splits (flash-decoding) a launch should use; 1 = no split.

    Split only short-query batches whose (sequence x KV-head) programs fill less than one wave of the
    GPU, up to about 4 programs per compute unit, keeping at least 4 key tiles per split so the
    partial-output traffic stays small next to the KV bytes.
    """
    programs = num_seqs * num_kv_heads
    if family == "cpu" or max_query_len > 16 or programs >= num_sms:
        return 1
    splits = 1
    while programs * splits * 2 <= 4 * num_sms and max_seq_len // (splits * 2) >= 4 * block_n and splits < 64:
        splits *= 2
    return splits


def flash_config(family: str, head_dim_pad: int, causal: bool) -> dict[str, Any]:
    """Tile sizes and launch options for the dense FlashAttention-2 forward."""
    if family == "cpu":
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if family in ("cdna2", "cdna3", "cdna4"):
        # 8 waves of 16 rows: with 4 waves the 128x128 fp32 accumulator plus the Q tile spill on gfx942.
        cfg = _amd_options(family, 8, 2)
        cfg.update(BLOCK_M=128, BLOCK_N=64)
        return cfg
    if family in ("rdna3", "rdna4"):
        # wave32 with a 256-VGPR budget: 64-row tiles of d=128 spill on gfx1100.
        cfg = _amd_options(family, 4, 0)
        cfg.update(BLOCK_M=32, BLOCK_N=32)
        return cfg
    # H200 sweep (causal 8x32x2048x128 fp16): 64x64 tiles, 4 warps, 3 stages beat 128-row tiles by ~10%.
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def reshape_cache_config(family: str) -> dict[str, Any]:
    """Launch options of `reshape_and_cache`: one program per token, a pure copy, same on every family."""
    del family
    return {"num_warps": 4, "num_stages": 1}


def split_launch_options(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate a config into (constexpr tile sizes, launch options)."""
    launch_keys = {"num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack"}
    consts = {k: v for k, v in cfg.items() if k not in launch_keys}
    launch = {k: v for k, v in cfg.items() if k in launch_keys}
    return consts, launch
