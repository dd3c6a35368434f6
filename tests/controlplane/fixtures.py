"""Pytest fixtures for the real Kubernetes control plane (etcd + kube-apiserver [+ kcm]).

- `control_plane` (session): a running tests.controlplane.cluster.ControlPlane; see that class
  for attributes (url, ca_file, token, kubeconfig, api_client(), configuration(),
  service_account_client(), impersonating_client(), start_controller_manager(),
  stop_apiserver()/start_apiserver()/restart_apiserver(), compact_etcd(), etcd_revision()).
- `kube_namespace` (function): a fresh namespace name, deleted afterwards.
- `apiserver_proxy` (function): a TcpProxy in front of the apiserver (cut/blackhole/restore).
- `control_plane_guard` (function): the control plane, with the apiserver started again and
  kube-controller-manager stopped after the test, for tests that break them on purpose.

The binaries come from tests/controlplane/build.sh (cached; the first build takes long).
"""
from __future__ import annotations

import uuid
from typing import Iterator

import kubernetes.client
import pytest

from tests.controlplane.cluster import ControlPlane, start_control_plane
from tests.controlplane.proxy import TcpProxy


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    plane = start_control_plane()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def control_plane_guard(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    try:
        yield control_plane
    finally:
        control_plane.stop_controller_manager()
        control_plane.start_apiserver()


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with control_plane.api_client() as admin:
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        if control_plane.apiserver_running():
            with control_plane.api_client() as admin:
                try:
                    kubernetes.client.CoreV1Api(admin).delete_namespace(name)
                except kubernetes.client.ApiException:
                    pass


@pytest.fixture
def apiserver_proxy(control_plane: ControlPlane) -> Iterator[TcpProxy]:
    with TcpProxy(control_plane.apiserver_port) as proxy:
        yield proxy
