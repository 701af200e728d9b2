"""`optimum-amdx benchmark` end to end on the tiny-llama shape: files, table, compare, refusals."""

import copy
import json
import subprocess
import sys

from optimum_amdx.benchmark.report import compare, format_compare, format_results
from optimum_amdx.cli.main import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_run_writes_json_table_and_plots(tiny_run):
    code, out, doc = tiny_run
    assert code == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["latency.png", "results.json", "table.txt", "throughput.png"]
    for name in ("latency.png", "throughput.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    rows = doc["results"]
    assert [(r["batch_size"], r["prompt_length"], r["new_tokens"]) for r in rows] == [(1, 8, 5), (2, 8, 5)]
    for r in rows:
        assert r["status"] == "ok" and r["dtype"] == "float32"
        assert r["ttft_s"]["n"] == 2 and r["itl_s"]["n"] == 2 * 4
        assert r["e2e_s"]["median"] > r["ttft_s"]["min"]
        assert r["peak_memory_bytes"] > 0
        decode = r["roofline"]["decode"]
        assert decode["weight_bytes"] > 0 and decode["kv_bytes_mean"] > 0
    table = (out / "table.txt").read_text()
    assert "tiny-llama" in table and "transformers" in table and "TTFT ms" in table


def test_refuses_non_empty_output_without_overwrite(tiny_run, tiny_args, capsys):
    _code, out, _doc = tiny_run
    before = (out / "results.json").read_bytes()
    assert main(tiny_args + ["--output-dir", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == before


def test_compare_cli_and_deltas(tiny_run, tmp_path, capsys):
    doc = tiny_run[2]
    slower = copy.deepcopy(doc)
    for r in slower["results"]:
        r["tpot_s"] = {k: (v * 2 if k != "n" else v) for k, v in r["tpot_s"].items()}
        r["decode_tokens_per_s"] = {k: (v / 2 if k != "n" else v) for k, v in r["decode_tokens_per_s"].items()}
    slower["results"] = slower["results"][:1]
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "b.json").write_text(json.dumps(slower))
    result = compare(doc, slower)
    assert len(result["matched"]) == 1 and len(result["only_before"]) == 1
    assert result["matched"][0]["tpot_s"]["change"] == 1.0
    assert result["matched"][0]["decode_tokens_per_s"]["change"] == -0.5
    assert result["matched"][0]["ttft_s"]["change"] == 0.0
    assert main(["benchmark", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    printed = capsys.readouterr().out
    assert "+100.0%" in printed and "-50.0%" in printed and "only in before" in printed
    assert main(["benchmark", "--json", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert json.loads(capsys.readouterr().out)["matched"][0]["tpot_s"]["change"] == 1.0


def test_compare_warns_across_devices(tiny_run):
    doc = tiny_run[2]
    other = copy.deepcopy(doc)
    other["environment"]["device_name"] = "AMD Instinct MI300X"
    assert "not comparable" in format_compare(compare(doc, other))


def test_compare_rejects_foreign_json(tmp_path, capsys):
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
    assert main(["benchmark", "--compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "optimum-amdx benchmark" in capsys.readouterr().err


def test_table_shows_failures_and_missing_roofline(tiny_run):
    doc = copy.deepcopy(tiny_run[2])
    doc["results"].append(dict(backend="rocm", dtype="float16", quantization="none", batch_size=64,
                               prompt_length=8, new_tokens=5, status="oom", error="OutOfMemoryError: 2 GiB"))
    text = format_results(doc)
    assert "OOM" in text and "OutOfMemoryError: 2 GiB" in text
    assert "no bandwidth known" in text


def test_command_module_imports_no_torch():
    code = ("import sys, optimum_amdx.cli.commands.benchmark, optimum_amdx.benchmark; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_merge_rebuilds_a_split_run(tiny_run, tmp_path, capsys):
    doc = tiny_run[2]
    parts = []
    for i, row in enumerate(doc["results"]):
        part = copy.deepcopy(doc)
        part["results"] = [row]
        (tmp_path / f"p{i}.json").write_text(json.dumps(part))
        parts.append(str(tmp_path / f"p{i}.json"))
    out = tmp_path / "merged"
    assert main(["benchmark", "--merge", *parts, "--output-dir", str(out)]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert merged["results"] == doc["results"]
    assert (out / "throughput.png").read_bytes().startswith(PNG_MAGIC)
    capsys.readouterr()
    assert main(["benchmark", "--merge", parts[0], parts[0], "--output-dir", str(tmp_path / "dup")]) == 2
    assert "duplicate point" in capsys.readouterr().err
    other = copy.deepcopy(doc)
    other["environment"]["device_name"] = "AMD Instinct MI300X"
    (tmp_path / "mi300.json").write_text(json.dumps(other))
    assert main(["benchmark", "--merge", parts[0], str(tmp_path / "mi300.json"), "-o", str(tmp_path / "x")]) == 2
    assert "different environment device_names" in capsys.readouterr().err


def test_table_warns_about_a_busy_cpu(tiny_run):
    doc = copy.deepcopy(tiny_run[2])
    doc["environment"].update(load_average_1m=9.5, cpu_count=2)
    assert "CPU was busy (load 9.5 on 2 cores)" in format_results(doc)
    doc["environment"].update(load_average_1m=0.5)
    assert "busy" not in format_results(doc)
