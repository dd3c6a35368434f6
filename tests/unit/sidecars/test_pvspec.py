"""The PV object, field for field."""
from __future__ import annotations

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.pvspec import ClassSecrets, PVOptions, build
from cephcsi.sidecars.provisioner.request import RequestOptions, plan
from tests.unit.sidecars.fixtures import DRIVER, claim, storage_class

pytestmark = pytest.mark.unit

SECRET_PARAMS = {
    "clusterID": "c1", "pool": "rbd",
    "csi.storage.k8s.io/provisioner-secret-name": "prov", "csi.storage.k8s.io/provisioner-secret-namespace": "sys",
    "csi.storage.k8s.io/node-stage-secret-name": "stage-${pvc.name}",
    "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}",
    "csi.storage.k8s.io/controller-expand-secret-name": "expand", "csi.storage.k8s.io/controller-expand-secret-namespace": "sys",
}
VOLUME = csi_pb2.Volume(volume_id="0001-0002-c1-0000000000000001-abc", capacity_bytes=2 << 30,
                        volume_context={"clusterID": "c1", "pool": "rbd", "imageName": "csi-vol-abc"})


def make(c: KubeObject, sc: KubeObject, volume: csi_pb2.Volume = VOLUME, topology: bool = False) -> KubeObject:
    planned = plan(c, sc, RequestOptions(DRIVER))
    secrets = ClassSecrets.resolve(planned.class_parameters, planned.name, c)
    return build(c, sc, planned, volume, secrets, PVOptions(DRIVER, "1-2-" + DRIVER, topology))


def test_filesystem_pv_has_every_field() -> None:
    c = claim("data", "team", uid="u1", size="1536Mi")
    pv = make(c, storage_class(parameters=SECRET_PARAMS, mountOptions=["discard"]))
    meta, spec = pv["metadata"], pv["spec"]
    assert meta["name"] == "pvc-u1"
    assert meta["annotations"] == {
        "pv.kubernetes.io/provisioned-by": DRIVER,
        "volume.kubernetes.io/provisioner-deletion-secret-name": "prov",
        "volume.kubernetes.io/provisioner-deletion-secret-namespace": "sys",
    }
    assert meta["finalizers"] == ["external-provisioner.volume.kubernetes.io/finalizer"]
    assert spec["capacity"] == {"storage": "2Gi"}  # what CreateVolume returned, not the request
    assert spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["storageClassName"] == "fast" and spec["volumeMode"] == "Filesystem"
    assert spec["mountOptions"] == ["discard"]
    assert spec["claimRef"] == {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "team",
                                "name": "data", "uid": "u1", "resourceVersion": "42"}
    csi = spec["csi"]
    assert csi["driver"] == DRIVER and csi["volumeHandle"] == VOLUME.volume_id and csi["fsType"] == "ext4"
    assert csi["volumeAttributes"] == {"clusterID": "c1", "pool": "rbd", "imageName": "csi-vol-abc",
                                       "storage.kubernetes.io/csiProvisionerIdentity": "1-2-" + DRIVER}
    assert csi["nodeStageSecretRef"] == {"name": "stage-data", "namespace": "team"}
    assert csi["controllerExpandSecretRef"] == {"name": "expand", "namespace": "sys"}
    assert "nodePublishSecretRef" not in csi and "nodeAffinity" not in spec


def test_retain_block_pv() -> None:
    pv = make(claim(volume_mode="Block"), storage_class(reclaimPolicy="Retain"))
    assert "finalizers" not in pv["metadata"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["volumeMode"] == "Block" and "fsType" not in pv["spec"]["csi"]


def test_zero_capacity_falls_back_to_the_request() -> None:
    volume = csi_pb2.Volume(volume_id="v", capacity_bytes=0)
    assert make(claim(size="3Gi"), storage_class(), volume)["spec"]["capacity"] == {"storage": "3Gi"}


def test_node_affinity_from_accessible_topology() -> None:
    volume = csi_pb2.Volume(volume_id="v", capacity_bytes=1 << 30, accessible_topology=[
        csi_pb2.Topology(segments={"zone": "a", "rack": "r1"}), csi_pb2.Topology(segments={"zone": "b"})])
    affinity = make(claim(), storage_class(), volume, topology=True)["spec"]["nodeAffinity"]
    assert affinity == {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]},
                              {"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}
