"""Volumes journaled by ceph-csi itself, written with raw RADOS calls in the order and with the
keys ceph-csi's journal uses (internal/journal/voljournal.go: ReserveName creates the record
object, then sets the name key in csi.volumes.<instance>, then the record's csi.volname,
csi.imagename and csi.volume.owner; StoreImageID adds csi.imageid once the image exists), never
through cephcsi's own Journal, so a test of cephcsi against them cannot share its mistakes.

Shared by the controller integration tests and the e2e migration walk.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import rados
import rbd

from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster

MiB = 1 << 20


@dataclass(frozen=True)
class CephCsiVolume:
    volume_id: str
    """`0001-<len>-<clusterID>-<pool id>-<uuid>`."""
    image: str
    """`csi-vol-<uuid>`."""
    uuid: str


def _set_omap(io: rados.Ioctx, obj: str, values: Mapping[str, str]) -> None:
    with rados.WriteOpCtx() as op:
        io.set_omap(op, tuple(values), tuple(v.encode() for v in values.values()))
        io.operate_write_op(op, obj)


def journal_as_ceph_csi(cluster: CephTestCluster, name: str, *, with_image_key: bool = True, size: int = 8 * MiB,
                        owner: str = "team-a", image_metadata: Mapping[str, str] | None = None) -> CephCsiVolume:
    """A volume ceph-csi provisioned for request `name` (instance id 'default', pool cluster.pool):
    journal entries, then the image (layering), then its id in the record; `image_metadata` is
    set on the image as ceph-csi's --setmetadata does. Without `with_image_key` the record is
    one from ceph-csi releases before csi.imagename existed (its image named implicitly)."""
    volume_uuid = str(uuid.uuid4())
    image = f"csi-vol-{volume_uuid}"
    client = rados.Rados(rados_id="admin", conf={"mon_host": cluster.mon_host, "key": cluster.admin_key})
    client.connect(timeout=30)
    try:
        with client.open_ioctx(cluster.pool) as io:
            record = f"csi.volume.{volume_uuid}"
            with rados.WriteOpCtx() as op:
                op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
                io.operate_write_op(op, record)
            _set_omap(io, "csi.volumes.default", {f"csi.volume.{name}": volume_uuid})
            values = {"csi.volname": name, "csi.volume.owner": owner}
            if with_image_key:
                values["csi.imagename"] = image
            _set_omap(io, record, values)
            rbd.RBD().create(io, image, size, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
            with rbd.Image(io, image) as handle:
                for key, value in (image_metadata or {}).items():
                    handle.metadata_set(key, value)
                image_id = handle.id()
            _set_omap(io, record, {"csi.imageid": image_id})
            pool_id = io.get_pool_id()
    finally:
        client.shutdown()
    return CephCsiVolume(VolumeId(cluster.cluster_id, pool_id, volume_uuid).encode(), image, volume_uuid)
