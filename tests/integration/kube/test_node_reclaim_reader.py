"""The node pass's claim reader (cephcsi.node.reclaim_claims.KubeTrimRequests) on a real
kube-apiserver, as the node plugin's ServiceAccount with deploy/'s cephcsi-node ClusterRole only:
the leader's last-run is read through `get` of the PV and its claim, a PV of another volume
answers nothing, and the role still lists nothing."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import kubernetes.client
import pytest

from cephcsi.node.reclaim_claims import KubeTrimRequests
from tests.controlplane.cluster import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.kube]
LAST_RUN = "reclaimspace.cephcsi.ceph.io/last-run"


@pytest.fixture
def node_kubeconfig(node_service_account: Callable[..., Path]) -> Path:
    """The token of a ServiceAccount bound to node-rbac.yaml's cephcsi-node ClusterRole, nothing else."""
    return node_service_account("cephcsi-node", "node", bind=True)


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
