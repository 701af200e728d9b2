"""Summary statistics for repeated timings: median, p90 and friends, in plain Python.

Kept free of numpy and torch so the JSON reader and `--compare` work anywhere, and so the
numbers are easy to check by hand. Percentiles interpolate linearly between order statistics
(numpy's default "linear" method), which is what optimum-benchmark reports.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from ..errors import InvalidArgumentError

SUMMARY_KEYS = ("n", "median", "p90", "mean", "std", "min", "max")


def _clean(values: Iterable[float]) -> list[float]:
    data = [float(v) for v in values]
    if not data:
        raise InvalidArgumentError("Cannot summarize an empty list of measurements; run at least one repeat.")
    if any(math.isnan(v) for v in data):
        raise InvalidArgumentError("Measurements contain NaN; every repeat must produce a finite timing.")
    return data


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between closest ranks."""
    if not 0.0 <= q <= 100.0:
        raise InvalidArgumentError(f"Percentile q={q} is outside [0, 100].")
    data = sorted(_clean(values))
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    frac = pos - lo
    return data[lo] + (data[hi] - data[lo]) * frac


def median(values: Sequence[float]) -> float:
    """The 50th percentile."""
    return percentile(values, 50.0)


def summarize(values: Iterable[float]) -> dict[str, float]:
    """n, median, p90, mean, population std, min and max of `values` (seconds, tokens/s, ...)."""
    data = _clean(values)
    n = len(data)
    mean = math.fsum(data) / n
    var = math.fsum((v - mean) ** 2 for v in data) / n
    return {
        "n": n,
        "median": percentile(data, 50.0),
        "p90": percentile(data, 90.0),
        "mean": mean,
        "std": math.sqrt(var),
        "min": min(data),
        "max": max(data),
    }


def relative_change(before: float | None, after: float | None) -> float | None:
    """(after - before) / before as a fraction, or None when either side is missing or before is 0."""
    if before is None or after is None or before == 0:
        return None
    return (after - before) / before
