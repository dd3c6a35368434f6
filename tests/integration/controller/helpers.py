from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection
from typing import TypeVar

import grpc

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.pool_state import describe_trash, foreign_held, trashed_images

MiB = 1 << 20
T = TypeVar("T")
Mode = csi_pb2.VolumeCapability.AccessMode


def mount_cap(mode: Mode.Mode = Mode.SINGLE_NODE_WRITER, fs: str = "") -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs), access_mode=Mode(mode=mode))


def block_cap(mode: Mode.Mode = Mode.SINGLE_NODE_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=Mode(mode=mode))


def create_request(cluster: CephTestCluster, name: str | None = None, size: int = 8 * MiB, **params: str) -> csi_pb2.CreateVolumeRequest:
    return csi_pb2.CreateVolumeRequest(
        name=name or f"pvc-{uuid.uuid4()}",
        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
        volume_capabilities=[mount_cap()],
        parameters={**cluster.parameters, **params},
        secrets=cluster.secrets,
    )


def image_of(volume_id: str, prefix: str = "csi-vol-") -> str:
    return prefix + VolumeId.decode(volume_id).object_uuid


def journal_entries(cluster: CephTestCluster, name: str) -> tuple[str | None, dict[str, str]]:
    """(uuid for the name, that uuid's record) as stored in the pool."""
    directory = cluster.omap("csi.volumes.default")
    uuid_value = directory.get(f"csi.volume.{name}")
    record = cluster.omap(f"csi.volume.{uuid_value}") if uuid_value else {}
    return uuid_value, record


def wait_for_empty_trash(cluster: CephTestCluster, images: Collection[str], timeout: float = 30) -> list[dict[str, str]]:
    """The trash entries of `images` (names) still there once they are gone or `timeout` passed.
    Only the test's own images: another test's residue is that test's failure, not this one's.
    An entry that only a foreign watch keeps there (queued with the mgr, watched by a client that
    is no driver: `pool_state.foreign_held`) is forgiven, as `wait_for_pool` forgives it."""
    deadline = time.monotonic() + timeout
    while True:
        trash = [entry for entry in cluster.trash() if entry.get("name") in images]
        if not trash:
            return trash
        if time.monotonic() > deadline:
            print(describe_trash(cluster), flush=True)
            held = foreign_held(cluster, [t for t in trashed_images(cluster) if t.name in images])
            return [entry for entry in trash if entry.get("name") not in held]
        time.sleep(0.3)


RETRYABLE = (
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


def until_ok(call: Callable[[], T], deadline: float = 60.0, also: tuple[grpc.StatusCode, ...] = ()) -> T:
    """Call until it succeeds, retrying what a CO retries (ABORTED: a lease of a killed
    driver not lapsed yet; UNAVAILABLE/DEADLINE_EXCEEDED: a driver restarting)."""
    give_up = time.monotonic() + deadline
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            if error.code() not in (*RETRYABLE, *also) or time.monotonic() > give_up:
                raise
            time.sleep(0.2)
