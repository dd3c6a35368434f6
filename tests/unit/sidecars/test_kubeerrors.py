"""Kubernetes API failures as cephcsi errors (cephcsi.sidecars.kubeerrors), one row per kind."""
from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes.client import ApiException

from cephcsi import errors
from cephcsi.kube import errors as kube_errors
from cephcsi.sidecars import kubeerrors

pytestmark = pytest.mark.unit


def api_error(status: int, reason: str = "", message: str = "") -> ApiException:
    exc = ApiException(status=status)
    exc.body = json.dumps({"kind": "Status", "reason": reason, "message": message})
    return exc


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
def test_translate(exc: BaseException, cls: type[errors.CephCSIError]) -> None:
    translated = kubeerrors.translate(exc, "get PVC ns/a")
    assert type(translated) is cls
    assert translated.message.startswith("get PVC ns/a: ")


def test_translate_keeps_the_servers_message_for_invalid_requests() -> None:
    assert "spec.x: Invalid value" in kubeerrors.translate(api_error(422, "Invalid", "spec.x: Invalid value"), "x").message


def test_every_kube_error_has_a_row() -> None:
    def leaves(cls: type[kube_errors.KubeError]) -> set[type[kube_errors.KubeError]]:
        subs = cls.__subclasses__()
        return {cls} if not subs else set().union(*(leaves(sub) for sub in subs))

    assert leaves(kube_errors.KubeError) == set(kubeerrors.TABLE)


def test_a_kube_error_keeps_its_message() -> None:
    translated = kubeerrors.translate(kube_errors.ClientConfigError("cannot load the kubeconfig"), "ignored")
    assert type(translated) is errors.ConfigError and translated.message == "cannot load the kubeconfig"
