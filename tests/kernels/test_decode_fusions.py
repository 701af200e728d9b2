"""The decode step's fused kernels against their PyTorch references (interpreter on CPU, Triton on a GPU):
rotary + paged-cache write, SiLU(gate) * up, and the skinny GEMM.

The references are themselves checked against the unfused ops the decoder used before
(`rotary_embedding_reference` + `reshape_and_cache_reference`, ``act(gate) * up``, ``F.linear``).
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.act_mul import silu_and_mul, silu_and_mul_reference
from optimum_amdx.kernels.rope_cache import rotary_and_cache_, rotary_and_cache_reference
from optimum_amdx.kernels.skinny_gemm import MAX_M, skinny_gemm, skinny_gemm_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.bfloat16]


def _rand(*shape, seed, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(DEVICE)


def _tables(max_pos: int, half: int):
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def _rope_case(tokens, hq, hk, d, half, dtype, seed, num_blocks=6, block=4):
    qkv = _rand(tokens, (hq + 2 * hk) * d, seed=seed, dtype=dtype)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    v = qkv[:, (hq + hk) * d:].view(tokens, hk, d)
    cos, sin = _tables(64, half)
    g = torch.Generator().manual_seed(seed + 1)
    positions = torch.randint(0, 64, (tokens,), generator=g).to(DEVICE)
    slots = torch.randperm(num_blocks * block, generator=g)[:tokens].to(DEVICE)
    slots[0] = -1  # a padding row writes nowhere
    kc = _rand(num_blocks, block, hk, d, seed=seed + 2, dtype=dtype)
    vc = _rand(num_blocks, block, hk, d, seed=seed + 3, dtype=dtype)
    return qkv, q, k, v, cos, sin, positions, slots, kc, vc



@pytest.fixture(autouse=True)
def _skinny_gemm_in_the_interpreter(monkeypatch):
    """The engine takes the skinny GEMM only on GPU families; here the interpreter ("cpu") takes it too,
    so these tests run the kernel itself (directly and inside the decoder)."""
    from optimum_amdx.kernels import _skinny_gemm_triton

    monkeypatch.setitem(_skinny_gemm_triton._FAMILY_MAX_M, "cpu", MAX_M)

def test_rope_cache_reference_matches_the_unfused_ops():
    from optimum_amdx.kernels.paged_attention import reshape_and_cache_reference
    from optimum_amdx.kernels.rotary import rotary_embedding_reference

    qkv, q, k, v, cos, sin, pos, slots, kc, vc = _rope_case(5, 4, 2, 16, 8, torch.float32, seed=3)
    q2, k2, kc2, vc2 = q.clone(), k.clone(), kc.clone(), vc.clone()
    k_before = k.clone()
    rotary_and_cache_reference(q, k, v, cos, sin, pos, kc, vc, slots)
    rotary_embedding_reference(q2, k2, cos, sin, pos)
    reshape_and_cache_reference(k2, v, kc2, vc2, slots)
    torch.testing.assert_close(q, q2, rtol=0, atol=0)
    torch.testing.assert_close(kc, kc2, rtol=0, atol=0)
    torch.testing.assert_close(vc, vc2, rtol=0, atol=0)
    torch.testing.assert_close(k, k_before, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk,d,half", [(4, 2, 16, 8), (3, 3, 32, 16), (4, 1, 32, 8)])  # GQA, MHA, partial rotary
def test_rope_cache_matches_reference(dtype, hq, hk, d, half):
    case = _rope_case(6, hq, hk, d, half, dtype, seed=hq * 100 + d)
    qkv, q, k, v, cos, sin, pos, slots, kc, vc = case
    ref = [t.clone() for t in (qkv, kc, vc)]
    rq = ref[0][:, : hq * d].view(6, hq, d)
    rk = ref[0][:, hq * d:(hq + hk) * d].view(6, hk, d)
    rv = ref[0][:, (hq + hk) * d:].view(6, hk, d)
    rotary_and_cache_reference(rq, rk, rv, cos, sin, pos, ref[1], ref[2], slots)
    rotary_and_cache_(q, k, v, cos, sin, pos, kc, vc, slots)
    tol = dict(rtol=0, atol=1e-2 if dtype == torch.bfloat16 else 2e-3)  # one rounding of a float32 FMA
    torch.testing.assert_close(q, rq, **tol)
    torch.testing.assert_close(kc, ref[1], **tol)
    torch.testing.assert_close(vc, ref[2], rtol=0, atol=0)
    torch.testing.assert_close(k, rk, rtol=0, atol=0)  # k itself is left as it was


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk,d,half", [(4, 2, 16, 8), (4, 1, 32, 8)])  # GQA, partial rotary
def test_rope_cache_reads_and_zeroes_a_float32_accumulator(dtype, hq, hk, d, half):
    """A q/k/v accumulator: the same caches and rotated q as the in-place kernel on the sums rounded to the
    activation dtype, bit for bit (q into a new tensor, the tail of partial rotary included), and the
    accumulator zeroed, the padding row's included."""
    from optimum_amdx.kernels.rope_cache import rotary_and_cache_accumulated

    qkv16, q, k, v, cos, sin, pos, slots, kc, vc = _rope_case(6, hq, hk, d, half, dtype, seed=hq * 10 + d)
    acc = (qkv16.float() + _rand(*qkv16.shape, seed=5, scale=1e-3)).contiguous()  # sums between half values
    plain = acc.to(dtype)
    pq = plain[:, : hq * d].view(6, hq, d)
    pk = plain[:, hq * d:(hq + hk) * d].view(6, hk, d)
    pv = plain[:, (hq + hk) * d:].view(6, hk, d)
    kc2, vc2 = kc.clone(), vc.clone()
    rotary_and_cache_(pq, pk, pv, cos, sin, pos, kc, vc, slots)
    got = rotary_and_cache_accumulated(acc, hq, hk, cos, sin, pos, kc2, vc2, slots, dtype)
    assert got.dtype == dtype and got.shape == (6, hq, d)
    torch.testing.assert_close(got, pq, rtol=0, atol=0)
    torch.testing.assert_close(kc2, kc, rtol=0, atol=0)
    torch.testing.assert_close(vc2, vc, rtol=0, atol=0)
    assert float(acc.abs().sum()) == 0.0
    with pytest.raises(InvalidArgumentError, match="float32 accumulator"):
        rotary_and_cache_accumulated(plain, hq, hk, cos, sin, pos, kc2, vc2, slots, dtype)


def test_rope_cache_rejects_mismatched_cache():
    _, q, k, v, cos, sin, pos, slots, kc, vc = _rope_case(3, 4, 2, 16, 8, torch.float16, seed=1)
    with pytest.raises(InvalidArgumentError, match="caches"):
        rotary_and_cache_(q, k, v, cos, sin, pos, kc[..., :8], vc[..., :8], slots)


def test_silu_and_mul_reference_matches_the_unfused_ops():
    x = _rand(3, 64, seed=4, dtype=torch.float16)
    act = torch.nn.SiLU()
    torch.testing.assert_close(silu_and_mul_reference(x), act(x[:, :32]) * x[:, 32:], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2 * 40), (5, 2 * 1100), (2, 3, 2 * 64)])
def test_silu_and_mul_matches_reference(dtype, shape):
    x = _rand(*shape, seed=shape[-1], dtype=dtype, scale=3.0)
    got = silu_and_mul(x)
    ref = silu_and_mul_reference(x)
    assert got.shape == ref.shape and got.dtype == dtype
    # SiLU rounded to the dtype, then one more rounding: at most one ulp apart where exp differs
    torch.testing.assert_close(got, ref, rtol=1e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-3)


def test_silu_and_mul_rejects_odd_width():
    with pytest.raises(InvalidArgumentError, match="2 \\* intermediate"):
        silu_and_mul(_rand(2, 7, seed=1, dtype=torch.float16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,bias", [(1, 40, 96, False), (1, 48, 80, True), (3, 33, 64, True), (MAX_M, 64, 48, False)])
def test_skinny_gemm_matches_reference(dtype, m, n, k, bias):
    x = _rand(m, k, seed=m + n, dtype=dtype)
    w = _rand(n, k, seed=n + k, dtype=dtype, scale=0.1)
    b = _rand(n, seed=k, dtype=dtype) if bias else None
    got = skinny_gemm(x, w, b)
    ref = skinny_gemm_reference(x.float(), w.float(), None if b is None else b.float())
    assert got.shape == (m, n) and got.dtype == dtype
    err = (got.float() - ref).norm() / ref.norm()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), f"relative error {err:.2e}"


def test_skinny_gemm_keeps_leading_dims_and_falls_back_above_max_m():
    x = _rand(2, 1, 32, seed=1, dtype=torch.float16)
    w = _rand(24, 32, seed=2, dtype=torch.float16)
    torch.testing.assert_close(skinny_gemm(x, w), skinny_gemm_reference(x.float(), w.float()).half(), rtol=2e-3, atol=2e-3)
    big = _rand(MAX_M + 1, 32, seed=3, dtype=torch.float16)
    torch.testing.assert_close(skinny_gemm(big, w), skinny_gemm_reference(big, w), rtol=0, atol=0)


def test_skinny_gemm_rejects_bad_shapes():
    with pytest.raises(InvalidArgumentError, match="do not multiply"):
        skinny_gemm(_rand(1, 32, seed=1, dtype=torch.float16), _rand(24, 16, seed=2, dtype=torch.float16))


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter end-to-end check; tests/modeling/test_gpu.py covers the GPU")
def test_decoder_with_fusions_generates_what_transformers_and_the_unfused_path_do():
    """A tiny fp32 Llama through every Triton kernel (interpreter), fused and unfused, against
    transformers' greedy continuation: the fused step (rotary+cache, SiLU*up, skinny GEMM for the
    decode rows) must produce the same tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from optimum_amdx.modeling import AMDModelForCausalLM
    from optimum_amdx.modeling.paged_model import DecodeFusions

    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                  max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    prompt = [5, 17, 3, 99, 42, 7]
    with torch.no_grad():
        ids = torch.tensor([prompt])
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                            pad_token_id=0)[0, len(prompt):].tolist()
    outs = {}
    variants = (("fused", DecodeFusions(act_gemm=True, norm_gemm=True)), ("default", DecodeFusions()),
                ("unfused", DecodeFusions(False, False, False, 0)))
    for name, fusions in variants:
        am = AMDModelForCausalLM(model, num_blocks=16, block_size=4, max_num_seqs=2, max_model_len=64)
        am.decoder.fusions = fusions
        outs[name] = am.generate([prompt], max_new_tokens=5, do_sample=False)[0]
    assert outs["fused"] == hf
    assert outs["default"] == hf
    assert outs["unfused"] == hf


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5])
def test_skinny_gemm_with_silu_mul_prologue_matches_reference(dtype, m):
    gate_up = _rand(m, 2 * 96, seed=m, dtype=dtype, scale=2.0)
    w = _rand(40, 96, seed=m + 1, dtype=dtype, scale=0.1)
    got = skinny_gemm(gate_up, w, act_mul=True)
    ref = skinny_gemm_reference(gate_up, w, act_mul=True).float()
    err = (got.float() - ref).norm() / ref.norm()
    assert got.shape == (m, 40) and err < (1e-2 if dtype == torch.bfloat16 else 2e-3), f"relative error {err:.2e}"


def test_skinny_gemm_family_table():
    from optimum_amdx.kernels._skinny_gemm_triton import has_config, tuned_config

    assert has_config("hopper", 1, 4096, 4096) and has_config("hopper", 16, 128256, 4096)
    assert not has_config("hopper", 1, 1000, 4096)  # unmeasured shape: cuBLAS
    assert not has_config("hopper", 4, 28672, 4096)  # measured slower than cuBLAS: cuBLAS
    assert not has_config("hopper", 17, 4096, 4096)
    assert has_config("cdna3", 8, 1000, 4096) and not has_config("cdna3", 9, 1000, 4096)
    assert not has_config("nvidia", 1, 4096, 4096)
    assert tuned_config("hopper", 3, 4096, 4096, 132)["BLOCK_N"] == 32  # bucket 4 entry
    cfg = tuned_config("cdna3", 1, 4096, 11008, 304)
    assert 11008 % cfg["BLOCK_K"] == 0 and cfg["BLOCK_N"] * cfg["BLOCK_K"] <= 16384


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="full-size weights: a GPU check of the tuned table")
def test_every_tuned_hopper_config_multiplies_right_at_its_shape():
    """Each measured (N, K, rows) entry, at its real size, through its own config (a K no tile divides, as
    Llama-2-7B's 11008 with 512-wide tiles, takes the masked tail)."""
    from optimum_amdx.kernels._skinny_gemm_triton import _TUNED, skinny_gemm_triton

    for (family, n, k, rows), cfg in sorted(_TUNED.items()):
        x = _rand(rows, k, seed=rows, dtype=torch.float16)
        w = (torch.randn(n, k, device=DEVICE) * 0.02).half()
        got = skinny_gemm_triton(x, w, None, family, cfg).float()
        ref = torch.nn.functional.linear(x.float(), w.float())
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 2e-3, (n, k, rows, cfg, err)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 96), (1, 80), (6, 64)])
def test_skinny_gemm_with_add_rmsnorm_prologue_matches_reference(dtype, m, k):
    from optimum_amdx.kernels.skinny_gemm import skinny_gemm_norm, skinny_gemm_norm_reference

    x = _rand(m, k, seed=m + k, dtype=dtype, scale=2.0)
    r = _rand(m, k, seed=m + k + 1, dtype=dtype)
    nw = _rand(k, seed=k, dtype=dtype)
    w = _rand(48, k, seed=k + 2, dtype=dtype, scale=0.1)
    b = _rand(48, seed=k + 3, dtype=dtype)
    y, h = skinny_gemm_norm(x, r, nw, 1e-5, w, b)
    y_ref, h_ref = skinny_gemm_norm_reference(x, r, nw, 1e-5, w, b)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)  # the residual is exact
    err = (y.float() - y_ref.float()).norm() / y_ref.float().norm()
    assert y.shape == (m, 48) and err < (1e-2 if dtype == torch.bfloat16 else 3e-3), f"relative error {err:.2e}"


def test_skinny_gemm_norm_reference_matches_rms_norm_then_linear():
    from optimum_amdx.kernels.rmsnorm import rms_norm_reference
    from optimum_amdx.kernels.skinny_gemm import skinny_gemm_norm_reference

    x, r = _rand(3, 32, seed=1, dtype=torch.float16), _rand(3, 32, seed=2, dtype=torch.float16)
    nw, w = _rand(32, seed=3, dtype=torch.float16), _rand(8, 32, seed=4, dtype=torch.float16)
    normed, h = rms_norm_reference(x, nw, 1e-6, r)
    y, h2 = skinny_gemm_norm_reference(x.cpu(), r.cpu(), nw.cpu(), 1e-6, w.cpu())
    torch.testing.assert_close(h2, h.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(y, torch.nn.functional.linear(normed.cpu().float(), w.cpu().float()).half(),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter end-to-end check; tests/modeling/test_gpu.py covers the GPU")
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_reads_and_zeroes_a_float32_accumulator(dtype):
    """`accumulated_dtype`: the float32 sums are read rounded to the activation dtype, exactly as the
    matmul's own output would have been, and the accumulator is left zeroed for the next matmul."""
    acc = _rand(2, 2 * 300, seed=8, scale=3.0).contiguous()
    plain = silu_and_mul(acc.to(dtype))  # the same kernel on the rounded sums: bit for bit
    out = silu_and_mul(acc, accumulated_dtype=dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(out, plain, rtol=0, atol=0)
    assert float(acc.abs().sum()) == 0.0
    with pytest.raises(InvalidArgumentError, match="float32"):
        silu_and_mul(acc.to(dtype), accumulated_dtype=dtype)


@pytest.mark.parametrize("perm", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_reads_and_zeroes_a_float32_accumulator(dtype, perm):
    from optimum_amdx.kernels.rmsnorm import rms_norm

    hidden = 192
    acc = _rand(3, hidden, seed=9, scale=2.0).contiguous()
    residual = _rand(3, hidden, seed=10, dtype=dtype)
    weight = _rand(hidden, seed=11, dtype=dtype)
    order = torch.randperm(hidden, generator=torch.Generator().manual_seed(4)).to(DEVICE) if perm else None
    y_plain, h_plain = rms_norm(acc.to(dtype), weight, 1e-6, residual=residual, perm=order)  # bit for bit
    y, h = rms_norm(acc, weight, 1e-6, residual=residual, perm=order, accumulated=True)
    assert y.dtype == y_plain.dtype and h.dtype == dtype
    torch.testing.assert_close(h, h_plain, rtol=0, atol=0)
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)
    assert float(acc.abs().sum()) == 0.0
    with pytest.raises(InvalidArgumentError, match="residual"):
        rms_norm(acc, weight, 1e-6, accumulated=True)


@pytest.mark.parametrize("accumulated", [False, True])
def test_silu_and_mul_writes_the_w4a16_pair_order(accumulated):
    """``paired=True``: the same values in `w4a16.pair_order` (each 128-value block's halves interleaved), for a
    down projection that reads them as pairs; an accumulator is still left zeroed."""
    from optimum_amdx.kernels.w4a16 import pair_order

    gate_up = _rand(2, 2 * 384, seed=12, scale=3.0).contiguous()  # 384: the kernel's 512-wide block is masked
    dtype = torch.float16
    plain = silu_and_mul(gate_up.to(dtype))
    if accumulated:
        out = silu_and_mul(gate_up, accumulated_dtype=dtype, paired=True)
        assert float(gate_up.abs().sum()) == 0.0
    else:
        out = silu_and_mul(gate_up.to(dtype), paired=True)
    torch.testing.assert_close(out, plain[:, pair_order(384, plain.device)], rtol=0, atol=0)
    with pytest.raises(InvalidArgumentError, match="multiple of 128"):
        silu_and_mul(_rand(1, 2 * 200, seed=1, dtype=dtype), paired=True)


@pytest.mark.parametrize("perm,residual,accumulated", [(False, False, False), (True, True, False),
                                                       (False, True, True), (True, True, True)])
def test_rms_norm_writes_the_w4a16_pair_order(perm, residual, accumulated):
    """``paired=True``: the normalized row (after `perm`) in `w4a16.pair_order`; h stays in order. (Without perm
    the kernel sums the squares in another order: within one fp16 rounding of the plain output.)"""
    from optimum_amdx.kernels.rmsnorm import rms_norm
    from optimum_amdx.kernels.w4a16 import pair_order

    hidden, dtype = 384, torch.float16
    x = _rand(2, hidden, seed=13, scale=2.0)
    r = _rand(2, hidden, seed=14, dtype=dtype) if residual else None
    weight = _rand(hidden, seed=15, dtype=dtype)
    order = torch.randperm(hidden, generator=torch.Generator().manual_seed(6)).to(DEVICE) if perm else None
    plain = rms_norm(x.to(dtype), weight, 1e-6, residual=r, perm=order)
    if accumulated:
        got = rms_norm(x.contiguous(), weight, 1e-6, residual=r, perm=order, accumulated=True, paired=True)
        assert float(x.abs().sum()) == 0.0
    else:
        got = rms_norm(x.to(dtype), weight, 1e-6, residual=r, perm=order, paired=True)
    y_plain, y = (plain[0], got[0]) if residual else (plain, got)
    torch.testing.assert_close(y, y_plain[:, pair_order(hidden, y.device)], rtol=1e-3, atol=0)
    if residual:
        torch.testing.assert_close(got[1], plain[1], rtol=0, atol=0)
    with pytest.raises(InvalidArgumentError, match="multiple of 128"):
        rms_norm(_rand(1, 200, seed=1, dtype=dtype), _rand(200, seed=2, dtype=dtype), 1e-6, paired=True)


def test_gptq_decoder_accumulating_projections_generates_the_same_tokens(monkeypatch):
    """A tiny act-order GPTQ Llama in fp16 through the kernels: q/k/v, o_proj, gate/up and down left in float32
    accumulators (read and zeroed by the rotary + cache kernel, the norm, SiLU * up after them) give the tokens
    of the decoder that flushes every matmul, and of transformers; decode steps take the accumulating path."""
    from optimum_amdx.kernels import w4a16
    from optimum_amdx.modeling import AMDModelForCausalLM

    from ..modeling.conftest import hf_greedy
    from ..modeling.test_act_order import act_order_model

    model = act_order_model(seed=5).half()
    prompt = [9, 4, 33, 2, 71, 8]
    expected = hf_greedy(model, prompt, 4)  # transformers on the CPU
    model = model.to(DEVICE)
    calls = []
    real = w4a16.w4a16_accumulate
    monkeypatch.setattr(w4a16, "w4a16_accumulate", lambda *a, **k: calls.append(a[1].out_features) or real(*a, **k))
    outs = {}
    graphs = False
    for on in (True, False):
        am = AMDModelForCausalLM(model, num_blocks=16, block_size=4, max_num_seqs=2, max_model_len=64)
        am.decoder.fusions.accumulate = on
        outs[on] = am.generate([prompt], max_new_tokens=4, do_sample=False)[0]
        if on:
            graphs = am.engine.uses_graphs
            cfg = model.config
            hidden, inter, head_dim = cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size // cfg.num_attention_heads
            qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * head_dim
            assert sorted(set(calls)) == sorted({qkv, hidden, 2 * inter}), calls  # q/k/v, o_proj / down, gate/up
            assert all(float(b.abs().sum()) == 0.0 for b in w4a16._ACCUMULATORS.values())
    # Eager steps: 3 one-row decode steps, and the 6-row prompt step where an accumulating route takes 6 rows
    # (the interpreter's stream kernel; on a GPU only if the dispatcher picks an accumulating route); 4 projections a
    # layer. With graphs the calls are those of the captures instead (one-row decode graphs, and the last layer
    # of the one-slot prompt graphs), checked by the set above.
    o_proj = model.model.layers[0].self_attn.o_proj.kernel_weight()
    prompt_step = w4a16.accumulating_route(torch.zeros(6, o_proj.in_features, dtype=torch.float16, device=DEVICE),
                                          o_proj) is not None
    if not graphs:
        assert len(calls) == (3 + prompt_step) * 4 * model.config.num_hidden_layers
    assert outs[True] == outs[False]
    if DEVICE == "cpu":  # the interpreter's kernels follow transformers' rounding (a GPU may break a near-tie)
        assert outs[True] == expected


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="the paired inputs feed the packed one-row loop (NVIDIA PTX)")
@pytest.mark.parametrize("group", [32, 128])
def test_gptq_decoder_with_paired_inputs_generates_the_same_tokens(monkeypatch, group):
    """An act-order GPTQ Llama whose sizes are multiples of 128 (so every one-row projection can take paired
    input): the decode steps' norms and SiLU * up write the W4A16 pair order (after the act-order gathers) and the
    one-row matmuls read it, with the tokens of the same decoder without pairs."""
    from optimum_amdx.kernels import w4a16
    from optimum_amdx.modeling import AMDModelForCausalLM

    from ..modeling.test_act_order import act_order_model

    model = act_order_model(seed=7, group=group, hidden_size=256, intermediate_size=384, num_attention_heads=4,
                            num_key_value_heads=2).half().to(DEVICE)
    prompt = [9, 4, 33, 2, 71, 8]
    calls = []
    real = w4a16.w4a16_accumulate
    monkeypatch.setattr(w4a16, "w4a16_accumulate",
                        lambda *a, **k: calls.append((a[1].in_features, bool(k.get("paired")))) or real(*a, **k))
    outs = {}
    for paired in (True, False):
        calls.clear()
        am = AMDModelForCausalLM(model, num_blocks=16, block_size=4, max_num_seqs=2, max_model_len=64)
        am.decoder.fusions.paired = paired
        outs[paired] = am.generate([prompt], max_new_tokens=6, do_sample=False)[0]
        assert {k for k, p in calls if p} == ({256, 384} if paired else set()), calls  # q/k/v, gate/up; down
        assert all(float(b.abs().sum()) == 0.0 for b in w4a16._ACCUMULATORS.values())
    assert outs[True] == outs[False]


def test_act_order_gptq_decoder_through_the_kernels_with_and_without_the_moved_gathers(monkeypatch):
    """A tiny act-order GPTQ Llama in fp16 through every Triton kernel (interpreter): the engine with the
    gathers moved into the RMSNorm and the gate/up column order (the norm's `perm` path and the W4A16
    kernels without a permutation) gives the tokens of the engine without the move (the kernels' own
    gathers) and of transformers."""
    from optimum_amdx.modeling import AMDModelForCausalLM, paged_model

    from ..modeling.conftest import hf_greedy
    from ..modeling.test_act_order import act_order_model

    model = act_order_model(seed=7).half()
    prompt = [5, 17, 3, 99, 42, 7, 11]
    outs = {}
    for hoist in (True, False):
        monkeypatch.setattr(paged_model, "HOIST_ACT_ORDER", hoist)
        am = AMDModelForCausalLM(model, num_blocks=16, block_size=4, max_num_seqs=2, max_model_len=64)
        assert (am.decoder.layers[0].down_sorted is not None) == hoist
        outs[hoist] = am.generate([prompt], max_new_tokens=4, do_sample=False)[0]
    assert outs[True] == outs[False] == hf_greedy(model, prompt, 4)
