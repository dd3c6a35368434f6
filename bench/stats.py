"""Latency and throughput statistics for the benchmarks.

Percentile method: **nearest rank** on the sorted samples — the p-th percentile is the
smallest sample such that at least p% of the samples are ≤ it, i.e. sorted[ceil(p/100·n) − 1]
(p=0 gives the minimum). It never interpolates, so every figure printed is a latency that
really happened. With n samples, p99 is the maximum unless n > 100 (n=128: the second largest).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

PERCENTILE_METHOD = "nearest-rank: sorted[ceil(p/100*n)-1], no interpolation"


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (0 ≤ p ≤ 100) by the nearest-rank method; ValueError on no samples."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside [0, 100]")
    ordered = sorted(samples)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    """One batch of operations: per-op latencies (seconds) and the batch's wall time."""

    count: int
    errors: int
    concurrency: int
    wall_s: float
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float

    @property
    def throughput(self) -> float:
        """Completed operations per second of wall time (0 when nothing completed)."""
        return self.count / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {**asdict(self), "throughput_ops_s": self.throughput}


def summarize(latencies: Sequence[float], wall_s: float, concurrency: int, errors: int = 0) -> Summary:
    """Summary of successful operations' latencies; `errors` counts the failed ones."""
    if not latencies:
        raise ValueError("no successful operations to summarize")
    return Summary(
        count=len(latencies),
        errors=errors,
        concurrency=concurrency,
        wall_s=wall_s,
        mean_s=sum(latencies) / len(latencies),
        p50_s=percentile(latencies, 50),
        p90_s=percentile(latencies, 90),
        p99_s=percentile(latencies, 99),
        max_s=max(latencies),
    )


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator/denominator, or None when the denominator is not positive."""
    if denominator <= 0:
        return None
    return numerator / denominator


# ---- figures over interleaved rounds -------------------------------------------------------------
#
# A batch run once gives one ratio, and on a shared machine a second run can give another: the
# driver is CPU-bound, the floor mostly waits on the OSD, so any other work on the box moves
# the ratio. The bench therefore runs each comparison in rounds (driver, baseline, driver,
# baseline, ...) and reports the median ratio over the rounds with its spread.


@dataclass(frozen=True)
class Spread:
    """Median and spread of one figure over rounds (nearest rank, like the percentiles)."""

    n: int
    median: float
    low: float
    high: float
    q1: float
    q3: float

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


def spread(values: Sequence[float]) -> Spread:
    """Median, min–max and quartiles (nearest rank: every figure is one that was measured; with
    an even count the median is the lower middle value). ValueError on no values."""
    if not values:
        raise ValueError("spread of no values")
    return Spread(n=len(values), median=percentile(values, 50), low=min(values), high=max(values),
                  q1=percentile(values, 25), q3=percentile(values, 75))


def round_ratios(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> list[float]:
    """Per-round numerator/denominator, pairing round i with round i; rounds where either side
    is missing (no successful op) or the denominator is not positive are left out."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} rounds against {len(denominators)}")
    out = []
    for a, b in zip(numerators, denominators):
        if a is None or b is None:
            continue
        r = ratio(a, b)
        if r is not None:
            out.append(r)
    return out


def ratio_spread(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> Spread | None:
    """Spread of the per-round ratios, or None when no round gives one."""
    ratios = round_ratios(numerators, denominators)
    return spread(ratios) if ratios else None


def pooled(latencies: Sequence[Sequence[float]], walls: Sequence[float], concurrency: int,
           errors: int = 0) -> Summary:
    """One Summary over all rounds: percentiles of every latency, throughput = all ops / the
    sum of the rounds' wall times."""
    flat = [x for batch in latencies for x in batch]
    return summarize(flat, sum(walls), concurrency, errors=errors)


def within(value: float | None, target: float, at_most: bool = True) -> bool | None:
    """Whether a figure meets a target (≤ target, or ≥ with at_most=False); None if unknown."""
    if value is None:
        return None
    return value <= target if at_most else value >= target
