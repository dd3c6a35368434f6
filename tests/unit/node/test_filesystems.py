from __future__ import annotations

import os

import pytest

from cephcsi.errors import FailedPrecondition, Internal, InvalidArgument
from cephcsi.node.filesystems import ensure_filesystem, mkfs_argv, mount_options, probe
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit


@pytest.fixture
def device(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(tmp_path, "dev")
    with open(path, "wb") as handle:
        handle.truncate(1 << 20)
    return path


def _blkid(rc: int, stdout: str = "", stderr: str = "") -> FakeRunner:
    def respond(argv: list[str]) -> tuple[int, str, str] | None:
        if argv[0] == "blkid":
            return rc, stdout, stderr
        return None

    return FakeRunner(respond)


def test_probe_empty(device: str) -> None:
    runner = _blkid(2)
    assert probe(runner, device, 10).empty
    assert runner.calls[0].argv == ["blkid", "-p", "-o", "export", device]


def test_probe_filesystem(device: str) -> None:
    found = probe(_blkid(0, f"DEVNAME={device}\nUUID=x\nTYPE=xfs\nUSAGE=filesystem\n"), device, 10)
    assert (found.fs_type, found.other) == ("xfs", "")


def test_probe_partition_table_and_ambivalent(device: str) -> None:
    assert "gpt partition table" in probe(_blkid(0, "PTUUID=x\nPTTYPE=gpt\n"), device, 10).other
    assert "conflicting" in probe(_blkid(8), device, 10).other
    assert "raid" in probe(_blkid(0, "TYPE=linux_raid_member\nUSAGE=raid\n"), device, 10).other


def test_probe_unreadable_device_is_not_empty(tmp_path: os.PathLike[str]) -> None:
    # blkid says "nothing" (exit 2) for a missing device too; we must not take that as empty.
    with pytest.raises(Internal, match="cannot open device"):
        probe(_blkid(2), os.path.join(tmp_path, "missing"), 10)


def test_mkfs_defaults_and_overrides() -> None:
    assert mkfs_argv("ext4", "/dev/x", "") == ["mkfs.ext4", "-m0", "-Enodiscard,lazy_itable_init=1,lazy_journal_init=1", "/dev/x"]
    assert mkfs_argv("xfs", "/dev/x", "") == ["mkfs.xfs", "-K", "/dev/x"]
    assert mkfs_argv("ext4", "/dev/x", "-m1 -L 'my label'") == ["mkfs.ext4", "-m1", "-L", "my label", "/dev/x"]
    with pytest.raises(InvalidArgument, match="cannot be parsed"):
        mkfs_argv("ext4", "/dev/x", "'unterminated")
    with pytest.raises(InvalidArgument, match="btrfs"):
        mkfs_argv("btrfs", "/dev/x", "")


def test_formats_only_an_empty_device(device: str) -> None:
    runner = _blkid(2)
    started: list[bool] = []
    assert ensure_filesystem(runner, device, "ext4", "", 10, on_mkfs_start=lambda: started.append(True))
    assert started == [True]
    assert runner.argvs()[-1][0] == "mkfs.ext4"


def test_existing_same_filesystem_is_kept(device: str) -> None:
    runner = _blkid(0, "TYPE=ext4\nUSAGE=filesystem\n")
    assert not ensure_filesystem(runner, device, "ext4", "", 10)
    assert [a[0] for a in runner.argvs()] == ["blkid"]


def test_never_reformats_another_filesystem(device: str) -> None:
    runner = _blkid(0, "TYPE=xfs\nUSAGE=filesystem\n")
    with pytest.raises(FailedPrecondition, match="already holds a xfs filesystem, not the requested ext4"):
        ensure_filesystem(runner, device, "ext4", "", 10)
    assert [a[0] for a in runner.argvs()] == ["blkid"]


def test_never_formats_over_a_partition_table(device: str) -> None:
    runner = _blkid(0, "PTTYPE=dos\n")
    with pytest.raises(FailedPrecondition, match="dos partition table"):
        ensure_filesystem(runner, device, "xfs", "", 10)


def test_resumed_mkfs_forces_over_its_own_partial_signature(device: str) -> None:
    runner = _blkid(0, "TYPE=xfs\nUSAGE=filesystem\n")
    assert ensure_filesystem(runner, device, "xfs", "", 10, resume_mkfs=True)
    assert runner.argvs()[-1] == ["mkfs.xfs", "-f", "-K", device]
    # ...but not over a different filesystem type.
    with pytest.raises(FailedPrecondition):
        ensure_filesystem(_blkid(0, "TYPE=ext4\nUSAGE=filesystem\n"), device, "xfs", "", 10, resume_mkfs=True)


def test_mount_options() -> None:
    assert mount_options("ext4", [], False) == ["_netdev"]
    assert mount_options("xfs", ["noatime", "_netdev"], True) == ["_netdev", "nouuid", "noatime", "ro"]
