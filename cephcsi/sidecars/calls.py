"""In-process CSI calls with --timeout, and a record of which volume names have a call running.
On expiry the caller gets DEADLINE_EXCEEDED while the call goes on; a retry on the same name joins
the running call. `busy(name)` says whether a call on a name runs; `drain` waits for all of them
(leader-only loops call it before they report themselves stopped). Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar, cast

import grpc

from cephcsi.errors import CephCSIError, DeadlineExceeded, OperationInFlight
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

T = TypeVar("T")
_SLICE = 0.1


class Stopping(CephCSIError):
    """The loop is stopping (leadership lost or shutdown); the work item is retried later."""

    code = grpc.StatusCode.CANCELLED


class CsiCalls:
    def __init__(self, max_workers: int, timeout: float) -> None:
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="csi-call")
        # Re-entrant: a call that finishes before add_done_callback runs its callback at once,
        # in the thread that holds the lock.
        self._lock = threading.RLock()
        self._running: dict[str, tuple[str, Future[object]]] = {}

    def busy(self, name: str) -> bool:
        with self._lock:
            running = self._running.get(name)
            return running is not None and not running[1].done()

    def running(self) -> int:
        with self._lock:
            return sum(1 for _m, f in self._running.values() if not f.done())

    def run(self, method: str, name: str, call: Callable[[], T], stop: threading.Event | None = None) -> T:
        """Run `call` (method `method` on volume `name`) and wait up to the timeout; attach to
        a running call of the same method and name instead of starting another."""
        if stop is not None and stop.is_set():
            # A stopped term must not start Ceph work a new leader could race with.
            raise Stopping(f"{method} for {name}: loop stopping; not started")
        with self._lock:
            running = self._running.get(name)
            if running is not None and running[1].done():
                running = None  # finished; its done-callback has not removed it yet
            if running is not None and running[0] != method:
                raise OperationInFlight(f"{running[0]} for {name} is still running; {method} waits for it")
            if running is None:
                context = contextvars.copy_context()  # the work item's request id follows the call
                future: Future[object] = self._pool.submit(context.run, call)
                self._running[name] = (method, future)
                future.add_done_callback(functools.partial(self._finished, name))
            else:
                future = running[1]
                log.info("joining a call still running from an earlier attempt", extra=fields(method=method, name=name))
        # The registry holds calls of every result type (Future[object]); a joined call has the
        # same method on the same name, so its result is this caller's T too.
        return cast(T, self._wait(method, name, future, stop))

    def _wait(self, method: str, name: str, future: Future[object], stop: threading.Event | None) -> object:
        deadline = time.monotonic() + self.timeout
        while not future.done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded(
                    f"{method} for {name} did not finish within {self.timeout:g}s (--timeout); it continues in the "
                    "background, bounded by the Ceph op timeouts, and the next attempt takes its result"
                )
            if stop is not None and stop.is_set():
                raise Stopping(f"{method} for {name}: loop stopping; the call finishes in the background")
            wait([future], timeout=min(_SLICE, remaining))
        return future.result()  # raises what the call raised

    def _finished(self, name: str, future: Future[object]) -> None:
        with self._lock:
            running = self._running.get(name)
            if running is not None and running[1] is future:
                del self._running[name]

    def drain(self, timeout: float) -> bool:
        """Wait until no call is running; False if some still are after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                futures = [f for _m, f in self._running.values() if not f.done()]
            if not futures:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            wait(futures, timeout=min(remaining, _SLICE))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

