"""PNG plots of a results document: latency and throughput against batch size, one line per backend.

`latency.png` has two panels (TTFT and TPOT, median with the p90 as an error bar); `throughput.png`
shows decode tokens/s with, dashed, the memory-bandwidth limit of each line where it is known.
Uses matplotlib's Agg backend, so it works without a display.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def _series(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Group ok rows into lines: backend, plus whichever of dtype/quant/prompt/new vary in the run."""
    ok = [r for r in doc["results"] if r["status"] == "ok"]
    varying = [k for k in ("dtype", "quantization", "prompt_length", "new_tokens") if len({r[k] for r in ok}) > 1]
    short = {"dtype": "", "quantization": "", "prompt_length": "p=", "new_tokens": "n="}
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        label = " ".join([r["backend"]] + [f"{short[k]}{r[k]}" for k in varying])
        lines[label].append(r)
    return {k: sorted(v, key=lambda r: r["batch_size"]) for k, v in lines.items()}


def _batch_axis(ax: Any, lines: dict[str, list[dict[str, Any]]]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    batches = sorted({r["batch_size"] for rows in lines.values() for r in rows})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(batches))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("batch size")


def _title(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    return f"{doc['model']['name']} on {env['device_name']} ({env['arch']})"


def write_plots(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write latency.png and throughput.png into `out_dir`; return their paths (none if nothing ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = _series(doc)
    if not lines:
        return []
    out = Path(out_dir)
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, name in ((axes[0], "ttft_s", "time to first token (prefill)"),
                             (axes[1], "tpot_s", "time per output token (decode)")):
        for label, rows in lines.items():
            x = [r["batch_size"] for r in rows]
            med = [r[metric]["median"] * 1e3 for r in rows]
            p90 = [r[metric]["p90"] * 1e3 for r in rows]
            ax.errorbar(x, med, yerr=[[0] * len(x), [p - m for p, m in zip(p90, med)]], marker="o", capsize=3,
                        label=label)
        _batch_axis(ax, lines)
        ax.set_ylabel("ms (median, bar to p90)")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(_title(doc))
    fig.tight_layout()
    paths.append(out / "latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    limits: dict[tuple, list[str]] = {}
    for label, rows in lines.items():
        x = [r["batch_size"] for r in rows]
        ax.plot(x, [r["decode_tokens_per_s"]["median"] for r in rows], marker="o", label=label)
        limit = [r["roofline"]["decode"]["tokens_per_s_limit"] for r in rows]
        if all(v is not None for v in limit):
            limits.setdefault(tuple(zip(x, (round(v, 6) for v in limit))), []).append(label)
    for points, owners in limits.items():  # lines with the same weights share one limit
        name = "bandwidth limit" if len(limits) == 1 else f"bandwidth limit ({', '.join(owners)})"
        ax.plot([p[0] for p in points], [p[1] for p in points], linestyle="--", color="gray", alpha=0.7, label=name)
    _batch_axis(ax, lines)
    ax.set_ylabel("decode tokens/s (median)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(_title(doc), fontsize=10)
    fig.tight_layout()
    paths.append(out / "throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
