"""Classification of a failed provisioning attempt (IN_PROGRESS, RESCHEDULE, FINAL), by the gRPC
code the error carries, as external-provisioner classifies it. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import enum

import grpc

from cephcsi.errors import CephCSIError

_NON_FINAL = frozenset({
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
})
# Go's names where they differ from a plain CamelCase of the Python enum.
_GO_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled"}


class Outcome(enum.Enum):
    IN_PROGRESS = "in_progress"
    RESCHEDULE = "reschedule"
    FINAL = "final"


def status_code(error: BaseException) -> grpc.StatusCode | None:
    return error.code if isinstance(error, CephCSIError) else None


def classify(error: BaseException, may_reschedule: bool) -> Outcome:
    code = status_code(error)
    if code is None:
        return Outcome.IN_PROGRESS
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and may_reschedule:
        return Outcome.RESCHEDULE
    return Outcome.IN_PROGRESS if code in _NON_FINAL else Outcome.FINAL


def go_code_name(code: grpc.StatusCode) -> str:
    return _GO_NAMES.get(code) or code.name.title().replace("_", "")


def describe(error: BaseException) -> str:
    """The error as users of external-provisioner read it in events:
    `rpc error: code = InvalidArgument desc = ...` for CSI errors, the plain message otherwise."""
    code = status_code(error)
    if code is None:
        return str(error) or type(error).__name__
    return f"rpc error: code = {go_code_name(code)} desc = {error}"
