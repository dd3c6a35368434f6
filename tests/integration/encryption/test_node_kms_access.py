"""The node's key lookup for an encrypted volume, end to end on the real Ceph cluster and a real
kube-apiserver, staging nothing (issue 33): a volume created by the controller with the
`metadata` KMS whose Secret is in the claim's namespace (no secretNamespace) is unlocked on
the node exactly as NodeStage does it — image metadata by `rbd image-meta list`, the tenant
from the journal record by `rados getomapval`, the Secret through the node plugin's own lazily
connected API client under deploy/'s cephcsi-kms-reader ClusterRole bound in that namespace only.
The controller (no embedded sidecars) reads the same Secret through its lazy client too."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph.credentials import Credentials
from cephcsi.cli.node_wiring import node_keys
from cephcsi.encryption.spec import from_volume_context
from cephcsi.encryption.volume_keys import wrapped_dek_of
from cephcsi.errors import PermissionDenied
from cephcsi.node import exec as node_exec
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.journal_owner import JournalOwner
from cephcsi.node.service import NodeConfig
from cephcsi.node.stage_record import ImageSpec
from tests.ceph.fixtures import CephTestCluster
from tests.controlplane.cluster import ControlPlane
from tests.integration.controller.helpers import create_request, image_of
from tests.integration.driver import DriverProcess
from tests.unit.deploy.manifests import KMS_READER
from tests.unit.encryption.test_wrap import go_unwrap

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.kube]

KEK = "tenant-kek-for-node-tests"
SECRET = "luks-kek"
KMS_ID = "tenant-meta"


@pytest.fixture
def plugin_kubeconfig(node_service_account: Callable[..., Path]) -> Path:
    """A kubeconfig with the token of a ServiceAccount that has only deploy/'s KMS reader role, not
    yet bound anywhere (the test binds it in the tenant namespace)."""
    return node_service_account(KMS_READER, "csi")


@pytest.fixture
def tenant_kms_driver(ceph_cluster: CephTestCluster, control_plane: ControlPlane,
                      tmp_path: Path) -> Iterator[tuple[DriverProcess, str]]:
    """A controller whose `metadata` KMS reads the tenant's Secret through the API (not the
    module-scoped kms_driver of this folder's conftest: this one names secretName)."""
    config = ceph_cluster.write_config(tmp_path / "config.json")
    kms = tmp_path / "kms.json"
    kms.write_text(json.dumps({KMS_ID: {"encryptionKMSType": "metadata", "secretName": SECRET}}))
    admin = control_plane.write_kubeconfig(tmp_path / "admin.kubeconfig")
    process = DriverProcess(config, mode="controller", args=[f"--kms-config={kms}", f"--kubeconfig={admin}"])
    process.start()
    try:
        yield process, str(kms)
    finally:
        process.cleanup()


def node_config(kubeconfig: Path, kms: str, tmp_path: Path) -> NodeConfig:
    return NodeConfig(node_id="node-1", driver_name="rbd.csi.ceph.com", kubelet_dir=str(tmp_path),
                      state_dir=str(tmp_path), mounter="", domain_labels=(), max_volumes_per_node=0,
                      device_timeout=10, command_timeout=30, connect_timeout=10, kubeconfig=str(kubeconfig),
                      kms_config=kms)


def test_node_unlocks_with_the_secret_of_the_claims_namespace(
        tenant_kms_driver: tuple[DriverProcess, str], ceph_cluster: CephTestCluster, control_plane: ControlPlane,
        kube_namespace: str, plugin_kubeconfig: Path, tmp_path: Path) -> None:
    driver, kms = tenant_kms_driver
    with control_plane.api_client() as admin:
        core = kubernetes.client.CoreV1Api(admin)
        core.create_namespaced_secret(kube_namespace, {"metadata": {"name": SECRET},
                                                       "stringData": {"encryptionPassphrase": KEK}})
        request = create_request(ceph_cluster, encrypted="true", encryptionKMSID=KMS_ID)
        request.parameters["csi.storage.k8s.io/pvc/namespace"] = kube_namespace
        volume = driver.controller.CreateVolume(request).volume
        try:
            spec = from_volume_context(dict(volume.volume_context))
            assert spec is not None and spec.kms_id == KMS_ID
            meta = RbdImageMetadata(node_exec.run, 30, ImageSpec(ceph_cluster.pool, image_of(volume.volume_id)),
                                    ceph_cluster.mon_host, Credentials(ceph_cluster.user, ceph_cluster.key))
            values = meta.read()
            owner = JournalOwner.beside(meta)
            assert owner.read(volume.volume_id) == kube_namespace
            # The passphrase the controller wrapped, unwrapped by an independent construction.
            expected = go_unwrap(KEK, volume.volume_id, wrapped_dek_of(values))

            keys = node_keys(node_config(plugin_kubeconfig, kms, tmp_path))
            reader = keys.keys.secret_reader
            assert reader is not None and not getattr(reader, "connected")

            def stage_lookup() -> str:  # the call NodeStage's LUKS step makes (encrypted_stage.LuksStage.open)
                return keys.passphrase(values, volume.volume_id, spec, {"userID": ceph_cluster.user},
                                       tenant=lambda: owner.read(volume.volume_id))

            # Not bound in the tenant namespace yet: refused, and the message names the binding to make.
            with pytest.raises(PermissionDenied, match=f"kubectl -n {kube_namespace} create rolebinding"):
                stage_lookup()
            kubernetes.client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(kube_namespace, {
                "metadata": {"name": KMS_READER},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": KMS_READER},
                "subjects": [{"kind": "ServiceAccount", "name": "cephcsi-node", "namespace": f"{kube_namespace}-csi"}],
            })
            assert until_granted(stage_lookup) == expected
            assert getattr(reader, "connected")
        finally:
            driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id,
                                                                       secrets=ceph_cluster.secrets))


def until_granted(call: Any, seconds: float = 10.0) -> str:
    """The RBAC authorizer's cache picks up a new RoleBinding within about a second."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return str(call())
        except PermissionDenied:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
