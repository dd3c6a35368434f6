"""Fixtures for the controller-loop tests: the control plane with kube-controller-manager's volume
controllers, the Ceph cluster, a Ceph Secret, and a factory of real controller processes."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ceph.fixtures import CephTestCluster
from tests.controlplane.cluster import ControlPlane
from tests.integration.sidecars.harness import FAST_ELECTION, KCM_CONTROLLERS, ControllerProcess, Kube

SECRET_NAMESPACE = "ceph-secrets"
SECRET_NAME = "csi-rbd-secret"


@dataclass
class Env:
    plane: ControlPlane
    ceph: CephTestCluster
    kube: Kube
    config_file: str
    lease_namespace: str
    secret: tuple[str, str] = (SECRET_NAMESPACE, SECRET_NAME)


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane, ceph_cluster: CephTestCluster,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    control_plane.start_controller_manager(KCM_CONTROLLERS)
    config_file = ceph_cluster.write_config(tmp_path_factory.mktemp("cfg") / "config.json")
    with control_plane.api_client() as admin:
        kube = Kube(admin)
        kube.create_ceph_secret(SECRET_NAMESPACE, SECRET_NAME, ceph_cluster)
        lease_namespace = f"le-{uuid.uuid4().hex[:6]}"
        kube.ensure_namespace(lease_namespace)
        try:
            yield Env(control_plane, ceph_cluster, kube, config_file, lease_namespace)
        finally:
            kube.delete_storage_classes()
            control_plane.stop_controller_manager()


StartControllers = Callable[..., list[ControllerProcess]]


@pytest.fixture
def start_controllers(env: Env) -> Iterator[StartControllers]:
    """start_controllers(n=1, args=(), env={}, kubeconfig=None, lease_namespace=None,
    wait=True): that many controller replicas (sidecars on, fast leader election), serving CSI
    when it returns unless `wait` is False; all stopped (and their Lease released) after the test."""
    started: list[ControllerProcess] = []

    def start(n: int = 1, args: Sequence[str] = (), environ: dict[str, str] | None = None,
              kubeconfig: Path | None = None, lease_namespace: str | None = None,
              wait: bool = True) -> list[ControllerProcess]:
        batch = []
        for _ in range(n):
            process = ControllerProcess(env.config_file, mode="controller", env=dict(environ or {}), args=[
                f"--kubeconfig={kubeconfig or env.plane.kubeconfig}",
                f"--leader-election-namespace={lease_namespace or env.lease_namespace}",
                *FAST_ELECTION,
                "--rados-osd-op-timeout=5", "--rados-mon-op-timeout=5", "--client-mount-timeout=5",
                "--retry-interval-start=200ms", "--retry-interval-max=5s", "--timeout=20s",
                *args,
            ])
            started.append(process)
            batch.append(process)
        for process in batch:
            if wait:
                process.start()
            else:
                process.launch()
        return batch

    yield start
    for process in started:
        process.cleanup()
