"""The GPTQ and RTN algorithms on single weight matrices: error, act-order bookkeeping, grids."""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.w4a16 import dequantize_gptq
from optimum_amdx.quantization import GPTQConfig
from optimum_amdx.quantization.gptq import HessianAccumulator, gptq_quantize, rtn_quantize
from optimum_amdx.quantization.packing import pack_gptq


def _layer(seed: int, n: int = 96, k: int = 128, tokens: int = 1024):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n, k, generator=g) * 0.05
    # correlated inputs with uneven scales, like real activations
    mix = torch.randn(k, k, generator=g) / k**0.5
    X = torch.randn(tokens, k, generator=g) @ mix * (torch.rand(k, generator=g) * 3 + 0.1)
    acc = HessianAccumulator(k, torch.device("cpu"))
    for chunk in X.split(256):
        acc.add(chunk)
    return W, X, acc.H


def _output_error(W, Q, X):
    return float(((X @ (W - Q).t()) ** 2).mean())


def test_hessian_accumulator_matches_direct():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(300, 16, generator=g)
    acc = HessianAccumulator(16, torch.device("cpu"))
    for chunk in X.split(70):
        acc.add(chunk)
    torch.testing.assert_close(acc.H, 2 * X.t() @ X / 300, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_gptq_beats_rtn_on_layer_output(bits):
    W, X, H = _layer(bits)
    cfg = GPTQConfig(bits=bits, group_size=32)
    gptq = gptq_quantize(W, H, cfg)
    rtn = rtn_quantize(W, cfg)
    assert _output_error(W, gptq.dequantized, X) < _output_error(W, rtn.dequantized, X)
    assert int(gptq.codes.min()) >= 0 and int(gptq.codes.max()) <= 2**bits - 1


@pytest.mark.parametrize("desc_act,static_groups,sym", [(False, False, True), (True, False, True), (True, True, False),
                                                        (False, False, False)])
def test_packed_tensors_reproduce_dequantized_weight(desc_act, static_groups, sym):
    W, X, H = _layer(5)
    cfg = GPTQConfig(bits=4, group_size=32, desc_act=desc_act, static_groups=static_groups, sym=sym)
    res = gptq_quantize(W, H, cfg)
    t = pack_gptq(res.codes, res.scales, res.zeros, res.g_idx, 4, cfg.checkpoint_format)
    w = dequantize_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 4, "gptq")
    torch.testing.assert_close(w.t(), res.dequantized, rtol=0, atol=1e-6)
    counts = torch.bincount(res.g_idx.long())
    assert counts.tolist() == [32] * 4  # every group holds group_size columns
    if desc_act and not static_groups:
        assert not torch.equal(res.g_idx.long(), torch.arange(128) // 32)  # act-order permutes groups
    else:
        assert torch.equal(res.g_idx.long(), torch.arange(128) // 32)


def test_desc_act_helps_or_matches_on_uneven_inputs():
    W, X, H = _layer(9)
    plain = gptq_quantize(W, H, GPTQConfig(bits=3, group_size=-1))
    act = gptq_quantize(W, H, GPTQConfig(bits=3, group_size=-1, desc_act=True))
    assert _output_error(W, act.dequantized, X) <= 1.05 * _output_error(W, plain.dequantized, X)


def test_asym_v1_zero_is_storable():
    W = torch.rand(64, 64) + 0.01  # all positive: the ideal zero point is 0
    res = rtn_quantize(W, GPTQConfig(bits=4, group_size=32, sym=False))
    assert int(res.zeros.min()) >= 1
    res2 = rtn_quantize(W, GPTQConfig(bits=4, group_size=32, sym=False, checkpoint_format="gptq_v2"))
    assert int(res2.zeros.min()) == 0


def test_rtn_in_a_column_order_gives_the_act_order_layout():
    """Groups over the columns taken in `order`: g_idx records them, the packed tensors dequantize to the
    result, and the error is that of RTN on the reordered matrix."""
    W = torch.randn(24, 96, generator=torch.Generator().manual_seed(4))
    cfg = GPTQConfig(bits=4, group_size=32, sym=False)
    order = torch.randperm(96, generator=torch.Generator().manual_seed(5))
    res = rtn_quantize(W, cfg, order)
    assert torch.equal(res.g_idx[order].long(), torch.arange(96) // 32)  # group g = order[32g : 32g + 32]
    packed = pack_gptq(res.codes, res.scales, res.zeros, res.g_idx, 4, "gptq")
    deq = dequantize_gptq(packed["qweight"], packed["qzeros"], packed["scales"], packed["g_idx"], 4, "gptq").t()
    torch.testing.assert_close(deq, res.dequantized, rtol=0, atol=1e-6)
    on_reordered = rtn_quantize(W[:, order], cfg)
    torch.testing.assert_close(res.dequantized[:, order], on_reordered.dequantized, rtol=0, atol=0)
    assert res.error == pytest.approx(on_reordered.error)
    with pytest.raises(InvalidArgumentError, match="permutation"):
        rtn_quantize(W, cfg, torch.zeros(96, dtype=torch.long))


def test_partial_last_group():
    W, X, H = _layer(2, k=96)
    res = gptq_quantize(W, H, GPTQConfig(bits=4, group_size=64))
    assert res.scales.shape == (2, 96)
    assert torch.bincount(res.g_idx.long()).tolist() == [64, 32]


def test_dead_inputs_do_not_break_factorization():
    W, X, H = _layer(4)
    H[:, :8] = 0
    H[:8, :] = 0
    res = gptq_quantize(W, H, GPTQConfig(bits=4, group_size=32))
    assert torch.isfinite(res.dequantized).all()
    assert res.dequantized[:, :8].abs().max() < 0.02  # dead columns are zeroed, up to one grid step


def test_group_aware_order_keeps_groups_whole_and_helps():
    W, X, H = _layer(12, k=160)  # groups of 64, 64, 32
    plain = gptq_quantize(W, H, GPTQConfig(bits=3, group_size=64))
    gar = gptq_quantize(W, H, GPTQConfig(bits=3, group_size=64, act_group_aware=True))
    assert torch.equal(gar.g_idx.long(), torch.arange(160) // 64)  # storage stays in order
    t = pack_gptq(gar.codes, gar.scales, gar.zeros, gar.g_idx, 3, "gptq")
    w = dequantize_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 3, "gptq")
    torch.testing.assert_close(w.t(), gar.dequantized, rtol=0, atol=1e-6)
    assert _output_error(W, gar.dequantized, X) < 1.1 * _output_error(W, plain.dequantized, X)
