"""Triton kernel behind `optimum_amdx.kernels.skinny_gemm` (``x @ W^T`` for M <= 16 rows).

Grid: one program per BLOCK_N output columns, all rows of x; each program streams its
``[BLOCK_N, K]`` slab of the weight in ``[BLOCK_N, BLOCK_K]`` tiles (contiguous along K, so 16-byte
loads) with the loop software-pipelined `num_stages` deep. Two bodies:

- one row (``USE_DOT=False``): an elementwise float32 ``[BLOCK_N, BLOCK_K]`` accumulator of
  ``w * x``, reduced along K once at the end (no per-tile cross-thread reduction);
- 2..16 rows (``USE_DOT=True``): ``tl.dot`` of the 16-row padded x tile with the transposed weight
  tile (MFMA on CDNA, WMMA on RDNA3, tensor cores on NVIDIA); the padding costs arithmetic only,
  which is free at this arithmetic intensity.

No split-K: the result is written once, by one launch, with no reduce kernel and no atomics.
With ``ACT_MUL`` the kernel reads the fused gate/up output ``[M, 2K]`` and forms
``silu(gate) * up`` (rounded as transformers rounds it) while loading, so the gated MLP's down
projection needs no separate activation kernel.

Where it runs by default (`family_max_m`, `has_config`): on AMD families (hipBLASLt is weak for
M <= 8) with the heuristic tiles; on Hopper only for the (N, K, row bucket) entries of
`_TUNED`, each the winner of an H200 (or H100) sweep that was at least as fast as cuBLAS there
(benchmarks/decode_step.py; benchmarks/RESULTS.md, decode section). Other shapes keep cuBLAS.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import triton
import triton.language as tl

from ._pdl import pdl_begin
from .compile_spec import CompileSpec
from .runtime import compute_units, pdl_for

_FAMILY_MAX_M: dict[str, int] = {
    # AMD: hipBLASLt is weak at M <= 8 (why vLLM ships skinny kernels for ROCm). Not measured on
    # AMD silicon here; the AMD compile check covers the configs below.
    "cdna2": 8,
    "cdna3": 8,
    "cdna4": 8,
    "rdna3": 8,
    "rdna4": 8,
    # NVIDIA: Hopper for the measured shapes of `_TUNED` only (see `has_config`); others never.
    "hopper": 16,
    "nvidia": 0,
    # The interpreter (family "cpu") never takes it by default: it is a speed choice, and an engine step in
    # the interpreter is slow. tests/kernels/test_decode_fusions.py switches it on to check the kernel.
    "cpu": 0,
}


_TABLE_ONLY = ("hopper",)
"""Families where only measured shapes (`_TUNED`) leave the vendor BLAS."""


def _ew(bn: int, bk: int, warps: int, stages: int) -> dict[str, Any]:
    return {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages, "USE_DOT": False}


def _dot(bn: int, bk: int, warps: int, stages: int) -> dict[str, Any]:
    return {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages, "USE_DOT": True}


# H200 sweep, 2026-11-23 (fp16, graph-timed, weights rotated past L2; Llama-2-7B down / lm_head at 1 row: the
# H100 winners of 2026-11-25, down the H200's too): (N, K) -> {row bucket: config}. Kept where no slower than
# cuBLAS; gate/up at 2..16 rows was 2-6 % slower and stays on cuBLAS. Llama-2-7B was swept at 1 and 16 rows; the
# dot body pads to 16 rows, so its 16-row time bounds 2..8 rows, used where the 16-row ratio left a 3 % margin.
_HOPPER: dict[tuple[int, int], dict[int, dict[str, Any]]] = {
    (6144, 4096): {1: _ew(8, 512, 4, 3), 2: _dot(64, 256, 4, 4), 4: _dot(64, 256, 4, 4), 8: _dot(64, 128, 4, 6),
                   16: _dot(64, 128, 4, 6)},                                       # Llama-3-8B qkv
    (4096, 4096): {1: _ew(16, 1024, 8, 3), **{b: _dot(32, 256, 4, 4) for b in (2, 4, 8, 16)}},  # o_proj
    (28672, 4096): {1: _ew(16, 256, 4, 4)},                                        # Llama-3-8B gate/up
    (4096, 14336): {1: _ew(16, 1024, 8, 3), **{b: _dot(32, 256, 4, 4) for b in (2, 4, 8, 16)}},  # down
    (128256, 4096): {1: _ew(16, 256, 4, 4), **{b: _dot(32, 128, 4, 6) for b in (2, 4, 8, 16)}},  # lm_head
    (12288, 4096): {1: _ew(16, 256, 4, 4), **{b: _dot(32, 128, 4, 6) for b in (2, 4, 8, 16)}},  # Llama-2-7B qkv
    (22016, 4096): {1: _ew(8, 512, 4, 4)},                                         # Llama-2-7B gate/up
    (4096, 11008): {1: _ew(4, 512, 8, 3), **{b: _dot(32, 256, 4, 4) for b in (2, 4, 8, 16)}},  # Llama-2-7B down
    (32000, 4096): {1: _ew(8, 1024, 8, 3), **{b: _dot(64, 128, 4, 6) for b in (2, 4, 8, 16)}},  # lm_head
}
_TUNED: dict[tuple[str, int, int, int], dict[str, Any]] = {
    ("hopper", n, k, b): cfg for (n, k), per_m in _HOPPER.items() for b, cfg in per_m.items()
}


def family_max_m(family: str) -> int:
    """Most rows for which the skinny kernel may replace the vendor BLAS on this family (0 = never)."""
    return _FAMILY_MAX_M.get(family, 0)


def has_config(family: str, m: int, n: int, k: int) -> bool:
    """Whether (M, N, K) takes the skinny kernel on `family`: within `family_max_m`, and on Hopper
    only for measured shapes."""
    if m > family_max_m(family):
        return False
    if family not in _TABLE_ONLY:
        return True
    key = (family, n, k, m_bucket(m))
    return key in _OVERRIDES or key in _TUNED


@triton.jit
def _load(ptrs, mask, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptrs, mask=mask, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _prologue(x, x_ptrs, r_ptrs, h_ptrs, nw_ptrs, mask, K, rstd, write_h,
              ACT_MUL: tl.constexpr, NORM: tl.constexpr, MASKED: tl.constexpr):
    """Turn a loaded input tile (any rank) into the GEMM operand: silu(gate) * up from the fused
    gate/up row (up sits K columns after gate; SiLU rounded to the dtype before the product, as
    torch does); or RMSNorm(x + r) * w with the rows' ``rstd`` (h = x + r rounded to the dtype, as
    the decoder layer adds; the program with `write_h` also stores h, the next residual)."""
    if ACT_MUL:
        u = _load(x_ptrs + K, mask, MASKED)
        gf = x.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(x.dtype)
        x = (act.to(tl.float32) * u.to(tl.float32)).to(x.dtype)
    if NORM:
        r = _load(r_ptrs, mask, MASKED)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        if write_h:
            if MASKED:
                tl.store(h_ptrs, h, mask=mask)
            else:
                tl.store(h_ptrs, h)
        nw = _load(nw_ptrs, mask, MASKED)
        x = (nw.to(tl.float32) * (h.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, h_ptr, M, N, K, stride_xm, stride_wn, stride_ym, stride_rm,
    stride_hm, eps,
    HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, EVEN_K: tl.constexpr, ACT_MUL: tl.constexpr,
    NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (`runtime.pdl_enabled`): let the next kernel launch, wait for the last
        pdl_begin()
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rn = offs_n % N  # wrapped rows: every weight load stays in bounds without a mask
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    write_h = pid_n == 0
    if USE_DOT:
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        r_ptrs = r_ptr + offs_m[:, None] * stride_rm + offs_k[None, :]
        h_ptrs = h_ptr + offs_m[:, None] * stride_hm + offs_k[None, :]
        rstd = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
        if NORM:  # 1 / RMS of each row of h = x + r (rounded to the dtype), over all K, in float32
            ss = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                mk = m_mask[:, None] & ((k0 + offs_k) < K)[None, :]
                hx = tl.load(x_ptrs + k0, mask=mk, other=0.0)
                hr = tl.load(r_ptrs + k0, mask=mk, other=0.0)
                hh = (hx.to(tl.float32) + hr.to(tl.float32)).to(hx.dtype).to(tl.float32)
                ss += tl.sum(hh * hh, axis=1)
            rstd = tl.math.rsqrt(ss / K + eps)[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                mask = m_mask[:, None]
                w = tl.load(w_ptrs)
            else:
                mask = m_mask[:, None] & ((k0 + offs_k) < K)[None, :]
                w = tl.load(w_ptrs, mask=((k0 + offs_k) < K)[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=mask, other=0.0)
            x = _prologue(x, x_ptrs, r_ptrs, h_ptrs, nw_ptr + k0 + offs_k[None, :], mask, K, rstd, write_h,
                          ACT_MUL, NORM, True)
            acc = tl.dot(x, tl.trans(w), acc)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
            r_ptrs += BLOCK_K
            h_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
    else:
        x_ptrs = x_ptr + offs_k
        r_ptrs = r_ptr + offs_k
        h_ptrs = h_ptr + offs_k
        rstd = 0.0
        if NORM:
            ss = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kmask = (k0 + offs_k) < K
                hx = tl.load(x_ptrs + k0, mask=kmask, other=0.0)
                hr = tl.load(r_ptrs + k0, mask=kmask, other=0.0)
                hh = (hx.to(tl.float32) + hr.to(tl.float32)).to(hx.dtype).to(tl.float32)
                ss += hh * hh
            rstd = tl.math.rsqrt(tl.sum(ss, axis=0) / K + eps)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                w = tl.load(w_ptrs)
                x = tl.load(x_ptrs)
                x = _prologue(x, x_ptrs, r_ptrs, h_ptrs, nw_ptr + k0 + offs_k, None, K, rstd, write_h,
                              ACT_MUL, NORM, False)
            else:
                k_mask = (k0 + offs_k) < K
                w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0)
                x = tl.load(x_ptrs, mask=k_mask, other=0.0)
                x = _prologue(x, x_ptrs, r_ptrs, h_ptrs, nw_ptr + k0 + offs_k, k_mask, K, rstd, write_h,
                              ACT_MUL, NORM, True)
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
            r_ptrs += BLOCK_K
            h_ptrs += BLOCK_K
        out = tl.sum(acc2, axis=1)
        if HAS_BIAS:
            out += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, out.to(y_ptr.dtype.element_ty), mask=n_mask)


def m_bucket(m: int) -> int:
    """The row bucket configs are keyed by: 1, 2, 4, 8 or 16."""
    b = 1
    while b < m:
        b *= 2
    return b


_OVERRIDES: dict[tuple[str, int, int, int], dict[str, Any]] = {}
"""Measured per-shape configs: (family, N, K, row bucket) -> config. Filled from benchmark sweeps."""


def set_override(family: str, n: int, k: int, m: int, config: dict[str, Any]) -> None:
    """Use `config` for (N, K) and the row bucket of `m` on `family` (benchmarks install sweep winners)."""
    _OVERRIDES[(family, n, k, m_bucket(m))] = dict(config)


def tuned_config(family: str, m: int, n: int, k: int, num_sms: int) -> dict[str, Any]:
    """Tile sizes and launch options for one (M, N, K) on one family.

    A measured per-shape entry wins. Otherwise: one row takes the elementwise body with a
    ``[16, 512]`` weight tile (a 64-register float32 accumulator per thread at 4 warps; wider
    tiles spill), or 8 columns when 16 would give fewer than two programs per compute unit;
    2..16 rows take the dot body with ``[32 or 64, 256]`` tiles.
    """
    key = (family, n, k, m_bucket(m))
    hit = _OVERRIDES.get(key) or _TUNED.get(key)
    if hit is not None:
        return dict(hit)
    use_dot = m > 1
    if family == "cpu":
        return {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1, "USE_DOT": use_dot}
    amd = family in ("cdna2", "cdna3", "cdna4", "rdna3", "rdna4")
    if use_dot:  # the shape of the H200 winners for o_proj / down_proj (16 columns measured 1.2x slower)
        bn = 64 if triton.cdiv(n, 64) >= 2 * num_sms else 32
        bk = 256
    else:
        bn = 16 if triton.cdiv(n, 16) >= 2 * num_sms else 8
        bk = 512
    while bk > 64 and k % bk:  # an even K tile keeps the loop unmasked
        bk //= 2
    cfg: dict[str, Any] = {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4,
                           "num_stages": 2 if amd else (4 if use_dot else 3), "USE_DOT": use_dot}
    if family in ("cdna2", "cdna3", "cdna4"):
        cfg.update(waves_per_eu=2, **({"matrix_instr_nonkdim": 16} if use_dot else {}))
    if family in ("rdna3", "rdna4") and use_dot:
        # wave32, 256 VGPRs per lane at most: [16, 256] operand tiles spill on gfx1100; 64-wide ones do not
        cfg.update(BLOCK_N=16, BLOCK_K=64 if k % 64 == 0 else 32, num_warps=4)
    return cfg


_LAUNCH_KEYS = ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack")


def skinny_gemm_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], family: str,
    config: Optional[dict[str, Any]] = None, act_mul: bool = False,
    norm: Optional[tuple[torch.Tensor, torch.Tensor, float]] = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Launch `_skinny_gemm_kernel`; returns ``[..., N]`` in x's dtype. With `act_mul`, x is the fused
    gate/up output ``[..., 2K]``. With `norm` = (residual, norm_weight, eps), the input is
    RMSNorm(x + residual) and the call returns (y, x + residual)."""
    n, k = weight.shape
    x2 = x.reshape(-1, 2 * k if act_mul else k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    cfg = dict(config) if config is not None else tuned_config(family, m, n, k, compute_units(x.device, on_cpu=4))
    use_dot = bool(cfg.pop("USE_DOT", m > 1)) or m > 1
    block_n, block_k = cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    launch = {key: v for key, v in cfg.items() if key in _LAUNCH_KEYS}
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    r2, nw, h, eps = x2, weight, y, 0.0
    if norm is not None:
        residual, nw, eps = norm
        r2 = residual.reshape(-1, k)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        h = torch.empty_like(x2)
    pdl = pdl_for(x2, "skinny", m)
    _skinny_gemm_kernel[(triton.cdiv(n, block_n),)](
        x2, weight, bias if bias is not None else weight, y, r2, nw, h, m, n, k, x2.stride(0), weight.stride(0),
        y.stride(0), r2.stride(0), h.stride(0), float(eps),
        HAS_BIAS=bias is not None, USE_DOT=use_dot, EVEN_K=k % block_k == 0, ACT_MUL=act_mul, NORM=norm is not None,
        BLOCK_M=16 if use_dot else 1, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, launch_pdl=pdl, **launch,
    )
    y = y.reshape(*x.shape[:-1], n)
    return y if norm is None else (y, h.reshape(x.shape))


def _spec(family: str, archs: tuple[str, ...], m: int, n: int, k: int, dtype: str, act_mul: bool = False,
          norm: bool = False) -> CompileSpec:
    cfg = tuned_config(family, m, n, k, 304 if family == "cdna3" else 104)
    use_dot = cfg.pop("USE_DOT")
    block_n, block_k = cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    launch = {key: v for key, v in cfg.items() if key in _LAUNCH_KEYS}
    sig = {"x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "y_ptr": f"*{dtype}",
           "r_ptr": f"*{dtype}", "nw_ptr": f"*{dtype}", "h_ptr": f"*{dtype}",
           "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32",
           "stride_rm": "i32", "stride_hm": "i32", "eps": "fp32",
           "HAS_BIAS": "constexpr", "USE_DOT": "constexpr", "EVEN_K": "constexpr", "ACT_MUL": "constexpr",
           "NORM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    return CompileSpec(
        name=f"skinny_gemm[{family},m{m},n{n},k{k},{dtype}{',silu_mul' if act_mul else ''}{',norm' if norm else ''}]",
        kernel=_skinny_gemm_kernel,
        signature=sig,
        constexprs={"HAS_BIAS": False, "USE_DOT": use_dot, "EVEN_K": k % block_k == 0, "ACT_MUL": act_mul,
                    "NORM": norm,
                    "BLOCK_M": 16 if use_dot else 1, "BLOCK_N": block_n, "BLOCK_K": block_k},
        options=lambda arch: dict(launch),
        hot=True,
        uses_dot=use_dot,
        archs=archs,
        divisible_by_16=("N", "K", "stride_xm", "stride_wn", "stride_ym", "stride_rm", "stride_hm"),
    )


_CDNA = ("gfx90a", "gfx942", "gfx950")
_RDNA3 = ("gfx1100",)

AMD_COMPILE_SPECS: list[CompileSpec] = [
    spec
    for family, archs in (("cdna3", _CDNA), ("rdna3", _RDNA3))
    for spec in (
        _spec(family, archs, 1, 4096, 4096, "fp16"),    # o_proj
        _spec(family, archs, 1, 4096, 14336, "bf16"),   # down_proj (Llama-3-8B)
        _spec(family, archs, 8, 28672, 4096, "fp16"),   # fused gate/up, 8 rows
        _spec(family, archs, 1, 4096, 14336, "fp16", act_mul=True),  # down_proj reading gate/up
        _spec(family, archs, 4, 4096, 11008, "bf16", act_mul=True),
        _spec(family, archs, 1, 6144, 4096, "fp16", norm=True),  # add + RMSNorm feeding q/k/v
        _spec(family, archs, 16, 28672, 4096, "bf16", norm=True),  # add + RMSNorm feeding gate/up
    )
]
