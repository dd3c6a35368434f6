"""Several independent small RADOS reads in one round trip (librados aio), as `Pending` values read
like sequential code. A read after this client's write to the same object is ordered after it
only with `Batch.omap(..., after_writes=True)`. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import rados

from cephcsi.ceph.errors import ceph_call

T = TypeVar("T")

NOTIFY_TIMEOUT_MS = 1000
"""How long `Batch.watch_free` waits for watchers to answer; only a watched object waits."""

# A notify payload that image watchers acknowledge without acting on it: an encoded librbd
# NotifyMessage (struct v1, compat 1, length 4) whose op number no librbd or kernel client
# knows. librbd and krbd ack unknown ops; an empty payload would instead be taken for a legacy
# header update and make every watcher re-read the image header. (A str, as the binding takes
# it: every byte is ASCII, so it is sent as written.)
UNKNOWN_NOTIFY = "\x01\x01\x04\x00\x00\x00\x7e\x7e\x00\x00"


@dataclass(eq=False)
class Pending(Generic[T]):
    """One submitted op: `result()` after `Batch.wait()`."""

    what: str
    where: str
    completion: rados.Completion | None = None
    decode: Callable[[], T] | None = None
    answers: dict[int, T | None] = field(default_factory=lambda: {-errno.ENOENT: None})
    """Negative return values that are answers, not errors, and the value each means; by
    default a missing object (ENOENT) answers None."""
    _value: Any = None
    _error: int = 0

    def result(self) -> T:
        if self._error in self.answers:
            return self.answers[self._error]  # type: ignore[return-value]
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
    _ops: list[rados.ReadOp | rados.WriteOp] = field(default_factory=list)

    def omap(self, obj: str, keys: tuple[str, ...] | None = None,
             after_writes: bool = False) -> Pending[dict[str, bytes] | None]:
        """The object's omap (all of it, or `keys`) as stored; None when the object is missing."""
        op = rados.ReadOp()
        op.create()
        pending: Pending[dict[str, bytes] | None] = Pending("read omap", f"object {obj!r}")
        flag = rados.LIBRADOS_OPERATION_ORDER_READS_WRITES if after_writes else rados.LIBRADOS_OPERATION_NOFLAG
        try:
            if keys is None:
                items, _ = self.io.get_omap_vals(op, "", "", -1)
            else:
                items, _ = self.io.get_omap_vals_by_keys(op, keys)
            pending.decode = lambda: {key: bytes(value) for key, value in items}
            with ceph_call(pending.what, pending.where):
                pending.completion = self.io.operate_aio_read_op(op, obj, flag=flag)
        except BaseException:
            op.release()  # never submitted: nothing in flight can write into it
            raise
        self._ops.append(op)
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
        pending: Pending[bool] = Pending("stat object", f"object {obj!r}", answers={-errno.ENOENT: False})
        pending.decode = lambda: True
        with ceph_call(pending.what, pending.where):
            pending.completion = self.io.aio_stat(obj, lambda *_: None)
        self._pending.append(pending)
        return pending

    def execute(self, obj: str, cls: str, method: str, data: bytes = b"") -> Pending[bytes | None]:
        """A class method's reply (cls_rbd and the like); None when the object is missing."""
        pending: Pending[bytes | None] = Pending(f"call {cls}.{method}", f"object {obj!r}")
        box: list[bytes] = []

        def done(_: rados.Completion, reply: bytes) -> None:
            box.append(bytes(reply or b""))

        pending.decode = lambda: box[0] if box else b""
        with ceph_call(pending.what, pending.where):
            pending.completion = self.io.aio_execute(obj, cls, method, data, oncomplete=done)
        self._pending.append(pending)
        return pending

    def write(self, obj: str, what: str, steps: Callable[[rados.WriteOp], None],
              answers: dict[int, bool | None] | None = None) -> Pending[bool | None]:
        """A write op built by `steps` (e.g. an exclusive create and a class call): True once
        applied; a negative return value listed in `answers` reads as its value instead of
        raising (EEXIST from an exclusive create, say)."""
        op = rados.WriteOp()
        op.create()
        pending: Pending[bool | None] = Pending(what, f"object {obj!r}", answers=dict(answers or {}))
        pending.decode = lambda: True
        try:
            steps(op)
            with ceph_call(pending.what, pending.where):
                pending.completion = self.io.operate_aio_write_op(op, obj)
        except BaseException:
            op.release()
            raise
        self._ops.append(op)
        self._pending.append(pending)
        return pending

    def watch_free(self, obj: str, timeout_ms: int = NOTIFY_TIMEOUT_MS) -> Pending[bool | None]:
        """Whether no client watches the object (True), some does (False), or the object is
        missing (None).

        The C API has no watcher listing (only librados' C++ one does), but a notify completes
        with every watch the OSD holds on the object, answered or timed out, and at once when
        there is none: one round trip where librbd's `watchers_list` needs an image open. A
        watcher that does not answer within `timeout_ms` (a killed client whose watch has not
        expired yet) makes the notify fail with ETIMEDOUT, which also means "watched"."""
        pending: Pending[bool | None] = Pending("notify watchers", f"object {obj!r}",
                                             answers={-errno.ENOENT: None, -errno.ETIMEDOUT: False})
        box: list[bool] = []

        def done(_: rados.Completion, ret: int, acks: list[Any] | None, timeouts: list[Any] | None) -> None:
            box.append(ret == 0 and not acks and not timeouts)

        pending.decode = lambda: box[0] if box else False
        with ceph_call(pending.what, pending.where):
            pending.completion = self.io.aio_notify(obj, done, msg=UNKNOWN_NOTIFY, timeout_ms=timeout_ms)
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
