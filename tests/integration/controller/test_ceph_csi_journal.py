"""Volumes journaled by ceph-csi itself, written here with raw RADOS calls in the order and with
the keys ceph-csi's journal uses (internal/journal/voljournal.go: ReserveName creates the record
object, then sets the name key in csi.volumes.<instance>, then the record's csi.volname,
csi.imagename and csi.volume.owner; StoreImageID adds csi.imageid once the image exists), not
through cephcsi's own Journal. cephcsi must adopt such a volume for a retried CreateVolume, grow it
and delete it with everything ceph-csi wrote. Records from ceph-csi releases before csi.imagename
existed name their image csi-vol-<uuid> implicitly.
"""
from __future__ import annotations

import json
import uuid

import pytest
import rados
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.audit.seed import run_audit
from tests.integration.controller.helpers import MiB, create_request, journal_entries, mount_cap
from tests.integration.controller.pool_state import admin_ioctx, read_pool, wait_for_pool
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def _set_omap(io: rados.Ioctx, obj: str, values: dict[str, str]) -> None:
    with rados.WriteOpCtx() as op:
        io.set_omap(op, tuple(values), tuple(v.encode() for v in values.values()))
        io.operate_write_op(op, obj)


def _journal_as_ceph_csi(cluster: CephTestCluster, name: str, with_image_key: bool) -> tuple[str, str]:
    """(volume id, image name) of a volume provisioned by ceph-csi (instance id 'default')."""
    volume_uuid = str(uuid.uuid4())
    image = f"csi-vol-{volume_uuid}"
    with admin_ioctx(cluster) as io:
        record = f"csi.volume.{volume_uuid}"
        with rados.WriteOpCtx() as op:
            op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
            io.operate_write_op(op, record)
        _set_omap(io, "csi.volumes.default", {f"csi.volume.{name}": volume_uuid})
        values = {"csi.volname": name, "csi.volume.owner": "team-a"}
        if with_image_key:
            values["csi.imagename"] = image
        _set_omap(io, record, values)
        rbd.RBD().create(io, image, 8 * MiB, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
        with rbd.Image(io, image, read_only=True) as handle:
            _set_omap(io, record, {"csi.imageid": handle.id()})
        pool_id = io.get_pool_id()
    return VolumeId(cluster.cluster_id, pool_id, volume_uuid).encode(), image


def _size(cluster: CephTestCluster, image: str) -> int:
    return int(json.loads(cluster.admin("rbd", "info", "--format", "json", f"{cluster.pool}/{image}"))["size"])


@pytest.mark.parametrize("with_image_key", [True, False], ids=["current", "before-csi.imagename"])
def test_a_volume_journaled_by_ceph_csi_is_adopted_grown_and_deleted(
    driver: DriverProcess, ceph_cluster: CephTestCluster, with_image_key: bool
) -> None:
    baseline = read_pool(ceph_cluster)
    request = create_request(ceph_cluster, size=8 * MiB)
    volume_id, image = _journal_as_ceph_csi(ceph_cluster, request.name, with_image_key)

    # `cephcsi audit` sees a consistent volume (other tests' debris in this pool aside).
    _rc, doc, _ = run_audit(ceph_cluster, driver.config_file)
    volume_uuid = volume_id[-36:]
    assert not [f for f in doc["findings"] if volume_uuid in json.dumps(f)], doc["findings"]

    # The external-provisioner retries CreateVolume after the switch: the same volume comes back.
    adopted = driver.controller.CreateVolume(request, timeout=60).volume
    assert adopted.volume_id == volume_id and adopted.capacity_bytes == 8 * MiB
    assert adopted.volume_context["imageName"] == image

    grown = driver.controller.ControllerExpandVolume(csi_pb2.ControllerExpandVolumeRequest(
        volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=24 * MiB),
        secrets=ceph_cluster.secrets, volume_capability=mount_cap()), timeout=60)
    assert grown.capacity_bytes == 24 * MiB and _size(ceph_cluster, image) == 24 * MiB

    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets),
                                   timeout=60)
    assert image not in ceph_cluster.images()
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline
