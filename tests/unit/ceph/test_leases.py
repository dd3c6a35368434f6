"""Journal leases: a lease whose object its holder removed needs no unlock round trip, and no
renewal may land after the removal (it would recreate the object)."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import rados

from cephcsi import errors
from cephcsi.ceph import omap
from cephcsi.ceph.leases import LeaseKeeper

pytestmark = pytest.mark.unit


class FakeIoctx:
    """The calls leases and omap.remove_object make, recorded."""

    def __init__(self, fail_remove: bool = False, calls: list[tuple[str, ...]] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = [] if calls is None else calls
        self.fail_remove = fail_remove
        self.closed = False

    def get_pool_id(self) -> int:
        return 1

    def get_namespace(self) -> str:
        return ""

    def dup(self) -> FakeIoctx:
        self.calls.append(("dup",))
        return FakeIoctx(self.fail_remove, self.calls)

    def close(self) -> None:
        self.closed = True

    def lock_exclusive(self, obj: str, name: str, cookie: str, **kwargs: Any) -> None:
        self.calls.append(("lock", obj))

    def unlock(self, obj: str, name: str, cookie: str) -> None:
        self.calls.append(("unlock", obj))

    def remove_object(self, obj: str) -> None:
        self.calls.append(("remove", obj))
        if self.fail_remove:
            raise rados.TimedOut("remove timed out")


@pytest.fixture
def keeper() -> LeaseKeeper:
    return LeaseKeeper()


def test_removing_the_leased_object_skips_the_unlock(keeper: LeaseKeeper) -> None:
    io = FakeIoctx()
    with keeper.hold(io, "csi.volume.a", "cephcsi.journal", 10) as held:  # type: ignore[arg-type]
        assert held
        keeper.remove_object(io, "csi.volume.a")  # type: ignore[arg-type]
    assert io.calls == [("lock", "csi.volume.a"), ("remove", "csi.volume.a")]


def test_a_lease_on_an_object_not_removed_is_unlocked(keeper: LeaseKeeper) -> None:
    io = FakeIoctx()
    with keeper.hold(io, "csi.volume.b", "cephcsi.journal", 10):  # type: ignore[arg-type]
        keeper.remove_object(io, "csi.volume.other")  # type: ignore[arg-type]
    assert io.calls[-1] == ("unlock", "csi.volume.b")


def test_a_failed_removal_still_unlocks(keeper: LeaseKeeper) -> None:
    io = FakeIoctx(fail_remove=True)
    with pytest.raises(Exception):
        with keeper.hold(io, "csi.volume.c", "cephcsi.journal", 10):  # type: ignore[arg-type]
            keeper.remove_object(io, "csi.volume.c")  # type: ignore[arg-type]
    assert io.calls[-1] == ("unlock", "csi.volume.c")


def test_no_renewal_after_the_removal_began() -> None:
    keeper = LeaseKeeper()
    io = FakeIoctx()
    with keeper.hold(io, "csi.volume.d", "cephcsi.journal", 3) as held:  # type: ignore[arg-type]
        assert held
        with keeper.removing(io, "csi.volume.d"):  # type: ignore[arg-type]
            pass
        (lease,) = list(keeper._leases)
        assert not lease.active and lease.removed
        keeper._renew(lease)  # a renewal that comes due now does nothing
    assert ("lock", "csi.volume.d") in io.calls and io.calls.count(("lock", "csi.volume.d")) == 1
    assert ("unlock", "csi.volume.d") not in io.calls


def test_cls_lock_requests_are_encoded_as_ceph_does() -> None:
    # ENCODE_START(1, 1) + u32 length, then the fields (src/cls/lock/cls_lock_ops.h).
    body = (b"\x04\x00\x00\x00name" + b"\x01" + b"\x02\x00\x00\x00ck" + b"\x00\x00\x00\x00"
            + b"\x07\x00\x00\x00cephcsi" + b"\x0a\x00\x00\x00" + b"\x00\x00\x00\x00" + b"\x00")
    assert omap.lock_request("name", "ck", 10.5) == b"\x01\x01" + len(body).to_bytes(4, "little") + body
    assert omap.lock_request("n", "c", 0.2)[-9:-5] == b"\x01\x00\x00\x00", "at least one second"
    unlock = b"\x04\x00\x00\x00name\x02\x00\x00\x00ck"
    assert omap.unlock_request("name", "ck") == b"\x01\x01" + len(unlock).to_bytes(4, "little") + unlock


class FailingRenewals(FakeIoctx):
    """The first lock succeeds; every renewal times out (Ceph stopped answering)."""

    def lock_exclusive(self, obj: str, name: str, cookie: str, **kwargs: Any) -> None:
        if kwargs.get("flags"):
            raise rados.TimedOut("renew timed out")
        super().lock_exclusive(obj, name, cookie, **kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_not_renewed_for_its_duration_stops_its_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("cephcsi.ceph.leases.time.monotonic", clock)
    keeper = LeaseKeeper()
    io = FailingRenewals()
    with keeper.hold(io, "csi.volume.e", "cephcsi.journal", 10) as lease:  # type: ignore[arg-type]
        assert lease is not None
        clock.now += 4
        keeper._renew(lease)  # fails: the lease still ends 10 s after it was taken
        clock.now += 5.9
        lease.ensure_held()
        clock.now += 0.1
        with pytest.raises(errors.OperationInFlight, match="lost the lease on journal entry csi.volume.e"):
            lease.ensure_held()
        # Nor may it remove the object another holder may have locked by now.
        with pytest.raises(errors.OperationInFlight):
            with keeper.removing(io, "csi.volume.e"):  # type: ignore[arg-type]
                raise AssertionError("the removal must not run")
    assert ("remove", "csi.volume.e") not in io.calls


def test_a_renewed_lease_is_held_from_the_renewal_on(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("cephcsi.ceph.leases.time.monotonic", clock)
    keeper = LeaseKeeper()
    io = FakeIoctx()
    with keeper.hold(io, "csi.volume.f", "cephcsi.journal", 10) as lease:  # type: ignore[arg-type]
        assert lease is not None
        clock.now += 9
        keeper._renew(lease)
        clock.now += 9.9
        lease.ensure_held()  # 18.9 s after the lock, 9.9 s after the renewal


def test_a_release_behind_runs_after_the_hold_and_a_second_hold_waits_for_it() -> None:
    keeper = LeaseKeeper()
    io = FakeIoctx()
    go = threading.Event()
    seen: list[FakeIoctx] = []

    def values(release_io: rados.Ioctx) -> dict[str, str | None]:
        seen.append(release_io)  # type: ignore[arg-type]
        go.wait(5)
        return {}

    with keeper.hold(io, "csi.volume.e", "cephcsi.journal", 10) as held:  # type: ignore[arg-type]
        assert held
        held.release_behind(values)
    assert io.calls == [("lock", "csi.volume.e"), ("dup",)], "the holder answered before the release"
    second: list[tuple[str, ...]] = []
    waiter = threading.Thread(target=lambda: second.extend(_hold_once(keeper, io, "csi.volume.e")))
    waiter.start()
    time.sleep(0.2)
    assert not second, "a hold of the same object in this process waits for the release"
    go.set()
    waiter.join(5)
    assert io.calls[2:] == [("unlock", "csi.volume.e"), ("lock", "csi.volume.e"), ("unlock", "csi.volume.e")]
    assert seen and seen[0] is not io and seen[0].closed, "the release used its own I/O context and closed it"
    assert keeper.drain(1)


def test_a_failed_call_releases_before_it_answers() -> None:
    keeper = LeaseKeeper()
    io = FakeIoctx()
    with pytest.raises(errors.Internal):
        with keeper.hold(io, "csi.volume.f", "cephcsi.journal", 10) as held:  # type: ignore[arg-type]
            assert held
            held.release_behind(lambda _: {})
            raise errors.Internal("the call failed")
    assert io.calls == [("lock", "csi.volume.f"), ("unlock", "csi.volume.f")]


def test_drain_waits_for_releases_behind_answers() -> None:
    keeper = LeaseKeeper()
    io = FakeIoctx()
    go = threading.Event()
    with keeper.hold(io, "csi.volume.g", "cephcsi.journal", 10) as held:  # type: ignore[arg-type]
        assert held
        held.release_behind(lambda _: {} if go.wait(5) else {})
    assert not keeper.drain(0.1)
    go.set()
    assert keeper.drain(5) and io.calls[-1] == ("unlock", "csi.volume.g")


def _hold_once(keeper: LeaseKeeper, io: FakeIoctx, obj: str) -> list[tuple[str, ...]]:
    with keeper.hold(io, obj, "cephcsi.journal", 10) as held:  # type: ignore[arg-type]
        return [("held",)] if held else []


def test_values_lost_with_the_lease_make_the_call_retry(keeper: LeaseKeeper, monkeypatch: pytest.MonkeyPatch) -> None:
    # update_and_unlock's False: the lock was no longer ours, nothing written.
    monkeypatch.setattr(omap, "update_and_unlock", lambda *args: False)
    io = FakeIoctx()
    with pytest.raises(errors.OperationInFlight):
        with keeper.hold(io, "csi.volume.d", "cephcsi.journal", 10) as held:  # type: ignore[arg-type]
            assert held
            held.on_release["csi.imageid"] = "abc"
    # A call that failed anyway keeps its own error.
    with pytest.raises(ValueError):
        with keeper.hold(io, "csi.volume.e", "cephcsi.journal", 10) as held:  # type: ignore[arg-type]
            assert held
            held.on_release["csi.imageid"] = "abc"
            raise ValueError("the call's own failure")
