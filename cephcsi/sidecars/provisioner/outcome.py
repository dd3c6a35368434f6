"""Classification of a failed provisioning attempt, as external-provisioner does it.

The in-process CSI calls raise cephcsi.errors exceptions whose `.code` is the gRPC status the
call would have returned over the socket, so the classes are external-provisioner's exactly:

- CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED, RESOURCE_EXHAUSTED: the volume may still
  be being created: IN_PROGRESS, keep retrying with backoff;
- RESOURCE_EXHAUSTED for a WaitForFirstConsumer claim with a selected node: RESCHEDULE (drop
  `volume.kubernetes.io/selected-node` so the scheduler picks another node);
- anything else: FINAL for this attempt. external-provisioner still retries these with backoff
  (the class may be fixed meanwhile) and so do we.
- an exception that is not a CSI error (an API server failure, a bug): IN_PROGRESS, because we
  cannot know whether a CreateVolume is running (external-provisioner's rule for non-gRPC errors).

What "in progress" changes: external-provisioner keeps such claims in memory to finish them even
if the claim stops qualifying. Here the provisioning finalizer on the claim does that durably
(see provision.py), so the class only decides rescheduling, logs and metrics.
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
