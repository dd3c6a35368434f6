"""--extra-create-metadata: the claim/PV names external-provisioner adds to CreateVolume's
parameters end up as RBD image metadata under ceph-csi's key names, idempotently; ROX mount
capabilities are accepted by CreateVolume."""
from __future__ import annotations

import json
import time

import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import Mode, create_request, image_of, journal_entries, mount_cap
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

OWNER = {"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "shop",
         "csi.storage.k8s.io/pv/name": "pvc-0b5c"}


def image_meta(cluster: CephTestCluster, image: str) -> dict[str, str]:
    out = cluster.admin("rbd", "image-meta", "list", "--format", "json", f"{cluster.pool}/{image}")
    return dict(json.loads(out or "{}"))


def test_owner_keys_become_image_metadata(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster, name="pvc-0b5c")
    request.parameters.update(OWNER)
    volume = driver.controller.CreateVolume(request).volume
    image = image_of(volume.volume_id)
    assert image_meta(ceph_cluster, image) == OWNER
    # The keys went to the new image's header in one class call (no image open); the id that
    # call read is the one journaled with the lease's release, just after the answer.
    image_id = ceph_cluster.admin("rados", "-p", ceph_cluster.pool, "get", f"rbd_id.{image}", "-")[4:]
    deadline = time.monotonic() + 10
    while journal_entries(ceph_cluster, "pvc-0b5c")[1].get("csi.imageid") != image_id and time.monotonic() < deadline:
        time.sleep(0.05)
    assert journal_entries(ceph_cluster, "pvc-0b5c")[1].get("csi.imageid") == image_id
    # A retry (same name) finds the volume and rewrites nothing; the context never carries the keys.
    assert driver.controller.CreateVolume(request).volume.volume_id == volume.volume_id
    assert image_meta(ceph_cluster, image) == OWNER
    assert not any(k.startswith("csi.storage.k8s.io/") for k in volume.volume_context)
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def test_without_the_flag_no_metadata(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume
    assert image_meta(ceph_cluster, image_of(volume.volume_id)) == {}
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def test_read_only_many_filesystem_is_created(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster)
    del request.volume_capabilities[:]
    request.volume_capabilities.extend([mount_cap(), mount_cap(mode=Mode.MULTI_NODE_READER_ONLY)])
    volume = driver.controller.CreateVolume(request).volume
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))
