"""Shared helpers of the kube integration tests: the project's deploy/ RBAC, polling."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator

import kubernetes.client
import pytest

from tests.controlplane.cluster import ControlPlane

ROOT = Path(__file__).resolve().parents[3]
CONTROLLER_NAMESPACE = "ceph-csi-rbd"
CONTROLLER_SERVICE_ACCOUNT = "cephcsi-controller"


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll predicate until it is true or timeout passes; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@pytest.fixture(scope="session")
def controller_rbac(control_plane: ControlPlane) -> ControlPlane:
    """deploy/namespace.yaml and deploy/controller-rbac.yaml applied to the control plane."""
    control_plane.apply_manifest(ROOT / "deploy" / "namespace.yaml")
    control_plane.apply_manifest(ROOT / "deploy" / "controller-rbac.yaml")
    return control_plane


@pytest.fixture
def controller_configuration(controller_rbac: ControlPlane) -> Iterator[kubernetes.client.Configuration]:
    """Client configuration authenticated as the controller's ServiceAccount (exactly the
    deploy/ RBAC)."""
    token = controller_rbac.service_account_token(CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT)
    yield controller_rbac.configuration(token)
