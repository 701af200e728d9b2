"""Static-shape decoders for MIGraphX: fixed-capacity KV cache, prefill/decode bucket graphs, one weight file.

The graphs run on the CPU provider here (the same fixed-shape graphs MIGraphX would compile) and
must reproduce transformers token for token: greedy, seeded sampling and beam search.
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.exporters import contract
from optimum_amdx.onnxruntime import ORTModelForCausalLM
from optimum_amdx.onnxruntime.static_cache import StaticKVCache


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()


def _prompts():
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 11, 12, 13]])
    return ids, (ids != 0).long()


def test_export_layout_and_metadata(llama_static_onnx):
    import onnx

    meta = contract.read_metadata(llama_static_onnx)
    assert meta["kv_cache"] == "static" and meta["kv_capacity"] == 40
    roles = {(g.role, g.batch, g.sequence): g.file for g in contract.graphs(meta)}
    assert roles[("prefill", 2, 16)] == "prefill_b2_s16.onnx" and roles[("decode", 1, 1)] == "decode_b1.onnx"
    assert len([g for g in contract.graphs(meta) if g.role == "prefill"]) == 4
    assert all(g["migraphx_unsupported_ops"] == [] for g in meta["graphs"]) and meta["migraphx_compatible"]
    assert meta["validation"]["max_abs_diff"] <= meta["validation"]["atol"]
    # Every graph is fully fixed-shape at its inputs and reads the one weight file.
    for name, dims in (("prefill_b2_s8.onnx", {"input_ids": [2, 8], "attention_mask": [2, 40],
                                                "cache_position": [8], "past_key_values.0.key": [2, 2, 40, 8]}),
                       ("decode_b1.onnx", {"input_ids": [1, 1], "cache_position": [1]})):
        graph = onnx.load(str(llama_static_onnx / name), load_external_data=False).graph
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
        assert all(shapes[k] == v for k, v in dims.items()), shapes
        assert all(all(d.dim_value > 0 for d in v.type.tensor_type.shape.dim) for v in graph.input)
        locations = {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}
        assert locations == {contract.WEIGHTS_FILE}
    assert len(list(llama_static_onnx.glob("*.data"))) == 1


@pytest.mark.parametrize("kwargs", [{}, {"use_io_binding": True}, {"use_static_shapes": False}],
                         ids=["bucket-graphs", "io-binding", "one-session"])
def test_greedy_beam_and_sampling_match_pytorch(llama_static_onnx, reference, kwargs):
    model = ORTModelForCausalLM.from_pretrained(llama_static_onnx, provider="cpu", **kwargs)
    ids, mask = _prompts()
    common = dict(input_ids=ids, attention_mask=mask, pad_token_id=0)
    got = model.generate(**common, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, reference.generate(**common, max_new_tokens=12, do_sample=False))
    beams = model.generate(input_ids=ids[:1], max_new_tokens=6, num_beams=2, do_sample=False, pad_token_id=0)
    assert torch.equal(beams, reference.generate(input_ids=ids[:1], max_new_tokens=6, num_beams=2, do_sample=False,
                                                 pad_token_id=0))
    torch.manual_seed(7)
    sampled = model.generate(**common, max_new_tokens=8, do_sample=True, top_k=20)
    torch.manual_seed(7)
    assert torch.equal(sampled, reference.generate(**common, max_new_tokens=8, do_sample=True, top_k=20))


def test_cache_object_and_bucket_choice(llama_static_onnx):
    model = ORTModelForCausalLM.from_pretrained(llama_static_onnx, provider="cpu")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13]])  # 9 tokens -> prompt bucket 16
    out = model(ids)
    cache = out.past_key_values
    assert isinstance(cache, StaticKVCache) and out.logits.shape == (1, 1, model.vocab_size)
    assert (cache.bucket_batch, cache.capacity, cache.slot, cache.get_seq_length()) == (1, 40, 16, 9)
    assert sorted(model._graph_sessions) == ["decode_b1.onnx", "prefill_b1_s16.onnx"]
    model(torch.tensor([[14]]), attention_mask=torch.ones(1, 10, dtype=torch.long), past_key_values=cache)
    assert (cache.slot, cache.get_seq_length()) == (17, 10)


def test_limits_are_clear_errors_before_any_work(llama_static_onnx):
    model = ORTModelForCausalLM.from_pretrained(llama_static_onnx, provider="cpu")
    ids, mask = _prompts()
    with pytest.raises(InvalidArgumentError, match=r"needs 47 KV slots, but this export holds 40.*capacity=N"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, pad_token_id=0)
    with pytest.raises(InvalidArgumentError, match="largest static prompt bucket 16.*--static-shapes sequence"):
        model.generate(input_ids=torch.ones(1, 17, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(InvalidArgumentError, match="largest static batch bucket 2.*--static-shapes batch"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, num_beams=2, pad_token_id=0)
    assert model._graph_sessions.keys() == {"decode_b1.onnx"}  # nothing ran


def test_full_cache_in_a_manual_loop_is_a_clear_error(llama_static_onnx):
    model = ORTModelForCausalLM.from_pretrained(llama_static_onnx, provider="cpu")
    cache = model(torch.ones(1, 16, dtype=torch.long) * 5).past_key_values
    for _ in range(40 - 16):
        model(torch.tensor([[6]]), past_key_values=cache)
    with pytest.raises(InvalidArgumentError, match=r"KV cache of this export is full \(40 slots.*capacity=N"):
        model(torch.tensor([[6]]), past_key_values=cache)


def test_pipeline_on_static_export(llama_static_onnx, tiny_llama_dir):
    from optimum_amdx import pipeline

    ort_pipe = pipeline("text-generation", model=str(llama_static_onnx), accelerator="ort")
    pt_pipe = pipeline("text-generation", model=str(tiny_llama_dir), accelerator=None)
    kw = dict(max_new_tokens=8, do_sample=False, return_full_text=False)
    got = ort_pipe("Once upon a time", **kw)[0]["generated_text"]
    assert got and got == pt_pipe("Once upon a time", **kw)[0]["generated_text"]


def test_static_flags_on_the_wrong_export(llama_onnx):
    with pytest.raises(InvalidArgumentError, match="dynamic-cache decoder.*--static-shapes"):
        ORTModelForCausalLM.from_pretrained(llama_onnx, provider="cpu", use_static_shapes=True)


def test_capacity_checks_at_export(tmp_path, tiny_llama_dir):
    from optimum_amdx.exporters import StaticShapes, export_model

    with pytest.raises(InvalidArgumentError, match="capacity=16 leaves no room"):
        export_model(tiny_llama_dir, tmp_path / "a", static_shapes=StaticShapes((1,), (16,), capacity=16))
    with pytest.raises(InvalidArgumentError, match="exceeds the model's max_position_embeddings"):
        export_model(tiny_llama_dir, tmp_path / "b", static_shapes=StaticShapes((1,), (16,), capacity=4096))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
