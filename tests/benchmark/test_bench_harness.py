"""The measuring loop on a scripted clock, backend choice, TunableOp on CPU, and real rocm/gptq runs."""

import types

import pytest
import torch

from optimum_amdx.benchmark import harness, timing, tunableop
from optimum_amdx.benchmark.backends import Runner
from optimum_amdx.benchmark.harness import BenchmarkSpec, choose_backends, measure_point, run_benchmark
from optimum_amdx.benchmark.schema import validate
from optimum_amdx.errors import InvalidArgumentError


class ScriptedTime:
    """A perf_counter that only moves when the fake model says so."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def _scripted_runner(clock, prefill_s, step_s, tail_s, drop_last=False):
    seen_prompts = []

    def generate(ids, mask, new_tokens, streamer):
        seen_prompts.append(ids.clone())
        streamer.put(ids)
        clock.advance(prefill_s * ids.shape[0])
        streamer.put(ids[:, :1])
        for _ in range(new_tokens - 1 - int(drop_last)):
            clock.advance(step_s)
            streamer.put(ids[:, :1])
        clock.advance(tail_s)
        streamer.end()

    runner = Runner(generate=generate, weight_bytes=1e6, embedding_bytes=1e5, tied_embeddings=False,
                    kv_element_bytes=2.0, non_embedding_params=4.5e5)
    return runner, seen_prompts


def test_measure_point_splits_prefill_and_decode(monkeypatch):
    clock = ScriptedTime()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    runner, prompts = _scripted_runner(clock, prefill_s=0.25, step_s=0.04, tail_s=0.01)
    m = measure_point(runner, "cpu", vocab=500, batch=3, prompt_length=7, new_tokens=6, warmup=2, repeats=4, seed=0)
    assert m["ttft_s"]["median"] == pytest.approx(0.75)
    assert m["tpot_s"]["median"] == pytest.approx(0.04)
    assert m["itl_s"]["n"] == 4 * 5
    assert m["e2e_s"]["median"] == pytest.approx(0.75 + 5 * 0.04 + 0.01)
    assert m["decode_tokens_per_s"]["median"] == pytest.approx(3 / 0.04)
    assert m["memory_kind"].startswith("process peak RSS")
    # 2 warm-up + 4 timed prompts, each fresh random [3, 7] ids inside the vocabulary, never all equal
    assert len(prompts) == 6
    assert all(p.shape == (3, 7) and 0 < int(p.min()) and int(p.max()) < 500 for p in prompts)
    assert not torch.equal(prompts[-1], prompts[-2])


def test_measure_point_rejects_short_generations(monkeypatch):
    clock = ScriptedTime()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    runner, _ = _scripted_runner(clock, 0.1, 0.01, 0.0, drop_last=True)
    with pytest.raises(RuntimeError, match="streamed 4 new tokens, expected 5"):
        measure_point(runner, "cpu", 100, 1, 4, 5, 0, 1, 0)


def test_call_seconds_is_the_median_per_call_after_warmup(monkeypatch):
    clock = ScriptedTime()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    costs = iter([9.0, 9.0] + [0.010, 0.030, 0.020] * 4 + [5.0] * 8)  # 2 slow warm-ups, then 12 timed calls
    calls = []

    def fn():
        calls.append(1)
        clock.advance(next(costs))

    assert timing.call_seconds(fn, "cpu", reps=3, warmup=2, calls_per_mark=4) == pytest.approx(0.020)
    assert len(calls) == 2 + 3 * 4  # warm-ups are not timed, and nothing runs after the last sample
    calls.clear()
    costs = iter([0.5, 0.1, 0.3, 0.2])
    assert timing.call_seconds(fn, "cpu", reps=3, warmup=1) == pytest.approx(0.2)  # median of 0.1, 0.3, 0.2
    assert len(calls) == 4


def test_call_seconds_on_a_gpu_warms_up_for_a_minimum_time(monkeypatch):
    """On a GPU the warm-up goes on past its call count until `WARMUP_SECONDS` have passed (the first reading on a
    freshly made large weight was slow after three short calls, RESULTS.md round26); the CPU keeps the count alone
    (above)."""
    clock = ScriptedTime()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))

    class GpuLikeClock(timing.Clock):
        def __init__(self, device):
            super().__init__("cpu")
            self.on_gpu = True  # the warm-up rule's switch; marks stay on the (scripted) host clock

        def synchronize(self):
            pass

    monkeypatch.setattr(timing, "Clock", GpuLikeClock)
    calls = []

    def fn():
        calls.append(1)
        clock.advance(0.004)

    assert timing.call_seconds(fn, "cuda", reps=3, warmup=2) == pytest.approx(0.004)
    # 2 counted warm-ups (8 ms), then calls until 50 ms more have passed (13 of 4 ms), then 3 timed calls
    assert len(calls) == 2 + 13 + 3


def _table(**available):
    return {name: {"available": ok, "reason": None if ok else "missing", "summary": ""}
            for name, ok in available.items()}


def test_choose_backends():
    table = _table(transformers=True, **{"transformers-compile": True}, rocm=False, ort=True)
    assert choose_backends(None, table, "cpu") == ["transformers"]
    assert choose_backends(None, table, "cuda") == ["transformers", "transformers-compile"]
    assert choose_backends(["ORT", "transformers"], table, "cpu") == ["ort", "transformers"]
    with pytest.raises(InvalidArgumentError, match="rocm: missing"):
        choose_backends(["rocm"], table, "cuda")
    with pytest.raises(InvalidArgumentError, match="Unknown backend"):
        choose_backends(["vllm"], table, "cuda")


@pytest.mark.parametrize("field,value", [("new_tokens", [1]), ("batch_sizes", [0]), ("repeats", 0),
                                         ("quantizations", ["awq"]), ("threads", 0)])
def test_spec_validation(field, value):
    spec = BenchmarkSpec(model="tiny-llama", device="cpu", **{field: value})
    with pytest.raises(InvalidArgumentError):
        run_benchmark(spec)


def test_tunable_op_on_cpu_is_a_recorded_no_op(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_TUNABLEOP_ENABLED", raising=False)
    state = tunableop.enable("cpu", "cpu", tmp_path)
    assert state["enabled"] is False and "no effect" in state["note"]
    assert "PYTORCH_TUNABLEOP_ENABLED" not in __import__("os").environ
    assert tunableop.results_file(tmp_path, "gfx942").name == "tunableop_results_gfx942.csv"


def test_rocm_and_gptq_backends_on_tiny_llama():
    """Our engine and the 4-bit path run through the harness and stream exactly the asked tokens."""
    spec = BenchmarkSpec(model="tiny-llama", device="cpu", backends=["rocm", "transformers"],
                         quantizations=["none", "gptq-4bit"], batch_sizes=[2], prompt_lengths=[6],
                         new_tokens=[4], warmup=0, repeats=1, seed=5, threads=1)
    threads = torch.get_num_threads()
    doc = validate(run_benchmark(spec))
    assert torch.get_num_threads() == threads
    rows = {(r["backend"], r["quantization"]): r for r in doc["results"]}
    assert set(rows) == {("rocm", "none"), ("rocm", "gptq-4bit"), ("transformers", "none"),
                         ("transformers", "gptq-4bit")}
    for key, row in rows.items():
        assert row["status"] == "ok", (key, row.get("error"))
        assert row["ttft_s"]["median"] > 0 and row["tpot_s"]["median"] > 0
    full = rows[("transformers", "none")]["roofline"]["decode"]["weight_bytes"]
    quant = rows[("transformers", "gptq-4bit")]["roofline"]["decode"]["weight_bytes"]
    assert quant < full


def test_ort_backend_exports_on_the_fly(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("OPTIMUM_AMDX_CACHE", str(tmp_path / "cache"))
    spec = BenchmarkSpec(model="tiny-llama", device="cpu", backends=["ort"], batch_sizes=[1, 3],
                         prompt_lengths=[5], new_tokens=[3], warmup=1, repeats=1, seed=2)
    doc = validate(run_benchmark(spec))
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"], [r.get("error") for r in doc["results"]]
    assert any("CPUExecutionProvider" in n for n in doc["notes"]["ort/float32/none"])
    assert not (tmp_path / "cache" / "onnx").exists()  # the random shape's export stays in its temp folder


def test_weight_accounting_of_quantized_model():
    """4-bit layers shrink the bytes a decode step reads but not the matmul work of prefill."""
    from optimum_amdx.benchmark.backends import _tensor_bytes, apply_quantization, build_torch_model, resolve_source
    from optimum_amdx.models.shapes import parameter_count

    source = resolve_source("tiny-llama")
    model = build_torch_model(source, torch.float32, "cpu", seed=1)
    total, emb, tied, non_emb = _tensor_bytes(model)
    params = parameter_count(source.config)
    assert not tied and emb == 4 * 256 * 64
    assert total >= 4 * params and non_emb == params - 256 * 64
    qmodel, notes = apply_quantization(model, "gptq-4bit", "cpu")
    q_total, q_emb, _, q_non_emb = _tensor_bytes(qmodel)
    assert q_emb == emb and q_non_emb == non_emb
    assert q_total < total and "RTN" in notes[0]

    from optimum_amdx.quantization import QuantLinear

    amodel, notes = apply_quantization(build_torch_model(source, torch.float32, "cpu", seed=1), "gptq-4bit-act-order", "cpu")
    layer = amodel.model.layers[0]
    assert "act-order" in notes[0] and isinstance(layer.mlp.down_proj, QuantLinear)
    g_idx = [getattr(layer.self_attn, n).g_idx for n in ("q_proj", "k_proj", "v_proj")]
    assert not bool((g_idx[0][1:] >= g_idx[0][:-1]).all())  # act-order: the groups are not in row order
    assert all(torch.equal(g, g_idx[0]) for g in g_idx)  # one input, one order: q/k/v still fuse
    assert torch.equal(layer.mlp.gate_proj.g_idx, layer.mlp.up_proj.g_idx)

    hmodel, notes = apply_quantization(build_torch_model(source, torch.float32, "cpu", seed=1), "gptq-4bit-lm-head", "cpu")
    assert isinstance(hmodel.lm_head, QuantLinear) and "output head" in notes[0]
    assert _tensor_bytes(hmodel)[0] < q_total  # the head's bytes shrink too


def test_unsupported_combination_is_recorded_not_fatal(monkeypatch):
    from optimum_amdx.benchmark import backends
    from optimum_amdx.errors import UnsupportedModelError

    def refuse(*args, **kwargs):
        raise UnsupportedModelError("this backend cannot run 4-bit weights")

    monkeypatch.setattr(backends.BACKENDS["ort"], "availability", lambda device: (True, ""))
    monkeypatch.setattr(backends.BACKENDS["ort"], "load", refuse)
    spec = BenchmarkSpec(model="tiny-llama", device="cpu", backends=["ort", "transformers"], batch_sizes=[1, 2],
                         prompt_lengths=[4], new_tokens=[2], warmup=0, repeats=1)
    doc = validate(run_benchmark(spec))
    status = {(r["backend"], r["batch_size"]): r["status"] for r in doc["results"]}
    assert status == {("ort", 1): "unavailable", ("ort", 2): "unavailable",
                      ("transformers", 1): "ok", ("transformers", 2): "ok"}
    assert "cannot run 4-bit" in doc["results"][0]["error"]


@pytest.mark.parametrize("on_host", [False, True])
def test_measure_point_makes_prompts_where_the_backend_takes_them(monkeypatch, on_host):
    """A backend whose API takes host ids (the paged engine, ONNX Runtime) gets CPU prompts, made before the
    clock starts; every other backend gets them on the benchmark's device."""
    clock = ScriptedTime()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    made_on: list[str] = []
    real = harness._prompt

    def prompt(torch_mod, generator, vocab, batch, length, device):
        made_on.append(device)
        return real(torch_mod, generator, vocab, batch, length, "cpu")

    monkeypatch.setattr(harness, "_prompt", prompt)
    runner, _ = _scripted_runner(clock, 0.1, 0.01, 0.0)
    runner.inputs_on_host = on_host
    measure_point(runner, "npu:0", 100, 1, 4, 3, 1, 2, 0)  # a device this machine lacks: only named here
    assert made_on == ["cpu" if on_host else "npu:0"] * 3
