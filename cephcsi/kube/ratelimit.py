"""Rate limiters: a token bucket (client QPS, event spam filter) and a per-item exponential
backoff (work-queue retries).

The token bucket hands out reservations: a caller takes a token even if none is available and
is told how long to sleep, so waiting happens outside the lock and callers are served in arrival
order. The per-item limiter doubles the delay on every failure of the same item and forgets the
item on success, like the external-provisioner's --retry-interval-start / --retry-interval-max.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Generic, Hashable, TypeVar

from cephcsi.kube.clock import SYSTEM_CLOCK, Clock

K = TypeVar("K", bound=Hashable)


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; rate <= 0 means unlimited."""

    def __init__(self, rate: float, burst: int, *, clock: Clock = SYSTEM_CLOCK) -> None:
        if rate > 0 and burst < 1:
            raise ValueError("burst must be at least 1 when rate is limited")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._stamp = clock.monotonic()

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def reserve(self) -> float:
        """Take one token and return how many seconds the caller must wait before using it."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            self._refill(self._clock.monotonic())
            self._tokens -= 1.0
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self.rate

    def try_take(self) -> bool:
        """Take a token only if one is available now."""
        if self.rate <= 0:
            return True
        with self._lock:
            self._refill(self._clock.monotonic())
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def take(self, stop: threading.Event | None = None) -> float:
        """Block until a token is ours (or `stop` is set); return the seconds waited."""
        delay = self.reserve()
        if delay > 0:
            if stop is None:
                time.sleep(delay)
            else:
                stop.wait(delay)
        return delay


@dataclass(frozen=True)
class ItemBackoffSettings:
    """Per-item retry delays."""

    base: float = 1.0
    """Delay after the first failure of an item (seconds)."""
    cap: float = 300.0
    """Longest delay (seconds)."""


class ItemExponentialBackoff(Generic[K]):
    """Delay for item = base * 2**(failures so far), capped; `forget` resets the item."""

    def __init__(self, settings: ItemBackoffSettings = ItemBackoffSettings()) -> None:
        if settings.base <= 0 or settings.cap < settings.base:
            raise ValueError("need 0 < base <= cap")
        self.settings = settings
        self._lock = threading.Lock()
        self._failures: dict[K, int] = {}

    def when(self, item: K) -> float:
        """Record one more failure of `item` and return its delay."""
        with self._lock:
            failures = self._failures.get(item, 0)
            self._failures[item] = failures + 1
        # Capping the exponent first keeps 2**n finite for items that fail forever.
        exponent = min(failures, 62)
        return float(min(self.settings.cap, self.settings.base * (2 ** exponent)))

    def forget(self, item: K) -> None:
        """The item succeeded: its next failure starts from `base` again."""
        with self._lock:
            self._failures.pop(item, None)

    def num_requeues(self, item: K) -> int:
        """How many failures of `item` are on record."""
        with self._lock:
            return self._failures.get(item, 0)
