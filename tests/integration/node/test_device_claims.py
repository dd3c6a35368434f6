"""devices.require_unclaimed on a real loop device (root, no Ceph): who may hold a device while
a stage formats or mounts it."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cephcsi.errors import OperationInFlight
from cephcsi.node import devices
from cephcsi.node.mounts import is_mount_point

pytestmark = pytest.mark.integration


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    """A loop device over a 64 MiB file holding an ext4."""
    backing = tmp_path / "disk.img"
    with open(backing, "wb") as handle:
        handle.truncate(64 << 20)
    device = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True, capture_output=True,
                            text=True).stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", device], check=True, stdin=subprocess.DEVNULL)
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def test_a_device_nobody_holds_passes(loop_device: str) -> None:
    devices.require_unclaimed(loop_device)
    devices.require_unclaimed(loop_device)  # the check itself leaves no claim behind


def test_a_process_claim_is_in_flight_and_names_the_process(loop_device: str) -> None:
    claim = os.open(loop_device, os.O_RDONLY | os.O_EXCL)  # as mkfs and an offline resize2fs hold it
    try:
        with pytest.raises(OperationInFlight) as caught:
            devices.require_unclaimed(loop_device)
        assert f"pid {os.getpid()} " in caught.value.message and loop_device in caught.value.message
    finally:
        os.close(claim)
    devices.require_unclaimed(loop_device)


def test_a_mount_of_the_device_is_no_obstacle(loop_device: str, tmp_path: Path) -> None:
    """Another staging of the same image (krbd maps an image once per node) mounts the device a
    second time, sharing its filesystem: that claim is a mount, not a command at work."""
    target = tmp_path / "mnt"
    target.mkdir()
    subprocess.run(["mount", loop_device, str(target)], check=True)
    try:
        devices.require_unclaimed(loop_device)
    finally:
        while is_mount_point(str(target)):
            subprocess.run(["umount", str(target)], check=True)
