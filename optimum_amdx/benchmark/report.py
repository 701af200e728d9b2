"""Terminal tables of one result file, and before/after deltas between two."""

from __future__ import annotations

import copy
from typing import Any

from ..errors import InvalidArgumentError
from .schema import row_key, validate
from .stats import relative_change

_GIB = float(1 << 30)


def _rate(value: float | None, unit: str) -> str:
    """1.23 TB/s, 45.6 GB/s, 789 GFLOP/s: the largest SI prefix that keeps the number >= 1."""
    if not value:
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, sep, *body])


def format_results(doc: dict[str, Any]) -> str:
    """The results of one run as a table, headed by the device and the ceilings used."""
    env, ceil = doc["environment"], doc["ceilings"]
    head = [f"model {doc['model']['name']} ({doc['model']['source']}) on {env['device_name']} [{env['arch']}], "
            f"torch {env['torch']}, transformers {env['transformers']}"]
    if ceil.get("bandwidth_bytes_per_s"):
        head.append(f"roofline: {_rate(ceil['bandwidth_bytes_per_s'], 'B/s')} ({ceil['bandwidth_source']}), "
                    f"{_rate(ceil.get('matmul_flops_per_s'), 'FLOP/s')} ({ceil.get('matmul_source')})")
    else:
        head.append("roofline: no bandwidth known for this device (pass --measure-ceilings or --gpu NAME)")
    load, cores = env.get("load_average_1m"), env.get("cpu_count")
    if load is not None and cores and load > cores:
        head.append(f"warning: the CPU was busy (load {load:.1f} on {cores} cores) when the run started: timings "
                    "are unreliable; on a CPU backend, --threads 1 avoids oversubscription")
    headers = ["backend", "dtype", "quant", "batch", "prompt", "new", "TTFT ms", "p90", "TPOT ms", "p90",
               "tok/s", "e2e ms", "peak GiB", "%dec", "%pre"]
    rows = []
    for r in doc["results"]:
        cells = [r["backend"], r["dtype"], r["quantization"], str(r["batch_size"]), str(r["prompt_length"]),
                 str(r["new_tokens"])]
        if r["status"] != "ok":
            rows.append(cells + [r["status"].upper()] + [""] * 8)
            continue
        roof = r["roofline"]
        rows.append(cells + [
            _fmt(r["ttft_s"]["median"], 1e3), _fmt(r["ttft_s"]["p90"], 1e3),
            _fmt(r["tpot_s"]["median"], 1e3), _fmt(r["tpot_s"]["p90"], 1e3),
            _fmt(r["decode_tokens_per_s"]["median"], 1, 1), _fmt(r["e2e_s"]["median"], 1e3, 1),
            _fmt(r["peak_memory_bytes"], 1 / _GIB, 2) if r["peak_memory_bytes"] is not None else "-",
            _fmt(roof.get("tpot_pct_of_limit"), 1, 1), _fmt(roof.get("ttft_pct_of_limit"), 1, 1),
        ])
    lines = head + ["", _table(headers, rows)]
    errors = [r for r in doc["results"] if r["status"] != "ok"]
    for r in errors:
        lines.append(f"  {r['backend']} b={r['batch_size']} p={r['prompt_length']}: {r['status']}: {r['error']}")
    for key, notes in (doc.get("notes") or {}).items():
        for note in notes:
            lines.append(f"  note ({key}): {note}")
    if doc.get("tunable_op"):
        t = doc["tunable_op"]
        lines.append(f"  TunableOp: {t.get('file') or 'off'}; {t.get('note', '')}")
    lines.append("%dec = decode floor (weight + KV bytes / bandwidth) as % of measured TPOT; "
                 "%pre = prefill floor (max of FLOPs / matmul rate, weight bytes / bandwidth) as % of TTFT.")
    return "\n".join(lines)


COMPARED = (
    ("TTFT ms", "ttft_s", 1e3),
    ("TPOT ms", "tpot_s", 1e3),
    ("tok/s", "decode_tokens_per_s", 1.0),
    ("e2e ms", "e2e_s", 1e3),
)


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Match points of two result files and give each metric's before, after and relative change."""
    a_rows = {row_key(r): r for r in before["results"] if r["status"] == "ok"}
    b_rows = {row_key(r): r for r in after["results"] if r["status"] == "ok"}
    matched = []
    for key in [k for k in a_rows if k in b_rows]:
        entry: dict[str, Any] = dict(zip(("backend", "dtype", "quantization", "batch_size", "prompt_length",
                                          "new_tokens"), key))
        for _label, metric, _scale in COMPARED:
            x, y = a_rows[key][metric]["median"], b_rows[key][metric]["median"]
            entry[metric] = {"before": x, "after": y, "change": relative_change(x, y)}
        x, y = a_rows[key]["peak_memory_bytes"], b_rows[key]["peak_memory_bytes"]
        entry["peak_memory_bytes"] = {"before": x, "after": y, "change": relative_change(x, y)}
        matched.append(entry)
    warnings = []
    devices = (before["environment"]["device_name"], after["environment"]["device_name"])
    if devices[0] != devices[1]:
        warnings.append(f"different devices ({devices[0]} vs {devices[1]}): timings are not comparable")
    if before["model"]["name"] != after["model"]["name"]:
        warnings.append(f"different models ({before['model']['name']} vs {after['model']['name']})")
    return {
        "matched": matched,
        "only_before": [list(k) for k in a_rows if k not in b_rows],
        "only_after": [list(k) for k in b_rows if k not in a_rows],
        "warnings": warnings,
    }


def format_compare(result: dict[str, Any]) -> str:
    """Before/after table; a positive change is higher (better for tok/s, worse for latencies)."""
    headers = ["backend", "dtype", "quant", "batch", "prompt", "new"]
    for label, _m, _s in COMPARED:
        headers += [f"{label} before", "after", "change"]
    rows = []
    for e in result["matched"]:
        cells = [e["backend"], e["dtype"], e["quantization"], str(e["batch_size"]), str(e["prompt_length"]),
                 str(e["new_tokens"])]
        for _label, metric, scale in COMPARED:
            m = e[metric]
            digits = 1 if metric == "decode_tokens_per_s" else 2
            change = "-" if m["change"] is None else f"{m['change'] * 100:+.1f}%"
            cells += [_fmt(m["before"], scale, digits), _fmt(m["after"], scale, digits), change]
        rows.append(cells)
    lines = [_table(headers, rows)] if rows else ["no measured point appears in both files"]
    for key in result["only_before"]:
        lines.append(f"  only in before: {key}")
    for key in result["only_after"]:
        lines.append(f"  only in after: {key}")
    for w in result["warnings"]:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One document from runs of the same model on the same device (e.g. one process per backend).

    The first document's environment and ceilings are kept; points must not repeat.
    """
    if not docs:
        raise InvalidArgumentError("--merge needs at least one results file.")
    first = docs[0]
    for other in docs[1:]:
        for section, key in (("environment", "device_name"), ("model", "name")):
            if other[section][key] != first[section][key]:
                raise InvalidArgumentError(
                    f"Cannot merge results of different {section} {key}s ({first[section][key]!r} vs "
                    f"{other[section][key]!r}); use --compare for before/after across setups."
                )
    out = copy.deepcopy(first)
    out["settings"] = dict(out["settings"], merged_from=[d["created"] for d in docs])
    out["results"] = [row for d in docs for row in d["results"]]
    for d in docs[1:]:
        for name, info in d["backends"].items():
            if info["available"] or name not in out["backends"]:
                out["backends"][name] = info
        out.setdefault("notes", {}).update(d.get("notes") or {})
    return validate(out)
