"""Request validation of the CSI Node servicer, with the node service replaced by a recorder."""
from __future__ import annotations

import base64
import json
import os
import struct
from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.csi.node import NODE_CAPABILITIES, NodeServicer
from cephcsi.errors import (
    CephCSIError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from cephcsi.node.requests import PublishRequest, StageRequest
from cephcsi.node.stats import VolumeStats
from cephcsi.settings import NodeSettings, Settings
from cephcsi.volumes.volume_id import VolumeId

pytestmark = pytest.mark.unit

KEY = base64.b64encode(struct.pack("<HIIH", 1, 1, 0, 16) + b"k" * 16).decode()
SECRETS = {"userID": "csi", "userKey": KEY}
VOLUME_ID = VolumeId("ceph", 1, "11111111-2222-3333-4444-555555555555").encode()
CONTEXT = {"clusterID": "ceph", "pool": "rbd", "imageName": "csi-vol-1"}
Cap = csi_pb2.VolumeCapability
Mode = Cap.AccessMode


class FakeService:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.stats = VolumeStats(block=False, total_bytes=100, used_bytes=10, available_bytes=90,
                                 total_inodes=50, used_inodes=5, available_inodes=45)
        self.segments: dict[str, str] = {}

    def stage(self, request: StageRequest) -> None:
        self.calls.append(("stage", request))

    def unstage(self, volume_id: str, staging_path: str) -> None:
        self.calls.append(("unstage", (volume_id, staging_path)))

    def publish(self, request: PublishRequest) -> None:
        self.calls.append(("publish", request))

    def unpublish(self, volume_id: str, target_path: str) -> None:
        self.calls.append(("unpublish", (volume_id, target_path)))

    def volume_stats(self, volume_id: str, path: str) -> VolumeStats:
        self.calls.append(("stats", (volume_id, path)))
        return self.stats

    def topology(self) -> dict[str, str]:
        return self.segments


@pytest.fixture
def kubelet(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(tmp_path, "kubelet")
    os.makedirs(path)
    return path


@pytest.fixture
def servicer(tmp_path: os.PathLike[str], kubelet: str) -> tuple[NodeServicer, FakeService]:
    config = os.path.join(tmp_path, "config.json")
    with open(config, "w") as handle:
        json.dump([{"clusterID": "ceph", "monitors": ["10.0.0.1:6789"], "rbd": {"radosNamespace": "tenant"}}], handle)
    settings = Settings(mode="node", node=NodeSettings(node_id="node-1", kubelet_dir=kubelet, max_volumes_per_node=7))
    fake = FakeService()
    return NodeServicer(fake, ClusterRegistry(config), settings), fake  # type: ignore[arg-type]


def mount_cap(fs: str = "", mode: Mode.Mode = Mode.SINGLE_NODE_WRITER, flags: tuple[str, ...] = ()) -> Cap:
    return Cap(mount=Cap.MountVolume(fs_type=fs, mount_flags=list(flags)), access_mode=Mode(mode=mode))


def block_cap(mode: Mode.Mode = Mode.SINGLE_NODE_WRITER) -> Cap:
    return Cap(block=Cap.BlockVolume(), access_mode=Mode(mode=mode))


def stage_request(kubelet: str, **overrides: Any) -> csi_pb2.NodeStageVolumeRequest:
    fields: dict[str, Any] = dict(
        volume_id=VOLUME_ID, staging_target_path=f"{kubelet}/plugins/st/globalmount",
        volume_capability=mount_cap(), secrets=SECRETS, volume_context=CONTEXT,
    )
    fields.update(overrides)
    return csi_pb2.NodeStageVolumeRequest(**{k: v for k, v in fields.items() if v is not None})


def expect(error: type[CephCSIError], text: str, call: Any, *args: Any) -> CephCSIError:
    with pytest.raises(error, match=text) as caught:
        call(*args, None)
    return caught.value


def test_stage_builds_the_domain_request(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    ctx = {**CONTEXT, "mounter": "rbd-nbd", "mapOptions": "nbd:io-timeout=5", "mkfsOptions": "-m1"}
    node.NodeStageVolume(stage_request(kubelet, volume_context=ctx, volume_capability=mount_cap(flags=("noatime",))), None)
    kind, request = fake.calls[0]
    assert kind == "stage"
    assert request.staging_path == f"{kubelet}/plugins/st/globalmount"
    assert str(request.image) == "rbd/tenant/csi-vol-1"  # namespace from config.json when ctx has none
    assert request.monitors == "10.0.0.1:6789"
    assert request.access.fs_type == "ext4" and request.access.mount_flags == ("noatime",)
    assert (request.mounter, request.map_options, request.mkfs_options) == ("rbd-nbd", "nbd:io-timeout=5", "-m1")
    assert request.credentials.user_id == "csi"
    assert KEY not in repr(request)


def test_stage_block_and_read_only(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    node.NodeStageVolume(stage_request(kubelet, volume_capability=block_cap(Mode.MULTI_NODE_READER_ONLY)), None)
    access = fake.calls[0][1].access
    assert access.block and access.read_only


@pytest.mark.parametrize(
    "overrides, error, text",
    [
        ({"volume_id": ""}, InvalidArgument, "volume_id is required"),
        ({"staging_target_path": ""}, InvalidArgument, "staging_target_path is required"),
        ({"staging_target_path": "relative/x"}, InvalidArgument, "staging_target_path.*absolute"),
        ({"staging_target_path": "/etc/x"}, InvalidArgument, "staging_target_path.*not inside the kubelet directory"),
        ({"volume_capability": None}, InvalidArgument, "volume_capability is required"),
        ({"volume_capability": Cap(mount=Cap.MountVolume())}, InvalidArgument, "access_mode must be set"),
        ({"volume_capability": mount_cap("btrfs")}, InvalidArgument, "filesystem 'btrfs' is not supported"),
        ({"volume_capability": mount_cap(mode=Mode.MULTI_NODE_MULTI_WRITER)}, InvalidArgument, "only for block"),
        ({"volume_capability": mount_cap(mode=Mode.MULTI_NODE_SINGLE_WRITER)}, InvalidArgument, "only for block"),
        ({"volume_capability": mount_cap(flags=("bind",))}, InvalidArgument, "mount_flags: 'bind'"),
        ({"volume_capability": mount_cap(flags=("a b",))}, InvalidArgument, "mount_flags"),
        ({"volume_id": "fake-vol-id-1234"}, NotFound, "does not exist"),
        ({"volume_context": {"clusterID": "ceph", "pool": "rbd"}}, InvalidArgument, "missing imageName"),
        ({"volume_context": {"clusterID": "ceph", "imageName": "x"}}, InvalidArgument, "missing pool"),
        ({"volume_context": {**CONTEXT, "clusterID": "other"}}, InvalidArgument, "does not match"),
        ({"secrets": {}}, InvalidArgument, "userID and userKey"),
        ({"secrets": {"userID": "csi", "userKey": "bm90LWEta2V5"}}, InvalidArgument, "userKey"),
    ],
)
def test_stage_refusals(servicer: tuple[NodeServicer, FakeService], kubelet: str, overrides: dict[str, Any], error: type, text: str) -> None:
    node, fake = servicer
    raised = expect(error, text, node.NodeStageVolume, stage_request(kubelet, **overrides))
    assert KEY not in raised.message and "bm90LWEta2V5" not in raised.message
    assert fake.calls == []


def test_stage_unknown_cluster(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, _ = servicer
    vid = VolumeId("nowhere", 1, "11111111-2222-3333-4444-555555555555").encode()
    expect(NotFound, "clusterID 'nowhere' is not in", node.NodeStageVolume,
           stage_request(kubelet, volume_id=vid, volume_context={"pool": "rbd", "imageName": "x"}))


def test_unstage(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    expect(InvalidArgument, "volume_id is required", node.NodeUnstageVolume,
           csi_pb2.NodeUnstageVolumeRequest(staging_target_path=f"{kubelet}/x"))
    expect(InvalidArgument, "staging_target_path is required", node.NodeUnstageVolume,
           csi_pb2.NodeUnstageVolumeRequest(volume_id=VOLUME_ID))
    expect(InvalidArgument, "'..'", node.NodeUnstageVolume,
           csi_pb2.NodeUnstageVolumeRequest(volume_id=VOLUME_ID, staging_target_path=f"{kubelet}/../x"))
    # Cleanup calls do not decode ids: an unknown id is passed on (and is a no-op on an empty path).
    node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(volume_id="fake-vol-id", staging_target_path=f"{kubelet}/x"), None)
    assert fake.calls == [("unstage", ("fake-vol-id", f"{kubelet}/x"))]


def test_publish(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    base: dict[str, Any] = dict(volume_id=VOLUME_ID, staging_target_path=f"{kubelet}/st",
                                target_path=f"{kubelet}/pods/p/mount", volume_capability=mount_cap())
    expect(InvalidArgument, "volume_id is required", node.NodePublishVolume, csi_pb2.NodePublishVolumeRequest())
    expect(InvalidArgument, "target_path is required", node.NodePublishVolume,
           csi_pb2.NodePublishVolumeRequest(volume_id=VOLUME_ID))
    expect(InvalidArgument, "staging_target_path is required", node.NodePublishVolume,
           csi_pb2.NodePublishVolumeRequest(**{**base, "staging_target_path": ""}))
    expect(InvalidArgument, "volume_capability is required", node.NodePublishVolume,
           csi_pb2.NodePublishVolumeRequest(**{k: v for k, v in base.items() if k != "volume_capability"}))
    expect(InvalidArgument, "must not contain each other", node.NodePublishVolume,
           csi_pb2.NodePublishVolumeRequest(**{**base, "target_path": f"{kubelet}/st/inside"}))
    expect(NotFound, "does not exist", node.NodePublishVolume,
           csi_pb2.NodePublishVolumeRequest(**{**base, "volume_id": "fake-vol-id"}))
    node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(**base, readonly=True), None)
    kind, request = fake.calls[0]
    assert kind == "publish" and request.read_only and request.target_path == f"{kubelet}/pods/p/mount"


def test_unpublish(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    expect(InvalidArgument, "volume_id is required", node.NodeUnpublishVolume, csi_pb2.NodeUnpublishVolumeRequest())
    expect(InvalidArgument, "target_path is required", node.NodeUnpublishVolume,
           csi_pb2.NodeUnpublishVolumeRequest(volume_id=VOLUME_ID))
    expect(InvalidArgument, "not inside the kubelet", node.NodeUnpublishVolume,
           csi_pb2.NodeUnpublishVolumeRequest(volume_id=VOLUME_ID, target_path="/var/tmp/x"))
    node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id=VOLUME_ID, target_path=f"{kubelet}/t"), None)
    assert fake.calls == [("unpublish", (VOLUME_ID, f"{kubelet}/t"))]


def test_stats(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    expect(InvalidArgument, "volume_id is required", node.NodeGetVolumeStats,
           csi_pb2.NodeGetVolumeStatsRequest(volume_path="some/path"))
    expect(InvalidArgument, "volume_path is required", node.NodeGetVolumeStats,
           csi_pb2.NodeGetVolumeStatsRequest(volume_id=VOLUME_ID))
    # csi-sanity: an unknown id, and a known id on a path that is no volume, are NOT_FOUND.
    # ("fake-vol-id" could be a static volume's image name: the path decides.)
    expect(NotFound, "does not exist|no volume", node.NodeGetVolumeStats,
           csi_pb2.NodeGetVolumeStatsRequest(volume_id="fake-vol-id", volume_path="some/path"))
    expect(NotFound, "does not exist", node.NodeGetVolumeStats,
           csi_pb2.NodeGetVolumeStatsRequest(volume_id="-not-an-image", volume_path=f"{kubelet}/t"))
    expect(NotFound, "no volume", node.NodeGetVolumeStats,
           csi_pb2.NodeGetVolumeStatsRequest(volume_id=VOLUME_ID, volume_path="some/path"))
    response = node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id=VOLUME_ID, volume_path=f"{kubelet}/t"), None)
    Unit = csi_pb2.VolumeUsage.Unit
    assert [(u.unit, u.total, u.used, u.available) for u in response.usage] == [
        (Unit.BYTES, 100, 10, 90), (Unit.INODES, 50, 5, 45)]
    assert not response.volume_condition.abnormal
    fake.stats = VolumeStats(block=True, abnormal=True, message="device gone")
    response = node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id=VOLUME_ID, volume_path=f"{kubelet}/t"), None)
    assert list(response.usage) == []
    assert response.volume_condition.abnormal and response.volume_condition.message == "device gone"


def test_capabilities_info_expand(servicer: tuple[NodeServicer, FakeService]) -> None:
    node, fake = servicer
    caps = node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), None)
    assert [c.rpc.type for c in caps.capabilities] == list(NODE_CAPABILITIES)
    assert csi_pb2.NodeServiceCapability.RPC.EXPAND_VOLUME in NODE_CAPABILITIES
    info = node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), None)
    assert (info.node_id, info.max_volumes_per_node, info.HasField("accessible_topology")) == ("node-1", 7, False)
    fake.segments = {"topology.rbd.csi.ceph.com/zone": "z1"}
    info = node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), None)
    assert dict(info.accessible_topology.segments) == fake.segments
    expect(InvalidArgument, "volume_id is required", node.NodeExpandVolume, csi_pb2.NodeExpandVolumeRequest())


def test_service_errors_pass_through(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer

    def refuse(request: Any) -> None:
        raise FailedPrecondition("not staged")

    fake.publish = refuse  # type: ignore[method-assign]
    expect(FailedPrecondition, "not staged", node.NodePublishVolume, csi_pb2.NodePublishVolumeRequest(
        volume_id=VOLUME_ID, staging_target_path=f"{kubelet}/st", target_path=f"{kubelet}/t", volume_capability=mount_cap()))


# -- static (pre-provisioned) volumes: ceph-csi's volumeHandle = bare image name -------------------

STATIC_CONTEXT = {"staticVolume": "true", "clusterID": "ceph", "pool": "rbd", "imageFeatures": "layering"}


def test_static_volume_stage_maps_the_named_image(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
        volume_id="static-image", staging_target_path=f"{kubelet}/st", volume_capability=mount_cap(),
        secrets=SECRETS, volume_context={**STATIC_CONTEXT, "mounter": "rbd-nbd"}), None)
    kind, request = fake.calls[-1]
    assert kind == "stage" and request.volume_id == "static-image"
    assert (request.image.pool, request.image.image, request.image.namespace) == ("rbd", "static-image", "tenant")
    assert request.cluster_id == "ceph" and request.mounter == "rbd-nbd"
    node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
        volume_id="static-image", staging_target_path=f"{kubelet}/st2", volume_capability=mount_cap(),
        secrets=SECRETS, volume_context={**STATIC_CONTEXT, "staticVolume": "True", "radosNamespace": ""}), None)
    assert fake.calls[-1][1].image.namespace == ""


@pytest.mark.parametrize("context, volume_id, error, text", [
    ({**STATIC_CONTEXT, "staticVolume": "yes"}, "img", InvalidArgument, "staticVolume='yes' is not a boolean"),
    ({k: v for k, v in STATIC_CONTEXT.items() if k != "pool"}, "img", InvalidArgument, "volumeAttributes.pool is required"),
    ({k: v for k, v in STATIC_CONTEXT.items() if k != "clusterID"}, "img", InvalidArgument, "clusterID is required"),
    ({**STATIC_CONTEXT, "imageFeatures": "layering,bogus"}, "img", InvalidArgument, "unknown feature"),
    (STATIC_CONTEXT, "img@snap", InvalidArgument, "bare RBD image name"),
    (STATIC_CONTEXT, "-img", InvalidArgument, "bare RBD image name"),
    ({**STATIC_CONTEXT, "clusterID": "other"}, "img", NotFound, "clusterID 'other' is not in"),
    ({"clusterID": "ceph", "pool": "rbd"}, "img", NotFound, 'set volumeAttributes staticVolume: "true"'),
])
def test_static_volume_stage_refusals(servicer: tuple[NodeServicer, FakeService], kubelet: str,
                                      context: dict[str, str], volume_id: str, error: type[CephCSIError], text: str) -> None:
    node, fake = servicer
    expect(error, text, node.NodeStageVolume, csi_pb2.NodeStageVolumeRequest(
        volume_id=volume_id, staging_target_path=f"{kubelet}/st", volume_capability=mount_cap(),
        secrets=SECRETS, volume_context=context))
    assert fake.calls == []


def test_static_volume_publish_and_stats(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
        volume_id="static-image", staging_target_path=f"{kubelet}/st", target_path=f"{kubelet}/pods/t",
        volume_capability=mount_cap(), volume_context=STATIC_CONTEXT), None)
    assert fake.calls[-1][0] == "publish" and fake.calls[-1][1].volume_id == "static-image"
    # Without staticVolume the bare name is no id of ours.
    expect(NotFound, "does not exist", node.NodePublishVolume, csi_pb2.NodePublishVolumeRequest(
        volume_id="static-image", staging_target_path=f"{kubelet}/st", target_path=f"{kubelet}/pods/t",
        volume_capability=mount_cap(), volume_context={"pool": "rbd"}))
    # Stats carry no context: a bare name is only a volume where a stage of it is found.
    expect(NotFound, "no stage of it found", node.NodeGetVolumeStats,
           csi_pb2.NodeGetVolumeStatsRequest(volume_id="static-image", volume_path=f"{kubelet}/pods/t"))


def test_read_only_many_filesystem_is_accepted(servicer: tuple[NodeServicer, FakeService], kubelet: str) -> None:
    node, fake = servicer
    node.NodeStageVolume(stage_request(kubelet, volume_capability=mount_cap(mode=Mode.MULTI_NODE_READER_ONLY)), None)
    request = fake.calls[-1][1]
    assert request.access.read_only and not request.access.block
