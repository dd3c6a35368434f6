"""The control-plane fixture's own promises: identities, kube-controller-manager, compaction."""
from __future__ import annotations

import time

import kubernetes.client as k8s
import pytest

from tests.controlplane.cluster import ControlPlane
from tests.integration.kube.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.timeout(120)]


def test_identities_are_subject_to_rbac(control_plane: ControlPlane, kube_namespace: str) -> None:
    with control_plane.service_account_client(kube_namespace, "nobody") as sa:
        with pytest.raises(k8s.ApiException) as denied:
            k8s.CoreV1Api(sa).list_namespaced_config_map(kube_namespace)
        assert denied.value.status == 403
    with control_plane.impersonating_client("alice", ["readers"]) as alice:
        with pytest.raises(k8s.ApiException):
            k8s.CoreV1Api(alice).list_namespaced_config_map(kube_namespace)
        with control_plane.api_client() as admin:
            rbac = k8s.RbacAuthorizationV1Api(admin)
            # (Not the built-in "view": it is aggregated by kube-controller-manager, absent here.)
            rbac.create_namespaced_role(kube_namespace, {
                "metadata": {"name": "cm-reader"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]})
            rbac.create_namespaced_role_binding(kube_namespace, {
                "metadata": {"name": "readers"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
                "subjects": [{"kind": "Group", "name": "readers", "apiGroup": "rbac.authorization.k8s.io"}]})
        assert wait_until(lambda: _can_list(alice, kube_namespace), 10)


def _can_list(client: k8s.ApiClient, namespace: str) -> bool:
    try:
        k8s.CoreV1Api(client).list_namespaced_config_map(namespace)
        return True
    except k8s.ApiException:
        return False


def test_compaction_makes_old_resource_versions_gone(control_plane: ControlPlane, kube_namespace: str) -> None:
    with control_plane.api_client() as client:
        api = k8s.CoreV1Api(client)
        old = api.create_namespaced_pod_template(kube_namespace, {
            "metadata": {"name": "t"}, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}})
        # Two changes: a watch from `old` starts at old+1, which must lie below the compaction
        # point (a watch starting exactly at it gets 500 "PrevKv=nil" instead of 410).
        for value in ("1", "2"):
            api.patch_namespaced_pod_template("t", kube_namespace, {"metadata": {"labels": {"x": value}}})
        revision = control_plane.compact_etcd()
        assert revision > int(old.metadata.resource_version)
        response = api.list_namespaced_pod_template(kube_namespace, watch=True, timeout_seconds=2,
                                                    resource_version=old.metadata.resource_version,
                                                    _preload_content=False)
        assert b'"code":410' in response.data


def test_controller_manager_binds_claims(control_plane_guard: ControlPlane, kube_namespace: str) -> None:
    plane = control_plane_guard
    plane.start_controller_manager(["persistentvolume-binder"])
    with plane.api_client() as client:
        api = k8s.CoreV1Api(client)
        pv_name = f"pv-{kube_namespace}"
        api.create_persistent_volume({
            "metadata": {"name": pv_name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                     "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "vol-1"}}})
        try:
            api.create_namespaced_persistent_volume_claim(kube_namespace, {
                "metadata": {"name": "claim"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                         "resources": {"requests": {"storage": "1Gi"}}}})
            assert wait_until(lambda: api.read_namespaced_persistent_volume_claim(
                "claim", kube_namespace).status.phase == "Bound", 60, interval=0.2)
        finally:
            api.delete_persistent_volume(pv_name)
    started = time.monotonic()
    plane.stop_controller_manager()
    assert time.monotonic() - started < 20
