"""Online expansion on a real kernel: the image is grown from the host (as ControllerExpandVolume
does), then NodeExpandVolume makes the mapped device and the mounted filesystem follow, data
intact. krbd and rbd-nbd (mapped the default way) grow online; an rbd-nbd device mapped through
the kernel's netlink interface cannot, and the answer says so and that a restage brings the
new size — which the test then checks."""
from __future__ import annotations

import grpc
import pytest

from tests.integration.node.conftest import expect_code
from tests.vm.conftest import MiB, VmEnv, VmVolume, mount_cap
from tests.vm.guestio import device_bytes, fs_bytes, read_payload, stage_record, write_payload

# 900 s: the first test also waits for the VM to boot under TCG (up to ~8 minutes on a loaded host).
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]

# xfs needs 300 MB at mkfs; ext4 is kept small (mkfs and resize2fs cost time under TCG).
SIZES = {"ext4": (64, 192), "xfs": (320, 512)}


@pytest.mark.parametrize("fs_type, mounter", [
    ("ext4", "krbd"), ("ext4", "rbd-nbd"), ("xfs", "krbd"),
    pytest.param("xfs", "rbd-nbd", marks=pytest.mark.long),  # xfs growth is the krbd case's; rbd-nbd growth the ext4 case's
])
def test_mounted_filesystem_grows_online(vm_env: VmEnv, make_volume, mounter: str, fs_type: str) -> None:  # type: ignore[no-untyped-def]
    size_mb, grown_mb = SIZES[fs_type]
    volume: VmVolume = make_volume(size_mb, mounter=mounter)
    cap = mount_cap(fs_type)
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    digest = write_payload(vm_env.vm, target, block=False)
    before = fs_bytes(vm_env.vm, target)
    device = str(stage_record(vm_env.vm, staging)["device"])

    volume.grow(grown_mb)
    assert volume.expand(target, grown_mb, staging) == grown_mb * MiB
    assert device_bytes(vm_env.vm, device) == grown_mb * MiB
    after = fs_bytes(vm_env.vm, target)
    assert after > before + (grown_mb - size_mb - 32) * MiB, (before, after)
    assert volume.expand(target, grown_mb) == grown_mb * MiB  # again, found through the mounts: no change
    assert fs_bytes(vm_env.vm, target) == after
    assert read_payload(vm_env.vm, target, block=False) == digest
    # Writable beyond the old end.
    vm_env.vm.check(f"head -c {(grown_mb - size_mb) // 2}M /dev/zero >{target}/fill && sync {target}/fill", timeout=120)

    volume.unpublish(target)
    volume.unstage(staging)
    assert vm_env.mapped("krbd" if mounter == "krbd" else "nbd") == ""


def test_netlink_mapped_rbd_nbd_says_restage_and_restage_grows(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64, mounter="rbd-nbd", mapOptions="nbd:try-netlink")
    cap = mount_cap("ext4")
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    device = str(stage_record(vm_env.vm, staging)["device"])
    name = device.rsplit("/", 1)[-1]
    assert vm_env.vm.run(f"test -e /sys/block/{name}/backend").ok, "try-netlink did not bind through netlink"
    digest = write_payload(vm_env.vm, target, block=False)

    volume.grow(192)
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.expand, target, 192, staging)
    assert "netlink" in message and "staged again" in message and "retry" not in message, message
    # The kernel's view, which the message is about: the device kept its size.
    assert device_bytes(vm_env.vm, device) == 64 * MiB

    # Restaged (what the message asks for): mapped anew at the new size, filesystem grown at stage.
    volume.unpublish(target)
    volume.unstage(staging)
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    assert fs_bytes(vm_env.vm, target) > 160 * MiB
    assert read_payload(vm_env.vm, target, block=False) == digest
    volume.unpublish(target)
    volume.unstage(staging)
    assert vm_env.mapped("nbd") == ""
