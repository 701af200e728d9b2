"""AMD compile specs of the attention kernels (what `AMD_COMPILE_SPECS` lists in their modules).

Each spec is one shipped configuration, built from the same `attention_configs` functions that pick
the launch config at run time, so the compile check sees exactly what a user's GPU runs. Archs whose
tile sizes differ (RDNA3 is wave32 with a smaller register budget per tile) get their own row.
"""

from __future__ import annotations

from typing import Any, Callable

from optimum_amdx.kernels.attention_configs import (
    flash_config,
    reshape_cache_config,
    split_launch_options,
    split_reduce_config,
    unified_config,
)
from optimum_amdx.kernels.compile_spec import AMD_ARCHS, CompileSpec
from optimum_amdx.kernels.runtime import arch_family

_DTYPE = {"fp16": "*fp16", "bf16": "*bf16"}


def _grouped(
    name: str, kernel: Any, signature: dict[str, str], make: Callable[[str], tuple[dict, dict]], hot: bool, uses_dot: bool
) -> list[CompileSpec]:
    """One spec per group of archs sharing constexprs; `make(arch)` -> (constexprs, options)."""
    groups: dict[tuple, list[str]] = {}
    for arch in AMD_ARCHS:
        consts, _ = make(arch)
        groups.setdefault(tuple(sorted(consts.items())), []).append(arch)
    specs = []
    for i, (key, archs) in enumerate(groups.items()):
        label = name if i == 0 else f"{name[:-1]},{arch_family(archs[0])}]"
        specs.append(
            CompileSpec(
                name=label, kernel=kernel, signature=signature, constexprs=dict(key),
                options=lambda arch, make=make: make(arch)[1], hot=hot, uses_dot=uses_dot, archs=tuple(archs),
            )
        )
    return specs


def _unified_spec(mode: str, head_dim: int, dtype: str, num_qpk: int, num_splits: int) -> list[CompileSpec]:
    from optimum_amdx.kernels.paged_attention_triton import _unified_attention_kernel

    ptr = _DTYPE[dtype]
    signature = {
        "q_ptr": ptr, "k_cache_ptr": ptr, "v_cache_ptr": ptr, "out_ptr": ptr,
        "part_out_ptr": "*fp32" if num_splits > 1 else ptr, "part_lse_ptr": "*fp32" if num_splits > 1 else ptr,
        "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32",
        "qk_scale": "fp32", "sliding_window": "i32", "num_seqs": "i32", "num_heads": "i32",
        **{s: "i32" for s in ("stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb",
                              "stride_vs", "stride_vh", "stride_ot", "stride_oh", "stride_bt")},
    }
    max_query_len = 1 if mode in ("decode", "splitk") else 512

    def make(arch: str) -> tuple[dict, dict]:
        consts, launch = split_launch_options(unified_config(arch_family(arch), head_dim, num_qpk, max_query_len))
        consts = {
            "NUM_QPK": num_qpk, "BLOCK_M": consts["BLOCK_M"], "BLOCK_Q": max(1, consts["BLOCK_M"] // num_qpk),
            "HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim, "BLOCK_N": consts["BLOCK_N"], "PAGE_SIZE": 16,
            "USE_WINDOW": False, "NUM_SPLITS": num_splits, "UPCAST_DOT": False,
        }
        return consts, launch

    signature.update({k: "constexpr" for k in make("gfx942")[0]})
    return _grouped(f"unified_attention[{mode},d{head_dim},{dtype}]", _unified_attention_kernel, signature, make, True, True)


def _reduce_spec(head_dim: int, dtype: str, num_splits: int) -> list[CompileSpec]:
    from optimum_amdx.kernels.paged_attention_triton import _split_reduce_kernel

    consts = {"NUM_SPLITS": num_splits, "SPLITS_PAD": num_splits, "HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim}
    signature = {
        "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": _DTYPE[dtype], "num_heads": "i32",
        "stride_ot": "i32", "stride_oh": "i32", **{k: "constexpr" for k in consts},
    }
    return _grouped(
        f"unified_attention_split_reduce[d{head_dim},{dtype}]", _split_reduce_kernel, signature,
        lambda arch: (consts, split_reduce_config(arch_family(arch))), False, False,
    )


def _reshape_spec(head_dim: int, dtype: str, num_kv_heads: int) -> list[CompileSpec]:
    from optimum_amdx.kernels.paged_attention_triton import _reshape_and_cache_kernel

    ptr = _DTYPE[dtype]
    consts = {"NUM_KV_HEADS": num_kv_heads, "HEAD_DIM": head_dim, "HEADS_PAD": num_kv_heads,
              "HEAD_DIM_PAD": head_dim, "PAGE_SIZE": 16}
    strides = ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_kcb", "stride_kcs", "stride_kch",
               "stride_vcb", "stride_vcs", "stride_vch")
    signature = {"key_ptr": ptr, "value_ptr": ptr, "k_cache_ptr": ptr, "v_cache_ptr": ptr, "slot_ptr": "*i64",
                 **{s: "i32" for s in strides}, **{k: "constexpr" for k in consts}}
    return _grouped(
        f"reshape_and_cache[d{head_dim},{dtype}]", _reshape_and_cache_kernel, signature,
        lambda arch: (consts, reshape_cache_config(arch_family(arch))), False, False,
    )


def _flash_spec(head_dim: int, dtype: str, causal: bool, varlen: bool, num_qpk: int) -> list[CompileSpec]:
    from optimum_amdx.kernels.flash_attention_triton import _flash_fwd_kernel

    ptr = _DTYPE[dtype]
    strides = [f"stride_{t}{d}" for t in "qkvo" for d in "bhs"]
    signature = {"q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "o_ptr": ptr, "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
                 "qk_scale": "fp32", "seqlen_q": "i32", "seqlen_k": "i32", "num_heads": "i32",
                 **{s: "i32" for s in strides}}

    def make(arch: str) -> tuple[dict, dict]:
        consts, launch = split_launch_options(flash_config(arch_family(arch), head_dim, causal))
        return {"NUM_QPK": num_qpk, "HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim, **consts,
                "CAUSAL": causal, "VARLEN": varlen, "UPCAST_DOT": False}, launch

    signature.update({k: "constexpr" for k in make("gfx942")[0]})
    mode = ("causal" if causal else "full") + (",varlen" if varlen else "")
    return _grouped(f"flash_attention_fwd[{mode},d{head_dim},{dtype}]", _flash_fwd_kernel, signature, make, True, True)


def paged_attention_specs() -> list[CompileSpec]:
    """Shipped configs of the paged kernels: decode, prefill, split-K + reduce, reshape_and_cache."""
    return [
        *_unified_spec("decode", 128, "fp16", 4, 1),
        *_unified_spec("decode", 64, "bf16", 3, 1),
        *_unified_spec("prefill", 128, "fp16", 4, 1),
        *_unified_spec("splitk", 128, "fp16", 4, 4),
        *_reduce_spec(128, "fp16", 4),
        *_reshape_spec(128, "fp16", 8),
    ]


def flash_attention_specs() -> list[CompileSpec]:
    """Shipped configs of the dense FlashAttention-2 forward."""
    return [
        *_flash_spec(128, "fp16", True, False, 4),
        *_flash_spec(128, "fp16", False, False, 1),
        *_flash_spec(64, "bf16", True, True, 3),
    ]
