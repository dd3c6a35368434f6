"""The node pass's claim reader (cephcsi.node.reclaim_claims.KubeTrimRequests) on a real
kube-apiserver, as the node plugin's ServiceAccount with deploy/'s cephcsi-node ClusterRole only:
the leader's last-run is read through `get` of the PV and its claim, a PV of another volume
answers nothing, and the role still lists nothing."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from cephcsi.node.reclaim_claims import KubeTrimRequests
from tests.controlplane.cluster import ControlPlane
from tests.unit.deploy.manifests import DEPLOY

pytestmark = [pytest.mark.integration, pytest.mark.kube]
LAST_RUN = "reclaimspace.cephcsi.ceph.io/last-run"


def _ignore_conflict(call: Any) -> None:
    try:
        call()
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise


@pytest.fixture
def node_kubeconfig(control_plane: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[Path]:
    """The token of a ServiceAccount bound to node-rbac.yaml's cephcsi-node ClusterRole, nothing else."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "node-rbac.yaml").read_text()) if d]
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "cephcsi-node")
    role = {**role, "metadata": {**role["metadata"], "name": f"cephcsi-node-{kube_namespace}"}}
    account_namespace = f"{kube_namespace}-node"
    token = control_plane.service_account_token(account_namespace, "cephcsi-node")
    binding = {"metadata": {"name": role["metadata"]["name"]},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
               "subjects": [{"kind": "ServiceAccount", "name": "cephcsi-node", "namespace": account_namespace}]}
    with control_plane.api_client() as admin:
        rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
        _ignore_conflict(lambda: rbac.create_cluster_role(role))
        _ignore_conflict(lambda: rbac.create_cluster_role_binding(binding))
    try:
        yield control_plane.write_kubeconfig(tmp_path / "node.kubeconfig", token)
    finally:
        with control_plane.api_client() as admin:
            rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
            rbac.delete_cluster_role_binding(role["metadata"]["name"])
            rbac.delete_cluster_role(role["metadata"]["name"])
            kubernetes.client.CoreV1Api(admin).delete_namespace(account_namespace)


def test_the_node_reads_the_leaders_record_by_name_only(control_plane: ControlPlane, kube_namespace: str,
                                                        node_kubeconfig: Path) -> None:
    pv_name = f"pv-{uuid.uuid4().hex[:8]}"
    volume_id = f"0001-0004-test-{uuid.uuid4().hex}"
    with control_plane.api_client() as admin:
        core = kubernetes.client.CoreV1Api(admin)
        core.create_namespaced_persistent_volume_claim(kube_namespace, {
            "metadata": {"name": "data", "annotations": {LAST_RUN: "2026-11-27T00:00:04Z"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        core.create_persistent_volume({
            "metadata": {"name": pv_name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "claimRef": {"namespace": kube_namespace, "name": "data"},
                     "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": volume_id}}})
        try:
            reader = KubeTrimRequests(str(node_kubeconfig))
            assert reader._last_run(volume_id, pv_name) == datetime(2026, 11, 27, 0, 0, 4, tzinfo=UTC)
            assert reader._last_run("another-volume", pv_name) is None  # a PV of another volume: nothing
            with pytest.raises(kubernetes.client.ApiException) as refused:
                reader._client().list_persistent_volume()
            assert refused.value.status == 403
        finally:
            core.delete_persistent_volume(pv_name)
            core.delete_namespaced_persistent_volume_claim("data", kube_namespace)
