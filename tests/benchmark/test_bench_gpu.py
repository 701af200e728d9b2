"""The harness on a real GPU: device events, CUDA memory, compiled and graph-captured backends, TunableOp."""

import pytest
import torch

from optimum_amdx.benchmark.harness import BenchmarkSpec, run_benchmark

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def test_gpu_backends_on_tiny_llama(tmp_path):
    spec = BenchmarkSpec(model="tiny-llama", device="cuda", backends=["transformers", "transformers-compile", "rocm"],
                         batch_sizes=[1, 4], prompt_lengths=[16], new_tokens=[8], warmup=2, repeats=2,
                         measure_ceilings=True, tunable_op=True, tunable_op_dir=str(tmp_path))
    doc = run_benchmark(spec)
    assert doc["environment"]["device_type"] == "cuda"
    assert doc["ceilings"]["measured_copy_bytes_per_s"] > 1e11
    assert doc["tunable_op"]["enabled"] and doc["tunable_op"]["file"].endswith(
        f"tunableop_results_{doc['environment']['arch']}.csv")
    for row in doc["results"]:
        assert row["status"] == "ok", (row["backend"], row["error"])
        assert row["memory_kind"] == "torch.cuda.max_memory_allocated" and row["peak_memory_bytes"] > 0
        assert row["roofline"]["tpot_pct_of_limit"] is not None
    compiled = {r["backend"]: r["compiled"] for r in doc["results"]}
    assert compiled["transformers"] is False
    assert compiled["transformers-compile"] is True
    assert compiled["rocm"] is True
