"""The node trim's decisions (what is trimmed, never a path that is not the volume's mount) and
fstrim's output, with a fake runner; the real fstrim runs in tests/integration/node and tests/vm."""
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


def mount(point: str, options: tuple[str, ...] = ("rw",)) -> mounts.MountEntry:
    return mounts.MountEntry(mount_id=40, parent_id=1, major=252, minor=0, root="/", mount_point=point,
                             options=options, fs_type="ext4", source="/dev/rbd0", super_options=("rw",))


def test_fstrim_runs_on_the_staging_mount_and_counts_its_bytes() -> None:
    runner = FakeRunner(lambda argv: (0, f"{STAGING}/fs: 512 MiB (536870912 bytes) trimmed\n", ""))
    done = reclaim.trim(record(), runner, 30.0, [mount(f"{STAGING}/fs")])
    assert [call.argv for call in runner.calls] == [["fstrim", "-v", f"{STAGING}/fs"]]
    assert (done.outcome, done.trimmed_bytes) == (reclaim.TRIMMED, 536870912)


@pytest.mark.parametrize(("changes", "table", "reason"), [
    ({"access_type": stage_record.ACCESS_BLOCK}, [mount(f"{STAGING}/block")], "Block volume"),
    ({"read_only": True}, [mount(f"{STAGING}/fs")], "read-only"),
    ({"staged": False}, [mount(f"{STAGING}/fs")], "not completely staged"),
    ({"crypt_name": "luks-rbd-vol-1", "encryption": "block"}, [mount(f"{STAGING}/fs")], "LUKS-encrypted"),
    ({}, [], "is not mounted"),
    ({}, [mount("/var/lib/kubelet")], "is not mounted"),  # fstrim would trim the kubelet disk
    ({}, [mount(f"{STAGING}/fs", ("ro",))], "mounted read-only"),
])
def test_nothing_runs_where_a_trim_is_wrong(changes: dict[str, object], table: list[mounts.MountEntry],
                                            reason: str) -> None:
    runner = FakeRunner()
    done = reclaim.trim(record(**changes), runner, 30.0, table)
    assert runner.calls == [] and done.outcome == reclaim.SKIPPED and reason in done.reason


@pytest.mark.parametrize(("stdout", "expected"), [
    ("/mnt: 1.5 GiB (1610612736 bytes) trimmed\n", 1610612736),
    ("/mnt: 0 B (0 bytes) trimmed\n", 0),
    ("", 0),
])
def test_fstrim_output(stdout: str, expected: int) -> None:
    assert reclaim.trimmed_bytes(stdout) == expected
