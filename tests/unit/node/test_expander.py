"""NodeExpandVolume and resize-on-stage, by the exact commands run for each mapper; the
superblock readers; the servicer's checks. Real runs (fuse + loop) are in
tests/integration/node/test_expand.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cephcsi.errors import FailedPrecondition, InvalidArgument, NotFound, OperationInFlight
from cephcsi.locks import KeyLocks
from cephcsi.node import fssize, stage_record
from cephcsi.node.expander import NodeExpander, NodeExpandRequest
from cephcsi.node.mappers import nbd
from cephcsi.node.mappers.base import FUSE, KRBD, NBD
from cephcsi.node.mounts import MountEntry
from cephcsi.node.stage_record import ACCESS_BLOCK, ACCESS_MOUNT, StageRecord
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit
MiB = 1 << 20
VOLUME = "0001-0004-ceph-0000000000000001-6a1f1b1e-0000-4000-8000-000000000001"


class FakeMapper:
    def __init__(self, device: str | None) -> None:
        self.device = device

    def find(self, record: StageRecord) -> str | None:
        return self.device


def entry(mount_point: str, source: str = "/dev/x", major: int = 7, minor: int = 0, root: str = "/") -> MountEntry:
    return MountEntry(1, 0, major, minor, root, mount_point, ("rw",), "ext4", source, ())


class Node:
    """An expander over fakes: device sizes, filesystem sizes, mounts, one stage record."""

    def __init__(self, tmp: Path, mapper: str, device: str, access: str = ACCESS_MOUNT, fs_type: str = "ext4",
                 read_only: bool = False) -> None:
        self.staging = str(tmp / "staging")
        os.makedirs(self.staging)
        self.work_dir = str(tmp / "work")
        self.record = StageRecord(VOLUME, self.staging, "ceph", "rbd", "img", "", mapper, access, fs_type=fs_type,
                                  read_only=read_only, work_dir=self.work_dir, device=device, staged=True)
        stage_record.save(self.record)
        if access == ACCESS_MOUNT:
            os.makedirs(self.record.mount_path)
        else:
            Path(self.record.mount_path).touch()
        self.sizes = {device: 64 * MiB}
        self.fs: fssize.FsSize | None = fssize.FsSize(fs_type, 4096, 64 * MiB // 4096)
        self.mounts = [entry(self.record.mount_path, device)]
        self.runner = FakeRunner(self.respond)
        mappers = {name: FakeMapper(device) for name in (KRBD, NBD, FUSE)}
        self.expander = NodeExpander(mappers, self.runner, 5.0, 0.3, read_mounts=lambda: self.mounts,  # type: ignore[arg-type]
                                     size_of=lambda d: self.sizes[d], fs_size=lambda d, t: self.fs,
                                     sleep=lambda s: None, device_numbers=lambda d: (7, 0))

    def respond(self, argv: list[str]) -> tuple[int, str, str] | None:
        if argv[:2] == ["losetup", "--set-capacity"]:
            self.sizes[argv[2]] = os.stat(os.path.join(self.work_dir, "mnt", "img")).st_size
        if argv[0] in ("resize2fs", "xfs_growfs") and self.fs is not None:
            device = self.record.device
            self.fs = fssize.FsSize(self.fs.fs_type, 4096, self.sizes[device] // 4096)
        return None

    def expand(self, required: int = 0, **extra: Any) -> int:
        request = NodeExpandRequest(VOLUME, self.record.mount_path, self.staging, required, **extra)
        return self.expander.expand(self.expander.locate(request), request)


@pytest.mark.parametrize("mapper, device", [(KRBD, "/dev/rbd0"), (NBD, "/dev/nbd3")])
def test_krbd_and_nbd_devices_follow_the_image_so_only_the_filesystem_is_grown(tmp_path: Path, mapper: str,
                                                                                device: str) -> None:
    node = Node(tmp_path, mapper, device)
    node.sizes[device] = 128 * MiB  # the kernel / rbd-nbd picked up the resize
    assert node.expand(128 * MiB) == 128 * MiB
    assert node.runner.argvs() == [["resize2fs", device]]
    assert node.expand(128 * MiB) == 128 * MiB  # idempotent: the filesystem fills the device now
    assert node.runner.argvs() == [["resize2fs", device]]


def test_xfs_is_grown_on_its_mount_point(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd1", fs_type="xfs")
    node.sizes["/dev/rbd1"] = 128 * MiB
    node.expand(128 * MiB)
    assert node.runner.argvs() == [["xfs_growfs", "-d", node.record.mount_path]]


def test_fuse_loop_capacity_is_refreshed_before_the_filesystem(tmp_path: Path) -> None:
    node = Node(tmp_path, FUSE, "/dev/loop4")
    backing = tmp_path / "work" / "mnt" / "img"
    backing.parent.mkdir(parents=True)
    backing.write_bytes(b"")
    os.truncate(backing, 128 * MiB)  # rbd-fuse reports the grown image
    assert node.expand(128 * MiB) == 128 * MiB
    assert node.runner.argvs() == [["losetup", "--set-capacity", "/dev/loop4"], ["resize2fs", "/dev/loop4"]]


def test_block_volume_only_grows_the_device(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd2", access=ACCESS_BLOCK)
    node.sizes["/dev/rbd2"] = 96 * MiB
    assert node.expand(96 * MiB) == 96 * MiB
    assert node.runner.argvs() == []


def test_device_that_never_grows_is_a_clear_precondition_failure(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd0")
    with pytest.raises(FailedPrecondition, match="ControllerExpandVolume must run first"):
        node.expand(128 * MiB)
    assert node.runner.argvs() == []


def test_netlink_bound_nbd_device_says_restage_instead_of_retry(tmp_path: Path) -> None:
    # rbd-nbd 16.2 does not resize a netlink-bound device (tests/vm shows it on Linux 6.1).
    node = Node(tmp_path, NBD, "/dev/nbd3")
    node.expander.netlink_bound = lambda device: device == "/dev/nbd3"
    with pytest.raises(FailedPrecondition) as caught:
        node.expand(128 * MiB)
    message = caught.value.message
    assert "netlink" in message and "staged again" in message and "retry" not in message
    assert node.runner.argvs() == []
    node.sizes["/dev/nbd3"] = 128 * MiB  # a kernel that does apply the size passes
    assert node.expand(128 * MiB) == 128 * MiB


def test_only_netlink_binds_have_a_backend_in_sysfs(tmp_path: Path) -> None:
    (tmp_path / "nbd0").mkdir()
    (tmp_path / "nbd0" / "backend").write_text("39484675-0350-42d9-84ba-676137fad925\n")
    (tmp_path / "nbd1").mkdir()
    assert nbd.netlink_bound("/dev/nbd0", str(tmp_path))
    assert not nbd.netlink_bound("/dev/nbd1", str(tmp_path))


def test_unexpected_filesystem_is_never_touched(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd0")
    node.sizes["/dev/rbd0"] = 128 * MiB
    node.fs = None  # the superblock is not ext4's
    node.runner.respond = lambda argv: (0, "TYPE=xfs\nUSAGE=filesystem\n", "") if argv[0] == "blkid" else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("cephcsi.node.devices.read_probe", lambda path: None)
        with pytest.raises(FailedPrecondition, match="holds xfs, not the ext4"):
            node.expand(128 * MiB)
    assert [a[0] for a in node.runner.argvs()] == ["blkid"]


def test_read_only_and_unmounted_stages(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd0", read_only=True)
    node.sizes["/dev/rbd0"] = 128 * MiB
    node.expand(128 * MiB)
    assert node.runner.argvs() == []
    other = Node(tmp_path / "b", KRBD, "/dev/rbd0")
    other.sizes["/dev/rbd0"] = 128 * MiB
    other.mounts = []
    with pytest.raises(FailedPrecondition, match="not mounted"):
        other.expand(128 * MiB)


def test_resize_on_stage_grows_an_image_grown_while_unstaged(tmp_path: Path) -> None:
    node = Node(tmp_path, NBD, "/dev/nbd0")
    node.sizes["/dev/nbd0"] = 256 * MiB
    node.expander.after_stage(node.record)
    assert node.runner.argvs() == [["resize2fs", "/dev/nbd0"]]


def test_an_ext4_grown_while_unstaged_is_checked_and_grown_before_the_mount(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd0")
    node.mounts = []
    node.sizes["/dev/rbd0"] = 256 * MiB
    node.expander.before_mount(node.record)
    assert node.runner.argvs() == [["e2fsck", "-f", "-p", "/dev/rbd0"], ["resize2fs", "/dev/rbd0"]]
    node.expander.before_mount(node.record)  # fills the device now: nothing more
    assert len(node.runner.argvs()) == 2


def test_before_the_mount_only_a_read_write_ext4_that_does_not_fill_its_device_is_touched(tmp_path: Path) -> None:
    for name, node in [("fills", Node(tmp_path / "a", KRBD, "/dev/rbd0")),
                       ("xfs", Node(tmp_path / "b", KRBD, "/dev/rbd0", fs_type="xfs")),
                       ("read-only", Node(tmp_path / "c", KRBD, "/dev/rbd0", read_only=True)),
                       ("block", Node(tmp_path / "d", KRBD, "/dev/rbd0", access=ACCESS_BLOCK))]:
        if name != "fills":
            node.sizes["/dev/rbd0"] = 256 * MiB
        node.expander.before_mount(node.record)
        assert node.runner.argvs() == [], name


def test_a_check_that_needs_a_person_leaves_the_filesystem_at_its_old_size(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd0")
    node.sizes["/dev/rbd0"] = 256 * MiB
    node.runner.respond = lambda argv: (4, "", "UNEXPECTED INCONSISTENCY; RUN fsck MANUALLY.") if argv[0] == "e2fsck" else None
    node.expander.before_mount(node.record)  # best effort: the stage goes on
    assert [a[0] for a in node.runner.argvs()] == ["e2fsck"], "never resized after a failed check"


def test_locating_the_volume(tmp_path: Path) -> None:
    node = Node(tmp_path, KRBD, "/dev/rbd0")
    publish = tmp_path / "pods" / "p1"
    publish.mkdir(parents=True)
    node.mounts.append(entry(str(publish), "/dev/rbd0"))
    # Without a staging path the record is found through the mount sharing the device.
    found = node.expander.locate(NodeExpandRequest(VOLUME, str(publish)))
    assert found.staging_path == node.staging
    with pytest.raises(NotFound, match="does not exist"):
        node.expander.locate(NodeExpandRequest(VOLUME, str(tmp_path / "missing"), node.staging))
    with pytest.raises(NotFound, match="not staged at"):
        node.expander.locate(NodeExpandRequest(VOLUME, str(publish), str(tmp_path)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(NotFound, match="not a path where"):
        node.expander.locate(NodeExpandRequest(VOLUME, str(elsewhere), node.staging))
    with pytest.raises(InvalidArgument, match="staged as mount"):
        node.expander.locate(NodeExpandRequest(VOLUME, str(publish), node.staging, access_type=ACCESS_BLOCK))


def test_busy_volume_is_aborted(tmp_path: Path) -> None:
    from cephcsi.node.service import NodeService

    service = NodeService.__new__(NodeService)
    service.volume_locks, service.path_locks = KeyLocks("volume"), KeyLocks("path")
    with service.volume_locks.hold(VOLUME), pytest.raises(OperationInFlight):
        service.expand(NodeExpandRequest(VOLUME, str(tmp_path)))


def test_superblock_parsers_on_real_filesystems(tmp_path: Path) -> None:
    image = tmp_path / "fs.img"
    with open(image, "wb") as handle:
        handle.truncate(64 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    ext4 = fssize.filesystem_size(str(image), "ext4")
    assert ext4 is not None and ext4.bytes == 64 * MiB and ext4.fills(64 * MiB) and not ext4.fills(65 * MiB)
    assert fssize.filesystem_size(str(image), "xfs") is None
    with open(image, "wb") as handle:
        handle.truncate(320 * MiB)
    subprocess.run(["mkfs.xfs", "-q", "-f", str(image)], check=True)
    xfs = fssize.filesystem_size(str(image), "xfs")
    assert xfs is not None and xfs.bytes == 320 * MiB and xfs.block_size == 4096
    assert fssize.parse_ext4(b"\0" * 4096) is None and fssize.parse_xfs(b"XFSB" + b"\0" * 12) is None
