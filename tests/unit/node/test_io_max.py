"""krbd QoS through cgroup v2 io.max (cephcsi.node.io_max): the pure parts, the writer on a
cgroup tree made of plain directories, and where publish calls it."""
from __future__ import annotations

import base64
import errno
import json
import logging
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph.credentials import Credentials
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.csi.node import NodeServicer
from cephcsi.errors import Internal, NotFound
from cephcsi.node import io_max
from cephcsi.node.io_max import IoLimits, IoMaxWriter, KrbdQos
from cephcsi.node.publisher import Publisher, _Staged
from cephcsi.node.requests import PublishRequest, VolumeAccess
from cephcsi.node.stage_record import ImageSpec, StageRecord
from cephcsi.settings import NodeSettings, Settings
from cephcsi.volumes.volume_id import VolumeId
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

UID = "0b0e005c-39ec-4719-bbfe-78aadbc3e4ad"
SLICE_UID = UID.replace("-", "_")
MOUNT_TARGET = f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount"
BLOCK_TARGET = f"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/{UID}"
KEY = base64.b64encode(struct.pack("<HIIH", 1, 1, 0, 16) + b"k" * 16).decode()
"""A well-formed cephx key (aes)."""


def test_limits_from_metadata_maps_each_direction_and_the_combined_limits() -> None:
    assert io_max.limits_from_metadata({}) == IoLimits()
    assert io_max.limits_from_metadata({"conf_rbd_qos_write_iops_limit": "40",
                                        "conf_rbd_qos_read_bps_limit": "1048576"}) == IoLimits(wiops=40, rbps=1048576)
    # The combined limits bound each direction; a direction's own limit wins when lower.
    assert io_max.limits_from_metadata({"conf_rbd_qos_iops_limit": "100", "conf_rbd_qos_read_iops_limit": "30",
                                        "conf_rbd_qos_write_iops_limit": "500", "conf_rbd_qos_bps_limit": "4096"}) \
        == IoLimits(riops=30, wiops=100, rbps=4096, wbps=4096)
    # 0 is librbd's "unlimited"; a value that is no number is not a limit; other keys are ignored.
    assert io_max.limits_from_metadata({"conf_rbd_qos_iops_limit": "0", "conf_rbd_qos_bps_limit": "x",
                                        "rbd_base_qos_write_iops_limit": "40"}).unlimited


def test_io_max_line_always_names_all_four_keys() -> None:
    assert io_max.io_max_line(252, 0, IoLimits(wiops=40)) == "252:0 rbps=max wbps=max riops=max wiops=40"
    assert io_max.io_max_line(253, 3, IoLimits(1, 2, 3, 4)) == "253:3 rbps=3 wbps=4 riops=1 wiops=2"
    assert io_max.io_max_line(252, 16, IoLimits()) == "252:16 rbps=max wbps=max riops=max wiops=max"


def test_parse_io_max() -> None:
    text = "252:0 rbps=max wbps=1048576 riops=max wiops=max\n8:16 rbps=max wbps=max riops=10 wiops=max\n\n"
    assert io_max.parse_io_max(text) == {(252, 0): "252:0 rbps=max wbps=1048576 riops=max wiops=max",
                                         (8, 16): "8:16 rbps=max wbps=max riops=10 wiops=max"}
    assert io_max.parse_io_max("") == {}


def test_pod_uid_from_kubelet_targets() -> None:
    assert io_max.pod_uid(MOUNT_TARGET) == UID
    assert io_max.pod_uid(BLOCK_TARGET) == UID
    assert io_max.pod_uid(f"/srv/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount") == UID
    # A static pod's uid is a hash without dashes.
    assert io_max.pod_uid("/var/lib/kubelet/pods/0123456789abcdef0123456789abcdef/volumes/x/y/mount") \
        == "0123456789abcdef0123456789abcdef"
    assert io_max.pod_uid("/mnt/target") is None
    assert io_max.pod_uid(f"/var/lib/kubelet/pods/{UID}/x") is None


def cgroup_tree(root: Path, relative: str) -> Path:
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    pod = root / relative
    pod.mkdir(parents=True)
    (pod / "io.max").write_text("")
    return pod


@pytest.mark.parametrize("relative", [
    f"kubepods/pod{UID}",  # cgroupfs, Guaranteed
    f"kubepods/burstable/pod{UID}",
    f"kubepods/besteffort/pod{UID}",
    f"kubepods.slice/kubepods-pod{SLICE_UID}.slice",  # systemd, Guaranteed
    f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE_UID}.slice",
    f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice",
    # Not a default place (kubelet --cgroup-root): found by the walk.
    f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{SLICE_UID}.slice",
])
def test_find_pod_cgroup(tmp_path: Path, relative: str) -> None:
    pod = cgroup_tree(tmp_path, relative)
    (tmp_path / "kubepods" / "burstable" / "podother").mkdir(parents=True)
    assert io_max.find_pod_cgroup(str(tmp_path), UID) == str(pod)
    assert io_max.find_pod_cgroup(str(tmp_path), "11111111-2222-3333-4444-555555555555") is None


def blockdev(major: int, minor: int) -> Callable[[str], os.stat_result]:
    """A stat that knows one block device node, /dev/rbd0, as MAJ:MIN."""
    def fake_stat(path: str) -> os.stat_result:
        if path != "/dev/rbd0":
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return os.stat_result((stat.S_IFBLK | 0o660, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(major, minor)})
    return fake_stat


def test_device_numbers() -> None:
    assert io_max.device_numbers("/dev/rbd0", blockdev(252, 16)) == (252, 16)
    with pytest.raises(Internal, match="cannot read the device numbers of /dev/rbd9"):
        io_max.device_numbers("/dev/rbd9", blockdev(252, 16))
    with pytest.raises(Internal, match="/dev/null is not a block device"):
        io_max.device_numbers("/dev/null")


def test_writer_sets_replaces_and_removes_the_rule(tmp_path: Path) -> None:
    pod = cgroup_tree(tmp_path, f"kubepods/besteffort/pod{UID}")
    writer = IoMaxWriter((str(tmp_path),), blockdev(252, 0))
    assert writer.apply("vol", MOUNT_TARGET, "/dev/rbd0", IoLimits(wiops=40))
    assert (pod / "io.max").read_text() == "252:0 rbps=max wbps=max riops=max wiops=40\n"
    # Republish (the kernel file lists the rule as it is now): the same line again.
    assert writer.apply("vol", MOUNT_TARGET, "/dev/rbd0", IoLimits(wiops=40))
    assert (pod / "io.max").read_text() == "252:0 rbps=max wbps=max riops=max wiops=40\n"
    # Limits lifted: all `max`, which makes the kernel drop the rule.
    assert writer.apply("vol", MOUNT_TARGET, "/dev/rbd0", IoLimits())
    assert (pod / "io.max").read_text() == "252:0 rbps=max wbps=max riops=max wiops=max\n"
    # No limits and no rule: nothing written.
    (pod / "io.max").write_text("")
    assert writer.apply("vol", BLOCK_TARGET, "/dev/rbd0", IoLimits())
    assert (pod / "io.max").read_text() == ""


def test_writer_carries_on_where_limits_cannot_be_set(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cephcsi.node.io_max")
    limits = IoLimits(wiops=40)
    # cgroup v1 (no cgroup.controllers at the root): said once.
    v1 = IoMaxWriter((str(tmp_path / "v1"),), blockdev(252, 0))
    assert not v1.apply("vol", MOUNT_TARGET, "/dev/rbd0", limits)
    assert not v1.apply("vol", MOUNT_TARGET, "/dev/rbd0", limits)
    assert [r.message for r in caplog.records].count("krbd QoS not enforced on this node: no cgroup v2 hierarchy") == 1
    # No io controller in the pod's cgroup (no io.max): said once.
    (tmp_path / "v2").mkdir()
    pod = cgroup_tree(tmp_path / "v2", f"kubepods/pod{UID}")
    (pod / "io.max").unlink()
    writer = IoMaxWriter((str(tmp_path / "v2"),), blockdev(252, 0))
    assert not writer.apply("vol", MOUNT_TARGET, "/dev/rbd0", limits)
    assert not writer.apply("vol", MOUNT_TARGET, "/dev/rbd0", limits)
    assert sum("io controller is not enabled" in r.message for r in caplog.records) == 1
    # A target path that is not kubelet's, a pod without a cgroup: a warning, no error.
    assert not writer.apply("vol", "/mnt/target", "/dev/rbd0", limits)
    assert not writer.apply("vol", MOUNT_TARGET.replace(UID, "11111111-2222-3333-4444-555555555555"),
                            "/dev/rbd0", limits)
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 2


def test_writer_looks_in_each_root(tmp_path: Path) -> None:
    """The container's own cgroup namespace view first (no pods in it), then the node's."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "cgroup.controllers").write_text("io\n")
    (tmp_path / "node").mkdir()
    pod = cgroup_tree(tmp_path / "node", f"kubepods/burstable/pod{UID}")
    writer = IoMaxWriter((str(own), str(tmp_path / "node")), blockdev(252, 32))
    assert writer.apply("vol", MOUNT_TARGET, "/dev/rbd0", IoLimits(rbps=1024))
    assert (pod / "io.max").read_text() == "252:32 rbps=1024 wbps=max riops=max wiops=max\n"


def test_writer_reports_a_failed_write(tmp_path: Path) -> None:
    pod = cgroup_tree(tmp_path, f"kubepods/pod{UID}")
    (pod / "io.max").unlink()
    (pod / "io.max").mkdir()  # readable as nothing, not writable: stands for a refused write
    writer = IoMaxWriter((str(tmp_path),), blockdev(252, 0))
    with pytest.raises(Internal):
        writer.apply("vol", MOUNT_TARGET, "/dev/rbd0", IoLimits(wiops=40))


class RecordingWriter(IoMaxWriter):
    def __init__(self) -> None:
        super().__init__(("/nonexistent",))
        self.applied: list[tuple[str, str, str, IoLimits]] = []

    def apply(self, volume_id: str, target_path: str, device: str, limits: IoLimits) -> bool:
        self.applied.append((volume_id, target_path, device, limits))
        return True


MONITORS = {"ceph": "10.0.0.1:6789"}
SECRETS = {"userID": "csi", "userKey": KEY}


def monitors_of(cluster_id: str) -> str:
    if cluster_id not in MONITORS:
        raise NotFound(f"clusterID {cluster_id!r} is not in config.json")
    return MONITORS[cluster_id]


def test_krbd_qos_reads_the_image_with_the_publish_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cephcsi.node.io_max")
    meta = {"conf_rbd_qos_write_iops_limit": "40", "conf_rbd_qos_bps_limit": "8388608", "other": "x"}
    runner = FakeRunner(lambda argv: (0, json.dumps(meta), ""))
    writer = RecordingWriter()
    qos = KrbdQos(runner, 5.0, writer)
    image = ImageSpec("rbd", "csi-vol-1", "tenant")
    qos.apply("vol", MOUNT_TARGET, "/dev/mapper/luks-rbd-vol", image, "ceph", SECRETS, monitors_of)
    assert writer.applied == [("vol", MOUNT_TARGET, "/dev/mapper/luks-rbd-vol",
                               IoLimits(wiops=40, rbps=8388608, wbps=8388608))]
    (call,) = runner.calls
    assert call.argv[:9] == ["rbd", "image-meta", "list", "--pool", "rbd", "--namespace", "tenant", "--image", "csi-vol-1"]
    assert call.argv[call.argv.index("-m") + 1] == "10.0.0.1:6789"
    assert not any(KEY in arg for arg in call.argv)  # the key only in a 0600 file
    assert [mode for mode, text in call.files.values() if KEY in text] == [0o600]
    # No node-publish secret: nothing read or written, said once.
    qos.apply("vol", MOUNT_TARGET, "/dev/rbd0", image, "ceph", {}, monitors_of)
    qos.apply("vol", MOUNT_TARGET, "/dev/rbd0", image, "ceph", {}, monitors_of)
    assert len(runner.calls) == 1 and len(writer.applied) == 1
    assert sum("node-publish secret" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("secrets, cluster_id", [
    ({"token": "s3cr3t-value"}, "ceph"),  # a secret for something else (no cephx user)
    ({"userID": "csi", "userKey": "s3cr3t-value"}, "ceph"),  # not a cephx key
    (SECRETS, "elsewhere"),  # a cluster config.json does not know
])
def test_krbd_qos_with_an_unusable_secret_or_cluster_warns_and_publishes_unthrottled(
        caplog: pytest.LogCaptureFixture, secrets: dict[str, str], cluster_id: str) -> None:
    caplog.set_level(logging.INFO, logger="cephcsi.node.io_max")
    runner, writer = FakeRunner(), RecordingWriter()
    KrbdQos(runner, 5.0, writer).apply("vol", MOUNT_TARGET, "/dev/rbd0", ImageSpec("rbd", "img"), cluster_id,
                                       secrets, monitors_of)
    assert runner.calls == [] and writer.applied == []
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "krbd QoS not enforced" in warning.getMessage() and "vol" in str(warning.__dict__)
    logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "s3cr3t-value" not in logged and KEY not in logged


def test_krbd_qos_read_failure_warns_and_publishes_unthrottled(caplog: pytest.LogCaptureFixture) -> None:
    """A mon election or a user not allowed to read the image must not block the pod."""
    caplog.set_level(logging.INFO, logger="cephcsi.node.io_max")
    runner = FakeRunner(lambda argv: (1, "", "rbd: error opening image img: (13) Permission denied"))
    writer = RecordingWriter()
    KrbdQos(runner, 5.0, writer).apply("vol-7", MOUNT_TARGET, "/dev/rbd0", ImageSpec("rbd", "img"), "ceph",
                                       SECRETS, monitors_of)
    assert len(runner.calls) == 1 and writer.applied == []
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "could not be read" in warning.getMessage() and "rbd image-meta list" in warning.getMessage()
    assert "vol-7" in str(warning.__dict__)
    assert KEY not in str(warning.__dict__)


def test_krbd_qos_key_file_failure_warns_and_publishes_unthrottled(caplog: pytest.LogCaptureFixture) -> None:
    """The 0600 key file cannot be written (a full /tmp): still no reason to refuse the pod."""
    caplog.set_level(logging.INFO, logger="cephcsi.node.io_max")

    class NoSpace(KrbdQos):
        def read_limits(self, image: ImageSpec, monitors: str, credentials: Credentials) -> IoLimits:
            raise OSError(28, "No space left on device")
    writer = RecordingWriter()
    NoSpace(FakeRunner(), 5.0, writer).apply("vol-8", MOUNT_TARGET, "/dev/rbd0", ImageSpec("rbd", "img"), "ceph",
                                             SECRETS, monitors_of)
    assert writer.applied == []
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "could not be read" in warning.getMessage() and "vol-8" in str(warning.__dict__)


def test_writer_does_not_stat_the_device_when_no_rule_is_needed(tmp_path: Path) -> None:
    cgroup_tree(tmp_path, f"kubepods/pod{UID}")  # io.max lists no device

    def no_stat(path: str) -> os.stat_result:
        raise AssertionError(f"{path} looked at with no rule to write")
    assert IoMaxWriter((str(tmp_path),), no_stat).apply("vol", MOUNT_TARGET, "/dev/rbd0", IoLimits())


class RecordingQos(KrbdQos):
    def __init__(self) -> None:
        super().__init__(FakeRunner(), 1.0, RecordingWriter())
        self.calls: list[tuple[Any, ...]] = []

    def apply(self, *args: Any) -> None:
        self.calls.append(args)


def record(mapper: str, device: str = "/dev/rbd0", crypt: str = "") -> StageRecord:
    return StageRecord(volume_id="vol", staging_path="/st", cluster_id="ceph", pool="rbd", image="img",
                       namespace="", mapper=mapper, access_type="mount", device=device, crypt_name=crypt,
                       staged=True)


def test_publish_limits_krbd_only(tmp_path: Path) -> None:
    qos = RecordingQos()
    publisher = Publisher(None, str(tmp_path), krbd_qos=qos)  # type: ignore[arg-type]
    request = PublishRequest("vol", "/st", MOUNT_TARGET, VolumeAccess("mount"), secrets=SECRETS,
                             cluster_monitors=monitors_of)
    for mapper in ("rbd-nbd", "fuse"):  # librbd enforces the limits itself
        publisher._limit_io(_Staged("/st/fs", "mount", False, record=record(mapper)), request)
    publisher._limit_io(_Staged("/st/fs", "mount", False), request)  # ceph-csi's stage: no record
    assert qos.calls == []
    publisher._limit_io(_Staged("/st/fs", "mount", False, record=record("krbd", crypt="luks-rbd-vol")), request)
    assert qos.calls == [("vol", MOUNT_TARGET, "/dev/mapper/luks-rbd-vol", ImageSpec("rbd", "img", ""),
                          "ceph", SECRETS, monitors_of)]


def test_publish_with_a_non_cephx_secret_is_untouched_for_nbd(caplog: pytest.LogCaptureFixture,
                                                               tmp_path: Path) -> None:
    """A node-publish secret meant for something else never fails a librbd-mapped publish."""
    caplog.set_level(logging.INFO, logger="cephcsi.node.io_max")
    runner = FakeRunner()
    publisher = Publisher(None, str(tmp_path), krbd_qos=KrbdQos(runner, 1.0, RecordingWriter()))  # type: ignore[arg-type]
    request = PublishRequest("vol", "/st", MOUNT_TARGET, VolumeAccess("mount"), secrets={"token": "x"},
                             cluster_monitors=monitors_of)
    publisher._limit_io(_Staged("/st/fs", "mount", False, record=record("rbd-nbd")), request)
    assert runner.calls == [] and not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_node_publish_passes_the_publish_secret_unchecked(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    kubelet.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps([{"clusterID": "ceph", "monitors": ["10.0.0.1:6789"]}]))
    published: list[PublishRequest] = []

    class Service:
        def publish(self, request: PublishRequest) -> None:
            published.append(request)

    settings = Settings(mode="node", node=NodeSettings(node_id="n", kubelet_dir=str(kubelet)))
    node = NodeServicer(Service(), ClusterRegistry(str(config)), settings)  # type: ignore[arg-type]
    volume_id = VolumeId("ceph", 1, "11111111-2222-3333-4444-555555555555").encode()
    cap = csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                   access_mode=csi_pb2.VolumeCapability.AccessMode(
                                       mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))
    base: dict[str, Any] = dict(volume_id=volume_id, staging_target_path=f"{kubelet}/st",
                                target_path=f"{kubelet}/pods/{UID}/volumes/kubernetes.io~csi/pv/mount",
                                volume_capability=cap)
    node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(**base), None)
    node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(**base, secrets=SECRETS), None)
    # Neither a secret without a cephx user nor a volume of a cluster config.json does not know
    # fails the publish here: only the krbd QoS step reads them.
    node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(**base, secrets={"token": "s3cr3t"}), None)
    other = VolumeId("gone", 1, "11111111-2222-3333-4444-555555555555").encode()
    node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(**{**base, "volume_id": other}, secrets=SECRETS), None)
    assert [dict(p.secrets) for p in published] == [{}, SECRETS, {"token": "s3cr3t"}, SECRETS]
    assert published[1].cluster_monitors is not None and published[1].cluster_monitors("ceph") == "10.0.0.1:6789"
    assert KEY not in repr(published[1]) and "s3cr3t" not in repr(published[2])
