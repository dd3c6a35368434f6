"""Requests and librbd reads/writes for the snapshot and clone tests."""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import grpc
import rbd

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, create_request, image_of, until_ok
from tests.integration.controller.pool_state import admin_ioctx
from tests.integration.driver import DriverProcess

BLOCK = 4 * MiB


def snapshot_request(cluster: CephTestCluster, volume_id: str, name: str | None = None) -> csi_pb2.CreateSnapshotRequest:
    return csi_pb2.CreateSnapshotRequest(name=name or f"snapshot-{uuid.uuid4()}", source_volume_id=volume_id,
                                         secrets=cluster.secrets)


def from_snapshot(cluster: CephTestCluster, snapshot_id: str, size: int = 8 * MiB, name: str | None = None) -> csi_pb2.CreateVolumeRequest:
    request = create_request(cluster, name=name, size=size)
    request.volume_content_source.snapshot.snapshot_id = snapshot_id
    return request


def from_volume(cluster: CephTestCluster, volume_id: str, size: int = 8 * MiB, name: str | None = None) -> csi_pb2.CreateVolumeRequest:
    request = create_request(cluster, name=name, size=size)
    request.volume_content_source.volume.volume_id = volume_id
    return request


def write(cluster: CephTestCluster, volume_id: str, data: bytes, offset: int = 0) -> None:
    with admin_ioctx(cluster) as io, rbd.Image(io, image_of(volume_id)) as image:
        image.write(data, offset)
        image.flush()


def read(cluster: CephTestCluster, volume_id: str, length: int, offset: int = 0) -> bytes:
    with admin_ioctx(cluster) as io, rbd.Image(io, image_of(volume_id), read_only=True) as image:
        return bytes(image.read(offset, length))


def pattern(tag: str, length: int = BLOCK) -> bytes:
    """Recognisable data: a tag then random bytes (so no two writes compare equal by chance)."""
    return (tag.encode() + os.urandom(length))[:length]


def depth(cluster: CephTestCluster, name: str) -> int:
    """The image's clone-chain depth, as the admin sees it."""
    count = 0
    with admin_ioctx(cluster) as io:
        image = rbd.Image(io, name, read_only=True)
        while True:
            try:
                parent_id = image.parent_id()
            except rbd.ImageNotFound:
                image.close()
                return count
            image.close()
            count += 1
            image = rbd.Image(io, image_id=parent_id, read_only=True)


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def delete_all(driver: DriverProcess, cluster: CephTestCluster, snapshots: list[str], volumes: list[str]) -> None:
    """Delete as a CO does: retried, also on FAILED_PRECONDITION (a killed process's watch on
    an image lasts until the OSD's watch timeout, 30 s)."""
    c = driver.controller
    also = (grpc.StatusCode.FAILED_PRECONDITION,)
    for snapshot_id in snapshots:
        request = csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=cluster.secrets)
        until_ok(lambda: c.DeleteSnapshot(request, timeout=60), deadline=90, also=also)
    for volume_id in volumes:
        delete = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=cluster.secrets)
        until_ok(lambda: c.DeleteVolume(delete, timeout=60), deadline=90, also=also)


def snapshot_count(cluster: CephTestCluster, name: str) -> int:
    """RBD snapshots on the image, every namespace (trash-namespace ones hold clone children)."""
    with admin_ioctx(cluster) as io, rbd.Image(io, name, read_only=True) as image:
        return len(list(image.list_snaps()))


def read_chain(cluster: CephTestCluster, name: str) -> int:
    """How many parents a read of the image's head can fall through, following each parent at
    the snapshot its child links to (what krbd and librbd follow). Unlike `depth`, this also
    counts parents kept only by the snapshots of an image flattened without deep-flatten."""
    count = 0
    with admin_ioctx(cluster) as io:
        image = rbd.Image(io, name, read_only=True)
        try:
            while True:
                try:
                    parent_id, snap_name = image.parent_id(), image.get_parent_image_spec()["snap_name"]
                except rbd.ImageNotFound:
                    return count
                count += 1
                image.close()
                image = rbd.Image(io, image_id=parent_id, read_only=True)
                snap_ids = [int(s["id"]) for s in image.list_snaps() if s["name"] == snap_name]
                image.set_snap_by_id(snap_ids[0])
        finally:
            image.close()
