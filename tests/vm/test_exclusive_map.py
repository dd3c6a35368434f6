"""One writer per single-node volume (cephcsi.node.mappers.exclusive), on a real kernel: while the
node has a volume staged read-write, another Ceph client's write to the image fails loudly (EROFS)
instead of interleaving with the node's; unstage releases the lock. Read-only stages take no lock.
And why krbd is not exclusive by default: such a mapping refuses `rbd resize` (online expansion)."""
from __future__ import annotations

import subprocess

import pytest

from tests.vm.conftest import VmEnv, VmVolume, block_cap
from tests.vm.guestio import stage_record
from cephcsi._generated import csi_pb2

pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]

Cap = csi_pb2.VolumeCapability
EXCLUSIVE_LOCK = "layering,exclusive-lock"


def _second_writer(env: VmEnv, image: str) -> subprocess.CompletedProcess[str]:
    """Another client (the host, librbd as client.admin) writes 64 KiB to the image."""
    argv = env.cluster.cli("rbd", "bench", "--io-type", "write", "--io-size", "4K", "--io-total", "64K",
                           f"{env.cluster.pool}/{image}")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _refused(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode != 0 and "Read-only file system" in result.stdout + result.stderr


@pytest.mark.parametrize("mounter, map_options", [("rbd-nbd", ""), ("krbd", "krbd:exclusive")])
def test_second_writer_fails_while_staged_read_write(vm_env: VmEnv, make_volume, mounter: str,  # type: ignore[no-untyped-def]
                                                     map_options: str) -> None:
    context = {"mapOptions": map_options} if map_options else {}
    volume: VmVolume = make_volume(64, mounter=mounter, features=EXCLUSIVE_LOCK, **context)
    staging = vm_env.staging()
    volume.stage(staging, block_cap())
    device = str(stage_record(vm_env.vm, staging)["device"])
    vm_env.vm.check(f"dd if=/dev/urandom of={device} bs=64k count=4 oflag=direct status=none", timeout=60)
    result = _second_writer(vm_env, volume.image)
    assert _refused(result), f"a second writer was not refused: rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    # The node's own I/O is unaffected.
    vm_env.vm.check(f"dd if=/dev/urandom of={device} bs=64k count=4 oflag=direct status=none", timeout=60)
    if mounter == "rbd-nbd":
        # librbd serves the controller's requests through its lock: the volume still grows.
        volume.grow(96)
    volume.unstage(staging)
    assert vm_env.mapped("nbd" if mounter == "rbd-nbd" else "krbd") == ""
    result = _second_writer(vm_env, volume.image)
    assert result.returncode == 0, f"the lock outlived the unstage:\n{result.stdout}\n{result.stderr}"


def test_no_lock_for_read_only_stage_nor_by_default_on_krbd(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64, mounter="rbd-nbd", features=EXCLUSIVE_LOCK)
    reader = Cap(block=Cap.BlockVolume(), access_mode=Cap.AccessMode(mode=Cap.AccessMode.MULTI_NODE_READER_ONLY))
    staging = vm_env.staging()
    volume.stage(staging, reader)
    assert _second_writer(vm_env, volume.image).returncode == 0
    volume.unstage(staging)

    # krbd read-write without mapOptions: no `exclusive`, so the controller can still resize it.
    krbd: VmVolume = make_volume(64, mounter="krbd", features=EXCLUSIVE_LOCK)
    staging = vm_env.staging()
    krbd.stage(staging, block_cap())
    krbd.grow(96)
    krbd.unstage(staging)
    assert vm_env.mapped("krbd") == "" and vm_env.mapped("nbd") == ""
