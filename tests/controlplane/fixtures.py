"""Pytest fixtures for the real Kubernetes control plane (etcd + kube-apiserver [+ kcm]).

- `control_plane` (session): a running tests.controlplane.cluster.ControlPlane; see that class
  for attributes (url, ca_file, token, kubeconfig, api_client(), configuration(),
  service_account_client(), impersonating_client(), start_controller_manager(),
  stop_apiserver()/start_apiserver()/restart_apiserver(), compact_etcd(), etcd_revision()).
- `kube_namespace` (function): a fresh namespace name, deleted afterwards.
- `apiserver_proxy` (function): a TcpProxy in front of the apiserver (cut/blackhole/restore).
- `control_plane_guard` (function): the control plane, with the apiserver started again and
  kube-controller-manager stopped after the test, for tests that break them on purpose.
- `node_service_account` (function): makes the node plugin's ServiceAccount with one of
  deploy/node-rbac.yaml's ClusterRoles and answers a kubeconfig with its token.

The binaries come from tests/controlplane/build.sh (cached; the first build takes long).
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable, Iterator

import kubernetes.client
import pytest
import yaml

from tests.controlplane.access import create_ignoring_conflict
from tests.controlplane.cluster import ControlPlane, start_control_plane
from tests.controlplane.proxy import TcpProxy
from tests.unit.deploy.manifests import DEPLOY

NODE_ACCOUNT = "cephcsi-node"


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


@pytest.fixture
def node_service_account(control_plane: ControlPlane, kube_namespace: str,
                         tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """make(role, suffix, bind=False): the ServiceAccount `cephcsi-node` in a namespace of its own,
    `<kube_namespace>-<suffix>`, and deploy/node-rbac.yaml's ClusterRole `role`; answers a
    kubeconfig with the account's token. Unbound, the role keeps its name and the test binds it;
    bound, a copy named for the test is bound to the account cluster-wide. All of it but an
    unbound role (deploy/'s, shared) is removed after the test."""
    cleanups: list[Callable[[kubernetes.client.RbacAuthorizationV1Api], None]] = []
    namespaces: list[str] = []

    def make(role_name: str, suffix: str, bind: bool = False) -> Path:
        role = next(doc for doc in yaml.safe_load_all((DEPLOY / "node-rbac.yaml").read_text())
                    if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == role_name)
        account_namespace = f"{kube_namespace}-{suffix}"
        if bind:
            role = {**role, "metadata": {**role["metadata"], "name": f"{role_name}-{kube_namespace}"}}
        token = control_plane.service_account_token(account_namespace, NODE_ACCOUNT)
        namespaces.append(account_namespace)
        with control_plane.api_client() as admin:
            rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
            create_ignoring_conflict(lambda: rbac.create_cluster_role(role))
            if bind:
                name = role["metadata"]["name"]
                binding = {"metadata": {"name": name},
                           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                           "subjects": [{"kind": "ServiceAccount", "name": NODE_ACCOUNT,
                                         "namespace": account_namespace}]}
                create_ignoring_conflict(lambda: rbac.create_cluster_role_binding(binding))
                cleanups.append(lambda api: api.delete_cluster_role_binding(name))
                cleanups.append(lambda api: api.delete_cluster_role(name))
        return control_plane.write_kubeconfig(tmp_path / f"{suffix}.kubeconfig", token)

    try:
        yield make
    finally:
        with control_plane.api_client() as admin:
            rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
            for cleanup in cleanups:
                cleanup(rbac)
            for namespace in namespaces:
                kubernetes.client.CoreV1Api(admin).delete_namespace(namespace)
