"""What the resize and the modify status share: a claim condition as external-resizer writes it,
the claim's present conditions, and which errors are final for an attempt. Pure."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from cephcsi.errors import CephCSIError
from cephcsi.sidecars import objects

# external-resizer's classes: these codes mean "try again", anything else is final for the attempt.
NOT_FINAL = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})


def is_final(error: BaseException) -> bool:
    """Not worth retrying unchanged (an error of ours that is not a 'try again' code)."""
    return isinstance(error, CephCSIError) and error.code not in NOT_FINAL


def condition(kind: str, now: str, message: str = "") -> dict[str, str]:
    """A true condition of `kind` that became so at `now`; no message key when there is none."""
    item = {"type": kind, "status": "True", "lastTransitionTime": now}
    if message:
        item["message"] = message
    return item


def conditions_of(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return objects.status(claim).get("conditions") or []
