"""The measuring harness behind `optimum-amdx benchmark`: latency, throughput, memory, roofline.

Modules: `harness` (the loop, `run_benchmark`, `BenchmarkSpec`), `backends` (what can be
measured), `timing` (device clocks, token-timestamping streamer), `stats` (median, p90),
`roofline` (bytes and FLOP floors), `ceilings` (device facts, measured bandwidth and matmul rate),
`schema` (the versioned JSON), `report` (tables, `--compare`), `plots` (PNGs), `tunableop`.
Names load lazily so importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BenchmarkSpec": "harness",
    "run_benchmark": "harness",
    "SCHEMA_ID": "schema",
    "load": "schema",
    "validate": "schema",
    "compare": "report",
    "format_results": "report",
    "format_compare": "report",
    "write_plots": "plots",
    "summarize": "stats",
    "percentile": "stats",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'optimum_amdx.benchmark' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
