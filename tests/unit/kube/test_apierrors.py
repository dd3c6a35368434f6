"""Error classification and translation into cephcsi.errors."""
from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes.client import ApiException

from cephcsi import errors
from cephcsi.kube import apierrors

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def api_error(status: int, reason: str = "", message: str = "") -> ApiException:
    exc = ApiException(status=status)
    exc.body = json.dumps({"kind": "Status", "reason": reason, "message": message})
    return exc


def test_classification() -> None:
    assert apierrors.is_not_found(api_error(404))
    assert apierrors.is_conflict(api_error(409, "Conflict"))
    assert apierrors.is_already_exists(api_error(409, "AlreadyExists"))
    assert not apierrors.is_already_exists(api_error(409, "Conflict"))
    assert apierrors.is_gone(api_error(410, "Expired"))
    assert apierrors.is_transient(api_error(503))
    assert apierrors.is_transient(api_error(429))
    assert not apierrors.is_transient(api_error(403))
    assert apierrors.is_transient(urllib3.exceptions.NewConnectionError(None, "refused"))  # type: ignore[arg-type]
    assert apierrors.is_timeout(urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"))  # type: ignore[arg-type]
    assert apierrors.status_code(ValueError()) is None


@pytest.mark.parametrize(("exc", "cls"), [
    (api_error(404), errors.NotFound),
    (api_error(409, "Conflict"), errors.OperationInFlight),
    (api_error(403), errors.PermissionDenied),
    (api_error(422, "Invalid", "spec.x: Invalid value"), errors.InvalidArgument),
    (api_error(500), errors.Unavailable),
    (api_error(504), errors.DeadlineExceeded),
    (urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"), errors.DeadlineExceeded),  # type: ignore[arg-type]
    (api_error(418), errors.Internal),
])
def test_translate(exc: BaseException, cls: type) -> None:
    translated = apierrors.translate(exc, "get PVC ns/a")
    assert type(translated) is cls
    assert translated.message.startswith("get PVC ns/a: ")


def test_translate_keeps_the_servers_message_for_invalid_requests() -> None:
    assert "spec.x: Invalid value" in apierrors.translate(api_error(422, "Invalid", "spec.x: Invalid value"), "x").message
