"""The versioned JSON format of benchmark results, its validator and its reader.

A results file is one JSON object whose "schema" is `SCHEMA_ID`. Fields are only ever added
within a version; renaming or removing one bumps the version, so scripts that read `/1` files
keep working. `validate()` checks the structure and types that readers rely on.

Top level: schema, created (ISO 8601 UTC), optimum_amdx_version, environment, model, settings,
ceilings, tunable_op, backends (name -> availability), results (one row per measured point).
A row: backend, dtype, quantization, batch_size, prompt_length, new_tokens, status ("ok",
"error", "oom", "unavailable"), error, and for "ok" rows the summaries ttft_s, tpot_s, e2e_s,
itl_s, decode_tokens_per_s (each {n, median, p90, mean, std, min, max}), peak_memory_bytes,
memory_kind, load_s, warmup_s, compiled (decode ran torch.compile'd or graph-captured),
roofline {decode, prefill, tpot_pct_of_limit, ttft_pct_of_limit}. Times are seconds, memory bytes.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import InvalidArgumentError
from .stats import SUMMARY_KEYS

SCHEMA_ID = "optimum-amdx.benchmark/1"

STATUSES = ("ok", "error", "oom", "unavailable")
TOP_LEVEL = {
    "schema": str,
    "created": str,
    "optimum_amdx_version": str,
    "environment": dict,
    "model": dict,
    "settings": dict,
    "ceilings": dict,
    "backends": dict,
    "results": list,
}
ROW_KEYS = {
    "backend": str,
    "dtype": str,
    "quantization": str,
    "batch_size": int,
    "prompt_length": int,
    "new_tokens": int,
    "status": str,
}
OK_SUMMARIES = ("ttft_s", "tpot_s", "e2e_s", "itl_s", "decode_tokens_per_s")
OK_FIELDS = {
    "peak_memory_bytes": (int, type(None)),
    "memory_kind": (str, type(None)),
    "load_s": (int, float),
    "warmup_s": (int, float),
    "compiled": bool,
    "roofline": dict,
}
ENVIRONMENT_KEYS = ("device_type", "device_name", "python", "torch", "transformers")
MODEL_KEYS = ("name", "source", "geometry", "parameters")


def row_key(row: dict[str, Any]) -> tuple:
    """The identity of a measured point, used to match rows across two result files."""
    return (row["backend"], row["dtype"], row["quantization"], row["batch_size"], row["prompt_length"], row["new_tokens"])


def _fail(where: str, msg: str) -> None:
    raise InvalidArgumentError(f"Invalid benchmark results ({where}): {msg}")


def _check_type(where: str, value: Any, expected: Any) -> None:
    if isinstance(value, bool) and expected in (int, (int, float)):
        _fail(where, "expected a number, got a boolean")
    if not isinstance(value, expected):
        names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
        _fail(where, f"expected {names}, got {type(value).__name__}")


def _check_summary(where: str, summary: Any) -> None:
    _check_type(where, summary, dict)
    for key in SUMMARY_KEYS:
        if key not in summary:
            _fail(where, f"summary lacks {key!r}")
        _check_type(f"{where}.{key}", summary[key], (int, float))
    if not summary["min"] <= summary["median"] <= summary["p90"] <= summary["max"]:
        _fail(where, "expected min <= median <= p90 <= max")


def validate(doc: Any) -> dict[str, Any]:
    """Check that `doc` is a results document of this schema version; return it unchanged."""
    _check_type("document", doc, dict)
    schema = doc.get("schema")
    if schema != SCHEMA_ID:
        if isinstance(schema, str) and schema.startswith("optimum-amdx.benchmark/"):
            _fail("schema", f"version {schema!r} is not supported by this optimum-amdx (it reads {SCHEMA_ID!r})")
        _fail("schema", f"expected {SCHEMA_ID!r}, got {schema!r}; is this an `optimum-amdx benchmark` JSON file?")
    for key, typ in TOP_LEVEL.items():
        if key not in doc:
            _fail(key, "missing")
        _check_type(key, doc[key], typ)
    for key in ENVIRONMENT_KEYS:
        if key not in doc["environment"]:
            _fail(f"environment.{key}", "missing")
    for key in MODEL_KEYS:
        if key not in doc["model"]:
            _fail(f"model.{key}", "missing")
    for name, info in doc["backends"].items():
        _check_type(f"backends.{name}", info, dict)
        _check_type(f"backends.{name}.available", info.get("available"), bool)
    seen = set()
    for i, row in enumerate(doc["results"]):
        where = f"results[{i}]"
        _check_type(where, row, dict)
        for key, typ in ROW_KEYS.items():
            if key not in row:
                _fail(f"{where}.{key}", "missing")
            _check_type(f"{where}.{key}", row[key], typ)
        if row["status"] not in STATUSES:
            _fail(f"{where}.status", f"expected one of {STATUSES}, got {row['status']!r}")
        key = row_key(row)
        if key in seen:
            _fail(where, f"duplicate point {key}")
        seen.add(key)
        if row["status"] != "ok":
            _check_type(f"{where}.error", row.get("error"), str)
            continue
        for name in OK_SUMMARIES:
            if name not in row:
                _fail(f"{where}.{name}", "missing")
            _check_summary(f"{where}.{name}", row[name])
        for name, typ in OK_FIELDS.items():
            if name not in row:
                _fail(f"{where}.{name}", "missing")
            _check_type(f"{where}.{name}", row[name], typ)
    return doc


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a results file; a clear error for missing or foreign files."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise InvalidArgumentError(f"Benchmark results file {path} does not exist; pass the results.json a run wrote.") from None
    except json.JSONDecodeError as err:
        raise InvalidArgumentError(f"Benchmark results file {path} is not valid JSON ({err}).") from None
    try:
        return validate(doc)
    except InvalidArgumentError as err:
        raise InvalidArgumentError(f"{path}: {err}") from None


def dump(doc: dict[str, Any], path: str | os.PathLike) -> None:
    """Validate and write a results document (sorted keys, stable diffs)."""
    validate(doc)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.write("\n")
