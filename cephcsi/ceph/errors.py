"""Translation of librados/librbd exceptions into cephcsi errors, in one place.

The bindings raise errno-carrying exceptions; what a caller can do about them depends on the
errno, not the Python class (both modules have parallel hierarchies), so the table is by errno.
"""
from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from contextlib import contextmanager

import rados
import rbd

from cephcsi.errors import (
    AlreadyExists,
    CephCSIError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Rule,
    Unavailable,
    translate_by,
)
from cephcsi.observability.metrics import CEPH_CALLS

LibradosError = rados.Error
"""librados' base exception, for the one caller outside this package that skips a pool whatever
failed there (ListSnapshots over every pool); everything else translates through `ceph_call`."""

# Errors after which a cached connection must not be reused.
CONNECTION_LOST = {errno.ESHUTDOWN, errno.ENOTCONN, 108}  # 108: EBLOCKLISTED on Linux (ESHUTDOWN)


def error_number(error: BaseException) -> int | None:
    number = getattr(error, "errno", None)
    if isinstance(number, int):
        return abs(number)
    if isinstance(error, (rados.TimedOut, getattr(rbd, "Timeout", rados.TimedOut))):
        return errno.ETIMEDOUT
    if isinstance(error, (rados.ObjectNotFound, rbd.ImageNotFound)):
        return errno.ENOENT
    if isinstance(error, (rados.ObjectExists, rbd.ImageExists)):
        return errno.EEXIST
    if isinstance(error, (rados.PermissionError, rados.PermissionDeniedError, rbd.PermissionError)):
        return errno.EPERM
    if isinstance(error, (rados.ConnectionShutdown, rbd.ConnectionShutdown)):
        return errno.ESHUTDOWN
    return None


TABLE: tuple[Rule, ...] = (
    Rule(DeadlineExceeded, "Ceph did not complete {what} in time; the cluster may be unreachable or overloaded, "
         "retry later", errnos=frozenset({errno.ETIMEDOUT, errno.EINTR})),
    Rule(Unavailable, "lost the connection to Ceph during {what}; retry", errnos=frozenset(CONNECTION_LOST)),
    Rule(PermissionDenied, "Ceph refused {what}: the cephx user lacks the capabilities (needs mon 'profile rbd', "
         "osd 'profile rbd pool=<pool>', mgr 'profile rbd pool=<pool>')", errnos=frozenset({errno.EPERM, errno.EACCES})),
    Rule(NotFound, "{subject} does not exist ({operation})", errnos=frozenset({errno.ENOENT})),
    Rule(AlreadyExists, "{subject} already exists ({operation})", errnos=frozenset({errno.EEXIST})),
    Rule(ResourceExhausted, "no space or quota left for {what}", errnos=frozenset({errno.ENOSPC, errno.EDQUOT})),
    Rule(FailedPrecondition, "{subject} is busy ({operation}); it may still be in use", errnos=frozenset({errno.EBUSY})),
    # librbd's EMLINK: the image is a member of an RBD group, which newer clients refuse to move or remove.
    Rule(FailedPrecondition, "{subject} is a member of an RBD group ({operation}): a VolumeGroupSnapshot whose "
         "creation was interrupted still holds it (retry or delete that VolumeGroupSnapshot), or remove it from the "
         "group with `rbd group image remove`", errnos=frozenset({errno.EMLINK})),
    Rule(Internal, "{what} failed: {error}"),
)
"""librados/librbd failures by errno, first match wins."""


def translate(error: BaseException, operation: str, subject: str) -> CephCSIError:
    """A cephcsi error that says what failed on which object and what to do about it."""
    number = error_number(error)
    found = translate_by(TABLE, {number} if number is not None else set(), "",
                         what=f"{operation} {subject}".strip(), operation=operation, subject=subject, error=error)
    assert found is not None  # the table ends with a fallback row
    return found


@contextmanager
def ceph_call(operation: str, subject: str = "") -> Iterator[None]:
    """Time one Ceph call and translate its failure. Our own errors pass through unchanged."""
    started = time.monotonic()
    outcome = "ok"
    try:
        yield
    except CephCSIError:
        outcome = "error"
        raise
    except (rados.Error, rbd.Error, OSError) as error:
        outcome = "error"
        raise translate(error, operation, subject) from error
    finally:
        CEPH_CALLS.labels(operation, outcome).observe(time.monotonic() - started)
