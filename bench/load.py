"""Run N operations with C in flight and time each one (client side, perf_counter)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bench.stats import Summary, summarize

WAVES = 10
"""Calls per round at a concurrency level are at least this many times the concurrency: at c=32 a
round of 3 waves (96 creates) lasted ≈ 0.1 s, so one stall of the cluster of a few tens of ms set
its ops/s (single rounds from 0.46× to 1.35× of the same code); 10 waves last ≈ 0.35 s."""

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class Batch(Generic[Result]):
    latencies: list[float] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    concurrency: int = 1

    def summary(self) -> Summary:
        return summarize(self.latencies, self.wall_s, self.concurrency, errors=len(self.errors))


def run_batch(op: Callable[[Item], Result], items: Sequence[Item], concurrency: int) -> Batch[Result]:
    """Call op(item) for every item on `concurrency` threads; each call is timed on its own.
    Failures are counted (first message kept per kind) and left out of the latencies; the wall
    time runs from the first submit to the last completion, so throughput = ok ops / wall."""
    batch: Batch[Result] = Batch(concurrency=concurrency)
    lock = threading.Lock()

    def one(item: Item) -> None:
        started = time.perf_counter()
        try:
            result = op(item)
        except Exception as error:  # noqa: BLE001 - a failed op is a figure, not a crash
            with lock:
                batch.errors.append(f"{type(error).__name__}: {error}"[:300])
            return
        elapsed = time.perf_counter() - started
        with lock:
            batch.latencies.append(elapsed)
            batch.results.append(result)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench") as pool:
        started = time.perf_counter()
        futures = [pool.submit(one, item) for item in items]
        for future in futures:
            future.result()
        batch.wall_s = time.perf_counter() - started
    return batch


@dataclass
class TimedBatch:
    """A batch of driver calls with the CPU they cost: the driver's, and the caller's when the
    caller is a process of its own (the Go gRPC caller; None in-process, where they are one)."""
    batch: Batch[str]
    driver_cpu_s: float
    caller_cpu_s: float | None = None


def ops_per_round(ops: int, rounds: int, c: int) -> int:
    """Calls per side and round at concurrency c: `ops` spread over the rounds, but at least
    WAVES waves of c. With fewer calls than c they all start at once, never reach concurrency
    c, and the round's ops/s is set by its slowest call (the p99) rather than by throughput."""
    return max(1, ops // max(1, rounds), WAVES * c)
