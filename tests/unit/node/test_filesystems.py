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
    u = "0b5c1a9e-7d1e-4a39-9a1b-2f1c7a1c0001"
    assert mkfs_argv("ext4", "/dev/x", "", u) == [
        "mkfs.ext4", "-m0", "-Enodiscard,lazy_itable_init=1,lazy_journal_init=1", "-U", u, "/dev/x"
    ]
    assert mkfs_argv("xfs", "/dev/x", "", u) == ["mkfs.xfs", "-K", "-m", f"uuid={u}", "/dev/x"]
    # User options replace the defaults; the UUID option is still added.
    assert mkfs_argv("ext4", "/dev/x", "-m1 -L 'my label'", u) == ["mkfs.ext4", "-m1", "-L", "my label", "-U", u, "/dev/x"]
    assert mkfs_argv("xfs", "/dev/x", "-m crc=1,finobt=1", u) == ["mkfs.xfs", "-m", "crc=1,finobt=1", "-m", f"uuid={u}", "/dev/x"]
    # A value that looks like a flag is a value: a label "-F" is no force.
    assert mkfs_argv("ext4", "/dev/x", "-L -F", u)[1:3] == ["-L", "-F"]
    with pytest.raises(InvalidArgument, match="cannot be parsed"):
        mkfs_argv("ext4", "/dev/x", "'unterminated", u)
    with pytest.raises(InvalidArgument, match="btrfs"):
        mkfs_argv("btrfs", "/dev/x", "", u)


@pytest.mark.parametrize(
    ("fs_type", "options"),
    [("ext4", "-F"), ("ext4", "-m0 -F"), ("ext4", "-qF"), ("ext4", "-FF"), ("xfs", "-f"), ("xfs", "-K -f"), ("xfs", "-Kf")],
)
def test_mkfs_options_may_not_force(fs_type: str, options: str) -> None:
    with pytest.raises(InvalidArgument, match="never forces mkfs"):
        mkfs_argv(fs_type, "/dev/x", options, "u")


@pytest.mark.parametrize(
    ("fs_type", "options"),
    [("ext4", "-U 1-2-3"), ("ext4", "-Urandom"), ("ext4", "-q -U clear"), ("xfs", "-m uuid=1-2"), ("xfs", "-m crc=1,uuid=1-2")],
)
def test_mkfs_options_may_not_set_the_uuid(fs_type: str, options: str) -> None:
    with pytest.raises(InvalidArgument, match="must not set the filesystem UUID"):
        mkfs_argv(fs_type, "/dev/x", options, "u")


@pytest.mark.parametrize("options", ["/dev/sdb", "-m0 /dev/sdb", "-m0 -- /dev/sdb", "--force", "-L"])
def test_mkfs_options_hold_only_options(options: str) -> None:
    # A stray word would be taken for the device (or a size) by mke2fs.
    with pytest.raises(InvalidArgument, match="mkfsOptions"):
        mkfs_argv("ext4", "/dev/x", options, "u")


@pytest.mark.parametrize("fs_type", ["ext4", "xfs"])
def test_formats_only_an_empty_device_with_the_recorded_uuid(device: str, fs_type: str) -> None:
    runner = _blkid(2)
    started: list[str] = []
    assert ensure_filesystem(runner, device, fs_type, "", 10, on_mkfs_start=started.append)
    assert len(started) == 1
    argv = runner.argvs()[-1]
    assert argv[0] == f"mkfs.{fs_type}" and argv[-1] == device
    # The UUID mkfs gets is the one recorded before it ran.
    uuid_arg = ["-U", started[0]] if fs_type == "ext4" else ["-m", f"uuid={started[0]}"]
    assert argv[-3:-1] == uuid_arg
    assert "-F" not in argv and "-f" not in argv


def test_options_are_refused_before_anything_is_recorded(device: str) -> None:
    runner = _blkid(2)
    started: list[str] = []
    with pytest.raises(InvalidArgument):
        ensure_filesystem(runner, device, "ext4", "-F", 10, on_mkfs_start=started.append)
    assert started == [] and [a[0] for a in runner.argvs()] == ["blkid"]


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


@pytest.mark.parametrize(
    "interrupted_uuid",
    ["8d2c7b0e-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002", ""],
    ids=["ours", "another-nodes", "old-record-without-uuid"],
)
@pytest.mark.parametrize("fs_type", ["ext4", "xfs"])
def test_resumed_stage_after_interrupted_mkfs_keeps_the_filesystem(
    device: str, fs_type: str, interrupted_uuid: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The data-loss scenario of issue 11: our mkfs finished but the stage record still says
    "mkfs started"; another node has used the filesystem since. The resumed stage must keep it,
    whoever's UUID it carries — never mkfs, never a force flag."""
    runner = _blkid(0, f"UUID=8d2c7b0e-0000-4000-8000-000000000001\nTYPE={fs_type}\nUSAGE=filesystem\n")
    started: list[str] = []
    with caplog.at_level("WARNING"):
        created = ensure_filesystem(
            runner, device, fs_type, "", 10, on_mkfs_start=started.append, interrupted_uuid=interrupted_uuid
        )
    assert not created and started == []
    assert [a[0] for a in runner.argvs()] == ["blkid"]
    origin = str(getattr(caplog.records[-1], "fields", {}).get("origin", ""))
    expected = {"8d2c7b0e-0000-4000-8000-000000000001": "ours", "": "unknown"}.get(interrupted_uuid, "not ours")
    assert origin.startswith(expected)


@pytest.mark.parametrize(
    "blkid",
    [(0, "TYPE=ext4\nUSAGE=filesystem\n"), (0, "PTTYPE=gpt\n"), (8, ""), (0, "TYPE=jbd\nUSAGE=other\n")],
    ids=["other-fs", "partition-table", "ambivalent", "partial"],
)
def test_resumed_stage_refuses_anything_else_untouched(device: str, blkid: tuple[int, str]) -> None:
    runner = _blkid(*blkid)
    with pytest.raises(FailedPrecondition, match="refusing to format it.*interrupted.*wipefs") as caught:
        ensure_filesystem(runner, device, "xfs", "", 10, interrupted_uuid="u", volume="vol-1")
    assert "volume vol-1" in caught.value.message
    assert [a[0] for a in runner.argvs()] == ["blkid"]


def test_probe_reports_the_uuid(device: str) -> None:
    assert probe(_blkid(0, "UUID=abc\nTYPE=ext4\nUSAGE=filesystem\n"), device, 10).uuid == "abc"


def test_mount_options() -> None:
    assert mount_options("ext4", [], False) == ["_netdev"]
    # Read-only mounts never replay a journal (ReadOnlyMany: many nodes read one image).
    assert mount_options("xfs", ["noatime", "_netdev"], True) == ["_netdev", "nouuid", "noatime", "ro", "norecovery"]
    assert mount_options("ext4", [], True) == ["_netdev", "ro", "noload"]
