"""The Mounter's bind and unmount through mount(2)/umount2(2), on real mounts (tmpfs, root):
the same results mount(8) gives, read back from /proc/self/mountinfo."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cephcsi.errors import FailedPrecondition
from cephcsi.node import mount_syscalls
from cephcsi.node.exec import run
from cephcsi.node.mounts import Mounter, is_mount_point, read_mounts, top_mount

pytestmark = pytest.mark.integration


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs mounted nosuid,nodev (as a staging mount may be), with one file."""
    path = tmp_path / "src"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nosuid,nodev,size=1m", "tmpfs", str(path)], check=True)
    (path / "file").write_text("data")
    yield path
    while is_mount_point(str(path)):
        subprocess.run(["umount", str(path)], check=True)


def options(path: Path) -> tuple[str, ...]:
    entry = top_mount(str(path), read_mounts())
    assert entry is not None, f"{path} is not mounted"
    return entry.options


def test_read_only_bind_keeps_nosuid_and_nodev(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    mounter = Mounter(run, 10)
    mounter.bind(str(source), str(target), read_only=True)
    try:
        assert {"ro", "nosuid", "nodev"} <= set(options(target))
        assert (target / "file").read_text() == "data"
        with pytest.raises(OSError):
            (target / "new").write_text("x")
        assert "rw" in options(source), "the source stays writable"
    finally:
        mounter.unmount(str(target))
    assert not is_mount_point(str(target))


def test_bind_with_flags_and_with_options_only_mount8_knows(source: Path, tmp_path: Path) -> None:
    mounter = Mounter(run, 10)
    flagged, other = tmp_path / "flagged", tmp_path / "other"
    flagged.mkdir()
    other.mkdir()
    mounter.bind(str(source), str(flagged), options=["noexec"])
    # "lazytime" is no per-mount flag: the mount(8) path takes it (and the kernel ignores it on a bind).
    assert not mount_syscalls.supported(["lazytime"])
    mounter.bind(str(source), str(other), options=["lazytime"])
    try:
        assert {"rw", "noexec", "nosuid", "nodev"} <= set(options(flagged))
        assert "rw" in options(other)
    finally:
        mounter.unmount(str(flagged))
        mounter.unmount(str(other))


def test_unmount_is_idempotent_and_busy_is_failed_precondition(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    mounter = Mounter(run, 10)
    mounter.bind(str(source), str(target))
    mounter.bind(str(source), str(target))  # stacked, as a crashed earlier attempt leaves it
    holder = os.open(str(target), os.O_RDONLY)
    os.chdir(str(target))
    try:
        with pytest.raises(FailedPrecondition, match="busy"):
            mounter.unmount(str(target))
    finally:
        os.chdir("/")
        os.close(holder)
    mounter.unmount(str(target))
    assert not is_mount_point(str(target))
    mounter.unmount(str(target))  # nothing mounted: fine
    assert mount_syscalls.unmount(str(target)) is False
    assert mount_syscalls.unmount(str(tmp_path / "missing")) is False
