"""The one-row packed fp16 loop of the W4A16 stream kernel (NVIDIA PTX) and its activation pairs.

The packed loop runs only on an NVIDIA GPU (inline PTX); on the CPU the pair-packing kernel runs in
the interpreter and the route choice is checked. On a GPU every group layout, zero mode, act-order,
ragged K/N and split of the tile stream is compared with the exact float32 result.
"""

from __future__ import annotations

import pytest
import torch

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


def test_packed_route_only_for_fp16_one_row_on_nvidia():
    from optimum_amdx.kernels._w4a16_triton import packed_route

    cfg = {"BLOCK_M": 1}
    assert not packed_route(cfg, "gfx942", torch.float16, 1)
    assert not packed_route(cfg, "cpu", torch.float16, 1)
    assert not packed_route({"BLOCK_M": 16}, "sm_90", torch.float16, 1)
    assert not packed_route(cfg, "sm_90", torch.bfloat16, 1)
    assert not packed_route(cfg, "sm_90", torch.float16, 8)  # group 16: float32 loop
    assert not packed_route({"BLOCK_M": 1, "PACKED": False}, "sm_90", torch.float16, 1)


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
                                 {"maxnreg": 72}])
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


def test_wide_one_row_calls_take_smaller_programs():
    """The hopper one-row config: 4-warp programs only for one scale group per tile and at least
    `wide_min_units_per_cu` tiles per SM (4096x28672: 7168 tiles on 132 SMs); otherwise unchanged."""
    from optimum_amdx.kernels._w4a16_triton import stream_config, wide_rule

    cfg = stream_config("sm_90", 1)
    assert cfg["num_warps"] == 8 and cfg["wide_num_warps"] == 4
    assert wide_rule(cfg, 7168, 1, 132)["num_warps"] == 4
    assert wide_rule(cfg, 3584, 1, 132)["num_warps"] == 8  # 4096x14336: too few tiles per SM
    assert wide_rule(cfg, 7168, 4, 132)["num_warps"] == 8  # group 32
    assert wide_rule(stream_config("sm_90", 16), 7168, 1, 132)["num_warps"] == 8
    assert wide_rule(stream_config("gfx942", 1), 7168, 1, 304) == stream_config("gfx942", 1)
