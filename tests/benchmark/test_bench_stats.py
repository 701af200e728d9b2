"""Statistics of repeated timings: percentiles match numpy's linear method, summaries are consistent."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimum_amdx.benchmark.stats import median, percentile, relative_change, summarize
from optimum_amdx.errors import InvalidArgumentError


def test_percentile_by_hand():
    data = [4.0, 1.0, 3.0, 2.0, 10.0]
    assert median(data) == 3.0
    # sorted 1,2,3,4,10: position 0.9*4 = 3.6 -> 4 + 0.6*(10-4)
    assert percentile(data, 90) == pytest.approx(7.6)
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 10.0
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=40),
       st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_summarize_random_timings():
    rng = random.Random(1234)
    values = [rng.lognormvariate(-5, 0.3) for _ in range(101)]
    s = summarize(values)
    assert s["n"] == 101
    assert s["min"] <= s["median"] <= s["p90"] <= s["max"]
    assert s["median"] == pytest.approx(float(np.median(values)))
    assert s["p90"] == pytest.approx(float(np.percentile(values, 90)))
    assert s["mean"] == pytest.approx(float(np.mean(values)))
    assert s["std"] == pytest.approx(float(np.std(values)))


def test_single_value_summary():
    s = summarize([0.25])
    assert s["median"] == s["p90"] == s["min"] == s["max"] == 0.25
    assert s["std"] == 0.0


@pytest.mark.parametrize("bad", [[], [1.0, math.nan]])
def test_summarize_rejects_empty_and_nan(bad):
    with pytest.raises(InvalidArgumentError):
        summarize(bad)


def test_percentile_range_checked():
    with pytest.raises(InvalidArgumentError):
        percentile([1.0, 2.0], 101)


def test_relative_change():
    assert relative_change(2.0, 3.0) == pytest.approx(0.5)
    assert relative_change(4.0, 1.0) == pytest.approx(-0.75)
    assert relative_change(0.0, 1.0) is None
    assert relative_change(None, 1.0) is None
