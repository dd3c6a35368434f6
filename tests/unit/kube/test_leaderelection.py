"""Leader election decisions and fencing, with an in-memory lease and a fake clock."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from cephcsi.kube.clock import FakeClock
from cephcsi.kube.leaderelection import LeaderCallbacks, LeaderElectionConfig, LeaderElector, Outcome
from cephcsi.kube.leaselock import LeaseConflict, LeaseRecord, lease_seconds

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]


class MemoryLock:
    """A LeaseLock with the API server's optimistic-concurrency rules."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.fail = False
        self.writes = 0
        self.attempts = 0
        """Calls of get/create/update, failed or not: the elector's progress, for waiting on."""
        self._lock = threading.Lock()

    def describe(self) -> str:
        return "test/lease"

    def _check(self) -> None:
        self.attempts += 1
        if self.fail:
            raise ConnectionError("apiserver unreachable")

    def get(self, timeout: float) -> LeaseRecord | None:
        self._check()
        with self._lock:
            return self.record

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        self._check()
        with self._lock:
            if self.record is not None:
                raise LeaseConflict("exists")
            return self._store(record)

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        self._check()
        with self._lock:
            if self.record is None or record.resource_version != self.record.resource_version:
                raise LeaseConflict("stale")
            return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        current = int(self.record.resource_version) if self.record and self.record.resource_version else 0
        self.version = max(self.version, current) + 1
        self.writes += 1
        self.record = record.with_changes(resource_version=str(self.version))
        return self.record


def noop_callbacks(**overrides: object) -> LeaderCallbacks:
    values: dict[str, object] = {"on_started_leading": lambda stop: None, "on_stopped_leading": lambda: None,
                                 "on_fencing_failure": lambda: None}
    values.update(overrides)
    return LeaderCallbacks(**values)  # type: ignore[arg-type]


def config(identity: str, **kw: float) -> LeaderElectionConfig:
    timings = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 2.0}
    timings.update(kw)
    return LeaderElectionConfig(lease_name="lease", namespace="ns", identity=identity, **timings)  # type: ignore[arg-type]


def elector(lock: MemoryLock, identity: str, clock: FakeClock, **kw: object) -> LeaderElector:
    timings = {k: v for k, v in kw.items() if k in ("lease_duration", "renew_deadline", "retry_period")}
    callbacks = {k: v for k, v in kw.items() if k not in timings}
    return LeaderElector(lock, config(identity, **timings), noop_callbacks(**callbacks), clock=clock)  # type: ignore[arg-type]


def test_first_candidate_creates_the_lease() -> None:
    clock, lock = FakeClock(), MemoryLock()
    a = elector(lock, "a", clock)
    assert a.try_acquire_or_renew() is Outcome.LEADING
    assert a.is_leader
    assert lock.record is not None
    assert lock.record.holder_identity == "a"
    assert lock.record.lease_duration_seconds == 15
    assert lock.record.lease_transitions == 0
    assert lock.record.acquire_time == clock.wall()


def test_standby_waits_the_full_lease_duration_from_its_own_observation() -> None:
    clock, lock = FakeClock(), MemoryLock()
    a, b = elector(lock, "a", clock), elector(lock, "b", clock)
    assert a.try_acquire_or_renew() is Outcome.LEADING
    assert b.try_acquire_or_renew() is Outcome.HELD_BY_OTHER
    assert b.leader_identity == "a"
    clock.advance(14.9)
    assert b.try_acquire_or_renew() is Outcome.HELD_BY_OTHER
    clock.advance(0.1)
    assert b.try_acquire_or_renew() is Outcome.LEADING
    assert lock.record is not None
    assert lock.record.holder_identity == "b"
    assert lock.record.lease_transitions == 1
    assert lock.record.acquire_time == clock.wall()


def test_every_observed_change_restarts_the_standby_clock() -> None:
    clock, lock = FakeClock(), MemoryLock()
    a, b = elector(lock, "a", clock), elector(lock, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.advance(10)
    assert a.try_acquire_or_renew() is Outcome.LEADING  # renewal
    assert b.try_acquire_or_renew() is Outcome.HELD_BY_OTHER  # sees the change now
    clock.advance(10)  # 20s after b's first look, but only 10s after the change
    assert b.try_acquire_or_renew() is Outcome.HELD_BY_OTHER
    clock.advance(5)
    assert b.try_acquire_or_renew() is Outcome.LEADING


def test_wall_clock_times_in_the_lease_are_never_compared() -> None:
    clock, lock = FakeClock(), MemoryLock()
    # A holder whose renewTime looks a day old by our wall clock is still valid: we only trust
    # how long WE have watched the record stay unchanged.
    stale = clock.wall() - timedelta(days=1)
    lock.record = LeaseRecord("other", 15, stale, stale, 3, resource_version="7")
    b = elector(lock, "b", clock)
    assert b.try_acquire_or_renew() is Outcome.HELD_BY_OTHER
    # And a renewTime in the future does not keep it alive past the observed duration.
    future = clock.wall() + timedelta(days=1)
    lock.record = LeaseRecord("other", 15, future, future, 3, resource_version="8")
    assert b.try_acquire_or_renew() is Outcome.HELD_BY_OTHER
    clock.advance(15)
    assert b.try_acquire_or_renew() is Outcome.LEADING


def test_renewal_keeps_acquire_time_and_transitions() -> None:
    clock, lock = FakeClock(), MemoryLock()
    a = elector(lock, "a", clock)
    a.try_acquire_or_renew()
    assert lock.record is not None
    acquired = lock.record.acquire_time
    clock.advance(2)
    assert a.try_acquire_or_renew() is Outcome.LEADING
    assert lock.record.acquire_time == acquired
    assert lock.record.renew_time == clock.wall()
    assert lock.record.lease_transitions == 0


def test_leader_recovers_from_a_conflicting_write_when_still_holder() -> None:
    clock, lock = FakeClock(), MemoryLock()
    a = elector(lock, "a", clock)
    a.try_acquire_or_renew()
    assert lock.record is not None
    # Someone bumps the object (e.g. a label change): our cached resourceVersion goes stale.
    lock.record = lock.record.with_changes(resource_version="99")
    assert a.try_acquire_or_renew() is Outcome.LEADING
    assert lock.record.holder_identity == "a"


def test_racing_candidates_on_an_expired_lease_produce_one_winner() -> None:
    clock, lock = FakeClock(), MemoryLock()
    old = clock.wall()
    lock.record = LeaseRecord("dead", 15, old, old, 0, resource_version="1")
    b, c = elector(lock, "b", clock), elector(lock, "c", clock)
    assert b.try_acquire_or_renew() is Outcome.HELD_BY_OTHER
    assert c.try_acquire_or_renew() is Outcome.HELD_BY_OTHER
    clock.advance(15)
    # Both read the same expired record before either writes; the second write carries a
    # stale resourceVersion and must lose.
    barrier = threading.Barrier(2)
    real_get = lock.get

    def get_together(timeout: float) -> LeaseRecord | None:
        record = real_get(timeout)
        barrier.wait(2)
        return record

    lock.get = get_together  # type: ignore[method-assign]
    results: list[Outcome] = []
    threads = [threading.Thread(target=lambda e=e: results.append(e.try_acquire_or_renew())) for e in (b, c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(r.value for r in results) == ["failed", "leading"]
    assert lock.record is not None and lock.record.lease_transitions == 1
    assert lock.writes == 1


def test_released_lease_is_taken_at_once() -> None:
    clock, lock = FakeClock(), MemoryLock()
    now = clock.wall()
    lock.record = LeaseRecord("", 1, now, now, 4, resource_version="3")
    b = elector(lock, "b", clock)
    assert b.try_acquire_or_renew() is Outcome.LEADING
    assert lock.record is not None and lock.record.lease_transitions == 5


def test_standby_poll_wakes_at_observed_expiry() -> None:
    clock, lock = FakeClock(), MemoryLock()
    a, b = elector(lock, "a", clock), elector(lock, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    assert 2.0 <= b.next_poll_delay() <= 2.4  # retry period with jitter
    clock.advance(14.5)
    assert b.next_poll_delay() == pytest.approx(0.51, abs=0.001)
    clock.advance(1)
    assert b.next_poll_delay() == pytest.approx(0.01, abs=0.001)


def test_health_fails_only_for_a_leader_that_stopped_renewing() -> None:
    clock, lock = FakeClock(), MemoryLock()
    a = elector(lock, "a", clock)
    assert a.healthy()  # not leader: nothing to report
    a.try_acquire_or_renew()
    clock.advance(15 + 5)
    assert a.healthy()
    clock.advance(0.1)
    assert not a.healthy()
    assert "not renewed" in (a.check_health() or "")


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        config("a", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError):
        config("a", renew_deadline=2, retry_period=2)
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", fence_deadline=16)
    assert config("a").effective_fence_deadline == pytest.approx(13.5)
    assert lease_seconds(3.2) == 4 and lease_seconds(0.2) == 1


def test_default_identity_is_unique_and_starts_with_hostname() -> None:
    import socket

    first, second = LeaderElectionConfig("l", "ns"), LeaderElectionConfig("l", "ns")
    assert first.identity != second.identity
    assert first.identity.startswith(socket.gethostname() + "_")


# ---- the run loop (real threads, fake clock for the deadlines) ----------------------------------


class Loops:
    """Records the leader-only loop's life."""

    def __init__(self, block_stop: bool = False) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.stop_event: threading.Event | None = None
        self.block_stop = block_stop

    def on_started(self, stop: threading.Event) -> None:
        self.stop_event = stop
        self.started.set()
        stop.wait()

    def on_stopped(self) -> None:
        if self.block_stop:
            time.sleep(3600)
        self.stopped.set()


def wait_until(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


def test_failed_renewals_stop_the_loops_at_the_renew_deadline() -> None:
    clock, lock, loops = FakeClock(), MemoryLock(), Loops()
    el = elector(lock, "a", clock, lease_duration=4, renew_deadline=3, retry_period=0.02,
                 on_started_leading=loops.on_started, on_stopped_leading=loops.on_stopped)
    el.start()
    try:
        assert loops.started.wait(2)
        lock.fail = True
        deadline = el.renew_deadline_at()
        clock.advance(2.9)
        # Several failed renewals at this (fake) time: had the deadline been reached, it would show.
        seen = lock.attempts
        assert wait_until(lambda: lock.attempts >= seen + 3)
        assert not loops.stopped.is_set() and el.is_leader
        clock.advance(0.2)  # past last renewal start + renew deadline
        assert clock.monotonic() >= deadline
        assert loops.stopped.wait(2)
        assert loops.stop_event is not None and loops.stop_event.is_set()
        assert wait_until(lambda: not el.is_leader)
        # It campaigns again (re-enters the election) and leads once the lease is reachable.
        loops.started.clear()
        lock.fail = False
        assert loops.started.wait(2)
        assert el.is_leader
    finally:
        el.stop(5)


def test_another_holder_in_the_lease_stops_the_loops_at_once() -> None:
    clock, lock, loops = FakeClock(), MemoryLock(), Loops()
    el = elector(lock, "a", clock, lease_duration=4, renew_deadline=3, retry_period=0.02,
                 on_started_leading=loops.on_started, on_stopped_leading=loops.on_stopped)
    el.start()
    try:
        assert loops.started.wait(2)
        assert lock.record is not None
        lock.record = lock.record.with_changes(holder_identity="intruder", resource_version="500")
        assert loops.stopped.wait(2)  # no clock advance needed
        assert wait_until(lambda: not el.is_leader)
    finally:
        el.stop(5)


def test_loops_that_do_not_stop_trigger_the_fencing_failure_hook() -> None:
    clock, lock, loops = FakeClock(), MemoryLock(), Loops(block_stop=True)
    fenced = threading.Event()
    el = elector(lock, "a", clock, lease_duration=4, renew_deadline=3, retry_period=0.02,
                 on_started_leading=loops.on_started, on_stopped_leading=loops.on_stopped,
                 on_fencing_failure=fenced.set)
    el.start()
    try:
        assert loops.started.wait(2)
        lock.fail = True
        clock.advance(3.1)
        # The elector has asked the loops to stop and is waiting for them (its fence budget runs
        # on the fake clock, so no amount of real time may trip it before the next advance).
        assert wait_until(lambda: loops.stop_event is not None and loops.stop_event.is_set())
        assert not fenced.wait(0.2)  # still inside the fence budget (0.9 * 4s after the renewal)
        clock.advance(0.5)
        assert fenced.wait(2)
        assert el.is_leader  # leader-only work may still run: is_leader must not lie
        assert not el.healthy()
    finally:
        el.stop(1)


def test_graceful_stop_stops_loops_before_releasing_the_lease() -> None:
    clock, lock = FakeClock(), MemoryLock()
    order: list[str] = []
    started = threading.Event()

    def on_started(stop: threading.Event) -> None:
        started.set()
        stop.wait()
        order.append("loops ended")

    def on_stopped() -> None:
        holder = lock.record.holder_identity if lock.record else None
        order.append(f"stopped while holder={holder}")

    el = elector(lock, "a", clock, lease_duration=4, renew_deadline=3, retry_period=0.02,
                 on_started_leading=on_started, on_stopped_leading=on_stopped)
    el.start()
    assert started.wait(2)
    assert el.stop(5)
    assert sorted(order) == ["loops ended", "stopped while holder=a"]
    assert lock.record is not None
    assert lock.record.holder_identity == ""
    assert lock.record.lease_duration_seconds == 1
    assert not el.is_leader


def test_crashing_leader_loop_gives_the_lease_up() -> None:
    clock, lock = FakeClock(), MemoryLock()
    stopped = threading.Event()

    def on_started(stop: threading.Event) -> None:
        raise RuntimeError("boom")

    el = elector(lock, "a", clock, lease_duration=4, renew_deadline=3, retry_period=0.5,
                 on_started_leading=on_started, on_stopped_leading=stopped.set)
    el.start()
    try:
        assert stopped.wait(2)
        assert wait_until(lambda: lock.record is not None and lock.record.holder_identity == "")
    finally:
        el.stop(5)


def test_new_leader_callback_reports_holder_changes() -> None:
    clock, lock = FakeClock(), MemoryLock()
    seen: list[str] = []
    a = elector(lock, "a", clock)
    b = elector(lock, "b", clock, on_new_leader=seen.append)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.advance(15)
    b.try_acquire_or_renew()
    assert seen == ["a", "b"]


def test_release_rereads_when_our_last_write_is_newer_than_we_know() -> None:
    clock, lock = FakeClock(), MemoryLock()
    started = threading.Event()

    def on_started(stop: threading.Event) -> None:
        started.set()
        stop.wait()

    el = elector(lock, "a", clock, lease_duration=20, renew_deadline=10, retry_period=5,
                 on_started_leading=on_started)
    el.start()
    assert started.wait(2)
    assert lock.record is not None
    # A renewal of ours landed but its answer was lost (e.g. it completed after the term ended).
    lock.record = lock.record.with_changes(resource_version="77")
    assert el.stop(5)
    assert lock.record.holder_identity == ""
