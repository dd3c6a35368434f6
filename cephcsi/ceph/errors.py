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
    Unavailable,
)
from cephcsi.observability.metrics import CEPH_CALLS

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


def translate(error: BaseException, operation: str, subject: str) -> CephCSIError:
    """A cephcsi error that says what failed on which object and what to do about it."""
    number = error_number(error)
    what = f"{operation} {subject}".strip()
    if number in (errno.ETIMEDOUT, errno.EINTR):
        return DeadlineExceeded(f"Ceph did not complete {what} in time; the cluster may be unreachable or overloaded, retry later")
    if number in CONNECTION_LOST:
        return Unavailable(f"lost the connection to Ceph during {what}; retry")
    if number in (errno.EPERM, errno.EACCES):
        return PermissionDenied(
            f"Ceph refused {what}: the cephx user lacks the capabilities "
            "(needs mon 'profile rbd', osd 'profile rbd pool=<pool>', mgr 'profile rbd pool=<pool>')"
        )
    if number == errno.ENOENT:
        return NotFound(f"{subject} does not exist ({operation})")
    if number == errno.EEXIST:
        return AlreadyExists(f"{subject} already exists ({operation})")
    if number in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(f"no space or quota left for {what}")
    if number == errno.EBUSY:
        return FailedPrecondition(f"{subject} is busy ({operation}); it may still be in use")
    return Internal(f"{what} failed: {error}")


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
