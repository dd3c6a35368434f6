"""Work queue semantics: dedup, per-key exclusivity, re-add during processing, delays,
rate-limited retries, shutdown and drain, and the worker pool."""
from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

import pytest
from prometheus_client import REGISTRY

from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff
from cephcsi.kube.workqueue import WorkQueue, Workers

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def fast_queue(name: str, base: float = 0.01, cap: float = 0.08) -> WorkQueue[str]:
    return WorkQueue(name, rate_limiter=ItemExponentialBackoff(ItemBackoffSettings(base=base, cap=cap)))


def test_duplicate_adds_are_queued_once() -> None:
    q = fast_queue("dedup")
    for _ in range(3):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(0) == "a"
    assert q.get(0) == "b"
    assert q.get(0) is None


def test_key_added_while_processing_is_processed_again_after_done() -> None:
    q = fast_queue("readd")
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")
    q.add("a")
    # Not handed out while a worker owns it ...
    assert len(q) == 0
    assert q.get(0.05) is None
    # ... but queued once as soon as the worker is done.
    q.done("a")
    assert len(q) == 1
    assert q.get(0) == "a"
    q.done("a")
    assert len(q) == 0


def test_done_without_readd_does_not_requeue() -> None:
    q = fast_queue("noreadd")
    q.add("a")
    q.done(q.get(0))  # type: ignore[arg-type]
    assert q.get(0.02) is None


def test_get_blocks_until_add() -> None:
    q = fast_queue("blocking")
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get(30)))
    t.start()
    t.join(0.05)
    assert t.is_alive() and got == [], "get() must block while the queue is empty"
    q.add("x")
    t.join(30)
    assert got == ["x"]


def test_item_backoff_doubles_and_caps_and_forget_resets() -> None:
    limiter: ItemExponentialBackoff[str] = ItemExponentialBackoff(ItemBackoffSettings(base=1.0, cap=10.0))
    assert [limiter.when("k") for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert limiter.num_requeues("k") == 6
    assert limiter.when("other") == 1.0  # per item
    limiter.forget("k")
    assert limiter.num_requeues("k") == 0
    assert limiter.when("k") == 1.0


def test_item_backoff_defaults_match_sidecars() -> None:
    limiter: ItemExponentialBackoff[str] = ItemExponentialBackoff()
    delays = [limiter.when("k") for _ in range(12)]
    assert delays[0] == 1.0
    assert max(delays) == 300.0


def test_item_backoff_survives_many_failures() -> None:
    limiter: ItemExponentialBackoff[str] = ItemExponentialBackoff(ItemBackoffSettings(base=1.0, cap=5.0))
    for _ in range(2000):
        delay = limiter.when("k")
    assert delay == 5.0


def test_add_rate_limited_waits_for_the_items_backoff() -> None:
    # Lower bounds only (a sleep never ends early); the delays are long enough that "not yet"
    # holds even when this thread is descheduled for a while.
    q = fast_queue("ratelimited", base=0.3, cap=1.0)
    start = time.monotonic()
    q.add_rate_limited("a")
    assert q.get(0.05) is None  # not yet
    assert q.get(30) == "a"
    first = time.monotonic() - start
    q.done("a")
    start = time.monotonic()
    q.add_rate_limited("a")
    assert q.get(30) == "a"
    second = time.monotonic() - start
    assert first >= 0.3
    assert second >= 0.6
    assert q.num_requeues("a") == 2
    q.forget("a")
    assert q.num_requeues("a") == 0


def test_add_after_delays_and_collapses_to_earliest() -> None:
    q = fast_queue("after")
    start = time.monotonic()
    q.add_after("a", 60)
    q.add_after("a", 0.1)
    q.add_after("a", 40)
    assert q.waiting() == 1
    assert q.get(30) == "a"  # within 30 s: the 0.1 s entry, not a 40 or 60 s one
    assert time.monotonic() - start >= 0.1
    q.done("a")
    # The later entries were superseded, not kept.
    assert q.waiting() == 0
    assert q.get(0) is None


def test_add_after_non_positive_is_immediate() -> None:
    q = fast_queue("after0")
    q.add_after("a", 0)
    assert q.get(0) == "a"


def test_shut_down_is_immediate() -> None:
    q = fast_queue("shutdown")
    q.add("a")
    q.add("b")
    q.add_after("c", 0.05)
    q.shut_down()
    assert q.get(0) is None
    q.add("d")
    assert len(q) == 0
    assert q.waiting() == 0, "the delayed add was dropped, so it can never come back"
    assert q.get(0.1) is None


def test_shut_down_wakes_blocked_getters() -> None:
    q = fast_queue("wake")
    results: list[str | None] = []
    threads = [threading.Thread(target=lambda: results.append(q.get())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(0.02)
    assert all(t.is_alive() for t in threads) and results == [], "getters block on an empty queue"
    q.shut_down()
    for t in threads:
        t.join(30)
    assert results == [None, None, None]


def test_drain_processes_queued_and_in_flight_keys() -> None:
    q = fast_queue("drain")
    processed: list[str] = []

    def process(key: str) -> None:
        time.sleep(0.01)
        processed.append(key)

    for key in "abcdef":
        q.add(key)
    workers = Workers(q, process, count=2)
    workers.start()
    assert workers.stop(drain=True, timeout=5)
    assert sorted(processed) == list("abcdef")
    q.add("late")
    assert len(q) == 0


def test_drain_includes_key_re_added_during_processing() -> None:
    q = fast_queue("drain-readd")
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")  # dirty while processing
    done = threading.Event()

    def drain() -> None:
        q.shut_down_with_drain(2)
        done.set()

    t = threading.Thread(target=drain)
    t.start()
    assert not done.wait(0.05), "the drain waits for the key being processed"
    q.done("a")
    assert q.get(0.5) == "a"  # still handed out while draining
    q.done("a")
    t.join(2)
    assert done.is_set()


def test_drain_times_out_when_a_worker_hangs() -> None:
    q = fast_queue("drain-timeout")
    q.add("a")
    q.get(0)
    assert q.shut_down_with_drain(0.1) is False


def test_never_two_workers_on_one_key_under_stress() -> None:
    q = fast_queue("stress", base=0.001, cap=0.005)
    keys = [f"k{i}" for i in range(12)]
    active: dict[str, int] = defaultdict(int)
    lock = threading.Lock()
    violations: list[str] = []
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    seq = iter(range(10**9))
    rng = random.Random(7)

    def process(key: str) -> None:
        with lock:
            active[key] += 1
            if active[key] > 1:
                violations.append(key)
            last_start[key] = next(seq)
        time.sleep(rng.random() * 0.002)
        with lock:
            active[key] -= 1
        if rng.random() < 0.1:
            raise RuntimeError("simulated failure")

    workers = Workers(q, process, count=8, name="stress")
    workers.start()

    def producer(n: int) -> None:
        local = random.Random(n)
        for _ in range(400):
            key = local.choice(keys)
            with lock:
                last_add[key] = next(seq)
            q.add(key)
            if local.random() < 0.2:
                time.sleep(0.0005)

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for p in producers:
        p.start()
    for p in producers:
        p.join(10)
    # Every key must be processed after its last add (failures are retried within ~5 ms).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with lock:
            if all(last_start.get(k, -1) > last_add[k] for k in last_add) and not any(active.values()):
                break
        time.sleep(0.01)
    workers.stop(timeout=5)
    assert violations == []
    assert all(last_start.get(k, -1) > last_add[k] for k in last_add)


def test_workers_retry_failures_with_backoff_and_forget_on_success() -> None:
    q = fast_queue("retry", base=0.02, cap=0.1)
    attempts: list[float] = []
    succeeded = threading.Event()
    requeues_seen: list[int] = []

    def process(key: str) -> None:
        attempts.append(time.monotonic())
        requeues_seen.append(q.num_requeues(key))
        if len(attempts) < 3:
            raise ValueError("not yet")
        succeeded.set()

    workers = Workers(q, process, count=2)
    workers.start()
    q.add("a")
    assert succeeded.wait(3)
    workers.stop(timeout=2)
    assert requeues_seen == [0, 1, 2]
    assert attempts[1] - attempts[0] >= 0.02
    assert attempts[2] - attempts[1] >= 0.04
    assert q.num_requeues("a") == 0  # forgotten after success


def test_workers_stop_after_current_key() -> None:
    q = fast_queue("stop")
    started = threading.Event()
    release = threading.Event()
    processed: list[str] = []

    def process(key: str) -> None:
        processed.append(key)
        started.set()
        release.wait(2)

    workers = Workers(q, process, count=1)
    workers.start()
    q.add("a")
    q.add("b")
    assert started.wait(2)
    stopper = threading.Thread(target=workers.stop, kwargs={"timeout": 3})
    stopper.start()
    deadline = time.monotonic() + 10
    while not q.shutting_down:  # the stop has begun while "a" is still processing
        assert time.monotonic() < deadline
        time.sleep(0.001)
    release.set()
    stopper.join(3)
    assert workers.alive() == 0
    assert processed == ["a"]


def test_metrics_are_labelled_by_queue_name() -> None:
    q = fast_queue("metrics-q")

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"name": "metrics-q"}) or 0.0

    adds_before = sample("workqueue_adds_total")
    q.add("a")
    q.add("a")
    q.add("b")
    assert sample("workqueue_adds_total") - adds_before == 2
    assert sample("workqueue_depth") == 2
    key = q.get(0)
    assert key is not None
    q.done(key)
    assert sample("workqueue_work_duration_seconds_count") == 1
    assert sample("workqueue_queue_duration_seconds_count") == 1
    q.add_rate_limited("c")
    assert sample("workqueue_retries_total") == 1
    q.shut_down()


def test_workers_grow_with_queued_work_and_shrink_when_idle() -> None:
    """One thread at rest; a burst of slow keys gets up to `count` threads working at once; once
    idle the extra threads end and one stays; a key added while every thread is busy starts a
    thread at once instead of waiting behind a slow key."""
    queue: WorkQueue[int] = WorkQueue("elastic")
    release = threading.Event()
    running: set[int] = set()
    peak = 0
    lock = threading.Lock()

    def process(key: int) -> None:
        nonlocal peak
        with lock:
            running.add(key)
            peak = max(peak, len(running))
        release.wait(5)
        with lock:
            running.discard(key)

    workers = Workers(queue, process, count=4, idle_timeout=0.2)
    workers.start()
    try:
        assert workers.alive() == 1
        queue.add(0)
        deadline = time.monotonic() + 2
        while 0 not in running and time.monotonic() < deadline:
            time.sleep(0.01)
        queue.add(1)  # the only thread is busy on key 0: key 1 must not wait for it
        while len(running) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert running == {0, 1}
        for key in range(2, 10):
            queue.add(key)
        while len(running) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(running) == 4 and workers.alive() == 4  # never more than count
        release.set()
        while (len(queue) or queue.processing()) and time.monotonic() < deadline + 3:
            time.sleep(0.01)
        assert peak == 4 and len(queue) == 0
        time.sleep(0.6)
        assert workers.alive() == 1
    finally:
        release.set()
        assert workers.stop(timeout=2)
