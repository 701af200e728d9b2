"""The issue's acceptance checks on the real bundled models (SmolLM2-135M, all-MiniLM-L6-v2).

SmolLM2 is exported once per session through the real `optimum-cli export rocm` command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.network]


@pytest.fixture(scope="module")
def smollm2_onnx(tmp_path_factory, smollm2_dir) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "out"
    exe = Path(sys.executable).with_name("optimum-cli")
    proc = subprocess.run([str(exe), "export", "rocm", "--model", "default", str(out)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Exported llama" in proc.stdout
    return out


def test_smollm2_ort_pipeline_greedy_equals_pytorch(smollm2_onnx, smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_amdx import pipeline

    pipe = pipeline("text-generation", model=str(smollm2_onnx), accelerator="ort")
    assert pipe.model.provider == "CPUExecutionProvider"
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    pt = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    prompt = "The three primary colors are"
    got = pipe(prompt, max_new_tokens=24, do_sample=False, return_full_text=False)[0]["generated_text"]
    enc = tok(prompt, return_tensors="pt")
    ref_ids = pt.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id)
    ref = tok.decode(ref_ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert got == ref and len(got.split()) > 5


def test_minilm_embeddings_match_pytorch_mean_pooling(minilm_dir, tmp_path_factory):
    from transformers import AutoModel, AutoTokenizer

    from optimum_amdx.onnxruntime import ORTModelForFeatureExtraction, mean_pooling

    out = tmp_path_factory.mktemp("minilm") / "out"
    from optimum_amdx.exporters import export_model

    export_model(minilm_dir, out, optimize="extended")
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    sentences = ["A man is eating food.", "A man rides a horse on a sunny beach while it rains.", "Embeddings!"]
    enc = tok(sentences, padding=True, return_tensors="pt")
    pt = AutoModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        ref = mean_pooling(pt(**enc).last_hidden_state, enc["attention_mask"])
    model = ORTModelForFeatureExtraction.from_pretrained(out)
    got = mean_pooling(model(**enc).last_hidden_state, enc["attention_mask"])
    assert got.shape == (3, 384)
    assert float((got - ref).abs().max()) < 1e-4
    sims = torch.nn.functional.normalize(got, dim=-1) @ torch.nn.functional.normalize(got, dim=-1).T
    assert sims[0, 1] < 0.99


@pytest.fixture(scope="module")
def smollm2_static_onnx(tmp_path_factory, smollm2_dir) -> Path:
    """SmolLM2 with a fixed-capacity KV cache, kept small for CI: batch 1, one 16-token prompt bucket, 48 slots."""
    from optimum_amdx.exporters import StaticShapes, export_model

    out = tmp_path_factory.mktemp("smollm2-static") / "out"
    return export_model(smollm2_dir, out, static_shapes=StaticShapes((1,), (16,), capacity=48)).output_dir


def test_smollm2_static_graphs_greedy_equal_pytorch(smollm2_static_onnx, smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_amdx import pipeline
    from optimum_amdx.exporters.contract import read_metadata

    meta = read_metadata(smollm2_static_onnx)
    assert [g["file"] for g in meta["graphs"]] == ["model.onnx", "prefill_b1_s16.onnx", "decode_b1.onnx"]
    assert meta["migraphx_compatible"] and all(g["migraphx_unsupported_ops"] == [] for g in meta["graphs"])
    pipe = pipeline("text-generation", model=str(smollm2_static_onnx), accelerator="ort")
    assert pipe.model.provider == "CPUExecutionProvider" and pipe.model.use_static_shapes
    prompt = "The three primary colors are"
    got = pipe(prompt, max_new_tokens=24, do_sample=False, return_full_text=False)[0]["generated_text"]
    assert sorted(pipe.model._graph_sessions) == ["decode_b1.onnx", "prefill_b1_s16.onnx"]  # the bucket graphs ran
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    pt = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    enc = tok(prompt, return_tensors="pt")
    ref_ids = pt.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id)
    ref = tok.decode(ref_ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert got == ref and len(got.split()) > 5
