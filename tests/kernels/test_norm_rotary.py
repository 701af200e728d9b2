"""RMSNorm (with and without the residual add) and in-place rotary embedding vs their references.

The references are themselves checked against transformers' LlamaRMSNorm and apply_rotary_pos_emb.
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.rmsnorm import rms_norm, rms_norm_reference
from optimum_amdx.kernels.rotary import rotary_embedding_, rotary_embedding_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.bfloat16]


def _rand(*shape, seed, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(DEVICE)


def test_rms_norm_reference_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(96, eps=1e-6)
    norm.weight.data = _rand(96, seed=1).cpu()
    x = _rand(4, 7, 96, seed=2, dtype=torch.bfloat16).cpu()
    torch.testing.assert_close(rms_norm_reference(x, norm.weight, 1e-6), norm(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [96, 577, 1024])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_matches_reference(dtype, hidden, residual):
    x = _rand(3, 5, hidden, seed=hidden, dtype=dtype, scale=3.0)
    w = _rand(hidden, seed=hidden + 1, dtype=dtype)
    r = _rand(3, 5, hidden, seed=hidden + 2, dtype=dtype) if residual else None
    got = rms_norm(x, w, 1e-5, r)
    ref = rms_norm_reference(x, w, 1e-5, r)
    if residual:
        torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
        got, ref = got[0], ref[0]
    assert got.dtype == dtype and got.shape == x.shape
    # one rounding step of the output dtype, scaled by |weight|
    torch.testing.assert_close(got, ref, rtol=1e-2 if dtype == torch.float16 else 2e-2, atol=1e-2)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden", [96, 577])
def test_rms_norm_gathers_its_output_through_perm(residual, hidden):
    """With `perm` the normalized row comes out in the permutation's order (what an act-order GPTQ
    projection reads) and the residual sum stays in the natural order, in one pass."""
    x = _rand(3, hidden, seed=hidden, dtype=torch.float16, scale=3.0)
    w = _rand(hidden, seed=hidden + 1, dtype=torch.float16)
    r = _rand(3, hidden, seed=hidden + 2, dtype=torch.float16) if residual else None
    perm = torch.randperm(hidden, generator=torch.Generator().manual_seed(hidden)).to(torch.int32).to(DEVICE)
    plain = rms_norm(x, w, 1e-5, r)
    got = rms_norm(x, w, 1e-5, r, perm=perm)
    ref = rms_norm_reference(x, w, 1e-5, r, perm=perm)
    if residual:
        torch.testing.assert_close(got[1], plain[1], rtol=0, atol=0)  # h: natural order, exact
        torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
        got, ref, plain = got[0], ref[0], plain[0]
    assert got.shape == x.shape and got.dtype == torch.float16
    # the same values as the plain norm, moved: only the float32 sum of squares may differ in its order
    torch.testing.assert_close(got, plain[..., perm.long()], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)


def test_rms_norm_fp32_weight_promotes_and_single_row():
    x = _rand(1, 333, seed=7, dtype=torch.float16)
    w = _rand(333, seed=8)
    got = rms_norm(x, w, 1e-6)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, rms_norm_reference(x, w, 1e-6), rtol=2e-3, atol=2e-3)


def test_rms_norm_rejects_bad_shapes():
    x = _rand(2, 64, seed=1, dtype=torch.float16)
    with pytest.raises(InvalidArgumentError, match="weight"):
        rms_norm(x, _rand(32, seed=2, dtype=torch.float16), 1e-6)
    with pytest.raises(InvalidArgumentError, match="residual"):
        rms_norm(x, _rand(64, seed=2, dtype=torch.float16), 1e-6, _rand(3, 64, seed=3, dtype=torch.float16))
    with pytest.raises(InvalidArgumentError, match="perm"):
        rms_norm(x, _rand(64, seed=2, dtype=torch.float16), 1e-6, perm=torch.arange(32, device=DEVICE))


def _tables(max_pos: int, rot_dim: int, base: float = 10000.0):
    inv = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def test_rotary_reference_matches_transformers_rotate_half():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    t, hq, hk, d = 6, 4, 2, 32
    q = _rand(t, hq, d, seed=1).cpu()
    k = _rand(t, hk, d, seed=2).cpu()
    cos, sin = (c.cpu() for c in _tables(64, d))
    pos = torch.tensor([0, 5, 9, 17, 33, 63])
    emb_cos = torch.cat([cos[pos], cos[pos]], dim=-1)[None]  # HF: [batch, seq, d]
    emb_sin = torch.cat([sin[pos], sin[pos]], dim=-1)[None]
    hq_out, hk_out = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb_cos, emb_sin)
    q2, k2 = q.clone(), k.clone()
    rotary_embedding_reference(q2, k2, cos, sin, pos)
    torch.testing.assert_close(q2, hq_out[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k2, hk_out[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_rotary_gptj_pairs_adjacent_features():
    q = _rand(1, 1, 4, seed=3)
    k = _rand(1, 1, 4, seed=4)
    cos = torch.tensor([[0.0, 1.0]], device=DEVICE)
    sin = torch.tensor([[1.0, 0.0]], device=DEVICE)
    q0 = q.clone()
    rotary_embedding_(q, k, cos, sin, torch.zeros(1, dtype=torch.int64, device=DEVICE), interleaved=True)
    # pair (0, 1) rotated by 90 degrees, pair (2, 3) untouched
    torch.testing.assert_close(q[0, 0], torch.stack([-q0[0, 0, 1], q0[0, 0, 0], q0[0, 0, 2], q0[0, 0, 3]]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("hq,hk,d,rot", [(4, 4, 64, 64), (9, 3, 64, 32), (8, 1, 128, 128), (6, 2, 80, 48)])
def test_rotary_matches_reference(dtype, interleaved, hq, hk, d, rot):
    t = 7
    q = _rand(t, hq, d, seed=hq * d, dtype=dtype)
    k = _rand(t, hk, d, seed=hk * d + 1, dtype=dtype)
    cos, sin = _tables(128, rot)
    pos = torch.randint(0, 128, (t,), generator=torch.Generator().manual_seed(rot)).to(DEVICE)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_reference(q_ref, k_ref, cos, sin, pos, interleaved)
    q0 = q.clone()
    rotary_embedding_(q, k, cos, sin, pos, interleaved)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=2e-2, atol=3e-2)
    torch.testing.assert_close(q, q_ref, **tol)
    torch.testing.assert_close(k, k_ref, **tol)
    if rot < d:
        assert torch.equal(q[..., rot:], q0[..., rot:])
    assert not torch.equal(q[..., :rot], q0[..., :rot])


def test_rotary_on_views_of_a_fused_qkv_projection():
    t, hq, hk, d = 5, 6, 2, 64
    qkv = _rand(t, (hq + 2 * hk) * d, seed=11, dtype=torch.float16)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    v_before = qkv[:, (hq + hk) * d :].clone()
    cos, sin = _tables(32, d)
    pos = torch.arange(t, device=DEVICE) * 3
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_reference(q_ref, k_ref, cos, sin, pos)
    rotary_embedding_(q, k, cos, sin, pos)
    torch.testing.assert_close(q, q_ref, rtol=0, atol=1e-2)
    torch.testing.assert_close(k, k_ref, rtol=0, atol=1e-2)
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before)


def test_rotary_rejects_bad_shapes():
    q = _rand(3, 2, 16, seed=1)
    k = _rand(3, 2, 16, seed=2)
    cos, sin = _tables(8, 32)
    with pytest.raises(InvalidArgumentError, match="exceeds head_dim"):
        rotary_embedding_(q, k, cos, sin, torch.zeros(3, dtype=torch.int64, device=DEVICE))
    cos, sin = _tables(8, 16)
    with pytest.raises(InvalidArgumentError, match="positions"):
        rotary_embedding_(q, k, cos, sin, torch.zeros(4, dtype=torch.int64, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_full_size_on_gpu():
    x = _rand(4096, 4096, seed=1, dtype=torch.float16)
    r = _rand(4096, 4096, seed=2, dtype=torch.float16)
    w = _rand(4096, seed=3, dtype=torch.float16)
    y, h = rms_norm(x, w, 1e-6, r)
    y_ref, h_ref = rms_norm_reference(x, w, 1e-6, r)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, rtol=1e-2, atol=1e-2)
    perm = torch.randperm(4096, generator=torch.Generator().manual_seed(7)).to(torch.int32).to(DEVICE)
    y_p, h_p = rms_norm(x, w, 1e-6, r, perm=perm)
    torch.testing.assert_close(h_p, h_ref, rtol=0, atol=0)
    torch.testing.assert_close(y_p, y[:, perm.long()], rtol=1e-3, atol=1e-3)
    q = _rand(4096, 32, 128, seed=4, dtype=torch.bfloat16)
    k = _rand(4096, 8, 128, seed=5, dtype=torch.bfloat16)
    cos, sin = _tables(8192, 128)
    pos = torch.randint(0, 8192, (4096,), generator=torch.Generator().manual_seed(6)).to(DEVICE)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_reference(q_ref, k_ref, cos, sin, pos)
    rotary_embedding_(q, k, cos, sin, pos)
    torch.testing.assert_close(q, q_ref, rtol=2e-2, atol=3e-2)
    torch.testing.assert_close(k, k_ref, rtol=2e-2, atol=3e-2)
