"""The bench's statistics: nearest-rank percentiles, summaries, ratios."""
from __future__ import annotations

import pytest

from bench.stats import percentile, ratio, summarize

pytestmark = pytest.mark.unit


def test_percentile_is_nearest_rank_and_never_interpolates() -> None:
    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 20) == 1.0  # ceil(0.2*5)=1st
    assert percentile(samples, 21) == 2.0  # ceil(1.05)=2nd
    assert percentile(samples, 50) == 3.0
    assert percentile(samples, 100) == 5.0
    assert percentile([1.0, 2.0], 50) == 1.0  # not 1.5


def test_p99_is_the_maximum_up_to_100_samples_and_second_largest_at_128() -> None:
    hundred = [float(i) for i in range(1, 101)]
    assert percentile(hundred, 99) == 99.0
    assert percentile(hundred[:64], 99) == 64.0
    assert percentile([float(i) for i in range(1, 129)], 99) == 127.0


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


def test_percentile_does_not_reorder_the_callers_list() -> None:
    samples = [3.0, 1.0, 2.0]
    percentile(samples, 50)
    assert samples == [3.0, 1.0, 2.0]


def test_summary_figures_and_throughput() -> None:
    s = summarize([0.010, 0.020, 0.030, 0.040], wall_s=0.05, concurrency=2, errors=1)
    assert (s.count, s.errors, s.concurrency) == (4, 1, 2)
    assert s.p50_s == 0.020 and s.p99_s == 0.040 and s.max_s == 0.040
    assert s.mean_s == pytest.approx(0.025)
    assert s.throughput == pytest.approx(80.0)
    doc = s.to_json()
    assert doc["throughput_ops_s"] == pytest.approx(80.0)
    assert doc["p90_s"] == 0.040


def test_summary_needs_a_success_and_zero_wall_gives_zero_throughput() -> None:
    with pytest.raises(ValueError):
        summarize([], wall_s=1.0, concurrency=1)
    assert summarize([0.1], wall_s=0.0, concurrency=1).throughput == 0.0


def test_ratio() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 0.0) is None
    assert ratio(1.0, -1.0) is None
