"""The measuring harness behind `optimum-amdx benchmark`: latency, throughput, memory, roofline.

Modules: `harness` (the loop, `run_benchmark`, `BenchmarkSpec`), `backends` (what can be
measured), `timing` (device clocks, token-timestamping streamer), `stats` (median, p90),
`roofline` (bytes and FLOP floors), `ceilings` (device facts, measured bandwidth and matmul rate),
`schema` (the versioned JSON), `report` (tables, `--compare`), `plots` (PNGs), `tunableop`.
Names load lazily so importing this package does not import torch.
"""

from __future__ import annotations

from optimum_amdx._lazy import lazy_exports

_LAZY = {
    "BenchmarkSpec": ".harness",
    "run_benchmark": ".harness",
    "SCHEMA_ID": ".schema",
    "load": ".schema",
    "validate": ".schema",
    "compare": ".report",
    "format_results": ".report",
    "format_compare": ".report",
    "write_plots": ".plots",
    "summarize": ".stats",
    "percentile": ".stats",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
