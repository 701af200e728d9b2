"""PagedDecoder's decode-step choices that need no GPU to check: the attention split policy and the
fusion switches' fallbacks on CPU (the kernels themselves are tested in tests/kernels)."""

from __future__ import annotations

import torch

from optimum_amdx.modeling.paged_model import DecodeFusions, PagedDecoder

from .conftest import tiny_model


def _decoder(sms: int = 132) -> PagedDecoder:
    dec = PagedDecoder(tiny_model("llama"), max_model_len=576)
    dec.device = torch.device("cuda")  # the policy only reads the device type and the SM count
    dec._num_sms = sms
    return dec


def test_decode_splits_one_tile_per_program_while_the_grid_is_under_a_wave():
    dec = _decoder()  # 2 KV heads
    assert dec.decode_splits(1, 1, 576) == 9  # ceil(576 / 64) tiles, far under 4 programs per SM
    assert dec.decode_splits(1, 1, 4096) == 64
    assert dec.decode_splits(40, 1, 4096) == 6  # 80 programs: up to 4 * 132 // 80 splits
    assert dec.decode_splits(66, 1, 4096) is None  # 132 programs fill the GPU: the kernel decides
    assert dec.decode_splits(1, 7, 4096) is None  # not a pure decode step


def test_decode_splits_on_hopper_are_finer():
    from optimum_amdx.modeling.paged_model import DECODE_SPLITS

    dec = _decoder()  # 2 KV heads
    dec._split_keys, dec._split_per_cu = DECODE_SPLITS["hopper"]  # what a sm_90 device sets at build
    assert dec.decode_splits(1, 1, 576) == 18  # ceil(576 / 32)
    assert dec.decode_splits(40, 1, 4096) == 6  # 80 programs: up to 4 * 132 // 80 splits
    assert dec.decode_splits(66, 1, 4096) is None


def test_decode_splits_switch():
    dec = _decoder()
    dec.fusions = DecodeFusions(decode_splits=0)
    assert dec.decode_splits(1, 1, 4096) is None
    dec.fusions = DecodeFusions(decode_splits=3)
    assert dec.decode_splits(1, 1, 4096) == 3
    cpu = PagedDecoder(tiny_model("llama"), max_model_len=64)
    assert cpu.decode_splits(1, 1, 64) is None


def test_cpu_forward_uses_torch_linear_whatever_the_switches():
    dec = PagedDecoder(tiny_model("llama"), max_model_len=64)
    assert dec._linear_fn(1) is torch.nn.functional.linear  # no Triton on plain CPU tensors
    dec.fusions = DecodeFusions(skinny_gemm=False)
    assert dec._linear_fn(1) is torch.nn.functional.linear
