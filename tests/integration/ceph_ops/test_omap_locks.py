"""The journal's combined lock + omap write ops (cephcsi.ceph.omap) against a real OSD: the
hand-encoded cls_lock requests must mean to the OSD exactly what Ioctx.lock_exclusive/unlock
mean, and each combined op must be all or nothing."""
from __future__ import annotations

import time
import uuid

import pytest
import rados

from cephcsi.ceph import omap
from cephcsi.ceph.batch import Batch
from cephcsi.ceph.leases import Fill, LeaseKeeper
from cephcsi.errors import NotFound

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

LOCK = "cephcsi.journal"


def _obj() -> str:
    return f"test.omap-locks.{uuid.uuid4()}"


def _exists(io: rados.Ioctx, obj: str) -> bool:
    return omap.read(io, obj) is not None


def test_lock_and_fill_takes_the_lock_and_writes_in_one_op(io: rados.Ioctx) -> None:
    obj = _obj()
    assert omap.try_lock_and_fill(io, obj, LOCK, "a", 10, "name", {"name": "pvc-1", "image": "img"}) == "filled"
    assert omap.read(io, obj) == {"name": "pvc-1", "image": "img"}
    # The lock is a real exclusive cls_lock: another cookie cannot take it, by either path.
    assert not omap.try_lock(io, obj, LOCK, "b", 10)
    assert omap.try_lock_and_fill(io, _obj(), LOCK, "b", 10, "name", {"name": "x"}) == "filled"  # other object
    assert omap.try_lock_and_fill(io, obj, LOCK, "b", 10, "other", {"other": "x"}) == "busy"
    assert "other" not in (omap.read(io, obj) or {})
    omap.unlock(io, obj, LOCK, "a")
    assert omap.try_lock(io, obj, LOCK, "b", 10)
    omap.remove_object(io, obj)


def test_a_present_guard_key_changes_nothing_not_even_the_lock(io: rados.Ioctx) -> None:
    obj = _obj()
    assert omap.set_if_absent(io, obj, "name", "pvc-1")
    assert omap.try_lock_and_fill(io, obj, LOCK, "a", 10, "name", {"name": "pvc-2"}) == "guarded"
    assert omap.read(io, obj) == {"name": "pvc-1"}
    assert omap.try_lock(io, obj, LOCK, "b", 10), "the guarded op must not have left a lock behind"
    omap.remove_object(io, obj)


def test_a_lock_with_a_duration_expires(io: rados.Ioctx) -> None:
    obj = _obj()
    assert omap.try_lock_and_fill(io, obj, LOCK, "a", 1, "name", {"name": "pvc"}) == "filled"
    deadline = time.monotonic() + 10
    while not omap.try_lock(io, obj, LOCK, "b", 10):
        assert time.monotonic() < deadline, "a 1 s lock did not expire"
        time.sleep(0.2)
    omap.remove_object(io, obj)


def test_update_and_unlock_writes_and_releases_together(io: rados.Ioctx) -> None:
    obj = _obj()
    assert omap.try_lock_and_fill(io, obj, LOCK, "a", 10, "name", {"name": "pvc"}) == "filled"
    assert omap.update_and_unlock(io, obj, {"id": "1234"}, LOCK, "a")
    assert omap.read(io, obj) == {"name": "pvc", "id": "1234"}
    assert omap.try_lock(io, obj, LOCK, "b", 10), "released"
    # Not our lock any more (b holds it): nothing is written, the other holder keeps it.
    assert not omap.update_and_unlock(io, obj, {"id": "5678"}, LOCK, "a")
    assert (omap.read(io, obj) or {})["id"] == "1234"
    assert not omap.try_lock(io, obj, LOCK, "c", 10)
    omap.remove_object(io, obj)
    # A removed object is not recreated by the write half of the op.
    assert not omap.update_and_unlock(io, obj, {"id": "1"}, LOCK, "b")
    assert not _exists(io, obj)


def test_a_lease_with_a_fill_and_values_on_release(io: rados.Ioctx) -> None:
    keeper = LeaseKeeper()
    obj = _obj()
    with keeper.hold(io, obj, LOCK, 10, Fill("name", {"name": "pvc"})) as lease:
        assert lease is not None and lease.filled
        with keeper.hold(io, obj, LOCK, 10) as other:
            assert other is None
        lease.on_release["id"] = "abcd"
    assert omap.read(io, obj) == {"name": "pvc", "id": "abcd"}
    with keeper.hold(io, obj, LOCK, 10, Fill("name", {"name": "other"})) as lease:
        assert lease is not None and not lease.filled, "the record exists: the lease alone"
    assert (omap.read(io, obj) or {})["name"] == "pvc"
    omap.remove_object(io, obj)


def test_lock_then_read_sees_the_object_as_the_lock_found_it(io: rados.Ioctx) -> None:
    obj = _obj()
    assert omap.set_if_absent(io, obj, "name", "pvc-1")
    assert omap.try_lock_then_read(io, obj, LOCK, "a", 10) == (True, {"name": "pvc-1"})
    # Busy: nothing is read (a value read beside someone else's lock would be a guess).
    assert omap.try_lock_then_read(io, obj, LOCK, "b", 10) == (False, None)
    assert not omap.try_lock(io, obj, LOCK, "b", 10), "the first lock is a real exclusive cls_lock"
    omap.unlock(io, obj, LOCK, "a")
    # A missing object: the lock creates it (cls_lock does), and the read, ordered after the
    # lock, finds it empty rather than missing.
    fresh = _obj()
    assert omap.try_lock_then_read(io, fresh, LOCK, "c", 10) == (True, {})
    assert _exists(io, fresh)
    omap.remove_object(io, fresh)
    omap.remove_object(io, obj)


def test_lock_then_read_of_an_existing_object_only(io: rados.Ioctx) -> None:
    missing = _obj()
    with pytest.raises(NotFound):
        omap.try_lock_then_read(io, missing, LOCK, "a", 10, existing=True)
    assert not _exists(io, missing), "the guard fails the whole op: the lock created nothing"
    obj = _obj()
    assert omap.set_if_absent(io, obj, "name", "pvc-1")
    assert omap.try_lock_then_read(io, obj, LOCK, "a", 10, existing=True) == (True, {"name": "pvc-1"})
    assert omap.try_lock_then_read(io, obj, LOCK, "b", 10, existing=True) == (False, None)
    omap.unlock(io, obj, LOCK, "a")
    assert omap.try_lock(io, obj, LOCK, "b", 10), "the guarded lock was a real cls_lock, now released"
    omap.remove_object(io, obj)


def test_a_batch_reads_several_objects_at_once(io: rados.Ioctx) -> None:
    obj, data, missing = _obj(), _obj(), _obj()
    assert omap.set_if_absent(io, obj, "a", "1") and omap.set_if_absent(io, obj, "b", "2")
    io.write_full(data, b"\x03\x00\x00\x00abc")
    batch = Batch(io)
    some, every, absent = batch.omap(obj, ("a",)), batch.omap(obj), batch.omap(missing)
    content, no_content = batch.read(data, 4096), batch.read(missing, 16)
    there, not_there = batch.stat(data), batch.stat(missing)
    batch.wait()
    assert some.result() == {"a": b"1"} and every.result() == {"a": b"1", "b": b"2"} and absent.result() is None
    assert content.result() == b"\x03\x00\x00\x00abc" and no_content.result() is None
    assert there.result() is True and not_there.result() is False
    omap.remove_object(io, obj)
    omap.remove_object(io, data)
