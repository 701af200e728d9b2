"""Roofline arithmetic against hand-computed figures of known models."""

import pytest

from optimum_amdx.benchmark import roofline
from optimum_amdx.benchmark.roofline import ModelGeometry
from optimum_amdx.models.shapes import parameter_count, shape_config


@pytest.fixture(scope="module")
def llama7b():
    return shape_config("llama-2-7b")


def test_geometry_from_config(llama7b):
    g = ModelGeometry.from_config(llama7b)
    assert (g.num_layers, g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim) == (32, 4096, 32, 32, 128)
    gqa = ModelGeometry.from_config(shape_config("llama-3-8b"))
    assert gqa.num_kv_heads == 8 and gqa.head_dim == 128


def test_kv_cache_bytes_llama7b(llama7b):
    g = ModelGeometry.from_config(llama7b)
    # 2 (K and V) * 32 layers * 32 heads * 128 dims * 2 bytes = 512 KiB per token
    assert roofline.kv_cache_bytes(g, 1, 1, 2) == 524288
    assert roofline.kv_cache_bytes(g, 8, 1000, 2) == 524288 * 8 * 1000


def test_decode_floor_llama7b_h200(llama7b):
    g = ModelGeometry.from_config(llama7b)
    params = parameter_count(llama7b)
    embed = llama7b.vocab_size * llama7b.hidden_size
    weights = roofline.decode_weight_bytes(2.0 * params, 2.0 * embed, tied=False)
    assert weights == 2.0 * (params - embed)
    floor = roofline.decode_floor(weights, g, batch_size=1, prompt_length=128, new_tokens=65,
                                  kv_element_bytes=2, bandwidth_bytes_per_s=4.2e12)
    # decode steps k=1..64 attend over 128+k positions: mean 160.5
    assert floor["kv_bytes_mean"] == pytest.approx(524288 * 160.5)
    assert floor["bytes_per_step"] == pytest.approx(weights + 524288 * 160.5)
    # about 13.2 GB per step at 4.2 TB/s: a floor near 3.2 ms, i.e. ~313 tokens/s at batch 1
    assert 3.0e-3 < floor["tpot_floor_s"] < 3.3e-3
    assert floor["tokens_per_s_limit"] == pytest.approx(1 / floor["tpot_floor_s"])
    batched = roofline.decode_floor(weights, g, 8, 128, 65, 2, 4.2e12)
    assert batched["tokens_per_s_limit"] == pytest.approx(8 / batched["tpot_floor_s"])
    assert batched["kv_bytes_mean"] == pytest.approx(8 * floor["kv_bytes_mean"])


def test_decode_floor_without_bandwidth():
    g = ModelGeometry(2, 64, 4, 2, 16, 256)
    floor = roofline.decode_floor(1000.0, g, 1, 4, 2, 4, None)
    assert floor["tpot_floor_s"] is None and floor["tokens_per_s_limit"] is None
    # one decode step over 4 + 1 positions: 2 * 2 layers * 2 heads * 16 dims * 5 * 4 bytes
    assert floor["kv_bytes_mean"] == 2 * 2 * 2 * 16 * 5 * 4


def test_tied_embeddings_are_read():
    assert roofline.decode_weight_bytes(100.0, 30.0, tied=True) == 100.0
    assert roofline.decode_weight_bytes(100.0, 30.0, tied=False) == 70.0


def test_prefill_flops_brute_force():
    g = ModelGeometry(num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=100)
    batch, prompt, params = 2, 5, 1234
    attention = 0
    for i in range(prompt):  # query i sees keys 0..i; QK^T and PV each 2*head_dim FLOPs per pair and head
        attention += (i + 1) * 2 * 2 * g.head_dim * g.num_heads * g.num_layers
    expected = 2 * params * batch * prompt + attention * batch
    assert roofline.prefill_flops(params, g, batch, prompt) == pytest.approx(expected)
    floor = roofline.prefill_floor(params, g, batch, prompt, 1e9)
    assert floor["ttft_floor_s"] == pytest.approx(expected / 1e9) and floor["bound"] == "compute"


def test_short_prefill_is_memory_bound(llama7b):
    """Llama-2-7B, batch 1, 128 tokens on an H200: 1.7 TFLOP (2.1 ms at 800 TF/s) vs 13.2 GB (3.1 ms)."""
    g = ModelGeometry.from_config(llama7b)
    embed = llama7b.vocab_size * llama7b.hidden_size
    non_emb = parameter_count(llama7b) - embed
    floor = roofline.prefill_floor(non_emb, g, 1, 128, 800e12, 2.0 * non_emb, 4.2e12)
    assert floor["bound"] == "memory"
    assert floor["ttft_floor_s"] == floor["memory_floor_s"] == pytest.approx(2.0 * non_emb / 4.2e12)
    assert 2.0e-3 < floor["compute_floor_s"] < 2.3e-3
    long = roofline.prefill_floor(non_emb, g, 8, 2048, 800e12, 2.0 * non_emb, 4.2e12)
    assert long["bound"] == "compute" and long["ttft_floor_s"] == long["compute_floor_s"]


def test_percent_of_limit():
    assert roofline.percent_of_limit(0.003, 0.006) == pytest.approx(50.0)
    assert roofline.percent_of_limit(None, 0.006) is None
    assert roofline.percent_of_limit(0.003, 0.0) is None
