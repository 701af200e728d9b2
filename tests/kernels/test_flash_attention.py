"""Dense FlashAttention-2 kernel (flash_attention, flash_attention_varlen) against its PyTorch reference.

On CPU the Triton kernel runs in the interpreter (tests/kernels/conftest.py) at small shapes; on a GPU
the same tests run compiled, plus full-size `gpu` tests against torch SDPA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.flash_attention import (
    flash_attention,
    flash_attention_reference,
    flash_attention_varlen,
    flash_attention_varlen_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 inputs go through TF32 tensor-core dots on a GPU (as torch matmul with TF32 allowed).
TOL = {torch.float16: (3e-3, 1e-2), torch.bfloat16: (2e-2, 2e-2),
       torch.float32: (5e-3, 1e-2) if DEVICE == "cuda" else (1e-4, 1e-4)}


def rand(seed: int, *shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(2, 2, 64), (6, 2, 128), (8, 1, 64)])
def test_dense_matches_reference(dtype, causal, heads, kv_heads, head_dim):
    # 37 is not a multiple of any tile size; batch 2 checks the batch strides.
    q = rand(1, 2, heads, 37, head_dim, dtype=dtype)
    k = rand(2, 2, kv_heads, 37, head_dim, dtype=dtype)
    v = rand(3, 2, kv_heads, 37, head_dim, dtype=dtype)
    close(flash_attention(q, k, v, causal=causal), flash_attention_reference(q, k, v, causal=causal), dtype)


@pytest.mark.parametrize("sq,sk", [(1, 50), (9, 40), (33, 17), (16, 16)])
def test_causal_is_bottom_right_aligned(sq, sk):
    # Sq < Sk: the queries are the last Sq positions. Sq > Sk: the first rows see no key (zeros).
    q, k, v = rand(4, 1, 4, sq, 64), rand(5, 1, 2, sk, 64), rand(6, 1, 2, sk, 64)
    out = flash_attention(q, k, v, causal=True)
    close(out, flash_attention_reference(q, k, v, causal=True), torch.float16)
    if sq > sk:
        assert out[:, :, : sq - sk].abs().max().item() == 0.0


def test_head_dim_80_non_contiguous_input_and_scale():
    # transformers hands q/k/v as transposes of [B, S, H, D] buffers.
    q = rand(7, 1, 21, 4, 80).transpose(1, 2)
    k = rand(8, 1, 21, 2, 80).transpose(1, 2)
    v = rand(9, 1, 21, 2, 80).transpose(1, 2)
    out = flash_attention(q, k, v, causal=True, softmax_scale=0.3)
    close(out, flash_attention_reference(q, k, v, causal=True, softmax_scale=0.3), torch.float16)


def test_reference_matches_sdpa():
    """The reference itself, checked against torch SDPA with an explicit bottom-right mask."""
    q, k, v = (t.cpu().float() for t in (rand(10, 2, 6, 7, 64), rand(11, 2, 2, 12, 64), rand(12, 2, 2, 12, 64)))
    mask = torch.ones(7, 12, dtype=torch.bool).tril(diagonal=5)
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=mask
    )
    torch.testing.assert_close(flash_attention_reference(q, k, v, causal=True), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_varlen_with_uneven_and_empty_sequences(causal, dtype):
    q_lens, k_lens = [5, 0, 19, 1], [5, 3, 30, 9]
    cu_q = torch.tensor([0, 5, 5, 24, 25], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 5, 8, 38, 47], dtype=torch.int32, device=DEVICE)
    q, k, v = rand(13, 25, 6, 64, dtype=dtype), rand(14, 47, 2, 64, dtype=dtype), rand(15, 47, 2, 64, dtype=dtype)
    args = (q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal)
    close(flash_attention_varlen(*args), flash_attention_varlen_reference(*args), dtype)


def test_varlen_equals_dense_per_sequence():
    q, k, v = rand(16, 2, 4, 24, 128), rand(17, 2, 4, 24, 128), rand(18, 2, 4, 24, 128)
    cu = torch.tensor([0, 24, 48], dtype=torch.int32, device=DEVICE)
    packed = [t.transpose(1, 2).reshape(48, 4, 128) for t in (q, k, v)]
    varlen = flash_attention_varlen(*packed, cu, cu, 24, 24, causal=True)
    dense = flash_attention(q, k, v, causal=True).transpose(1, 2).reshape(48, 4, 128)
    close(varlen, dense, torch.float16)


def test_rejects_head_counts_that_do_not_divide():
    q, k = torch.randn(1, 5, 4, 64), torch.randn(1, 2, 4, 64)
    with pytest.raises(InvalidArgumentError, match="num_kv_heads"):
        flash_attention(q, k, k)
    with pytest.raises(InvalidArgumentError, match="head size"):
        flash_attention(q, torch.randn(1, 5, 4, 32), torch.randn(1, 5, 4, 32))


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_full_size_against_sdpa(dtype, causal):
    q, k, v = (rand(30 + i, 2, 32, 2048, 128, dtype=dtype) for i in range(3))
    out = flash_attention(q, k, v, causal=causal)
    close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal), dtype)


@pytest.mark.gpu
@gpu
def test_gpu_gqa_varlen_full_size():
    lens = [2048, 1000, 17, 513]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q, k, v = rand(40, sum(lens), 32, 128), rand(41, sum(lens), 8, 128), rand(42, sum(lens), 8, 128)
    args = (q, k, v, cu, cu, max(lens), max(lens), True)
    close(flash_attention_varlen(*args), flash_attention_varlen_reference(*args), torch.float16)
