"""PagedDecoder's decode-step choices that need no GPU to check: the attention split switch and the
fusion switches' fallbacks on CPU (the kernels themselves are tested in tests/kernels)."""

from __future__ import annotations

import torch

from optimum_amdx.modeling.paged_model import DecodeFusions, PagedDecoder

from .conftest import tiny_model


def test_decode_splits_switch():
    """Decode steps leave the split count to the attention kernel's rule (None) unless the switch names one
    (0 = no split); other steps always do."""
    dec = PagedDecoder(tiny_model("llama"), max_model_len=64)
    assert dec.decode_splits(1) is None
    dec.fusions = DecodeFusions(decode_splits=0)
    assert dec.decode_splits(1) == 1
    dec.fusions = DecodeFusions(decode_splits=3)
    assert dec.decode_splits(1) == 3
    assert dec.decode_splits(7) is None  # not a pure decode step


def test_cpu_forward_uses_torch_linear_whatever_the_switches():
    dec = PagedDecoder(tiny_model("llama"), max_model_len=64)
    assert dec._linear_fn(1) is torch.nn.functional.linear  # no Triton on plain CPU tensors
    dec.fusions = DecodeFusions(skinny_gemm=False)
    assert dec._linear_fn(1) is torch.nn.functional.linear
