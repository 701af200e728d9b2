"""The results JSON: a real run validates, and every structural fault is reported."""

import copy
import json

import pytest

from optimum_amdx.benchmark.schema import SCHEMA_ID, dump, load, row_key, validate
from optimum_amdx.errors import InvalidArgumentError


def test_real_run_matches_schema(tiny_run):
    _code, _out, doc = tiny_run
    assert doc["schema"] == SCHEMA_ID == "optimum-amdx.benchmark/1"
    validate(doc)
    assert doc["environment"]["device_type"] == "cpu"
    assert doc["environment"]["torch_threads"] == 1 and doc["settings"]["threads"] == 1
    assert doc["model"]["source"] == "shape"
    assert doc["model"]["geometry"]["num_layers"] == 2
    assert doc["backends"]["transformers"]["available"] is True


def _mutations():
    def drop(key):
        return lambda d: d.pop(key)

    def row(fn):
        return lambda d: fn(d["results"][0])

    return {
        "missing results": drop("results"),
        "missing environment": drop("environment"),
        "future schema": lambda d: d.update(schema="optimum-amdx.benchmark/2"),
        "foreign schema": lambda d: d.update(schema="something-else/1"),
        "bad status": row(lambda r: r.update(status="fine")),
        "batch as string": row(lambda r: r.update(batch_size="1")),
        "batch as bool": row(lambda r: r.update(batch_size=True)),
        "missing ttft": row(lambda r: r.pop("ttft_s")),
        "summary lacks p90": row(lambda r: r["tpot_s"].pop("p90")),
        "p90 below median": row(lambda r: r["e2e_s"].update(p90=r["e2e_s"]["median"] / 2,
                                                             min=r["e2e_s"]["median"] / 4)),
        "missing roofline": row(lambda r: r.pop("roofline")),
        "error row without message": row(lambda r: r.update(status="error", error=None)),
        "duplicate point": lambda d: d["results"].append(copy.deepcopy(d["results"][0])),
        "backend availability not bool": lambda d: d["backends"]["transformers"].update(available="yes"),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_validate_rejects(tiny_run, name):
    doc = copy.deepcopy(tiny_run[2])
    _mutations()[name](doc)
    with pytest.raises(InvalidArgumentError, match="Invalid benchmark results"):
        validate(doc)


def test_error_rows_need_no_timings(tiny_run):
    doc = copy.deepcopy(tiny_run[2])
    doc["results"].append(dict(backend="rocm", dtype="float16", quantization="none", batch_size=1,
                               prompt_length=8, new_tokens=5, status="oom", error="OutOfMemoryError: x"))
    validate(doc)


def test_dump_load_roundtrip(tiny_run, tmp_path):
    doc = tiny_run[2]
    dump(doc, tmp_path / "r.json")
    again = load(tmp_path / "r.json")
    assert again == doc
    assert [row_key(r) for r in again["results"]] == [row_key(r) for r in doc["results"]]


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"schema": "x"}))
    with pytest.raises(InvalidArgumentError, match="other.json"):
        load(tmp_path / "other.json")
