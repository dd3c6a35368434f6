"""Non-blocking per-key locks: one operation per volume id or request name at a time.

A second call on a busy key fails at once with ABORTED (the CO retries with backoff) instead of
queueing behind a call that may be stuck in Ceph — queued duplicates are what turns one slow
call into a pile of timed-out ones. Different keys never contend: the table lock is held only to
look up the set, never across a Ceph call.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cephcsi.errors import OperationInFlight


class KeyLocks:
    def __init__(self, what: str) -> None:
        self.what = what
        self._held: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._lock:
            if key in self._held:
                raise OperationInFlight(f"an operation on {self.what} {key!r} is already in progress; retry later")
            self._held.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._held.discard(key)

    def busy(self, key: str) -> bool:
        with self._lock:
            return key in self._held
