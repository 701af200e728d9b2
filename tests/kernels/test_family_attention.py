"""Attention features the model families need (issue 18): Gemma 2's logit soft-capping, its scale from
query_pre_attn_scalar, per-layer sliding windows; unified_attention (interpreter on CPU) against its reference."""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.flash_attention import masked_softmax_attention
from optimum_amdx.kernels.paged_attention import unified_attention, unified_attention_reference

from .test_paged_attention import check, make_batch


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softcap_decode_and_prefill(dtype, num_splits):
    # Large-magnitude queries so the cap (tanh) really bends the scores.
    batch = make_batch(11, [40, 19, 33], [1, 19, 6], 4, 2, 64, 16, dtype)
    batch["q"] = batch["q"] * 4
    check(batch, dtype, softcap=5.0, softmax_scale=24 ** -0.5, num_splits=num_splits)


def test_softcap_with_window_and_head_dim_256():
    # Gemma 2's sliding layers: head_dim 256, query_pre_attn_scalar 256, cap 50, window 4096 (here 12).
    batch = make_batch(12, [50, 9], [5, 9], 4, 2, 256, 16, torch.bfloat16)
    check(batch, torch.bfloat16, softcap=50.0, softmax_scale=256 ** -0.5, sliding_window=12)


def test_softcap_changes_the_result_and_a_huge_cap_does_not():
    batch = make_batch(13, [30], [4], 2, 1, 64, 16, torch.float32)
    batch["q"] = batch["q"] * 6
    plain = unified_attention(**batch)
    capped = unified_attention(**batch, softcap=2.0)
    assert (plain - capped).abs().max() > 1e-2
    torch.testing.assert_close(unified_attention(**batch, softcap=1e6), plain, atol=1e-4, rtol=1e-4)


def test_reference_softcap_is_tanh_of_scaled_scores():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 8, generator=g) * 3 for _ in range(3))
    pos = torch.arange(3)
    got = masked_softmax_attention(q, k, v, pos, 0.5, True, None, softcap=1.5)
    scores = torch.einsum("qhd,khd->hqk", q, k) * 0.5
    scores = torch.tanh(scores / 1.5) * 1.5
    scores = scores.masked_fill(~torch.ones(3, 3, dtype=torch.bool).tril()[None], float("-inf"))
    expected = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    torch.testing.assert_close(got, expected)


def test_bad_softcap_and_window_are_refused():
    batch = make_batch(14, [4], [1], 2, 1, 64, 16, torch.float32, device="cpu")
    with pytest.raises(InvalidArgumentError, match="softcap"):
        unified_attention(**batch, softcap=0.0)
    with pytest.raises(InvalidArgumentError, match="sliding_window"):
        unified_attention(**batch, sliding_window=0)
    assert unified_attention_reference(**batch, softcap=3.0).shape == batch["q"].shape
