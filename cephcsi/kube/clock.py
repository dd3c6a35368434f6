"""Time sources for the Kubernetes machinery.

Timing decisions (lease expiry, backoff, event aggregation windows) use a monotonic clock so a
wall-clock step can never make a lease look expired or fresh. Wall time is only written into
API objects (renewTime, lastTimestamp), never compared. `FakeClock` lets unit tests drive time.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol


class Clock(Protocol):
    """The two readings the machinery needs."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""
        ...

    def wall(self) -> datetime:
        """The current UTC time, only for writing timestamps into objects."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(timezone.utc)


class FakeClock:
    """A clock that moves only when told to (for tests)."""

    def __init__(self, start: float = 1000.0, wall_start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._mono = start
        self._wall = wall_start or datetime(2030, 1, 1, tzinfo=timezone.utc)

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def wall(self) -> datetime:
        with self._lock:
            return self._wall

    def advance(self, seconds: float) -> None:
        """Move both readings forward."""
        with self._lock:
            self._mono += seconds
            self._wall += timedelta(seconds=seconds)


SYSTEM_CLOCK = SystemClock()


def micro_time(moment: datetime) -> str:
    """A metav1.MicroTime string (RFC 3339, microseconds, UTC)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_seconds(moment: datetime) -> str:
    """A metav1.Time string (RFC 3339, whole seconds, UTC)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    """Parse metav1.Time / MicroTime strings; None for empty input."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
