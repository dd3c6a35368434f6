"""The node trim's decisions (what is trimmed, never a path that is not the volume's mount, nor a
mount of another device, nor a filesystem the kernel made read-only) and fstrim's output, with a
fake runner and device numbers; the real fstrim runs in tests/integration/node and tests/vm."""
from __future__ import annotations

import dataclasses

import pytest

from cephcsi.node import mounts, reclaim, stage_record
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

STAGING = "/var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/abc/globalmount"


def record(**changes: object) -> stage_record.StageRecord:
    base = stage_record.StageRecord(volume_id="vol-1", staging_path=STAGING, cluster_id="c", pool="p", image="i",
                                    namespace="", mapper="krbd", access_type=stage_record.ACCESS_MOUNT,
                                    fs_type="ext4", device="/dev/rbd0", staged=True)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def mount(point: str, options: tuple[str, ...] = ("rw",), super_options: tuple[str, ...] = ("rw",),
          minor: int = 0) -> mounts.MountEntry:
    return mounts.MountEntry(mount_id=40, parent_id=1, major=252, minor=minor, root="/", mount_point=point,
                             options=options, fs_type="ext4", source=f"/dev/rbd{minor}", super_options=super_options)


def rbd0(device: str) -> tuple[int, int]:
    """The recorded device's numbers, as os.stat would give them for /dev/rbd0."""
    assert device == "/dev/rbd0"
    return (252, 0)


def test_fstrim_runs_on_the_staging_mount_and_counts_its_bytes() -> None:
    runner = FakeRunner(lambda argv: (0, f"{STAGING}/fs: 512 MiB (536870912 bytes) trimmed\n", ""))
    done = reclaim.trim(record(), runner, 30.0, [mount(f"{STAGING}/fs")], rbd0)
    assert [call.argv for call in runner.calls] == [["fstrim", "-v", f"{STAGING}/fs"]]
    assert (done.outcome, done.trimmed_bytes) == (reclaim.TRIMMED, 536870912)
    assert runner.calls[0].timeout == 30.0


def test_fstrim_has_its_own_longer_timeout() -> None:
    runner = FakeRunner()
    reclaim.trim(record(), runner, table=[mount(f"{STAGING}/fs")], device_numbers=rbd0)
    assert runner.calls[0].timeout == reclaim.TRIM_TIMEOUT >= 600


@pytest.mark.parametrize(("changes", "table", "reason"), [
    ({"access_type": stage_record.ACCESS_BLOCK}, [mount(f"{STAGING}/block")], "Block volume"),
    ({"read_only": True}, [mount(f"{STAGING}/fs")], "read-only"),
    ({"staged": False}, [mount(f"{STAGING}/fs")], "not completely staged"),
    ({"crypt_name": "luks-rbd-vol-1", "encryption": "block"}, [mount(f"{STAGING}/fs")], "LUKS-encrypted"),
    ({}, [], "is not mounted"),
    ({}, [mount("/var/lib/kubelet")], "is not mounted"),  # fstrim would trim the kubelet disk
    ({}, [mount(f"{STAGING}/fs", ("ro",))], "mounted read-only"),
    # ext4 after errors=remount-ro: the mount still says rw, its superblock ro (fails without the check)
    ({}, [mount(f"{STAGING}/fs", ("rw",), ("ro", "errors=remount-ro"))], "errors=remount-ro"),
    # something else mounted at the staging path: fstrim would trim that device's filesystem
    ({}, [mount(f"{STAGING}/fs", minor=16)], "not the volume's /dev/rbd0 (252:0)"),
    ({"device": ""}, [mount(f"{STAGING}/fs")], "names no device"),
])
def test_nothing_runs_where_a_trim_is_wrong(changes: dict[str, object], table: list[mounts.MountEntry],
                                            reason: str) -> None:
    runner = FakeRunner()
    done = reclaim.trim(record(**changes), runner, 30.0, table, rbd0)
    assert runner.calls == [] and done.outcome == reclaim.SKIPPED and reason in done.reason


def test_a_device_that_is_gone_is_not_trimmed() -> None:
    def gone(device: str) -> tuple[int, int]:
        raise FileNotFoundError(2, "No such file or directory", device)

    runner = FakeRunner()
    done = reclaim.trim(record(), runner, 30.0, [mount(f"{STAGING}/fs")], gone)
    assert runner.calls == [] and done.outcome == reclaim.SKIPPED and "/dev/rbd0 is gone" in done.reason


def test_a_mount_of_another_device_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger=reclaim.__name__):
        reclaim.trim(record(), FakeRunner(), 30.0, [mount(f"{STAGING}/fs", minor=16)], rbd0)
    assert [r.getMessage() for r in caplog.records] == ["staging mount is not the volume's device; not trimmed"]


@pytest.mark.parametrize(("stdout", "expected"), [
    ("/mnt: 1.5 GiB (1610612736 bytes) trimmed\n", 1610612736),
    ("/mnt: 0 B (0 bytes) trimmed\n", 0),
    ("", 0),
])
def test_fstrim_output(stdout: str, expected: int) -> None:
    assert reclaim.trimmed_bytes(stdout) == expected
