"""Connect single-flight and failure memory in cephcsi.ceph.connection, with a fake librados.

No sleeps: threads are lined up with events and barriers, time is a fake clock where the
behaviour depends on it.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import rados

from cephcsi.ceph.connection import ConnectionCache
from cephcsi.ceph.credentials import Credentials
from cephcsi.config.clusters import ClusterConfig
from cephcsi.errors import CephCSIError, PermissionDenied, Unavailable
from cephcsi.settings import CephSettings

pytestmark = pytest.mark.unit

CLUSTER = ClusterConfig("c1", ("127.0.0.1:1",))
OTHER = ClusterConfig("c2", ("127.0.0.2:1",))
USER = Credentials("csi", "AQAAAAAAAAAAABAAbWFkZS11cC1zZWNyZXQhIQ==")  # a well-formed aes key (secret made up)


@dataclass
class FakeLibrados:
    """Stands in for rados.Rados: counts connects; each one runs `outcome` for its cluster."""

    outcomes: dict[str, list[BaseException | None]] = field(default_factory=dict)
    """Per mon_host, what successive connects do: raise the error, or succeed (None)."""
    hold: dict[str, threading.Event] = field(default_factory=dict)
    """Connects to this mon_host block until the event is set."""
    entered: threading.Event = field(default_factory=threading.Event)
    connects: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def factory(self, rados_id: str, conf: dict[str, str]) -> FakeHandle:
        return FakeHandle(self, conf["mon_host"])


@dataclass
class FakeHandle:
    lib: FakeLibrados
    mon_host: str
    shut: bool = False

    def connect(self, timeout: int = 0) -> None:
        lib = self.lib
        with lib.lock:
            number = lib.connects.get(self.mon_host, 0)
            lib.connects[self.mon_host] = number + 1
        lib.entered.set()
        held = lib.hold.get(self.mon_host)
        if held is not None:
            held.wait(30)
        plan = lib.outcomes.get(self.mon_host, [None])
        outcome = plan[min(number, len(plan) - 1)]
        if outcome is not None:
            raise outcome

    def shutdown(self) -> None:
        self.shut = True

    def get_instance_id(self) -> int:
        return 4100


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lib(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLibrados]:
    fake = FakeLibrados()
    monkeypatch.setattr(rados, "Rados", fake.factory)
    yield fake
    for event in fake.hold.values():
        event.set()


def timed_out() -> rados.Error:
    return rados.TimedOut("error connecting to the cluster", errno=110)


def connect(cache: ConnectionCache, cluster: ClusterConfig = CLUSTER) -> object:
    with cache.session(cluster, USER) as session:
        return session.rados


def test_concurrent_callers_share_one_failed_attempt(lib: FakeLibrados) -> None:
    """The N-th of N callers must not wait N mount timeouts: one attempt, every caller gets
    its outcome (joined while it ran, or remembered right after)."""
    lib.outcomes[CLUSTER.mon_host] = [timed_out()]
    release = lib.hold[CLUSTER.mon_host] = threading.Event()
    cache = ConnectionCache(CephSettings(mount_timeout=10.0))
    callers = 16
    start = threading.Barrier(callers + 1)
    errors: list[BaseException] = []
    errors_lock = threading.Lock()

    def call() -> None:
        start.wait()
        try:
            connect(cache)
        except BaseException as error:  # noqa: BLE001 - collected for the assertions
            with errors_lock:
                errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    start.wait()
    assert lib.entered.wait(10)
    release.set()
    for thread in threads:
        thread.join(30)
    assert lib.connects[CLUSTER.mon_host] == 1, "every caller made its own connect attempt"
    assert len(errors) == callers and all(isinstance(e, Unavailable) for e in errors), errors
    assert len({id(e) for e in errors}) == callers, "one exception instance raised in many threads"
    assert all("'c1'" in str(e) and "monitors" in str(e) for e in errors)


def test_a_failure_is_remembered_then_retried_and_recovery_needs_no_restart(lib: FakeLibrados) -> None:
    lib.outcomes[CLUSTER.mon_host] = [timed_out(), None]
    clock = FakeClock()
    settings = CephSettings(mount_timeout=10.0, connect_failure_memory=5.0)
    cache = ConnectionCache(settings, clock=clock)
    with pytest.raises(Unavailable):
        connect(cache)
    clock.now += settings.failure_memory_seconds - 0.5
    with pytest.raises(Unavailable, match="last connect attempt failed 4.5s ago; the next one is made in 0.5s"):
        connect(cache)
    assert lib.connects[CLUSTER.mon_host] == 1
    clock.now += 0.5
    assert isinstance(connect(cache), FakeHandle)
    assert isinstance(connect(cache), FakeHandle)
    assert lib.connects[CLUSTER.mon_host] == 2


def test_authentication_failures_are_remembered_but_not_forever(lib: FakeLibrados) -> None:
    lib.outcomes[CLUSTER.mon_host] = [rados.InvalidArgumentError("bad key", errno=22), None]
    clock = FakeClock()
    settings = CephSettings(mount_timeout=3.0)
    cache = ConnectionCache(settings, clock=clock)
    for _ in range(3):
        with pytest.raises(PermissionDenied, match="check the secret's userID/userKey"):
            connect(cache)
    assert lib.connects[CLUSTER.mon_host] == 1
    clock.now += settings.failure_memory_seconds
    assert isinstance(connect(cache), FakeHandle)


def test_a_caller_never_waits_longer_than_one_mount_timeout_for_another_calls_attempt(lib: FakeLibrados) -> None:
    """Even if librados overran its mount timeout, joiners give up on the attempt in time."""
    release = lib.hold[CLUSTER.mon_host] = threading.Event()
    clock = FakeClock()
    cache = ConnectionCache(CephSettings(mount_timeout=2.0), clock=clock)
    first = threading.Thread(target=lambda: connect(cache))
    first.start()
    assert lib.entered.wait(10)
    clock.now += 3.0 + 0.1  # mount timeout + grace have passed for the running attempt
    with pytest.raises(Unavailable, match="still connecting to Ceph cluster 'c1'.*started by another call"):
        connect(cache)
    assert lib.connects[CLUSTER.mon_host] == 1
    release.set()
    first.join(10)
    assert isinstance(connect(cache), FakeHandle), "the late success is kept"


def test_a_slow_cluster_never_blocks_another(lib: FakeLibrados) -> None:
    release = lib.hold[CLUSTER.mon_host] = threading.Event()
    cache = ConnectionCache(CephSettings())
    slow = threading.Thread(target=lambda: connect(cache))
    slow.start()
    assert lib.entered.wait(10)
    assert isinstance(connect(cache, OTHER), FakeHandle)
    release.set()
    slow.join(10)


def test_failure_memory_never_exceeds_the_mount_timeout() -> None:
    assert CephSettings(mount_timeout=2.0, connect_failure_memory=5.0).failure_memory_seconds == 2.0
    assert CephSettings(mount_timeout=10.0).failure_memory_seconds == 5.0


def test_an_unexpected_connect_failure_is_reported_to_every_waiter(lib: FakeLibrados) -> None:
    lib.outcomes[CLUSTER.mon_host] = [RuntimeError("boom")]
    cache = ConnectionCache(CephSettings())
    with pytest.raises(CephCSIError, match="failed unexpectedly.*boom"):
        connect(cache)


def is_shut(handle: object) -> bool:
    assert isinstance(handle, FakeHandle)
    return handle.shut


def test_a_one_off_session_closes_the_connection_it_opened(lib: FakeLibrados) -> None:
    """A once-per-term read (keep=False) must not leave an idle librados client behind."""
    cache = ConnectionCache(CephSettings(mount_timeout=10.0))
    with cache.session(CLUSTER, USER, keep=False) as session:
        handle = session.rados
    assert isinstance(handle, FakeHandle) and handle.shut, "the one-off session's connection stayed open"
    assert connect(cache) is not handle, "a later caller got the closed connection"
    assert lib.connects[CLUSTER.mon_host] == 2


def test_a_one_off_sessions_failed_connect_is_remembered(lib: FakeLibrados) -> None:
    """One-offs (the attacher's fence-ledger reads, one per pool) must not each pay a connect
    timeout while the monitors are down: the failure is remembered as for kept connections."""
    lib.outcomes[CLUSTER.mon_host] = [timed_out(), None]
    clock = FakeClock()
    settings = CephSettings(mount_timeout=10.0, connect_failure_memory=5.0)
    cache = ConnectionCache(settings, clock=clock)
    for _ in range(3):
        with pytest.raises(Unavailable), cache.session(CLUSTER, USER, keep=False) as session:
            _ = session.rados
    assert lib.connects[CLUSTER.mon_host] == 1
    clock.now += settings.failure_memory_seconds
    with cache.session(CLUSTER, USER, keep=False) as session:
        handle = session.rados
    assert lib.connects[CLUSTER.mon_host] == 2
    assert is_shut(handle), "the one-off's connection, connected after the failure expired, stayed open"


def test_a_one_off_session_leaves_a_shared_connection_open(lib: FakeLibrados) -> None:
    """Kept connections stay: a one-off session on a connection that was already open, or that a
    keeping session used meanwhile, does not close it; two one-offs close theirs after the last."""
    cache = ConnectionCache(CephSettings(mount_timeout=10.0))
    kept = connect(cache)
    with cache.session(CLUSTER, USER, keep=False) as session:
        assert session.rados is kept
    assert isinstance(kept, FakeHandle) and not kept.shut
    with cache.session(OTHER, USER, keep=False) as one_off:
        with cache.session(OTHER, USER) as shared:
            other = shared.rados
        assert one_off.rados is other
    assert isinstance(other, FakeHandle) and not other.shut, "a keeping caller's connection was closed"
    third = ClusterConfig("c3", ("127.0.0.3:1",))
    with cache.session(third, USER, keep=False) as first:
        with cache.session(third, USER, keep=False) as second:
            assert second.rados is first.rados
        handle = first.rados
        assert not is_shut(handle), "closed under its other user"
    assert is_shut(handle), "the one-offs' own connection outlived both"
    fourth = ClusterConfig("c4", ("127.0.0.4:1",))
    with cache.session(fourth, USER, keep=False) as opener:
        inner = cache.session(fourth, USER, keep=False)
        joined = inner.__enter__()
    shared_handle = joined.rados
    assert opener is not joined and not is_shut(shared_handle), "closed while the second one-off still used it"
    inner.__exit__(None, None, None)
    assert is_shut(shared_handle), "left open when the one-off that did not open it ended last"
    assert connect(cache) is kept and lib.connects[CLUSTER.mon_host] == 1
