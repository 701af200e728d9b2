"""W4A16 GPTQ matmul: packing, dequantization against an independent construction, kernels vs reference.

On the CPU the Triton kernels run in the interpreter (conftest sets TRITON_INTERPRET=1); on a GPU
the same tests run the compiled kernels, plus the full-size checks marked `gpu`.
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.w4a16 import (
    dequantize_gptq,
    pack_gptq_int32,
    prepare_gptq_weight,
    unpack_gptq_int32,
    w4a16_matmul,
    w4a16_matmul_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def quantize(k: int, n: int, bits: int, group_size: int, sym: bool, act_order: bool, fmt: str, seed: int):
    """Quantize a random float matrix the GPTQ way (RTN per group) and pack it independently.

    Returns the GPTQ tensors and the float32 weight the packed tensors must dequantize to,
    computed straight from the integer codes (no unpacking involved).
    """
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(k, n, generator=g)
    gs = k if group_size == -1 else group_size
    n_groups = -(-k // gs)
    maxq = (1 << bits) - 1
    if act_order:
        order = torch.randperm(k, generator=g)
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = (torch.arange(k) // gs).to(torch.int32)
    else:
        g_idx = (torch.arange(k) // gs).to(torch.int32)
    scales = torch.empty(n_groups, n)
    zeros = torch.empty(n_groups, n, dtype=torch.int64)
    for grp in range(n_groups):
        rows = w[g_idx == grp]
        lo = rows.min(0).values.clamp(max=0)
        hi = rows.max(0).values.clamp(min=0)
        if sym:
            amax = torch.maximum(lo.abs(), hi)
            scales[grp] = (2 * amax / maxq).clamp(min=1e-5)
            zeros[grp] = (maxq + 1) // 2
        else:
            scales[grp] = ((hi - lo) / maxq).clamp(min=1e-5)
            zeros[grp] = torch.round(-lo / scales[grp]).long().clamp(0, maxq)
    scales = scales.half()
    q = torch.clamp(torch.round(w / scales.float()[g_idx.long()]) + zeros[g_idx.long()], 0, maxq).long()
    expected = (q - zeros[g_idx.long()]).float() * scales.float()[g_idx.long()]
    stored_zeros = zeros - 1 if fmt == "gptq" else zeros
    if fmt == "gptq":
        stored_zeros = stored_zeros.clamp(min=0)
        expected = (q - (stored_zeros + 1)[g_idx.long()]).float() * scales.float()[g_idx.long()]
    qweight = _pack_reference(q, bits, along_rows=True)
    qzeros = _pack_reference(stored_zeros, bits, along_rows=False)
    return qweight, qzeros, scales, g_idx, expected


def _pack_reference(vals: torch.Tensor, bits: int, along_rows: bool) -> torch.Tensor:
    """Straightforward python bit-stream packing (LSB first), independent of pack_gptq_int32."""
    v = vals if along_rows else vals.t()
    rows, cols = v.shape
    total_bits = rows * bits
    pad_rows = (-total_bits) % 32 // bits if (-total_bits) % 32 % bits == 0 else None
    assert pad_rows is not None
    v = torch.cat([v, v.new_zeros(pad_rows, cols)]) if pad_rows else v
    n_words = v.shape[0] * bits // 32
    out = torch.zeros(n_words, cols, dtype=torch.int64)
    for r in range(v.shape[0]):
        bit = r * bits
        word, shift = divmod(bit, 32)
        out[word] |= (v[r] << shift) & 0xFFFFFFFF
        if shift + bits > 32:
            out[word + 1] |= v[r] >> (32 - shift)
    out = torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)
    return out if along_rows else out.t().contiguous()


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_unpack_roundtrip(bits):
    g = torch.Generator().manual_seed(bits)
    vals = torch.randint(0, 1 << bits, (64, 12), generator=g, dtype=torch.int32)
    packed = pack_gptq_int32(vals, bits, dim=0)
    assert packed.shape == (64 * bits // 32, 12)
    assert torch.equal(packed, _pack_reference(vals.long(), bits, along_rows=True))
    assert torch.equal(unpack_gptq_int32(packed, bits, dim=0), vals)
    packed_cols = pack_gptq_int32(vals.t().contiguous(), bits, dim=1)
    assert torch.equal(unpack_gptq_int32(packed_cols, bits, dim=1), vals.t())


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("act_order", [False, True])
def test_dequantize_matches_independent_construction(bits, fmt, act_order):
    qweight, qzeros, scales, g_idx, expected = quantize(64, 64, bits, 32, sym=False, act_order=act_order, fmt=fmt, seed=bits)
    got = dequantize_gptq(qweight, qzeros, scales, g_idx, bits=bits, checkpoint_format=fmt)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    w = prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=bits, group_size=32, checkpoint_format=fmt)
    assert w.kernel_ready == (bits == 4)
    torch.testing.assert_close(w.dequantize(), expected, rtol=0, atol=0)


def test_v1_and_v2_differ_by_one_zero_step():
    qweight, qzeros, scales, g_idx, _ = quantize(32, 16, 4, 32, sym=False, act_order=False, fmt="gptq_v2", seed=3)
    v1 = dequantize_gptq(qweight, qzeros, scales, g_idx, checkpoint_format="gptq")
    v2 = dequantize_gptq(qweight, qzeros, scales, g_idx, checkpoint_format="gptq_v2")
    torch.testing.assert_close(v2 - v1, scales.float()[g_idx.long()], rtol=1e-6, atol=1e-6)


CASES = [
    # (M, K, N, group, sym, act_order, fmt, dtype)
    (1, 256, 96, 128, True, False, "gptq", torch.float16),
    (1, 200, 72, 32, False, True, "gptq", torch.float16),
    (1, 128, 64, -1, False, False, "gptq_v2", torch.bfloat16),
    (3, 192, 80, 64, True, True, "gptq_v2", torch.bfloat16),
    (3, 136, 40, -1, True, False, "gptq", torch.float16),
    (16, 128, 48, 32, False, False, "gptq", torch.float16),
    (17, 200, 72, 64, False, True, "gptq", torch.float16),
    (40, 128, 100, 128, True, False, "gptq_v2", torch.bfloat16),
    (33, 96, 64, 32, True, True, "gptq", torch.bfloat16),
    (70, 128, 40, 32, False, False, "gptq", torch.float16),  # more rows than the workspace: chunks
]


@pytest.mark.parametrize("m,k,n,group,sym,act_order,fmt,dtype", CASES)
def test_w4a16_kernel_matches_reference(m, k, n, group, sym, act_order, fmt, dtype):
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=m * 1000 + k + n)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), bits=4,
                            group_size=group, checkpoint_format=fmt)
    assert w.kernel_ready
    assert (w.zeros is None) == sym
    assert (w.perm is not None) == act_order
    g = torch.Generator().manual_seed(m + k)
    x = torch.randn(2, m, k, generator=g).to(dtype).to(DEVICE) if m == 3 else torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    bias = torch.randn(n, generator=g).to(dtype).to(DEVICE) if m % 2 else None
    out = w4a16_matmul(x, w, bias)
    ref = w4a16_matmul_reference(x, w, bias)
    assert out.shape == (*x.shape[:-1], n) and out.dtype == dtype
    exact = x.float() @ expected.to(DEVICE) + (bias.float() if bias is not None else 0)
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    scale = exact.abs().max().item()
    torch.testing.assert_close(ref.float(), exact, rtol=0, atol=tol * scale)
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=tol * scale)


def test_repacked_layout_is_tile_major_with_nibble_planes():
    """Tile (nb, kt) is one contiguous run of 128 x 16 words; nibble j of word r is row kt*128 + j*16 + r."""
    from optimum_amdx.kernels import _w4a16_triton
    from optimum_amdx.kernels.w4a16 import TILE_K, TILE_N

    assert (_w4a16_triton.TILE_N, _w4a16_triton.TILE_K) == (TILE_N, TILE_K)
    k, n = 200, 136
    qweight, qzeros, scales, _, _ = quantize(k, n, 4, -1, True, False, "gptq", seed=4)
    w = prepare_gptq_weight(qweight, qzeros, scales, None, group_size=-1)
    assert w.qweight.shape == (2 * 2 * 128, 16) and w.qweight.is_contiguous()  # 2 column blocks x 2 K tiles
    codes = unpack_gptq_int32(qweight, 4, dim=0)
    words = w.qweight.reshape(2, 2, 128, 16)
    for kk, nn in ((0, 0), (17, 5), (130, 131), (199, 135), (127, 64)):
        nb, c, kt = nn // 128, nn % 128, kk // 128
        j, r = (kk % 128) // 16, kk % 16
        assert (int(words[nb, kt, c, r]) >> (4 * j)) & 0xF == int(codes[kk, nn])
    assert int(words[1, :, 8:].abs().sum()) == 0  # padded columns 136..255
    assert torch.equal(w.codes(), codes)


def test_split_stream_workspace_is_left_clean_and_reused():
    """Many programs per column block: partial sums meet in the workspace, which is left zeroed with
    its tickets (several calls reuse them)."""
    qweight, qzeros, scales, g_idx, _ = quantize(512, 64, 4, 32, False, False, "gptq", seed=11)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), group_size=32)
    from optimum_amdx.kernels._w4a16_triton import _WORKSPACES

    g = torch.Generator().manual_seed(5)
    for m, programs in ((1, 3), (5, 4), (1, 2), (20, 3)):
        x = torch.randn(m, 512, generator=g).half().to(DEVICE)
        cfg = {"BLOCK_M": 1 if m == 1 else 16, "num_warps": 1, "programs": programs}
        out = w4a16_matmul(x, w, config=cfg, route="stream")
        ref = w4a16_matmul_reference(x, w).float()
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=2e-3 * ref.abs().max().item())
        ws, cnt = _WORKSPACES[(x.device, 64)]
        assert int(cnt.abs().sum()) == 0 and float(ws.abs().sum()) == 0.0


@pytest.mark.parametrize("m, programs", [(1, 3), (1, 1), (3, 4)])
def test_accumulate_adds_float32_sums_without_the_flush(m, programs):
    """`w4a16_accumulate`: programs sharing a column block add their sums into the caller's zeroed
    float32 accumulator (no ticket, no output store); the result is the matmul in float32, and the
    kernel's own workspace and tickets stay untouched."""
    from optimum_amdx.kernels._w4a16_triton import _WORKSPACES, stream_matmul
    from optimum_amdx.kernels.w4a16 import accumulating_route, accumulator, w4a16_accumulate

    qweight, qzeros, scales, g_idx, _ = quantize(512, 64, 4, 32, False, False, "gptq", seed=13)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), group_size=32)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)).half().to(DEVICE)
    ref = w4a16_matmul_reference(x, w).float()
    acc = accumulator(x.device, 64, m)
    if DEVICE == "cpu":  # the interpreter: force a grid whose programs share column blocks
        cfg = {"BLOCK_M": 1 if m == 1 else 16, "num_warps": 1, "programs": programs}
        stream_matmul(x, w, None, acc, "cpu", cfg, accumulate=True)
    else:
        assert (accumulating_route(x, w) is not None) == (m == 1)
        if m > 1:
            return
        w4a16_accumulate(x, w, acc)
    assert acc.dtype == torch.float32
    torch.testing.assert_close(acc, ref, rtol=0, atol=2e-3 * ref.abs().max().item())
    acc.zero_()
    ws, cnt = _WORKSPACES[(x.device, 64)]
    assert int(cnt.abs().sum()) == 0 and float(ws.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="no bias"):
        stream_matmul(x, w, torch.zeros(64, dtype=x.dtype, device=x.device), acc, "cpu", accumulate=True)


@pytest.mark.parametrize("group", [16, 32])  # 16: scales per word in every route's tile
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("route", ["stream", "dequant"])
def test_every_route_matches_reference(route, act_order, group):
    from optimum_amdx.kernels._w4a16_triton import dequantize_dense

    m = 3 if route == "stream" else 20
    qweight, qzeros, scales, g_idx, expected = quantize(160, 48, 4, group, False, act_order, "gptq", seed=21 + m)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), group_size=group)
    x = torch.randn(m, 160, generator=torch.Generator().manual_seed(m)).half().to(DEVICE)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(3)).half().to(DEVICE)
    exact = x.float() @ expected.to(DEVICE) + bias.float()
    out = w4a16_matmul(x, w, bias, route=route)
    torch.testing.assert_close(out.float(), exact, rtol=0, atol=2e-2 * exact.abs().max().item())
    if route == "dequant":
        sorted_w = expected[w.perm.long().cpu()] if act_order else expected
        for natural in (True, False):  # the transposed tile (NVIDIA) and the plane-by-plane stores (AMD)
            dense = dequantize_dense(w, torch.float32, config={"NATURAL": natural})
            torch.testing.assert_close(dense, sorted_w.t().to(DEVICE), rtol=0, atol=0)


GEMV_CASES = [
    # (M, K, N, group, sym, act_order, fmt, dtype): every M of the GEMV route, groups 32/64/128/-1,
    # K and N not multiples of the tiles, sym/asym, act-order, fp16/bf16
    (1, 328, 40, 32, False, True, "gptq", torch.float16),
    (1, 384, 72, 64, True, False, "gptq_v2", torch.bfloat16),
    (1, 264, 50, -1, False, False, "gptq", torch.float16),
    (2, 256, 40, 128, False, False, "gptq", torch.bfloat16),
    (4, 200, 24, -1, True, True, "gptq", torch.float16),
    (5, 320, 56, 32, True, False, "gptq_v2", torch.float16),
    (8, 192, 40, 64, False, True, "gptq", torch.bfloat16),
    (11, 136, 33, -1, False, False, "gptq", torch.float16),
    (16, 384, 40, 128, True, True, "gptq_v2", torch.float16),
    (1, 384, 300, 64, False, True, "gptq", torch.float16),  # 3 x 3 tiles: shares cross column blocks
    (3, 384, 260, 128, True, False, "gptq", torch.float16),
]


@pytest.mark.parametrize("m,k,n,group,sym,act_order,fmt,dtype", GEMV_CASES)
@pytest.mark.parametrize("programs", [1, 2, 3])
def test_stream_every_m_and_split(m, k, n, group, sym, act_order, fmt, dtype, programs):
    """The stream kernel for every small M, one program (direct stores) or several splitting the
    tile stream (partial sums through the workspace and the ticket; with two programs on 3 x 3 tiles
    the shares start and end mid-block)."""
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=7 * m + k + n)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), bits=4,
                            group_size=group, checkpoint_format=fmt)
    g = torch.Generator().manual_seed(m * 31 + k)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    bias = torch.randn(n, generator=g).to(dtype).to(DEVICE) if (m + programs) % 2 else None
    cfg = {"BLOCK_M": 1 if m == 1 else 16, "num_warps": 1, "programs": programs}
    out = w4a16_matmul(x, w, bias, config=cfg, route="stream")
    exact = x.float() @ expected.to(DEVICE) + (bias.float() if bias is not None else 0)
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    assert out.dtype == dtype and out.shape == (m, n)
    torch.testing.assert_close(out.float(), exact, rtol=0, atol=tol * exact.abs().max().item())


GEMM_CASES = [
    # (M, K, N, group, sym, act_order, fmt, dtype, config): the fused GEMM on every option: split-K
    # (the ticket and the workspace), x gathered in the kernel or once per call (the default for
    # act-order), 32/64/128-column slices of a tile, groups 32/64/128/-1, odd M, K and N off the tiles,
    # fp16/bf16, bias
    (17, 200, 72, 64, False, True, "gptq", torch.float16, {"BLOCK_M": 16, "BLOCK_N": 32, "SPLIT": 2, "X_PREP": False}),
    (33, 384, 96, 32, False, True, "gptq_v2", torch.bfloat16, {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT": 3,
                                                                "NATURAL": True, "PREFETCH": 2}),
    (18, 520, 64, 128, False, False, "gptq", torch.float16, {"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT": 2,
                                                              "NATURAL": True, "PREFETCH": 1}),
    (23, 264, 50, -1, True, True, "gptq", torch.bfloat16, {"BLOCK_M": 16, "BLOCK_N": 32, "NATURAL": True,
                                                           "PREFETCH": 2}),
    (5, 264, 50, -1, True, False, "gptq", torch.float16, {"BLOCK_M": 16, "BLOCK_N": 64, "X_PREP": True, "SPLIT": 2}),
    (19, 200, 40, 32, False, True, "gptq", torch.float16, {"BLOCK_M": 16, "BLOCK_N": 32, "X_PREP": True}),
    (20, 200, 40, 32, False, True, "gptq", torch.float16, {"BLOCK_M": 16, "BLOCK_N": 32, "X_PREP": True,
                                                           "NATURAL": True, "PREFETCH": 2}),
    (40, 256, 136, 128, True, False, "gptq", torch.bfloat16, {"BLOCK_M": 32, "BLOCK_N": 128}),
    (21, 256, 64, 64, False, False, "gptq_v2", torch.float16, {"BLOCK_M": 32, "BLOCK_N": 64, "X_PREP": True,
                                                                 "SPLIT": 2}),
]


@pytest.mark.parametrize("m,k,n,group,sym,act_order,fmt,dtype,cfg", GEMM_CASES)
def test_fused_gemm_matches_exact(m, k, n, group, sym, act_order, fmt, dtype, cfg):
    from optimum_amdx.kernels._w4a16_gemm_triton import _WORKSPACES

    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=3 * m + k + n)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), bits=4,
                            group_size=group, checkpoint_format=fmt)
    g = torch.Generator().manual_seed(m * 7 + k)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    bias = torch.randn(n, generator=g).to(dtype).to(DEVICE) if m % 2 else None
    exact = x.float() @ expected.to(DEVICE) + (bias.float() if bias is not None else 0)
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    for _ in range(2):  # the second call reuses the workspace the first one left zeroed
        out = w4a16_matmul(x, w, bias, route="gemm", config=dict(cfg, num_warps=4 if DEVICE == "cuda" else 1))
        assert out.dtype == dtype and out.shape == (m, n)
        torch.testing.assert_close(out.float(), exact, rtol=0, atol=tol * exact.abs().max().item())
    for ws, cnt in _WORKSPACES.values():
        assert int(cnt.abs().sum()) == 0 and float(ws.abs().sum()) == 0.0


@pytest.mark.parametrize("sym", [True, False])
def test_gemv_m1_error_is_the_fp16_rounding_of_the_output(sym):
    """The M=1 loop keeps the nibble high in a float32 mantissa and takes the bias off once per word;
    that must cost no visible precision: the error stays at the fp16 rounding of the exact result."""
    k, n = 2048, 64
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, 128, sym, False, "gptq", seed=12)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), group_size=128)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(13)).half().to(DEVICE)
    # the float32 loop (AMD, the interpreter); NVIDIA's packed fp16 loop has its own bound in test_w4a16_stream.py
    out = w4a16_matmul(x, w, config={"BLOCK_M": 1, "num_warps": 1, "programs": 1, "PACKED": False})
    exact = x.double() @ expected.double().to(DEVICE)
    rounding = (exact.half().double() - exact).abs().max().item()
    assert (out.double() - exact).abs().max().item() <= 1.5 * rounding + 1e-6 * exact.abs().max().item()


def test_two_and_three_rows_take_the_pipelined_gemm_with_or_without_act_order():
    """From 2 rows every layout takes the pipelined GEMM on NVIDIA, act-order too (H100, RESULTS.md round24: 1.08-1.57x
    the few-row kernel that kept act-order weights before), in both dtypes; an act-order weight stops at
    ``pipelined_max_act_order`` rows, or ``pipelined_max_act_order_long`` with a long input. Decided on the CPU: the
    route needs no GPU."""
    from optimum_amdx.kernels.w4a16 import ROUTE_LIMITS, dispatch_route

    top = ROUTE_LIMITS["hopper"].pipelined_max_act_order
    for act_order in (False, True):
        qweight, qzeros, scales, g_idx, _ = quantize(4096, 4096, 4, 128, True, act_order, "gptq", seed=5)
        w = prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=4, group_size=128)
        for dtype in (torch.float16, torch.bfloat16):
            assert [dispatch_route(m, w, dtype, "sm_90") for m in (1, 2, 3, 4)] == ["stream"] + ["pipelined"] * 3
        assert dispatch_route(top, w, torch.float16, "sm_90") == "pipelined"
    qweight, qzeros, scales, g_idx, _ = quantize(4096, 14336, 4, 128, False, True, "gptq", seed=5)
    w = prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=4, group_size=128)
    assert dispatch_route(top + 1, w, torch.float16, "sm_90") == "dequant"  # no prefill rows for act-order
    w_plain = prepare_gptq_weight(qweight, qzeros, scales, None, bits=4, group_size=128)
    assert dispatch_route(top + 1, w_plain, torch.float16, "sm_90") == "pipelined"
    assert dispatch_route(33, w, torch.float16, "gfx942") == "gemm"  # CDNA: act-order to 32 rows
    assert dispatch_route(32, w, torch.float16, "gfx942") == "pipelined"
    # a long input (the down projection) keeps act-order g128 on it for prefill rows (x gathered by whole rows, round25)
    qweight, qzeros, scales, g_idx, _ = quantize(14336, 4096, 4, 128, False, True, "gptq", seed=5)
    w_long = prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=4, group_size=128)
    long_top = ROUTE_LIMITS["hopper"].pipelined_max_act_order_long
    assert long_top > top
    assert dispatch_route(long_top, w_long, torch.float16, "sm_90") == "pipelined"
    assert dispatch_route(long_top + 1, w_long, torch.float16, "sm_90") == "dequant"


def test_dispatch_and_grid_choices():
    from optimum_amdx.kernels._w4a16_triton import _chunks, stream_config, stream_grid
    from optimum_amdx.kernels.w4a16 import choose_route

    from optimum_amdx.kernels import _w4a16_gemm_triton as kg
    from optimum_amdx.kernels.w4a16 import LONG_K, PIPELINED_MIN_WEIGHT, ROUTE_LIMITS, SMALL_WEIGHT, WIDE_N

    assert kg.SMALL_WEIGHT == SMALL_WEIGHT
    for fam in ("hopper", "cdna3", "rdna3", "default", "nvidia"):
        lim = ROUTE_LIMITS.get({"cdna3": "cdna"}.get(fam, fam), ROUTE_LIMITS["default"])
        stream_max, gemm_max, gemm_narrow = lim[:3]
        assert stream_max < gemm_narrow <= gemm_max
        assert choose_route(1, fam) == "stream" and choose_route(stream_max, fam) == "stream"
        assert choose_route(stream_max + 1, fam) == "gemm" and choose_route(gemm_max, fam) == "gemm"
        assert choose_route(gemm_max + 1, fam) == "dequant"
        assert choose_route(gemm_narrow, fam, WIDE_N - 1) == "gemm"
        assert choose_route(gemm_narrow + 1, fam, 4096) == "dequant"
        assert choose_route(gemm_narrow + 1, fam, WIDE_N) == "gemm"
        # the pipelined GEMM only where it applies, between its limits, on weights over its minimum
        big = PIPELINED_MIN_WEIGHT + 1
        if lim.pipelined_max_wide:
            lo, wide, narrow = lim.pipelined_min, lim.pipelined_max_wide, lim.pipelined_max_narrow
            assert stream_max < lo <= narrow <= wide
            assert choose_route(lo, fam, WIDE_N, pipelined=True, weight_elems=big) == "pipelined"
            assert choose_route(lo - 1, fam, WIDE_N, pipelined=True, weight_elems=big) != "pipelined"
            assert choose_route(wide, fam, WIDE_N, pipelined=True, weight_elems=big) == "pipelined"
            assert choose_route(wide + 1, fam, WIDE_N, pipelined=True, weight_elems=big) != "pipelined"
            assert choose_route(narrow + 1, fam, 4096, pipelined=True, weight_elems=big) != "pipelined"
            bf16_narrow = lim.pipelined_max_narrow_bf16  # bf16's float32 form (several groups a tile), narrow outputs
            assert bf16_narrow <= narrow
            if bf16_narrow:  # AMD sends bf16 of several groups a tile elsewhere (`pipelined_eligible`)
                assert lo <= bf16_narrow
                assert choose_route(bf16_narrow, fam, 4096, pipelined=True, weight_elems=big, bf16=True) == "pipelined"
                assert choose_route(bf16_narrow + 1, fam, 4096, pipelined=True, weight_elems=big,
                                    bf16=True) != "pipelined"
                assert choose_route(bf16_narrow + 1, fam, WIDE_N, pipelined=True, weight_elems=big,
                                    bf16=True) == "pipelined"
                # bf16 planes (one group per tile) keep narrow outputs to fp16's limit, short or long input
                for k in (4096, LONG_K + 1):
                    planes = {"pipelined": True, "weight_elems": big, "k": k, "one_group": True, "bf16": True}
                    assert choose_route(narrow, fam, 4096, **planes) == "pipelined"
                    assert choose_route(narrow + 1, fam, 4096, **planes) == "dequant"
            # prefill rows: one scale group per tile keeps fp16 on it to pipelined_max_prefill rows where the output
            # is wide or the input long
            pre = lim.pipelined_max_prefill
            assert not pre or wide <= pre
            if pre:
                for n, k in ((WIDE_N, 4096), (4096, LONG_K + 1)):
                    one = {"pipelined": True, "weight_elems": big, "k": k, "one_group": True}
                    assert choose_route(pre, fam, n, **one) == "pipelined"
                    assert choose_route(pre + 1, fam, n, **one) == "dequant"
                    assert choose_route(pre, fam, n, pipelined=True, weight_elems=big, k=k) != "pipelined"  # g32, g64
                    assert choose_route(wide + 1, fam, n, bf16=True, **one) != "pipelined"
                assert choose_route(narrow + 1, fam, 4096, pipelined=True, weight_elems=big, k=LONG_K,
                                    one_group=True) != "pipelined"  # 4096x6144 lost from 384 rows on an H100
            if bf16_narrow:
                assert choose_route(bf16_narrow + 1, fam, 4096, pipelined=True, weight_elems=big, k=LONG_K + 1,
                                    bf16=True) != "pipelined"
            # act-order weights (x gathered first) stop at pipelined_max_act_order rows, prefill rows included, or at
            # pipelined_max_act_order_long where the input is long (one group per tile in fp16 there; g32 keeps the
            # narrow limit)
            ao, ao_long = lim.pipelined_max_act_order, lim.pipelined_max_act_order_long
            assert lo <= ao <= wide and ao <= ao_long <= max(narrow, pre)
            for n, k, top in ((WIDE_N, 4096, ao), (4096, LONG_K + 1, ao_long)):
                one = {"pipelined": True, "weight_elems": big, "k": k, "one_group": True, "act_order": True}
                assert choose_route(top, fam, n, **one) == "pipelined"
                assert choose_route(top + 1, fam, n, **one) != "pipelined"
            g32 = {"pipelined": True, "weight_elems": big, "k": LONG_K + 1, "act_order": True}
            assert choose_route(min(narrow, ao_long) + 1, fam, 4096, **g32) != "pipelined"
            # a weight of exactly the minimum only up to pipelined_max_small rows (pipelined_max_small_one_group with
            # one group per tile), a smaller one never
            exact = {"pipelined": True, "weight_elems": PIPELINED_MIN_WEIGHT}
            for small, one_group in ((lim.pipelined_max_small, False), (lim.pipelined_max_small_one_group, True)):
                assert small <= narrow
                assert choose_route(small, fam, 4096, one_group=one_group, **exact) == "pipelined"
                assert choose_route(small + 1, fam, 4096, one_group=one_group, **exact) != "pipelined"
            assert lim.pipelined_max_small <= lim.pipelined_max_small_one_group
            assert choose_route(lo, fam, WIDE_N, pipelined=True, weight_elems=PIPELINED_MIN_WEIGHT - 1) == "gemm"
        else:  # no row count takes it here, even for a weight it could serve
            assert all(choose_route(m, fam, WIDE_N, pipelined=True, weight_elems=big) != "pipelined"
                       for m in range(1, 1025))
    big, small = kg.gemm_config("sm_90", 64, 4096 * 14336), kg.gemm_config("sm_90", 64, 4096 * 4096)
    assert "SMALL" not in big and big["BLOCK_M"] == 64 and small["num_warps"] != big["num_warps"]
    assert choose_route(1 << 20, "cpu") == "gemm"  # the interpreter never tests the BLAS on its own
    assert stream_config("sm_90", 1)["BLOCK_M"] == 1 and stream_config("gfx942", 2)["BLOCK_M"] == 16
    assert stream_config("gfx1100", 40)["BLOCK_M"] == 16 and stream_config("gfx90a", 200)["BLOCK_M"] == 64
    assert stream_config("sm_90", 64)["BLOCK_M"] == 32
    assert [_chunks(g) for g in (0, 128, 256, 64, 32, 16, 48)] == [1, 1, 1, 2, 4, 8, 8]
    cpu = torch.device("cpu")  # one "CU"
    assert stream_grid(10, 1, {"programs_per_cu": 4}, cpu) == 4
    assert stream_grid(2, 1, {"programs_per_cu": 4}, cpu) == 2  # never more programs than tiles
    assert stream_grid(10, 1, {"programs_per_cu": 4, "programs": 7}, cpu) == 7


@pytest.mark.parametrize("sym", [True, False])
def test_concat_weights_runs_parts_side_by_side(sym):
    from optimum_amdx.kernels.w4a16 import concat_weights

    parts, refs = [], []
    for i, n in enumerate((72, 136, 40)):
        qweight, qzeros, scales, g_idx, expected = quantize(256, n, 4, 64, sym and i != 1, True, "gptq", seed=40 + i)
        if i:  # act-order parts of one layer share the permutation
            g_idx = parts[0][3]
            qweight, qzeros, scales, _, expected = quantize_with_g_idx(256, n, 64, sym and i != 1, g_idx, seed=40 + i)
        parts.append((qweight, qzeros, scales, g_idx))
        refs.append(expected)
    ws = [prepare_gptq_weight(*(t.to(DEVICE) for t in p), group_size=64) for p in parts]
    fused = concat_weights(ws)
    assert fused is not None and fused.out_features == 248
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)).half().to(DEVICE)
    exact = x.float() @ torch.cat(refs, dim=1).to(DEVICE)
    torch.testing.assert_close(w4a16_matmul(x, fused).float(), exact, rtol=0, atol=2e-2 * exact.abs().max().item())
    other = prepare_gptq_weight(*(t.to(DEVICE) for t in quantize(256, 32, 4, 128, True, False, "gptq", seed=3)[:4]),
                                group_size=128)
    assert concat_weights([ws[0], other]) is None  # different groups: no shared launch

    # the paged engine's act-order forms: output columns reordered at build time, and a weight without its
    # permutation reading an input that arrives already permuted (kernels, not the reference, on 1 and 3 rows)
    order = torch.randperm(248, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    reordered = concat_weights(ws, column_order=order)
    presorted = fused.presorted()
    for rows in (1, 3):
        xr = x[:rows]
        plain = w4a16_matmul(xr, fused)
        # the same columns, though a column's split-K partition (its float32 summation order) may differ
        torch.testing.assert_close(w4a16_matmul(xr, reordered), plain[:, order], rtol=1e-3,
                                   atol=1e-3 * plain.abs().max().item())
        torch.testing.assert_close(w4a16_matmul(xr.index_select(1, fused.perm.long()), presorted), plain,
                                   rtol=1e-3, atol=1e-3 * plain.abs().max().item())
    with pytest.raises(InvalidArgumentError, match="permutation"):
        concat_weights(ws, column_order=torch.zeros(248, dtype=torch.long, device=DEVICE))
    # act-order MoE experts read one slice of a gathered [rows, experts, K] input each: a row-strided view
    xs = torch.randn(3, 3, 256, generator=torch.Generator().manual_seed(8)).half().to(DEVICE)
    for rows in (1, 3):
        view = xs[:rows, 1]
        assert view.stride(0) == 3 * 256
        torch.testing.assert_close(w4a16_matmul(view, presorted), w4a16_matmul(view.contiguous(), presorted),
                                   rtol=0, atol=0)


def quantize_with_g_idx(k: int, n: int, group: int, sym: bool, g_idx: torch.Tensor, seed: int):
    """Like `quantize` but with a given act-order g_idx (the parts of one fused projection share it)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=g)
    n_groups = k // group
    scales = (torch.rand(n_groups, n, generator=g) * 0.02 + 0.001).half()
    zeros = torch.full((n_groups, n), 8, dtype=torch.int64) if sym else torch.randint(1, 16, (n_groups, n), generator=g)
    expected = (q - zeros[g_idx.long()]).float() * scales.float()[g_idx.long()]
    return (_pack_reference(q, 4, along_rows=True), _pack_reference(zeros - 1, 4, along_rows=False), scales, g_idx,
            expected)


def test_a_gptq_layer_without_a_kernel_says_it_runs_the_slow_path_once():
    """An 8-bit layer (GPT-QModel's default lm_head=True head) runs dequantize + matmul where 4-bit layers get
    the kernels (GPU, or the interpreter here): the first call warns, later ones do not."""
    import warnings

    from optimum_amdx.quantization import QuantLinear

    k, n = 64, 32
    q = torch.randint(0, 256, (k, n), generator=torch.Generator().manual_seed(1))
    tensors = {"qweight": pack_gptq_int32(q, 8, dim=0), "qzeros": pack_gptq_int32(torch.full((2, n), 127), 8, dim=1),
               "scales": torch.full((2, n), 0.01).half(), "g_idx": (torch.arange(k) // 32).to(torch.int32)}
    layer = QuantLinear.from_packed({t: v.to(DEVICE) for t, v in tensors.items()}, k, n, 8, 32)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(2)).half().to(DEVICE)
    with pytest.warns(UserWarning, match="8-bit GPTQ linear .* no fast kernel"):
        first = layer(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(layer(x), first, rtol=0, atol=0)


def test_uneven_act_order_groups_fall_back_to_reference():
    qweight, qzeros, scales, _, _ = quantize(64, 16, 4, 32, False, False, "gptq", seed=2)
    g_idx = torch.zeros(64, dtype=torch.int32)
    g_idx[60:] = 1  # groups of 60 and 4 rows: not a GPTQ act-order permutation
    w = prepare_gptq_weight(qweight, qzeros, scales, g_idx, group_size=32)
    assert not w.kernel_ready
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1)).half()
    expected = x.float() @ dequantize_gptq(qweight, qzeros, scales, g_idx)
    torch.testing.assert_close(w4a16_matmul(x, w).float(), expected, rtol=0, atol=0.05)


def test_errors_name_the_problem():
    qweight, qzeros, scales, g_idx, _ = quantize(64, 16, 4, 32, False, False, "gptq", seed=2)
    with pytest.raises(InvalidArgumentError, match="checkpoint_format"):
        prepare_gptq_weight(qweight, qzeros, scales, g_idx, checkpoint_format="awq")
    with pytest.raises(InvalidArgumentError, match="bits=5"):
        dequantize_gptq(qweight, qzeros, scales, g_idx, bits=5)
    with pytest.raises(InvalidArgumentError, match="groups"):
        prepare_gptq_weight(qweight, qzeros, scales, None, group_size=16)
    w = prepare_gptq_weight(qweight, qzeros, scales, g_idx, group_size=32)
    with pytest.raises(InvalidArgumentError, match="features"):
        w4a16_matmul(torch.randn(2, 48).half(), w)
    with pytest.raises(InvalidArgumentError, match="float16 or bfloat16"):
        w4a16_matmul(torch.randn(2, 64), w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 4, 16, 40, 64, 200, 512])  # stream M=1 / 16 / 64-row tiles, dequant + BLAS
@pytest.mark.parametrize("act_order", [False, True])
def test_full_size_on_gpu(m, act_order):
    k, n = 4096, 11008
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, 128, False, act_order, "gptq", seed=m)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), group_size=128)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).half().cuda()
    out = w4a16_matmul(x, w)
    exact = x.float() @ expected.cuda()
    torch.testing.assert_close(out.float(), exact, rtol=0, atol=2e-2 * exact.abs().max().item())


def test_paged_projection_fuses_gptq_linears():
    """q/k/v as GPTQ linears run as one W4A16 matmul in the paged engine, with the same result."""
    from optimum_amdx.modeling.paged_model import _Projection
    from optimum_amdx.quantization.quant_linear import QuantLinear

    k, g = 256, 64
    first = quantize(k, 128, 4, g, False, True, "gptq", seed=50)
    mods = []
    for i, n in enumerate((128, 64, 64)):
        qweight, qzeros, scales, g_idx, _ = first if i == 0 else quantize_with_g_idx(k, n, g, True, first[3], seed=50 + i)
        tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}
        bias = torch.randn(n, generator=torch.Generator().manual_seed(i)).half() if i != 1 else None
        mods.append(QuantLinear.from_packed({t: v.to(DEVICE) for t, v in tensors.items()}, k, n, 4, g,
                                            bias=None if bias is None else bias.to(DEVICE)))
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(9)).half().to(DEVICE)
    separate = [m(x) for m in mods]
    proj = _Projection(mods)
    assert proj.qweight is not None and proj.qweight.out_features == 256
    # act-order: the fused weight reads its input already permuted (the engine's RMSNorm writes it so)
    order = proj.input_order(x.dtype)
    assert order is not None and proj.qweight.perm is None
    for got, want in zip(proj(x.index_select(-1, order.long())), separate):
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=2e-2 * want.abs().max().item())


def test_engine_fuses_gptq_projections_of_a_quantized_checkpoint(tmp_path):
    """The paged engine over a real (tiny) GPTQ checkpoint runs q/k/v and gate/up as one W4A16 matmul
    each, fused at load time, and the fused outputs equal the separate modules'."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from optimum_amdx import AMDModelForCausalLM
    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    GPTQQuantizer(GPTQConfig(bits=4, group_size=32), method="rtn", device="cpu", verbose=False).quantize(model)
    GPTQQuantizer(GPTQConfig(bits=4, group_size=32), method="rtn", device="cpu", verbose=False).save_pretrained(
        model, tmp_path / "q")
    am = AMDModelForCausalLM.from_pretrained(tmp_path / "q", device="cpu", dtype="fp16", num_blocks=16)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).half()
    for layer in am.decoder.layers:
        for proj, n in ((layer.qkv, 64 + 2 * 32), (layer.gate_up, 2 * 96)):
            assert proj.qweight is not None and proj.qweight.out_features == n
            fused = proj(x)
            for got, mod in zip(fused, proj.modules):
                want = mod(x)
                torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=2e-2 * want.abs().max().item())


def layout_columns(k_tiles: int, k: int, perm: list[int], natural: bool) -> list[int]:
    """For each position of each 128-row K tile, the column of x it meets (k: a padded row, a zero column), written
    element by element from the layout's rule rather than with the package's index code: the natural order is row
    p of the tile; the pair order puts row r of plane bitrev3(t) at position p = 8 r + t."""
    bitrev3 = [0, 4, 2, 6, 1, 5, 3, 7]
    out = []
    for kt in range(k_tiles):
        for p in range(128):
            row = kt * 128 + (p if natural else 16 * bitrev3[p % 8] + p // 8)
            out.append(perm[row] if row < k else k)
    return out


@pytest.mark.parametrize("k,act_order", [(256, True), (200, False), (256, False)])
def test_activation_order_is_made_with_the_weight(k, act_order):
    """A weight whose x the kernels gather (act-order, or K off the 128-row tiles) carries both activation orders
    from its construction, so no call makes them (a graph captured around a first call would record the build).
    Both orders equal `layout_columns`: the natural one is `perm` (or 0..K-1) with K, a zero column, for each padded
    row; the pair order the same columns as the fused GEMM's joined tile meets them. A presorted weight of whole
    tiles carries none."""
    qweight, qzeros, scales, g_idx, _ = quantize(k, 32, 4, 32, False, act_order, "gptq", seed=k)
    w = prepare_gptq_weight(qweight, qzeros, scales, g_idx, group_size=32)
    if not act_order and k % 128 == 0:
        assert w.x_order is None
        return
    assert set(w.x_order) == {True, False}
    perm = w.perm.tolist() if act_order else list(range(k))
    for order in (True, False):
        assert w.x_order[order].tolist() == layout_columns(w.k_tiles, k, perm, order)
    if act_order:
        assert w.presorted().x_order is None


@pytest.mark.parametrize("k,act_order,natural,dtype,form", [
    (200, True, True, torch.float16, None), (256, True, False, torch.bfloat16, None),
    (264, False, True, torch.float16, None), (200, True, True, torch.float16, (256, 256, 4)),
    (256, True, False, torch.bfloat16, (256, 128, 4)), (264, False, True, torch.float16, (512, 128, 4)),
    (64, False, True, torch.float16, (64, 128, 4)),
    (384, True, True, torch.float16, "auto")])
def test_gather_x_is_x_in_the_layout_order(k, act_order, natural, dtype, form):
    """The one-launch gather of the GEMM routes: x's columns in each K tile's order (act-order permutation
    applied), zeros for the padded rows; the input may be a strided view. Both kernels: the column gather (None)
    and the row gather, whole rows and chunks of them (K = 64 = ROW: the padded rows' index K lies past the row),
    and the default choice. The expected columns come from `layout_columns` (the layout's rule element by element),
    not from the index the kernels read (`x_index`)."""
    from optimum_amdx.kernels._w4a16_gemm_triton import gather_x

    qweight, qzeros, scales, g_idx, _ = quantize(k, 32, 4, 32, False, act_order, "gptq", seed=k)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), group_size=32)
    wide = torch.randn(6, k + 8, generator=torch.Generator().manual_seed(k)).to(dtype).to(DEVICE)
    x = wide[:, 3:3 + k]  # row stride k + 8
    perm = w.perm.tolist() if w.perm is not None else list(range(k))
    expected = torch.stack([x[:, c] if c < k else torch.zeros_like(x[:, 0])
                            for c in layout_columns(w.k_tiles, k, perm, natural)], dim=1)
    got = gather_x(x, w, natural, form)
    assert got.shape == expected.shape and torch.equal(got, expected)
