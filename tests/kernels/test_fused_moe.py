"""The fused-MoE op (top-k routing, expert-sorted pairs, grouped GEMMs) against its PyTorch reference.

On CPU the grouped-GEMM kernel runs in the Triton interpreter at small shapes."""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.fused_moe import fused_moe, fused_moe_reference, moe_align, route_topk

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: (2e-3, 2e-2), torch.bfloat16: (2e-2, 3e-2), torch.float32: (1e-4, 1e-4)}


def _problem(seed, tokens, hidden, inter, experts, top_k, dtype, renormalize=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(DEVICE, dtype)
    w1 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(DEVICE, dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(DEVICE, dtype)
    router = torch.randn(tokens, experts, generator=g).to(DEVICE)
    weights, ids = route_topk(router, top_k, renormalize)
    return x, w1, w2, weights, ids


def _dense(x, w1, w2, weights, ids):
    """Every token through every one of its experts, one at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w1[e].double().cpu() @ x[t].double().cpu()).chunk(2)
            out[t] += float(weights[t, j]) * (w2[e].double().cpu() @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("method", ["grouped", "small"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens,experts,top_k", [(1, 4, 2), (7, 8, 2), (37, 8, 4)])
def test_fused_moe_matches_reference(dtype, tokens, experts, top_k, method):
    x, w1, w2, weights, ids = _problem(tokens, tokens, 64, 48, experts, top_k, dtype)
    out = fused_moe(x, w1, w2, weights, ids, method=method)
    ref = fused_moe_reference(x, w1, w2, weights, ids)
    atol, rtol = TOL[dtype]
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=atol * 4, rtol=rtol)


def test_reference_equals_dense_per_token_math_fp32():
    x, w1, w2, weights, ids = _problem(3, 9, 32, 16, 4, 2, torch.float32, renormalize=False)
    torch.testing.assert_close(fused_moe_reference(x, w1, w2, weights, ids).double().cpu(), _dense(x, w1, w2, weights, ids),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["grouped", "small"])
def test_fp32_kernel_with_uneven_k_and_unused_experts(method):
    # hidden 40 (not a multiple of the K tile), inter 24 (nor that); 6 experts of which only two are routed to.
    x, w1, w2, _, _ = _problem(4, 11, 40, 24, 6, 2, torch.float32)
    ids = torch.tensor([[1, 4]] * 11, device=DEVICE)
    weights = torch.rand(11, 2, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got, ref = fused_moe(x, w1, w2, weights, ids, method=method), fused_moe_reference(x, w1, w2, weights, ids)
    # the interpreter multiplies in full fp32; a GPU's float32 tl.dot runs on the matrix units in tf32
    # (about 1e-3 relative, measured 3.6e-3 absolute on an H200), as Triton's default input precision says
    tol = 1e-4 if DEVICE == "cpu" else 1e-2
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)


def test_moe_align_sorts_pairs_by_expert_and_pads_each_run():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    sorted_ids, expert_ids = moe_align(ids, num_experts=4, block_m=4)
    pad = ids.numel()
    assert sorted_ids.shape[0] % 4 == 0 and sorted_ids.shape[0] >= pad + 4 * 3
    tiles = sorted_ids.view(-1, 4).tolist()
    flat = ids.flatten().tolist()
    seen = []
    for tile, e in zip(tiles, expert_ids.tolist()):
        real = [p for p in tile if p != pad]
        if e >= 4:
            assert not real
            continue
        assert all(flat[p] == e for p in real)
        seen += real
    assert sorted(seen) == list(range(pad))
    assert expert_ids.tolist()[:3] == [0, 1, 2]


def test_route_topk_renormalizes_like_mixtral():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    w, i = route_topk(logits, 2, True)
    assert i.tolist() == [[3, 2]] and torch.allclose(w.sum(-1), torch.ones(1))
    w2, _ = route_topk(logits, 2, False)
    assert w2.sum() < 1


def test_bad_shapes_are_refused():
    x, w1, w2, weights, ids = _problem(5, 3, 32, 16, 4, 2, torch.float32)
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        fused_moe(x, w1, w2[:, :, :8], weights, ids)
    with pytest.raises(InvalidArgumentError, match="top_k"):
        fused_moe(x, w1, w2, weights[:2], ids[:2])
    with pytest.raises(InvalidArgumentError, match="method"):
        fused_moe(x, w1, w2, weights, ids, method="fast")


# ---- Full size on a GPU: Mixtral-8x7B and Qwen3-30B-A3B layer shapes, random weights --------------------------
FULL_SHAPES = {"mixtral-8x7b": (4096, 14336, 8, 2), "qwen3-30b-a3b": (2048, 768, 128, 8)}  # H, I, E, top-k
_full_weights: dict = {}


def _full_size_weights(name):
    """float32 master weights of one shape, drawn on the GPU once per session (seeded)."""
    if name not in _full_weights:
        _full_weights.clear()  # one shape at a time (Mixtral's float32 experts are 5.6 GB)
        hidden, inter, experts, _ = FULL_SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        w1 = torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda").mul_(hidden ** -0.5)
        w2 = torch.randn(experts, hidden, inter, generator=g, device="cuda").mul_(inter ** -0.5)
        _full_weights[name] = (w1, w2)
    return _full_weights[name]


@pytest.mark.skipif(DEVICE != "cuda", reason="full-size shapes need a GPU")
@pytest.mark.parametrize("name", list(FULL_SHAPES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 16, 64, 512])
@pytest.mark.parametrize("method", ["grouped", "small"])
def test_fused_moe_full_size_on_gpu(name, dtype, tokens, method):
    """The kernel's output against the PyTorch reference in the same dtype, and both against a float32 result:
    the kernel may be no further from float32 than a small multiple of the reference's own rounding error."""
    if method == "small" and tokens > 64:
        pytest.skip("the few-token kernels are for decode batches")
    hidden, inter, experts, top_k = FULL_SHAPES[name]
    w1_32, w2_32 = _full_size_weights(name)
    g = torch.Generator().manual_seed(tokens)
    x32 = torch.randn(tokens, hidden, generator=g).cuda()
    weights, ids = route_topk(torch.randn(tokens, experts, generator=g).cuda(), top_k, True)
    x, w1, w2 = x32.to(dtype), w1_32.to(dtype), w2_32.to(dtype)
    out = fused_moe(x, w1, w2, weights, ids, method=method)
    ref = fused_moe_reference(x, w1, w2, weights, ids)
    truth = fused_moe_reference(x.float(), w1.float(), w2.float(), weights, ids)
    assert out.shape == x.shape and out.dtype == dtype and torch.isfinite(out).all()
    # same-dtype reference: outputs are O(1); fp16 keeps 11 bits, bf16 8, and each expert output is rounded
    atol, rtol = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 4e-2)}[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)
    err_out = (out.float() - truth).abs()
    err_ref = (ref.float() - truth).abs()
    assert err_out.mean() <= 1.5 * err_ref.mean() + 1e-5, (err_out.mean().item(), err_ref.mean().item())
    assert err_out.max() <= 2 * err_ref.max() + 1e-3, (err_out.max().item(), err_ref.max().item())
