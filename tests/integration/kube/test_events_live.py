"""Events written with the controller's deploy/ RBAC (events: create, patch) and read back the
way `kubectl describe` finds them (core/v1 Events by involvedObject)."""
from __future__ import annotations

from typing import Any

import kubernetes.client as k8s
import pytest

from cephcsi.kube.client import new_api_client
from cephcsi.kube.events import NORMAL, WARNING, EventRecorder, EventSettings
from tests.controlplane.cluster import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.timeout(60)]


def events_about(api: k8s.CoreV1Api, namespace: str, obj: Any) -> list[Any]:
    selector = (f"involvedObject.kind={obj.kind},involvedObject.name={obj.metadata.name},"
                f"involvedObject.uid={obj.metadata.uid}")
    return sorted(api.list_namespaced_event(namespace, field_selector=selector).items, key=lambda e: e.reason)


def test_events_are_created_and_aggregated(control_plane: ControlPlane, kube_namespace: str,
                                           controller_configuration: k8s.Configuration) -> None:
    with control_plane.api_client() as client:
        admin = k8s.CoreV1Api(client)
        pvc = admin.create_namespaced_persistent_volume_claim(kube_namespace, {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "storageClassName": "none"}})
        pvc.kind, pvc.api_version = "PersistentVolumeClaim", "v1"
        recorder = EventRecorder(new_api_client(configuration=controller_configuration),
                                 EventSettings(component="rbd.csi.ceph.com", host="test-host"))
        try:
            recorder.event(pvc, NORMAL, "Provisioning", "External provisioner is provisioning volume")
            for _ in range(3):
                recorder.event(pvc, WARNING, "ProvisioningFailed", "failed to provision volume: no space")
            assert recorder.flush(10)
            events = events_about(admin, kube_namespace, pvc)
            assert [(e.reason, e.type, e.count) for e in events] == [
                ("Provisioning", "Normal", 1), ("ProvisioningFailed", "Warning", 3)]
            failed = events[1]
            assert failed.message == "failed to provision volume: no space"
            assert failed.source.component == "rbd.csi.ceph.com" and failed.source.host == "test-host"
            assert failed.involved_object.uid == pvc.metadata.uid
            assert failed.last_timestamp >= failed.first_timestamp
        finally:
            recorder.stop()


def test_events_about_cluster_scoped_objects_go_to_default(control_plane: ControlPlane,
                                                           controller_configuration: k8s.Configuration) -> None:
    with control_plane.api_client() as client:
        admin = k8s.CoreV1Api(client)
        pv = admin.create_persistent_volume({
            "metadata": {"generateName": "pv-events-"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "h"}}})
        try:
            recorder = EventRecorder(new_api_client(configuration=controller_configuration),
                                     EventSettings(component="rbd.csi.ceph.com"))
            as_dict = {"kind": "PersistentVolume", "apiVersion": "v1",
                       "metadata": {"name": pv.metadata.name, "uid": pv.metadata.uid}}
            recorder.event(as_dict, WARNING, "VolumeFailedDelete", "image busy")
            recorder.event(as_dict, WARNING, "VolumeFailedDelete", "image busy")
            assert recorder.flush(10)
            recorder.stop()
            pv.kind = "PersistentVolume"
            events = events_about(admin, "default", pv)
            assert [(e.reason, e.count) for e in events] == [("VolumeFailedDelete", 2)]
        finally:
            admin.delete_persistent_volume(pv.metadata.name)
