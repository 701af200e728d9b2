"""Exporter: graphs pass onnx.checker, match PyTorch, carry the right files and metadata."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from optimum_amdx.errors import ExportValidationError, InvalidArgumentError
from optimum_amdx.exporters import StaticShapes, export_model, read_metadata
from optimum_amdx.exporters.optimize import MIGRAPHX_CONTRIB_OPS, contrib_ops


def test_decoder_export_folder_and_metadata(llama_onnx):
    names = {p.name for p in llama_onnx.iterdir()}
    assert {"model.onnx", "config.json", "generation_config.json", "amdx_export.json", "tokenizer.json"} <= names
    meta = read_metadata(llama_onnx)
    assert meta["task"] == "text-generation" and meta["dtype"] == "fp32" and meta["opset"] == 18
    assert meta["inputs"]["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 8]
    assert meta["outputs"]["present.1.value"] == ["batch_size", 2, "total_sequence_length", 8]
    assert meta["validation"]["max_abs_diff"] <= meta["validation"]["atol"] == 1e-3
    assert meta["optimization"]["level"] == "extended"
    assert meta["migraphx_compatible"] and all(op.split(".")[-1] in MIGRAPHX_CONTRIB_OPS for op in meta["contrib_ops"])
    assert set(meta["versions"]) >= {"torch", "transformers", "onnx", "onnxruntime"}
    assert "com.microsoft.SkipSimplifiedLayerNormalization" in meta["contrib_ops"]  # RMSNorm + residual fused
    # Every op of the graph is one MIGraphX's ONNX parser registers (FusedMatMul, which ORT's extended level
    # would emit, is not: its parser lives only on a MIGraphX feature branch).
    assert meta["graphs"] == [{"file": "model.onnx", "role": "main", "batch": None, "sequence": None,
                               "migraphx_unsupported_ops": []}]
    assert "FusedMatMul" not in meta["onnx_ops"] and "MatMul" in meta["onnx_ops"]


def test_unoptimized_export_passes_onnx_checker(qwen2_onnx):
    onnx.checker.check_model(str(qwen2_onnx / "model.onnx"))
    assert read_metadata(qwen2_onnx)["contrib_ops"] == []


def test_qwen2_graph_matches_pytorch_one_step(qwen2_onnx, tiny_qwen2_dir):
    """Independent of the exporter's own validation: one decode step over a random cache."""
    import onnxruntime as ort
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir).eval()
    gen = torch.Generator().manual_seed(5)
    past = [torch.randn(3, 2, 4, 8, generator=gen) for _ in range(4)]
    ids = torch.randint(5, 3000, (3, 1), generator=gen)
    mask = torch.ones(3, 5, dtype=torch.int64)
    pos = torch.full((3, 1), 4)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                    past_key_values=DynamicCache([(past[0], past[1]), (past[2], past[3])]), use_cache=True)
    sess = ort.InferenceSession(str(qwen2_onnx / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "position_ids": pos.numpy()}
    feed.update({f"past_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}": p.numpy() for i, p in enumerate(past)})
    logits, k0, *_ = sess.run(None, feed)
    np.testing.assert_allclose(logits, ref.logits.numpy(), atol=1e-4)
    np.testing.assert_allclose(k0, ref.past_key_values.layers[0].keys.numpy(), atol=1e-5)
    assert k0.shape == (3, 2, 5, 8)


def test_encoder_export_with_static_buckets(bert_onnx):
    meta = read_metadata(bert_onnx)
    assert meta["task"] == "feature-extraction" and meta["external_data"]
    assert meta["static_shapes"] == {"batch_sizes": [1, 4], "sequence_lengths": [16, 32]}
    assert sorted(meta["static_bucket_files"]) == sorted(f"model_b{b}_s{s}.onnx" for b in (1, 4) for s in (16, 32))
    bucket = onnx.load(str(bert_onnx / "model_b4_s32.onnx"), load_external_data=False)
    dims = [d.dim_value for d in bucket.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [4, 32]
    # Buckets share the weights file: each bucket graph is small.
    assert (bert_onnx / "model_b4_s32.onnx").stat().st_size < 200_000
    assert any(p.name.endswith(".data") for p in bert_onnx.iterdir())


def test_classification_export(bert_cls_onnx):
    meta = read_metadata(bert_cls_onnx)
    assert meta["task"] == "text-classification"
    assert meta["outputs"]["logits"] == ["batch_size", 3]
    assert json.loads((bert_cls_onnx / "config.json").read_text())["id2label"]["2"] == "pos"


def test_fp16_export_runs_and_validates(tmp_path, tiny_llama_dir):
    res = export_model(tiny_llama_dir, tmp_path / "fp16", dtype="fp16")
    meta = res.metadata
    assert meta["dtype"] == "fp16" and meta["validation"]["max_abs_diff"] <= 5e-2
    assert meta["inputs"]["past_key_values.0.key"][1] == 2
    graph = onnx.load(str(res.onnx_path), load_external_data=False)
    past = next(i for i in graph.graph.input if i.name == "past_key_values.0.key")
    assert past.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_external_data_on_request(tmp_path, tiny_bert_cls_dir):
    res = export_model(tiny_bert_cls_dir, tmp_path / "ext", external_data=True, validate=False)
    data_files = [p for p in res.output_dir.iterdir() if p.name.startswith("model.onnx") and p.name != "model.onnx"]
    assert data_files and data_files[0].stat().st_size > res.onnx_path.stat().st_size


def test_validation_failure_is_an_error_with_numbers_and_no_output(tmp_path, tiny_bert_cls_dir):
    out = tmp_path / "strict"
    with pytest.raises(ExportValidationError, match=r"max abs diff .* > atol 1e-12"):
        export_model(tiny_bert_cls_dir, out, atol=1e-12)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".strict")]


def test_optimized_graph_has_only_migraphx_contrib_ops(bert_onnx):
    ops = contrib_ops(bert_onnx / "model.onnx")
    assert ops, "extended optimization should fuse something in a BERT graph"
    assert all(op.split(".")[-1] in MIGRAPHX_CONTRIB_OPS for op in ops)


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "int3"}, "Unknown dtype"),
    ({"optimize": "max"}, "Unknown optimize level"),
    ({"opset": 9}, "opset 9"),
    ({"task": "translation"}, "Unknown task"),
])
def test_bad_export_arguments(tmp_path, tiny_bert_cls_dir, kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        export_model(tiny_bert_cls_dir, tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_kv_capacity_refused_for_encoders(tmp_path, tiny_bert_cls_dir, folder_snapshot):
    with pytest.raises(InvalidArgumentError, match="capacity=... applies to decoders"):
        export_model(tiny_bert_cls_dir, tmp_path / "x", static_shapes=StaticShapes((1,), (64,), capacity=128))
    assert folder_snapshot(tmp_path) == {}


def test_export_from_loaded_model_keeps_callers_model(tmp_path, tiny_bert_cls_dir, encoder_tokenizer):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_cls_dir)
    res = export_model(model, tmp_path / "m", dtype="fp16", tokenizer=encoder_tokenizer)
    assert next(model.parameters()).dtype == torch.float32
    assert res.metadata["dtype"] == "fp16" and res.metadata["source"] is None
    assert (res.output_dir / "tokenizer.json").is_file()


def test_migraphx_op_check_names_unparsed_ops(tmp_path):
    from onnx import TensorProto, helper

    from optimum_amdx.exporters.optimize import migraphx_op_check

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    nodes = [helper.make_node("Det", ["x"], ["d"]), helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("FusedMatMul", ["x", "x"], ["f"], domain="com.microsoft"),
             helper.make_node("ReduceSum", ["f"], ["s"], keepdims=0), helper.make_node("Add", ["r", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(tmp_path / "g.onnx"))
    check = migraphx_op_check(tmp_path / "g.onnx")
    assert check == {"ops": ["Add", "Det", "FusedMatMul", "ReduceSum", "Relu"], "unsupported": ["Det", "FusedMatMul"]}
