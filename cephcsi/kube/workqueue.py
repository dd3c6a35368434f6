"""Work queue of keys with client-go's semantics: de-duplication, per-key exclusivity, delayed and
rate-limited adds, `shut_down()` (immediate) and `shut_down_with_drain()`, and an elastic pool of
worker threads. Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from typing import Callable, Generic, Hashable, TypeVar

from cephcsi.kube.metrics import (
    WORKQUEUE_ADDS,
    WORKQUEUE_DEPTH,
    WORKQUEUE_QUEUE_DURATION,
    WORKQUEUE_RETRIES,
    WORKQUEUE_WORK_DURATION,
)
from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Semantics: docs/design/kubernetes-machinery.md. Keys must be hashable and not None."""

    def __init__(self, name: str, *, rate_limiter: ItemExponentialBackoff[K] | None = None) -> None:
        self.name = name
        self.rate_limiter: ItemExponentialBackoff[K] = rate_limiter or ItemExponentialBackoff(ItemBackoffSettings())
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._added_at: dict[K, float] = {}
        self._started_at: dict[K, float] = {}
        self._shutting_down = False
        self._draining = False
        # Delayed adds: key -> earliest ready time, and a heap of (ready, seq, key) entries where
        # entries that no longer match _waiting are stale and skipped.
        self._waiting: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._delay_cond = threading.Condition(threading.Lock())
        self._delay_thread: threading.Thread | None = None
        self._delay_stopped = False
        self._depth = WORKQUEUE_DEPTH.labels(name)
        self._adds = WORKQUEUE_ADDS.labels(name)
        self._retries = WORKQUEUE_RETRIES.labels(name)
        self._work_duration = WORKQUEUE_WORK_DURATION.labels(name)
        self._queue_duration = WORKQUEUE_QUEUE_DURATION.labels(name)
        self._on_ready: Callable[[], None] | None = None

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call `callback` (outside the queue's lock) whenever a key becomes ready to take: how an
        elastic worker pool learns it may need another thread."""
        self._on_ready = callback

    # ---- adding ---------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue key unless it is already waiting; ignored after shutdown."""
        with self._cond:
            if self._shutting_down or key in self._dirty:
                return
            self._adds.inc()
            self._dirty.add(key)
            self._added_at.setdefault(key, time.monotonic())
            if key in self._processing:
                return  # queued again by done()
            self._queue.append(key)
            self._depth.set(len(self._queue))
            self._cond.notify()
        if self._on_ready is not None:
            self._on_ready()

    def add_after(self, key: K, delay: float) -> None:
        """Queue key after `delay` seconds (at once if delay <= 0)."""
        if delay <= 0:
            self.add(key)
            return
        ready = time.monotonic() + delay
        with self._delay_cond:
            if self._delay_stopped:
                return
            current = self._waiting.get(key)
            if current is not None and current <= ready:
                return
            self._waiting[key] = ready
            heapq.heappush(self._heap, (ready, next(self._seq), key))
            if self._delay_thread is None:
                self._delay_thread = threading.Thread(
                    target=self._run_delayed, name=f"workqueue-{self.name}-delay", daemon=True)
                self._delay_thread.start()
            self._delay_cond.notify()

    def add_rate_limited(self, key: K) -> None:
        """Queue key after its per-key backoff delay (which this call lengthens)."""
        self._retries.inc()
        self.add_after(key, self.rate_limiter.when(key))

    def forget(self, key: K) -> None:
        """Reset key's backoff (call after a successful processing)."""
        self.rate_limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        """How many rate-limited re-adds key has had since it was last forgotten."""
        return self.rate_limiter.num_requeues(key)

    # ---- consuming -------------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> K | None:
        """The next key (now owned by the caller until `done`), or None when the queue is shut
        down (drained) or `timeout` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue:
                if self._shutting_down:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._shutting_down and not self._draining:
                return None
            key = self._queue.popleft()
            self._depth.set(len(self._queue))
            self._processing.add(key)
            self._dirty.discard(key)
            now = time.monotonic()
            added = self._added_at.pop(key, None)
            self._started_at[key] = now
        if added is not None:
            self._queue_duration.observe(now - added)
        return key

    def done(self, key: K) -> None:
        """The caller finished key; if it was added meanwhile, it is queued again now."""
        with self._cond:
            self._processing.discard(key)
            started = self._started_at.pop(key, None)
            requeued = key in self._dirty  # shut_down() empties _dirty, draining keeps it
            if requeued:
                self._queue.append(key)
                self._depth.set(len(self._queue))
                self._cond.notify()
            self._cond.notify_all()  # wakes shut_down_with_drain
        if requeued and self._on_ready is not None:
            self._on_ready()
        if started is not None:
            self._work_duration.observe(time.monotonic() - started)

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        """True once either shutdown was requested."""
        with self._cond:
            return self._shutting_down

    def processing(self) -> int:
        """Keys currently handed out and not done."""
        with self._cond:
            return len(self._processing)

    def waiting(self) -> int:
        """Keys waiting for a delayed add."""
        with self._delay_cond:
            return len(self._waiting)

    # ---- shutdown --------------------------------------------------------------------------------

    def shut_down(self) -> None:
        """Stop now: ignore adds, drop queued and delayed keys, make get() return None."""
        with self._cond:
            self._shutting_down = True
            self._queue.clear()
            self._dirty.clear()
            self._added_at.clear()
            self._depth.set(0)
            self._cond.notify_all()
        self._stop_delayed()

    def shut_down_with_drain(self, timeout: float | None = None) -> bool:
        """Ignore new adds (and drop delayed ones) but hand out what is queued; wait until the
        queue is empty and no key is processing. True if that happened within timeout."""
        with self._cond:
            self._shutting_down = True
            self._draining = True
            self._cond.notify_all()
        self._stop_delayed()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._processing:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    # ---- delayed adds ------------------------------------------------------------------------------

    def _stop_delayed(self) -> None:
        with self._delay_cond:
            self._delay_stopped = True
            self._waiting.clear()
            self._heap.clear()
            self._delay_cond.notify_all()

    def _run_delayed(self) -> None:
        while True:
            ready_keys: list[K] = []
            with self._delay_cond:
                if self._delay_stopped:
                    return
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    ready, _seq, key = heapq.heappop(self._heap)
                    if self._waiting.get(key) == ready:
                        del self._waiting[key]
                        ready_keys.append(key)
                if not ready_keys:
                    timeout = self._heap[0][0] - now if self._heap else None
                    self._delay_cond.wait(timeout)
                    continue
            for key in ready_keys:
                self.add(key)


class Workers(Generic[K]):
    """A pool of at most `count` threads taking keys from a queue and calling `process(key)`.

    The pool is elastic: one thread waits while the queue is idle; a worker that takes a key while
    more keys wait and no other worker is idle starts one more (up to `count`), and a thread beyond
    the first that finds nothing to do for `idle_timeout` seconds ends. So `count` (the sidecars'
    --worker-threads, 100 by default) bounds the concurrent calls as before, but an idle leader
    holds a few threads instead of hundreds, and a burst is served at full width within
    microseconds per thread.

    `process` returning normally → the key's backoff is forgotten; raising → the key is re-added
    with rate limiting (logged at WARNING with the number of requeues). Either way the key is
    marked done, so a re-add during processing runs it again."""

    def __init__(self, work_queue: WorkQueue[K], process: Callable[[K], None], *, count: int,
                 name: str | None = None, expected: tuple[type[BaseException], ...] = (),
                 idle_timeout: float = 30.0) -> None:
        if count < 1:
            raise ValueError("need at least one worker")
        self.queue = work_queue
        self.process = process
        self.count = count
        self.name = name or work_queue.name
        self.expected = expected
        """Failures of these types explain themselves: logged without a traceback."""
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._next_index = 0
        self._started = False

    def start(self) -> None:
        """Start the first worker thread (once); more start as work queues up."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self._spawn_locked(permanent=True)
        self.queue.on_ready(self._grow_if_needed)

    def _spawn_locked(self, *, permanent: bool = False) -> None:
        index, self._next_index = self._next_index, self._next_index + 1
        thread = threading.Thread(target=self._run, args=(permanent,), name=f"worker-{self.name}-{index}",
                                  daemon=True)
        self._threads.append(thread)
        self._idle += 1  # counted idle from the start, so a burst does not start a thread per key
        thread.start()

    def _grow_if_needed(self) -> None:
        """One more thread if keys wait and no worker is idle (called when a key becomes ready and
        when a worker takes one)."""
        if len(self.queue) == 0:
            return
        with self._lock:
            if self._idle > 0 or not self._started or self.queue.shutting_down:
                return
            self._threads = [t for t in self._threads if t.is_alive()]
            if len(self._threads) < self.count:
                self._spawn_locked()

    def stop(self, *, drain: bool = False, timeout: float | None = None) -> bool:
        """Shut the queue down (draining it first if asked) and wait for the workers; True if
        all of them ended within timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if drain:
            self.queue.shut_down_with_drain(timeout)
        self.queue.shut_down()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def alive(self) -> int:
        """Worker threads running now."""
        with self._lock:
            return sum(t.is_alive() for t in self._threads)

    def _run(self, permanent: bool) -> None:
        while True:
            key = self.queue.get(None if permanent else self.idle_timeout)
            with self._lock:
                if key is None:
                    # Shut down, or a surplus thread idle for idle_timeout: it ends, unless a key
                    # arrived since its wait ended (the add saw it idle and started nobody).
                    if self.queue.shutting_down or (not permanent and len(self.queue) == 0):
                        self._idle -= 1
                        return
                    continue
                self._idle -= 1
            self._grow_if_needed()
            try:
                self.process(key)
            except Exception as exc:  # noqa: BLE001 - every failure is retried with backoff
                log.warning("processing failed; will retry", exc_info=not isinstance(exc, self.expected),
                            extra={"fields": {"queue": self.queue.name, "key": str(key), "error": str(exc),
                                   "requeues": self.queue.num_requeues(key)}})
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)
                with self._lock:
                    self._idle += 1
