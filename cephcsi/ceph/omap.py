"""Atomic omap primitives on one RADOS object (the journal's building blocks).

Each function is one RADOS operation, so it either happens completely or not at all; the
conditional ones use omap_cmp so that two writers (say, two controller replicas during a
leader hand-over) cannot both win.
"""
from __future__ import annotations

import errno
import struct
from collections.abc import Mapping

import rados

from cephcsi.ceph import encoding
from cephcsi.ceph.batch import Batch
from cephcsi.ceph.errors import ceph_call, error_number

# librados.h LIBRADOS_LOCK_FLAG_RENEW (bit 0, alias MAY_RENEW) and LIBRADOS_LOCK_FLAG_MUST_RENEW
# (bit 1); the Pacific bindings export neither constant.
LOCK_FLAG_RENEW = 1
LOCK_FLAG_MUST_RENEW = 2
DESCRIPTION = "cephcsi"
"""The description of the journal's and leases' locks (`rados lock info` shows it)."""

# A write op creates a missing object; comparing a key nobody sets fails with ENOENT on a missing
# object instead, and passes on any existing one (the bindings have no assert_exists).
_NEVER_SET = "cephcsi.never-set"

def read(io: rados.Ioctx, obj: str, keys: tuple[str, ...] | None = None) -> dict[str, str] | None:
    """The object's omap (all of it, or just `keys`), or None when the object does not exist."""
    values = read_raw(io, obj, keys)
    return None if values is None else {key: value.decode() for key, value in values.items()}


def read_raw(io: rados.Ioctx, obj: str, keys: tuple[str, ...] | None = None) -> dict[str, bytes] | None:
    """Like `read`, with the values as stored (librbd's own omaps hold binary encodings)."""
    with ceph_call("read omap", f"object {obj!r}"):
        try:
            with rados.ReadOpCtx() as op:
                if keys is None:
                    items, _ = io.get_omap_vals(op, "", "", -1)
                else:
                    items, _ = io.get_omap_vals_by_keys(op, keys)
                io.operate_read_op(op, obj)
                return {key: bytes(value) for key, value in items}
        except rados.ObjectNotFound:
            return None


def set_if_absent(io: rados.Ioctx, obj: str, key: str, value: str) -> bool:
    """Create the object if needed and set key=value only if the key is absent.

    True when we set it; False when the key already existed (someone else won).
    """
    with ceph_call("reserve omap key", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            op.new(rados.LIBRADOS_CREATE_IDEMPOTENT)
            # A missing key compares equal to the empty value.
            op.omap_cmp(key, "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            io.set_omap(op, (key,), (value.encode(),))
            try:
                io.operate_write_op(op, obj)
                return True
            except rados.Error as error:
                if error_number(error) == errno.ECANCELED:
                    return False
                raise


def set_unless_key(io: rados.Ioctx, obj: str, guard_key: str, values: dict[str, str]) -> bool:
    """Set `values` on an existing object only while `guard_key` is absent; False if present.

    One write op: the guard and the write cannot be separated by another writer."""
    with ceph_call("write omap", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            op.omap_cmp(guard_key, "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            io.set_omap(op, tuple(values), tuple(v.encode() for v in values.values()))
            try:
                io.operate_write_op(op, obj)
                return True
            except rados.Error as error:
                if error_number(error) == errno.ECANCELED:
                    return False
                raise


def try_lock(io: rados.Ioctx, obj: str, name: str, cookie: str, seconds: float,
             description: str = DESCRIPTION) -> bool:
    """Take the exclusive cls_lock `name` on `obj` for `seconds`; False if someone holds it.
    `description` is what `rados lock info` (and a refused competitor) shows of the holder.

    cls_lock creates a missing object, and keeps a lock's xattr after unlock, so callers lock
    objects whose lifetime matches the lock's subject (removing the object removes the lock).
    The duration is what makes a holder that was SIGKILLed harmless: its lock expires."""
    with ceph_call("lock object", f"object {obj!r}"):
        try:
            io.lock_exclusive(obj, name, cookie, desc=description, duration=max(1, int(seconds)))
            return True
        except (rados.ObjectBusy, rados.ObjectExists):
            return False


# cls_lock's request structs, encoded by hand because the bindings expose cls_lock only as
# separate calls (Ioctx.lock_exclusive/unlock), and a lock that must share one atomic write op
# with omap steps needs the raw class method: WriteOp.execute("lock", "lock" | "unlock", input).
# Ceph encoding (src/cls/lock/cls_lock_ops.h, unchanged since Firefly): ENCODE_START(1, 1)
# = u8 version, u8 compat, u32 length; strings as u32 length + bytes; utime_t as u32 sec +
# u32 nsec; little endian.
_LOCK_TYPE_EXCLUSIVE = 1




def lock_request(name: str, cookie: str, seconds: float) -> bytes:
    """cls_lock_lock_op for an exclusive lock held `seconds` (at least 1), no tag, no flags."""
    return encoding.versioned(encoding.string(name) + struct.pack("<B", _LOCK_TYPE_EXCLUSIVE) + encoding.string(cookie)
                              + encoding.string("") + encoding.string(DESCRIPTION)
                              + struct.pack("<IIB", max(1, int(seconds)), 0, 0))


def unlock_request(name: str, cookie: str) -> bytes:
    """cls_lock_unlock_op."""
    return encoding.versioned(encoding.string(name) + encoding.string(cookie))


def lock_info_request(name: str) -> bytes:
    """cls_lock_get_info_op: the lock's name."""
    return encoding.versioned(encoding.string(name))


def lock_is_held(reply: bytes) -> bool:
    """cls_lock_get_info_reply starts (after its encoding header) with the lockers map's u32
    count; cls_lock leaves expired lockers out, so a killed holder's lapsed lease reads free."""
    start = encoding.STRUCT_HEADER
    return len(reply) >= start + 4 and struct.unpack_from("<I", reply, start)[0] > 0


_LEGACY_ADDR_BYTES = 4 + 4 + 128
"""entity_addr_t before MSG_ADDR2: u32 type 0, u32 nonce, sockaddr_storage."""


def lock_descriptions(reply: bytes) -> list[str]:
    """The descriptions of the lock's current holders in a cls_lock_get_info_reply (the map of
    locker_id_t → locker_info_t {utime expiration, entity_addr_t addr, string description}); []
    when it holds none or cannot be read. For messages only: a reply this cannot decode says
    nothing rather than failing the call that asks."""
    try:
        outer = encoding.read_versioned(reply, "lock info", 1)
        encoding.require(reply, outer.start, 4, outer.end, "lock info")
        (count,) = struct.unpack_from("<I", reply, outer.start)
        offset, found = outer.start + 4, []
        for _ in range(count):
            offset = encoding.read_versioned(reply, "locker id", 1, offset).end
            info = encoding.read_versioned(reply, "locker info", 1, offset)
            at = info.start + 8  # expiration
            encoding.require(reply, at, 1, info.end, "locker address")
            if reply[at] == 1:  # MSG_ADDR2: a marker byte, then a versioned struct
                at = encoding.read_versioned(reply, "locker address", 1, at + 1).end
            else:
                at += _LEGACY_ADDR_BYTES
            found.append(encoding.read_string_within(reply, at, info.end, "locker description")[0])
            offset = info.end
        return found
    except (encoding.UnknownEncoding, struct.error):
        return []


def try_lock_and_fill(io: rados.Ioctx, obj: str, name: str, cookie: str, seconds: float, guard_key: str,
                      values: Mapping[str, str]) -> str:
    """`try_lock` and `set_unless_key` in one atomic write op: one round trip instead of two.

    'filled' (locked and written), 'busy' (someone holds the lock: nothing changed) or
    'guarded' (`guard_key` is present: nothing changed, not even the lock)."""
    with ceph_call("lock and write omap", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            op.execute("lock", "lock", lock_request(name, cookie, seconds))
            op.omap_cmp(guard_key, "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            io.set_omap(op, tuple(values), tuple(v.encode() for v in values.values()))
            try:
                io.operate_write_op(op, obj)
                return "filled"
            except (rados.ObjectBusy, rados.ObjectExists):
                return "busy"
            except rados.Error as error:
                if error_number(error) == errno.ECANCELED:
                    return "guarded"
                raise


def try_lock_then_read(io: rados.Ioctx, obj: str, name: str, cookie: str, seconds: float,
                       existing: bool = False) -> tuple[bool, dict[str, str] | None]:
    """`try_lock`, and the object's omap as it is once the lock is ours, in one round trip.

    The read is submitted right behind the lock, ordered after it (ORDER_READS_WRITES), so it
    sees what the lock holder sees; when the lock is busy its result is dropped. Returns
    (locked, omap or None when the object held nothing but our lock's creation). With
    `existing`, a missing object is not created (cls_lock would) but NotFound is raised."""
    with ceph_call("lock object", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            if existing:
                op.omap_cmp(_NEVER_SET, "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            op.execute("lock", "lock", lock_request(name, cookie, seconds))
            locking = io.operate_aio_write_op(op, obj)
            batch = Batch(io)
            values = batch.omap(obj, after_writes=True)
            locking.wait_for_complete()
            batch.wait()
            outcome = locking.get_return_value()
    if outcome in (-errno.EBUSY, -errno.EEXIST):
        return False, None
    if outcome < 0:
        with ceph_call("lock object", f"object {obj!r}"):
            raise rados.OSError("cls_lock lock failed", errno=-outcome)
    raw = values.result()
    return True, None if raw is None else {key: value.decode() for key, value in raw.items()}


def update_and_unlock(io: rados.Ioctx, obj: str, values: Mapping[str, str | None], name: str, cookie: str) -> bool:
    """Set `values` (a None value removes its key) and release our lock in one atomic write op.
    False (and nothing written) when the lock is no longer ours (it expired, maybe taken by
    another holder, or the object is gone): writing under someone else's lock would be wrong,
    so the values are dropped."""
    setting = {key: value for key, value in values.items() if value is not None}
    removing = tuple(key for key, value in values.items() if value is None)
    with ceph_call("write omap and unlock", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            if setting:
                io.set_omap(op, tuple(setting), tuple(v.encode() for v in setting.values()))
            if removing:
                io.remove_omap_keys(op, removing)
            op.execute("lock", "unlock", unlock_request(name, cookie))
            try:
                io.operate_write_op(op, obj)
                return True
            except rados.ObjectNotFound:
                return False


def renew_lock(io: rados.Ioctx, obj: str, name: str, cookie: str, seconds: float) -> None:
    """Extend a lock we hold (same cookie) by `seconds` from now."""
    with ceph_call("renew object lock", f"object {obj!r}"):
        io.lock_exclusive(obj, name, cookie, desc=DESCRIPTION, duration=max(1, int(seconds)), flags=LOCK_FLAG_RENEW)


def renew_held_lock(io: rados.Ioctx, obj: str, name: str, cookie: str, seconds: float, description: str) -> bool:
    """Extend our lock by `seconds` from now only if we still hold it: False when it lapsed
    (cls_lock drops an expired locker when it reads the lock, whether or not another holder took
    it since). Plain RENEW would take a lapsed lock afresh and hide the gap; MUST_RENEW does not,
    so True means nobody else can have held the lock since we took it."""
    with ceph_call("renew object lock", f"object {obj!r}"):
        try:
            io.lock_exclusive(obj, name, cookie, desc=description, duration=max(1, int(seconds)),
                              flags=LOCK_FLAG_MUST_RENEW)
            return True
        except (rados.ObjectNotFound, rados.ObjectBusy, rados.ObjectExists):
            return False


def unlock(io: rados.Ioctx, obj: str, name: str, cookie: str) -> None:
    """Release our lock; a lock that expired or whose object is gone counts as released."""
    with ceph_call("unlock object", f"object {obj!r}"):
        try:
            io.unlock(obj, name, cookie)
        except rados.ObjectNotFound:
            pass


def create_exclusive(io: rados.Ioctx, obj: str, values: dict[str, str]) -> bool:
    """Create the object with this omap; False (and no change) if it already exists."""
    with ceph_call("create omap object", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
            io.set_omap(op, tuple(values), tuple(v.encode() for v in values.values()))
            try:
                io.operate_write_op(op, obj)
                return True
            except rados.ObjectExists:
                return False


def update(io: rados.Ioctx, obj: str, values: dict[str, str]) -> None:
    """Set keys on an existing object (fails with NotFound if it is gone)."""
    with ceph_call("update omap", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            io.set_omap(op, tuple(values), tuple(v.encode() for v in values.values()))
            op.omap_cmp(_NEVER_SET, "", rados.LIBRADOS_CMPXATTR_OP_EQ)  # fail, not create, when gone
            io.operate_write_op(op, obj)


def execute_on_existing(io: rados.Ioctx, obj: str, cls: str, method: str, data: bytes, operation: str,
                        subject: str) -> None:
    """Run a class write method on `obj` only if it exists (NotFound otherwise): a late call
    on an object removed meanwhile would otherwise create it again, holding only what the
    method writes. `operation` and `subject` name the call in errors and metrics."""
    with ceph_call(operation, subject):
        with rados.WriteOpCtx() as op:
            op.omap_cmp(_NEVER_SET, "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            op.execute(cls, method, data)
            io.operate_write_op(op, obj)


def remove_keys(io: rados.Ioctx, obj: str, keys: tuple[str, ...]) -> None:
    """Remove keys from an existing object (fails with NotFound if it is gone); absent keys are
    no error."""
    with ceph_call("remove omap keys", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            io.remove_omap_keys(op, keys)
            op.omap_cmp(_NEVER_SET, "", rados.LIBRADOS_CMPXATTR_OP_EQ)  # fail, not create, when gone
            io.operate_write_op(op, obj)


def remove_if_equal(io: rados.Ioctx, obj: str, key: str, expected: str) -> bool:
    """Remove key only while it still holds `expected`; True if removed or already absent."""
    with ceph_call("release omap key", f"object {obj!r}"):
        with rados.WriteOpCtx() as op:
            op.omap_cmp(key, expected, rados.LIBRADOS_CMPXATTR_OP_EQ)
            io.remove_omap_keys(op, (key,))
            try:
                io.operate_write_op(op, obj)
                return True
            except rados.ObjectNotFound:
                return True
            except rados.Error as error:
                if error_number(error) == errno.ECANCELED:
                    current = (read(io, obj, (key,)) or {}).get(key)
                    return current is None
                raise


def remove_object(io: rados.Ioctx, obj: str) -> None:
    """Delete the object; already gone counts as done. A cls_lock on it goes with it: an object
    this process may hold a lease on is removed through `LeaseKeeper.remove_object` instead."""
    with ceph_call("remove object", f"object {obj!r}"):
        try:
            io.remove_object(obj)
        except rados.ObjectNotFound:
            pass
