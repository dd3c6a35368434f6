"""The one exception hierarchy of cephcsi, and the one table from it to gRPC status codes.

Every layer raises these (Ceph, node, Kubernetes errors are translated where they happen);
the RPC decorator in cephcsi.csi.rpc turns them into a status with the message as written.
Messages are for a person: say what was wrong and, where possible, what to do about it.
They never contain secrets.
"""
from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

import grpc


class CephCSIError(Exception):
    """Base class. `code` is the gRPC status the error maps to."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(CephCSIError):
    """The request itself is wrong: a missing field, a bad parameter, a malformed path."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CephCSIError):
    """The named volume, snapshot, path or cluster does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(CephCSIError):
    """A resource with this name exists but is incompatible with the request."""

    code = grpc.StatusCode.ALREADY_EXISTS


class OperationInFlight(CephCSIError):
    """Another call on the same volume or name is still running; the caller should retry."""

    code = grpc.StatusCode.ABORTED


class FailedPrecondition(CephCSIError):
    """The system is not in a state that allows the operation (e.g. image still mapped)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRange(CephCSIError):
    """A size or count outside what the driver can honour."""

    code = grpc.StatusCode.OUT_OF_RANGE


class ResourceExhausted(CephCSIError):
    """No space or quota left."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(CephCSIError):
    """A peer (Ceph monitors, OSDs, the API server) cannot be reached right now; retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(CephCSIError):
    """A bounded operation ran out of time; it may or may not have taken effect, so retry."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class PermissionDenied(CephCSIError):
    """The credentials were refused or lack the capabilities for the operation."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unimplemented(CephCSIError):
    """The RPC or option is not supported by this driver."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(CephCSIError):
    """An unexpected failure; the message still says which step failed."""

    code = grpc.StatusCode.INTERNAL


class ConfigError(CephCSIError):
    """Start-up configuration (flags, config.json) is invalid; the process refuses to start."""

    code = grpc.StatusCode.FAILED_PRECONDITION


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for any exception: ours map to their own code, anything else
    is INTERNAL with a generic message (the traceback goes to the log, not to the caller)."""
    if isinstance(error, CephCSIError):
        return error.code, error.message
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}); see the driver log"


@dataclass(frozen=True)
class Rule:
    """One row of a translation table from a foreign failure to this hierarchy.

    Every translator (Ceph bindings by errno, the rbd and rbd-fuse tools by errno and stderr)
    is a table of these, read top to bottom: the first row whose conditions all hold wins.
    An empty condition holds for anything, so a last row with neither is the fallback."""

    error: type[CephCSIError]
    message: str
    """str.format template over the translator's named fields (what failed, on which object…)."""
    errnos: frozenset[int] = frozenset()
    """Holds when the failure carries one of these errnos."""
    phrases: tuple[str, ...] = ()
    """Holds when the failure's lower-cased text contains one of these."""

    def matches(self, errnos: Set[int], text: str) -> bool:
        return ((not self.errnos or bool(self.errnos & errnos))
                and (not self.phrases or any(phrase in text for phrase in self.phrases)))


def translate_by(table: Sequence[Rule], errnos: Set[int], text: str, **names: object) -> CephCSIError | None:
    """The error of the first matching row, its message filled from `names`; None if none does."""
    for rule in table:
        if rule.matches(errnos, text):
            return rule.error(rule.message.format(**names))
    return None
