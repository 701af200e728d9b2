"""Packing into standard GPTQ int32 tensors, checked against the kernel module's unpacker/dequantizer."""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.w4a16 import dequantize_gptq, pack_gptq_int32, unpack_gptq_int32
from optimum_amdx.quantization.packing import pack_gptq, pack_qweight, pack_qzeros


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_qweight_round_trip(bits):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (48, 64), generator=g)  # [N, K]
    packed = pack_qweight(codes, bits)
    assert packed.dtype == torch.int32 and packed.shape == (64 * bits // 32, 48)
    assert torch.equal(unpack_gptq_int32(packed, bits, dim=0), codes.t().int())
    assert torch.equal(packed, pack_gptq_int32(codes.t(), bits, dim=0))


def test_four_bit_word_layout():
    codes = torch.arange(8).reshape(1, 8)  # one output column, K = 8 -> one word
    word = int(pack_qweight(codes, 4)[0, 0]) & 0xFFFFFFFF
    assert word == sum(v << (4 * v) for v in range(8))


@pytest.mark.parametrize("fmt,offset", [("gptq", 1), ("gptq_v2", 0)])
def test_qzeros_convention(fmt, offset):
    g = torch.Generator().manual_seed(7)
    zeros = torch.randint(1, 16, (3, 64), generator=g)
    packed = pack_qzeros(zeros, 4, fmt)
    assert packed.shape == (3, 64 * 4 // 32)
    assert torch.equal(unpack_gptq_int32(packed, 4, dim=1) + offset, zeros.int())


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_dequantize_matches(bits):
    g = torch.Generator().manual_seed(11 + bits)
    n, k, gs = 64, 96, 32
    codes = torch.randint(0, 2**bits, (n, k), generator=g)
    zeros = torch.randint(1, 2**bits, (k // gs, n), generator=g)
    scales = torch.rand(k // gs, n, generator=g).half() + 0.01
    g_idx = torch.randperm(k, generator=g) % (k // gs)
    t = pack_gptq(codes, scales, zeros, g_idx, bits)
    w = dequantize_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits, "gptq")
    expected = (codes.t().float() - zeros[g_idx].float()) * scales.float()[g_idx]
    torch.testing.assert_close(w, expected)


def test_out_of_range_codes_rejected():
    with pytest.raises(InvalidArgumentError):
        pack_qweight(torch.full((8, 8), 16), 4)
