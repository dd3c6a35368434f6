"""fuse mapper: the loop device of a stage is released even when its backing file no longer
reads as a path under the work dir (node plugin restarted without a drain: the rbd-fuse mount
belonged to the dead container's mount namespace and the kernel shows `/<image>`)."""
from __future__ import annotations

import os

import pytest

from cephcsi.errors import FailedPrecondition
from cephcsi.node.mappers import fuse
from cephcsi.node.mappers import loops
from cephcsi.node.mappers.fuse import FuseMapper
from cephcsi.node.mappers.loops import loop_status
from cephcsi.node.mounts import Mounter
from cephcsi.node.stage_record import LoopBacking, StageRecord
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit


class FakeKernel:
    """Loop devices as sysfs and LOOP_GET_STATUS64 would show them. `status` None for an
    attached loop is what the ioctl gives when the backing FUSE mount is dead (ENOTCONN)."""

    def __init__(self, sys_block: str) -> None:
        self.sys_block = sys_block
        self.status: dict[str, LoopBacking | None] = {}

    def attach(self, device: str, backing_file: str, diskseq: int, status: LoopBacking | None = None) -> None:
        directory = os.path.join(self.sys_block, os.path.basename(device))
        os.makedirs(os.path.join(directory, "loop"), exist_ok=True)
        with open(os.path.join(directory, "loop", "backing_file"), "w") as handle:
            handle.write(backing_file + "\n")
        if diskseq:
            with open(os.path.join(directory, "diskseq"), "w") as handle:
                handle.write(f"{diskseq}\n")
        self.status[device] = status

    def detach(self, device: str) -> None:
        os.unlink(os.path.join(self.sys_block, os.path.basename(device), "loop", "backing_file"))
        del self.status[device]

    def respond(self, argv: list[str]) -> tuple[int, str, str] | None:
        if argv[:2] == ["losetup", "--detach"]:
            if argv[2] not in self.status:
                return 1, "", f"losetup: {argv[2]}: detach failed: No such device or address"
            self.detach(argv[2])
        return None


@pytest.fixture
def kernel(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    fake = FakeKernel(os.path.join(tmp_path, "sys-block"))
    os.makedirs(fake.sys_block)
    monkeypatch.setattr(loops, "SYS_BLOCK", fake.sys_block)
    monkeypatch.setattr(loops, "loop_status", lambda device: fake.status.get(device))
    return fake


def _setup(tmp_path: os.PathLike[str], kernel: FakeKernel, diskseq: int = 41) -> tuple[FuseMapper, FakeRunner, StageRecord]:
    runner = FakeRunner(kernel.respond)
    mapper = FuseMapper(runner, 10, os.path.join(tmp_path, "state"), 5, lambda d, t: None, 5, Mounter(runner, 10))
    staging = os.path.join(tmp_path, "staging")
    work_dir = mapper.work_dir_for("vol-1", staging)
    os.makedirs(os.path.join(work_dir, fuse.MOUNT_DIR))
    record = StageRecord(
        volume_id="vol-1", staging_path=staging, cluster_id="c", pool="rbd", image="csi-vol-1", namespace="",
        mapper="fuse", access_type="mount", fs_type="ext4", work_dir=work_dir, device="/dev/loop7",
        loop=LoopBacking("/dev/loop7", diskseq, fuse.backing_file(work_dir, "csi-vol-1")[:63], 0, 61, 2),
    )
    return mapper, runner, record


def _detached(runner: FakeRunner) -> list[str]:
    return [a[2] for a in runner.argvs() if a[:2] == ["losetup", "--detach"]]


def test_unmap_detaches_the_recorded_loop_of_a_dead_mount_namespace(tmp_path: os.PathLike[str], kernel: FakeKernel) -> None:
    mapper, runner, record = _setup(tmp_path, kernel)
    kernel.attach("/dev/loop7", "/csi-vol-1", diskseq=41)  # dead FUSE mount: the ioctl fails
    mapper.unmap(record)
    assert _detached(runner) == ["/dev/loop7"]
    assert kernel.status == {}
    assert not os.path.exists(record.work_dir)


@pytest.mark.parametrize(
    ("backing", "diskseq"), [("/csi-vol-1", 44), ("/csi-vol-2", 41)], ids=["reattached-since", "other-image"]
)
def test_unmap_leaves_a_loop_that_is_no_longer_ours_alone(
    tmp_path: os.PathLike[str], kernel: FakeKernel, backing: str, diskseq: int
) -> None:
    mapper, runner, record = _setup(tmp_path, kernel)
    kernel.attach("/dev/loop7", backing, diskseq=diskseq)
    mapper.unmap(record)
    assert _detached(runner) == []
    assert "/dev/loop7" in kernel.status


def test_unmap_with_the_loop_already_gone_is_a_no_op(tmp_path: os.PathLike[str], kernel: FakeKernel) -> None:
    mapper, runner, record = _setup(tmp_path, kernel)
    mapper.unmap(record)
    mapper.unmap(record)
    assert _detached(runner) == []


def test_unmap_by_path_still_works_and_detaches_once(tmp_path: os.PathLike[str], kernel: FakeKernel) -> None:
    mapper, runner, record = _setup(tmp_path, kernel)
    kernel.attach("/dev/loop7", fuse.backing_file(record.work_dir, "csi-vol-1"), diskseq=41, status=record.loop)
    mapper.unmap(record)
    assert _detached(runner) == ["/dev/loop7"]


def test_without_diskseq_the_ioctl_identity_decides(tmp_path: os.PathLike[str], kernel: FakeKernel) -> None:
    mapper, runner, record = _setup(tmp_path, kernel, diskseq=0)
    assert record.loop is not None
    # Backing file unreachable and no diskseq: cannot verify, so it is left attached.
    kernel.attach("/dev/loop7", "/csi-vol-1", diskseq=0, status=None)
    mapper.unmap_recorded_loop(record)
    assert _detached(runner) == []
    # Same file name and backing numbers: ours.
    kernel.status["/dev/loop7"] = record.loop
    mapper.unmap_recorded_loop(record)
    assert _detached(runner) == ["/dev/loop7"]


def test_loop_status_of_something_that_is_no_loop(tmp_path: os.PathLike[str]) -> None:
    assert loop_status(os.path.join(tmp_path, "missing")) is None
    path = os.path.join(tmp_path, "file")
    open(path, "w").close()
    assert loop_status(path) is None  # ENOTTY from a regular file: not an attached loop


def test_wait_for_exit_returns_at_the_exit_not_at_a_poll_interval() -> None:
    import subprocess
    import threading

    from cephcsi.node.mappers.fuse import wait_for_exit

    child = subprocess.Popen(["sleep", "60"])
    try:
        stopper = threading.Timer(0.05, child.terminate)
        stopper.start()
        wait_for_exit([child.pid], timeout=60)
        # The pidfd turns readable when the process exits (still a zombie here: not reaped).
        assert child.poll() is not None
    finally:
        child.kill()
        child.wait()


def test_wait_for_exit_gives_up_at_its_timeout_and_skips_gone_pids() -> None:
    import subprocess

    from cephcsi.node.mappers.fuse import wait_for_exit

    gone = subprocess.Popen(["true"])
    gone.wait()
    child = subprocess.Popen(["sleep", "60"])
    try:
        wait_for_exit([gone.pid, child.pid], timeout=0.05)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


class BusyMounter(Mounter):
    """Unmounts that read busy `busy_for` times, then succeed."""

    def __init__(self, busy_for: int) -> None:
        super().__init__(FakeRunner(lambda argv: None), 10)
        self.busy_for = busy_for
        self.calls = 0

    def unmount(self, target: str) -> None:
        self.calls += 1
        if self.calls <= self.busy_for:
            raise FailedPrecondition(f"cannot unmount {target}: it is busy")


def test_a_briefly_busy_rbd_fuse_mount_is_unmounted(tmp_path: os.PathLike[str]) -> None:
    """A detached loop device's backing file is let go of a moment after sysfs stops showing it."""
    mounter = BusyMounter(busy_for=3)
    mapper = FuseMapper(FakeRunner(lambda argv: None), 10, os.path.join(tmp_path, "state"), 5, lambda d, t: None, 5, mounter)
    mapper._unmount_fuse(os.path.join(tmp_path, "mnt"))
    assert mounter.calls == 4


def test_a_mount_that_stays_busy_is_refused(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuse, "_BUSY_WAIT", 0.1)
    mounter = BusyMounter(busy_for=10_000)
    mapper = FuseMapper(FakeRunner(lambda argv: None), 10, os.path.join(tmp_path, "state"), 5, lambda d, t: None, 5, mounter)
    with pytest.raises(FailedPrecondition, match="busy"):
        mapper._unmount_fuse(os.path.join(tmp_path, "mnt"))
    assert 2 <= mounter.calls < 100
