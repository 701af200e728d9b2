"""The one-row packed fp16 loop of the W4A16 stream kernel (NVIDIA PTX) and its activation pairs.

The packed loop runs only on an NVIDIA GPU (inline PTX); on the CPU the pair-packing kernel runs in
the interpreter and the route choice is checked. On a GPU every group layout, zero mode, act-order,
ragged K/N and split of the tile stream is compared with the exact float32 result.
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.w4a16 import prepare_gptq_weight, w4a16_matmul

from .test_w4a16 import DEVICE, quantize


def test_xpack_pairs_rows_64_apart_in_sorted_order():
    from optimum_amdx.kernels._w4a16_triton import XPACK_BLOCK, _w4a16_xpack_kernel

    k = 328  # ragged: the last tile's pairs past K are zero
    kt = -(-k // 128)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(3)).half().to(DEVICE)
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(4)).to(torch.int32).to(DEVICE)
    for use_perm in (False, True):
        xp = torch.empty(kt * 64, dtype=torch.int32, device=DEVICE)
        _w4a16_xpack_kernel[(-(-kt * 64 // XPACK_BLOCK),)](x, perm if use_perm else xp, xp, k, kt * 64,
                                                          HAS_PERM=use_perm, BLOCK=XPACK_BLOCK, num_warps=1)
        xs = x[0, perm.long()] if use_perm else x[0]
        padded = torch.zeros(kt * 128, dtype=torch.float16, device=DEVICE)
        padded[:k] = xs
        t = padded.reshape(kt, 2, 4, 16)  # row kt*128 + half*64 + J*16 + r
        halves = xp.cpu().view(torch.int16).view(torch.float16).reshape(kt, 4, 16, 2)
        assert torch.equal(halves[..., 0], t[:, 0].cpu()) and torch.equal(halves[..., 1], t[:, 1].cpu())


_XPACK_PDL_BUILD = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optimum_amdx.kernels._w4a16_triton import XPACK_BLOCK, _w4a16_xpack_kernel

sig = {"x_ptr": "*fp16", "perm_ptr": "*i32", "xp_ptr": "*i32", "K": "i32", "n_pairs": "i32", "HAS_PERM": "constexpr",
       "BLOCK": "constexpr", "PDL": "constexpr"}
for pdl in (False, True):
    c = triton.compile(ASTSource(_w4a16_xpack_kernel, sig, {"HAS_PERM": True, "BLOCK": XPACK_BLOCK, "PDL": pdl}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    body = c.asm["ptx"].split("griddepcontrol.wait")
    print(int(pdl), len(body) - 1, body[0].count("ld.global.b32") + body[0].count("ld.global.v4.b32"),
          body[-1].count("ld.global.b16"))
"""


def test_xpack_with_pdl_reads_the_permutation_before_its_wait():
    """Launched with programmatic dependent launch (one row on sm_90, as the stream kernel after it), the act-order
    pairs' launch waits for the previous kernel only before it reads x: the permutation, weight data, comes first;
    without PDL (AMD, the interpreter, switched off) there is no wait (sm_90 PTX, Triton's bundled ptxas)."""
    from .sm90_build import sm90_build_stdout

    rows = {int(r[0]): [int(v) for v in r[1:]] for r in
            (line.split() for line in sm90_build_stdout(_XPACK_PDL_BUILD, timeout=300).splitlines() if line.strip())}
    assert rows[0][0] == 0
    waits, perm_loads_before, x_loads_after = rows[1]
    assert waits == 1 and perm_loads_before > 0 and x_loads_after > 0


def test_pair_order_is_what_the_xpack_kernel_builds():
    """`w4a16.pair_order`: a row put in that order, read as int32 words, is the prepared pairs of the one-row
    loop (what `rms_norm(..., paired=True)` and `silu_and_mul(..., paired=True)` hand it instead)."""
    from optimum_amdx.kernels._w4a16_triton import XPACK_BLOCK, _w4a16_xpack_kernel
    from optimum_amdx.kernels.w4a16 import pair_order

    k = 384
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(5)).half().to(DEVICE)
    xp = torch.empty(k // 2, dtype=torch.int32, device=DEVICE)
    _w4a16_xpack_kernel[(-(-k // 2 // XPACK_BLOCK),)](x, xp, xp, k, k // 2, HAS_PERM=False, BLOCK=XPACK_BLOCK,
                                                     num_warps=1)
    order = pair_order(k, x.device)
    assert sorted(order.tolist()) == list(range(k)) and order is pair_order(k, x.device)  # a permutation, kept
    assert torch.equal(x[0, order].contiguous().view(torch.int32).cpu(), xp.cpu())
    with pytest.raises(InvalidArgumentError, match="multiple of 128"):
        pair_order(200, x.device)


def test_paired_input_only_where_the_packed_one_row_loop_reads_it():
    """`takes_pairs`: never in the interpreter, on AMD or for more than one row; `w4a16_accumulate` refuses a
    paired input it would not read as pairs."""
    from optimum_amdx.kernels.w4a16 import accumulator, takes_pairs, w4a16_accumulate

    qweight, qzeros, scales, g_idx, _ = quantize(256, 128, 4, 128, True, False, "gptq", seed=3)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=128)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1)).half().to(DEVICE)
    assert not takes_pairs(2, torch.float16, w) and not takes_pairs(1, torch.bfloat16, w)
    if DEVICE == "cpu":
        assert not takes_pairs(1, torch.float16, w)
        with pytest.raises(InvalidArgumentError, match="paired"):
            w4a16_accumulate(x, w, accumulator(x.device, 128, 1), paired=True)


def test_packed_route_only_for_half_one_row_on_nvidia():
    """fp16 one row on NVIDIA; bf16 too on wide or accumulating calls where its pairs can be built in the loop (no
    permutation, K a tile multiple: `_xpairs_bf16`); never under the interpreter, which runs no asm."""
    from unittest import mock

    from optimum_amdx.kernels import _w4a16_triton as kt

    cfg = {"BLOCK_M": 1}
    if kt.interpret_mode():  # the CPU test run: the interpreter runs no asm
        assert not kt.packed_route(cfg, "sm_90", torch.float16, 1)
    with mock.patch.object(kt, "interpret_mode", return_value=False):  # as compiled for an NVIDIA GPU
        assert kt.packed_route(cfg, "sm_90", torch.float16, 1)
        assert kt.packed_route(cfg, "sm_90", torch.float16, 4, True, False)  # fp16: prepared pairs for those
        assert not kt.packed_route(cfg, "gfx942", torch.float16, 1)
        assert not kt.packed_route(cfg, "cpu", torch.float16, 1)
        assert not kt.packed_route({"BLOCK_M": 16}, "sm_90", torch.float16, 1)
        assert kt.packed_route(cfg, "sm_90", torch.bfloat16, 1, scaled_bf16=True)
        assert not kt.packed_route(cfg, "sm_90", torch.bfloat16, 1)  # bf16 pairs: wide or accumulating calls only
        assert not kt.packed_route(cfg, "sm_90", torch.bfloat16, 1, perm=True, scaled_bf16=True)
        assert not kt.packed_route(cfg, "sm_90", torch.bfloat16, 1, even_k=False, scaled_bf16=True)
        assert not kt.packed_route(cfg, "sm_90", torch.float32, 1)
        assert not kt.packed_route(cfg, "sm_90", torch.float16, 8)  # group 16: float32 loop
        assert not kt.packed_route({"BLOCK_M": 1, "PACKED": False}, "sm_90", torch.float16, 1)


def test_half_loop_only_for_fp16_one_row_without_permutation_on_cdna():
    """CDNA's one-row config runs the packed arithmetic without asm (`HALF_LOOP`), for fp16 and no act-order
    permutation; gfx1100 and NVIDIA keep their loops."""
    from optimum_amdx.kernels._w4a16_triton import AMD_COMPILE_SPECS, half_loop_route, stream_config

    for arch in ("gfx90a", "gfx942", "gfx950"):
        cfg = stream_config(arch, 1)
        assert half_loop_route(cfg, torch.float16, False)
        assert not half_loop_route(cfg, torch.bfloat16, False) and not half_loop_route(cfg, torch.float16, True)
        assert not half_loop_route(stream_config(arch, 2), torch.float16, False)
    for arch in ("gfx1100", "sm_90", "cpu"):
        assert not half_loop_route(stream_config(arch, 1), torch.float16, False)
    # the AMD compile check builds the form each one-row spec launches
    one_row = [s for s in AMD_COMPILE_SPECS if s.name.startswith("w4a16_stream[m1:")]
    assert one_row and all(s.constexprs["HALF_LOOP"] == (not s.constexprs["HAS_PERM"] and "rdna3" not in s.name)
                           for s in one_row)


PACKED_CASES = [
    # (K, N, group, sym, act_order, fmt)
    (384, 256, 128, True, False, "gptq"),
    (384, 136, 128, False, True, "gptq"),
    (512, 128, 64, False, False, "gptq_v2"),
    (328, 72, 32, False, True, "gptq"),
    (256, 256, 32, True, False, "gptq"),
    (264, 50, -1, False, False, "gptq"),
    (320, 40, 16, True, False, "gptq"),  # 8 groups per tile: the float32 loop
    (1024, 200, 32, False, True, "gptq"),  # eight K tiles: several programs share each column block
    (768, 384, 128, True, False, "gptq"),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the packed loop is inline PTX)")
@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", PACKED_CASES)
@pytest.mark.parametrize("cfg", [{}, {"programs": 3}, {"XPREP": True}, {"PACK4": False}, {"num_warps": 8},
                                 {"LOOKAHEAD": True}, {"LOOKAHEAD": True, "FENCE": 2, "programs": 3},
                                 {"maxnreg": 72}, {"SCALES_AHEAD": True}, {"SCALES_AHEAD": True, "programs": 3}])
def test_packed_one_row_matches_exact(k, n, group, sym, act_order, fmt, cfg):
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=k + n + group)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group,
                            checkpoint_format=fmt)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).half().cuda()
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).half().cuda()
    config = dict({"BLOCK_M": 1, "num_warps": 4, "programs_per_cu": 8}, **cfg)
    out = w4a16_matmul(x, w, bias, config=config)
    exact = x.double() @ expected.double().cuda() + bias.double()
    scale = exact.abs().max().item()
    # fp16 products and short fp16 sums: well inside the fp16 kernels' usual 2e-2 of the largest output
    assert (out.double() - exact).abs().max().item() <= 4e-3 * scale


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the packed loop is inline PTX)")
@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", PACKED_CASES)
@pytest.mark.parametrize("magnitude", [1.0, 3e4])
def test_bf16_one_row_matches_exact(k, n, group, sym, act_order, fmt, magnitude):
    """bf16 one row: the packed loop with each K tile's x scaled into fp16 by a power of two (`_xpairs_bf16`) where
    it applies (wide calls: here every call, ``wide_min_units_per_cu`` = 1; one group per tile, no act-order), the
    float32 loop elsewhere. At 3e4 the activations are far past what fp16 sums of (q - z) * x could hold unscaled
    (8 x 15 x 3e4), so only the tile scaling keeps them finite."""
    from optimum_amdx.kernels._w4a16_triton import stream_matmul
    from optimum_amdx.kernels.runtime import device_arch

    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=k + n + group)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group,
                            checkpoint_format=fmt)
    x = (torch.randn(1, k, generator=torch.Generator().manual_seed(k)) * magnitude).bfloat16().cuda()
    out = w4a16_matmul(x, w, config={"BLOCK_M": 1, "num_warps": 8, "programs_per_cu": 8, "wide_min_units_per_cu": 1,
                                     "wide_num_warps": 4})
    exact = x.double() @ expected.double().cuda()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.double() - exact).abs().max().item() <= 8e-3 * exact.abs().max().item()
    # into a float32 accumulator (the decode step's form), which takes the tile-scaled pairs on any width
    acc = torch.zeros(1, n, dtype=torch.float32, device="cuda")
    stream_matmul(x, w, None, acc, device_arch(), accumulate=True)
    assert torch.isfinite(acc).all() and (acc.double() - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()


_BF16_BUILD = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optimum_amdx.kernels import _w4a16_triton as kt

for x_type, chunks in (("*fp16", 1), ("*bf16", 1), ("*bf16", 4)):
    sig = {"x_ptr": x_type, "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "perm_ptr": "*i32",
           "bias_ptr": "*fp16", "out_ptr": x_type, "ws_ptr": "*fp32", "cnt_ptr": "*i32", "xp_ptr": "*i32", "M": "i32",
           "N": "i32", "K": "i32", "KT": "i32", "NB": "i32", "stride_xm": "i32", "stride_om": "i32", "n_units": "i32",
           "e7_bits": "i32"}
    cons = {"GROUP_SIZE": 128 // chunks, "CHUNKS": chunks, "BLOCK_M": 1, "BLOCK_N": 128, "HAS_ZEROS": chunks > 1,
            "HAS_PERM": False, "HAS_BIAS": False, "EVEN_K": True, "EVEN_N": True, "FENCE": False, "PIPELINE": False,
            "STAGES": 1, "JOIN": True, "PACKED": True, "XPREP": False, "PACK4": True, "LOOKAHEAD": False, "PDL": False,
            "ACCUM": False, "HALF_LOOP": False, "BF16_PAIRS": x_type == "*bf16", "SCALES_AHEAD": False}
    sig.update({c: "constexpr" for c in cons})
    c = triton.compile(ASTSource(kt._w4a16_stream_kernel, sig, cons, {}), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 8, "num_stages": 1})
    ptx = c.asm["ptx"]
    print(x_type, chunks, ptx.count("lop3.b32"), ptx.count("cvt.rn.f16.f32"))
"""


def test_bf16_packed_one_row_assembles_for_sm90():
    """The packed loop with bf16 pairs scaled per tile (`_xpairs_bf16`) assembles for sm_90 with Triton's bundled
    ptxas, with as many LOP3s as the fp16 loop (the same PTX per word) and x converted to fp16 in the loop."""
    from .sm90_build import sm90_build_stdout

    rows = [line.split() for line in sm90_build_stdout(_BF16_BUILD, timeout=600).splitlines() if line.strip()]
    got = {(r[0], int(r[1])): (int(r[2]), int(r[3])) for r in rows}
    assert got[("*bf16", 1)][0] == got[("*fp16", 1)][0]
    assert got[("*bf16", 1)][1] > 0 and got[("*bf16", 4)][1] > 0


@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", PACKED_CASES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_half_loop_one_row_matches_exact(k, n, group, sym, act_order, fmt, accumulate):
    """`HALF_LOOP`: the packed loop's fp16 arithmetic without asm (the one-row form for AMD), under the interpreter
    on the CPU and as compiled on a GPU; flushed through the tickets or left in a float32 accumulator."""
    from optimum_amdx.kernels._w4a16_triton import stream_matmul
    from optimum_amdx.kernels.runtime import device_arch

    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=k + n + group)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group,
                            checkpoint_format=fmt)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).half().to(DEVICE)
    exact = x.double() @ expected.double().to(DEVICE)
    config = {"BLOCK_M": 1, "num_warps": 4 if DEVICE == "cuda" else 1, "programs_per_cu": 8 if DEVICE == "cuda" else 3,
              "PACKED": False, "HALF_LOOP": True}
    arch = device_arch() if DEVICE == "cuda" else "cpu"
    if accumulate:
        out = torch.zeros(1, n, dtype=torch.float32, device=DEVICE)
        stream_matmul(x, w, None, out, arch, config=config, accumulate=True)
    else:
        out = torch.empty(1, n, dtype=torch.float16, device=DEVICE)
        stream_matmul(x, w, None, out, arch, config=config)
    # fp16 products and sums of at most 8 of them, as the packed PTX loop (above)
    assert (out.double() - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the packed loop is inline PTX)")
@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", PACKED_CASES)
@pytest.mark.parametrize("programs", [3, 0])
def test_packed_one_row_scales_ahead_accumulates_exact(k, n, group, sym, act_order, fmt, programs):
    """``SCALES_AHEAD``: the packed loop's scales and zeros loaded a tile ahead with its words (the first tile's
    before the PDL wait), into a float32 accumulator as the decode step calls it; programs of several tiles and of
    one or two (the persistent grid)."""
    from optimum_amdx.kernels._w4a16_triton import stream_matmul
    from optimum_amdx.kernels.runtime import device_arch

    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=k + n + group)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group,
                            checkpoint_format=fmt)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).half().cuda()
    config = {"BLOCK_M": 1, "num_warps": 8, "programs_per_cu": 4, "programs": programs, "SCALES_AHEAD": True}
    out = torch.zeros(1, n, dtype=torch.float32, device="cuda")
    stream_matmul(x, w, None, out, device_arch(), config=config, accumulate=True)
    exact = x.double() @ expected.double().cuda()
    assert (out.double() - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the packed loop is inline PTX)")
@pytest.mark.parametrize("k,n,group,sym", [(384, 256, 128, True), (512, 136, 64, False), (1024, 200, 32, False),
                                           (768, 384, 128, True)])
def test_paired_one_row_accumulates_what_the_plain_row_does(k, n, group, sym):
    """An x in `pair_order` with ``paired=True`` gives the sums of the plain x (the same loop; only where its
    pairs come from differs), and both match the exact product."""
    from optimum_amdx.kernels.w4a16 import accumulator, pair_order, takes_pairs, w4a16_accumulate

    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, False, "gptq", seed=k + n)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).half().cuda()
    assert takes_pairs(1, torch.float16, w)
    plain = w4a16_accumulate(x, w, accumulator(x.device, n, 1)).clone()
    accumulator(x.device, n, 1).zero_()
    paired = w4a16_accumulate(x[:, pair_order(k, x.device)].contiguous(), w, accumulator(x.device, n, 1),
                              paired=True).clone()
    accumulator(x.device, n, 1).zero_()
    exact = x.double() @ expected.double().cuda()
    torch.testing.assert_close(paired, plain, rtol=1e-5, atol=1e-5 * exact.abs().max().item())
    assert (paired.double() - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()


def test_prepared_pairs_where_the_loop_cannot_build_them_and_on_wide_flushed_calls():
    """`prepared_pairs`: the packed fp16 loop reads prepared pairs for a paired input, act-order, ragged K, the
    look-ahead form, a config that asks, and (hopper's ``wide_xprep``) a wide flushed call; not on a narrower call, an
    accumulating one, bf16 pairs or any loop that is not the packed one."""
    from optimum_amdx.kernels._w4a16_triton import prepared_pairs, stream_config

    cfg = stream_config("sm_90", 1)
    plain = dict(packed=True, bf16_pairs=False, paired=False, lookahead=False, perm=False, even_k=True, wide=False,
                 accumulate=False)
    assert not prepared_pairs(cfg, **plain)
    for key, value in (("paired", True), ("lookahead", True), ("perm", True), ("even_k", False), ("wide", True)):
        assert prepared_pairs(cfg, **dict(plain, **{key: value})), key
    assert prepared_pairs(dict(cfg, XPREP=True), **plain)
    assert not prepared_pairs(cfg, **dict(plain, wide=True, accumulate=True))
    assert not prepared_pairs(stream_config("gfx942", 1), **dict(plain, wide=True))  # no wide_xprep there
    assert not prepared_pairs(cfg, **dict(plain, packed=False, perm=True))
    assert not prepared_pairs(cfg, **dict(plain, bf16_pairs=True, wide=True))


def test_scales_ahead_on_the_decode_steps_accumulating_packed_calls():
    """`scales_ahead_route` (hopper's ``accum_scales_ahead``): the packed loop takes its scales a tile ahead on an
    accumulating call, not on a flushed one (more registers, fewer programs per SM), the look-ahead loop or any other
    loop; a config's ``SCALES_AHEAD`` overrides the class either way; AMD families (no packed loop) never."""
    from optimum_amdx.kernels._w4a16_triton import scales_ahead_route, stream_config

    cfg = stream_config("sm_90", 1)
    assert scales_ahead_route(cfg, packed=True, lookahead=False, accumulate=True)
    assert not scales_ahead_route(cfg, packed=True, lookahead=False, accumulate=False)
    assert not scales_ahead_route(cfg, packed=True, lookahead=True, accumulate=True)
    assert not scales_ahead_route(cfg, packed=False, lookahead=False, accumulate=True)
    assert scales_ahead_route(dict(cfg, SCALES_AHEAD=1), packed=True, lookahead=False, accumulate=False)
    assert not scales_ahead_route(dict(cfg, SCALES_AHEAD=0), packed=True, lookahead=False, accumulate=True)
    assert not scales_ahead_route(stream_config("gfx942", 1), packed=True, lookahead=False, accumulate=True)


def test_one_row_warps_by_call_class():
    """`one_row_warps` (hopper), first match:
    - 4-warp programs for a flushed packed call that reads prepared pairs, one scale group per tile, at least
      ``xprep_min_units_per_cu`` tiles per SM (act-order 4096x11008: 2752 tiles on 132 SMs); not for 4096x4096
      (1024 tiles), group 32, calls that build their pairs in the loop, or the decode step's accumulating calls;
    - 4-warp programs for a wide call (`is_wide`: one scale group per tile, at least ``wide_min_units_per_cu`` tiles
      per SM; 4096x28672: 7168 tiles on 132 SMs; not 4096x14336 or group 32, nor from 2 rows), accumulating or not;
    - otherwise the config's 8, and a family without the keys (gfx942) is unchanged."""
    from optimum_amdx.kernels._w4a16_triton import is_wide, one_row_warps, stream_config

    cfg = stream_config("sm_90", 1)
    assert cfg["num_warps"] == 8 and cfg["xprep_num_warps"] == 4 and cfg["wide_num_warps"] == 4
    assert cfg["xprep_min_units_per_cu"] == 16

    def warps(xprep, accumulate, n_units, chunks, c=cfg, cus=132):
        return one_row_warps(c, is_wide(c, n_units, chunks, cus), xprep, accumulate, n_units, chunks, cus)["num_warps"]

    assert warps(True, False, 2752, 1) == 4
    assert warps(True, False, 1024, 1) == 8
    assert warps(True, False, 3584, 4) == 8
    assert warps(False, False, 3584, 1) == 8
    assert warps(True, True, 3584, 1) == 8
    assert warps(False, False, 7168, 1) == 4 and warps(False, True, 7168, 1) == 4  # wide
    assert warps(False, False, 3584, 1) == 8  # 4096x14336: too few tiles per SM to be wide
    assert warps(False, False, 7168, 4) == 8  # group 32
    assert warps(False, False, 7168, 1, c=stream_config("sm_90", 16)) == 8
    amd = stream_config("gfx942", 1)
    assert one_row_warps(amd, is_wide(amd, 7168, 1, 304), True, False, 7168, 1, 304) == amd
