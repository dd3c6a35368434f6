"""Several independent small RADOS reads in one round trip.

The delete path reads four traces of an image (its id object, its directory entry, its header,
its trash entry) and the journal record under a fresh lease. Each is one small op of ≈ 0.3 ms,
almost all of it waiting on the OSD; issued one after the other they add up on every call.
librados can have them all in flight at once (its aio calls), and python-rados exposes those,
but only as callbacks and completions: this module wraps them in `Pending` values so callers
read like the sequential code they replace.

Ordering: ops on different objects are independent. A read submitted after a write to the same
object from this client is ordered after it only with LIBRADOS_OPERATION_ORDER_READS_WRITES,
which `Batch.omap(..., after_writes=True)` sets.
"""
from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import rados

from cephcsi.ceph.errors import ceph_call

T = TypeVar("T")


@dataclass(eq=False)
class Pending(Generic[T]):
    """One submitted op: `result()` after `Batch.wait()`."""

    what: str
    where: str
    completion: rados.Completion | None = None
    decode: Callable[[], T] | None = None
    missing: T | None = None
    """The value when the object does not exist (ENOENT)."""
    _value: Any = None
    _error: int = 0

    def result(self) -> T:
        if self._error == -errno.ENOENT:
            return self.missing  # type: ignore[return-value]
        if self._error < 0:
            with ceph_call(self.what, self.where):
                raise rados.OSError(f"{self.what} failed", errno=-self._error)
        return self._value  # type: ignore[no-any-return]

    def _settle(self) -> None:
        """After the op completed (and its callback ran)."""
        assert self.completion is not None and self.decode is not None
        self._error = self.completion.get_return_value()
        if self._error >= 0:
            # Decoded before the read op is released: an omap iterator lives in the op's reply.
            self._value = self.decode()


@dataclass(eq=False)
class Batch:
    """Submit with `omap`, `read`, `stat`; then `wait()` once and read each `Pending`."""

    io: rados.Ioctx
    _pending: list[Pending[Any]] = field(default_factory=list)
    _ops: list[rados.ReadOp] = field(default_factory=list)

    def omap(self, obj: str, keys: tuple[str, ...] | None = None,
             after_writes: bool = False) -> Pending[dict[str, bytes] | None]:
        """The object's omap (all of it, or `keys`) as stored; None when the object is missing."""
        op = rados.ReadOp()
        op.create()
        self._ops.append(op)
        if keys is None:
            items, _ = self.io.get_omap_vals(op, "", "", -1)
        else:
            items, _ = self.io.get_omap_vals_by_keys(op, keys)
        pending: Pending[dict[str, bytes] | None] = Pending("read omap", f"object {obj!r}")
        pending.decode = lambda: {key: bytes(value) for key, value in items}
        flag = rados.LIBRADOS_OPERATION_ORDER_READS_WRITES if after_writes else rados.LIBRADOS_OPERATION_NOFLAG
        with ceph_call(pending.what, pending.where):
            pending.completion = self.io.operate_aio_read_op(op, obj, flag=flag)
        self._pending.append(pending)
        return pending

    def read(self, obj: str, length: int) -> Pending[bytes | None]:
        """Up to `length` bytes from the object's start; None when the object is missing."""
        pending: Pending[bytes | None] = Pending("read object", f"object {obj!r}")
        box: list[bytes] = []

        def done(_: rados.Completion, data: bytes | None) -> None:
            box.append(bytes(data or b""))

        pending.decode = lambda: box[0] if box else b""
        with ceph_call(pending.what, pending.where):
            pending.completion = self.io.aio_read(obj, length, 0, done)
        self._pending.append(pending)
        return pending

    def stat(self, obj: str) -> Pending[bool]:
        """Whether the object exists."""
        pending: Pending[bool] = Pending("stat object", f"object {obj!r}", missing=False)
        pending.decode = lambda: True
        with ceph_call(pending.what, pending.where):
            pending.completion = self.io.aio_stat(obj, lambda *_: None)
        self._pending.append(pending)
        return pending

    def wait(self) -> None:
        """Wait for every submitted op (and its callback); errors surface in `result()`."""
        # Every op completes before any is released (releasing an op in flight would free
        # what librados is about to write into).
        for pending in self._pending:
            assert pending.completion is not None
            pending.completion.wait_for_complete_and_cb()
        try:
            for pending in self._pending:
                pending._settle()
        finally:
            for op in self._ops:
                op.release()
            self._ops.clear()
