"""Error classification: predicates, and the kube errors of cephcsi.kube.errors."""
from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes.client import ApiException

from cephcsi.kube import apierrors, errors

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
    (api_error(404), errors.ApiNotFound),
    (api_error(409, "Conflict"), errors.ApiConflict),
    (api_error(403), errors.ApiForbidden),
    (api_error(422, "Invalid", "spec.x: Invalid value"), errors.ApiRejected),
    (api_error(500), errors.ApiUnavailable),
    (api_error(504), errors.ApiTimeout),
    (urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"), errors.ApiTimeout),  # type: ignore[arg-type]
    (api_error(418), errors.ApiFailed),
])
def test_classify(exc: BaseException, cls: type[errors.ApiError]) -> None:
    classified = apierrors.classify(exc, "get PVC ns/a")
    assert type(classified) is cls
    assert classified.message.startswith("get PVC ns/a: ")


def test_classify_keeps_the_servers_message_for_invalid_requests() -> None:
    assert "spec.x: Invalid value" in apierrors.classify(api_error(422, "Invalid", "spec.x: Invalid value"), "x").message
