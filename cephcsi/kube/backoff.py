"""Capped exponential backoff with jitter, for reconnect loops (informer watches, relists).

Jitter spreads reconnects of many clients after an apiserver restart so they do not arrive in
one wave. The delay resets to the initial value once a failure is `reset_after` seconds away
from the previous one, so a watch that ran fine for minutes starts again from a short delay.
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from cephcsi.kube.clock import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class BackoffSettings:
    """Shape of a backoff sequence."""

    initial: float = 0.8
    """First delay in seconds."""
    maximum: float = 30.0
    """Cap on the delay before jitter."""
    factor: float = 2.0
    """Multiplier per consecutive failure."""
    jitter: float = 0.2
    """Each delay is stretched by a random fraction in [0, jitter)."""
    reset_after: float = 120.0
    """A failure this long after the previous one starts the sequence over."""


def jittered(duration: float, jitter: float, rng: random.Random | None = None) -> float:
    """duration stretched by a random fraction in [0, jitter)."""
    if jitter <= 0:
        return duration
    return duration * (1.0 + (rng or random).random() * jitter)


class Backoff:
    """One backoff sequence; thread-safe."""

    def __init__(self, settings: BackoffSettings = BackoffSettings(), *, clock: Clock = SYSTEM_CLOCK,
                 rng: random.Random | None = None) -> None:
        self._settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._current = 0.0
        self._last_failure: float | None = None

    def next_delay(self) -> float:
        """Record a failure and return how long to wait before the next attempt."""
        s = self._settings
        now = self._clock.monotonic()
        with self._lock:
            if self._last_failure is None or now - self._last_failure > s.reset_after:
                self._current = s.initial
            else:
                self._current = min(s.maximum, max(s.initial, self._current * s.factor))
            self._last_failure = now
            base = self._current
        return jittered(base, s.jitter, self._rng)

    def reset(self) -> None:
        """Start over from the initial delay at the next failure."""
        with self._lock:
            self._current = 0.0
            self._last_failure = None
