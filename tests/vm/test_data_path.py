"""krbd and rbd-nbd on a real kernel: NodeStage/Publish/Unpublish/Unstage through the node
plugin running in the VM, data written before an unstage read back after a restage, and no
mapping left behind (`rbd device list`)."""
from __future__ import annotations

import pytest

from tests.vm.conftest import VmEnv, VmVolume, block_cap, mount_cap
from tests.vm.guestio import kubelet_mounts, read_payload, stage_record, write_payload

# 900 s: the first test also waits for the VM to boot under TCG (up to ~8 minutes on a loaded host).
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]


def round_trip(env: VmEnv, volume: VmVolume, access: str, mapper: str, device_prefix: str) -> None:
    block = access == "block"
    cap = block_cap() if block else mount_cap(access)
    device_type = "krbd" if mapper == "krbd" else "nbd"

    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    record = stage_record(env.vm, staging)
    assert record["mapper"] == mapper, record
    device = str(record["device"])
    assert device.startswith(device_prefix), record
    assert volume.image in env.mapped(device_type)
    volume.publish(staging, target, cap)
    digest = write_payload(env.vm, target, block)
    volume.unpublish(target)
    volume.unstage(staging)
    assert env.mapped(device_type) == "", f"still mapped after unstage:\n{env.mapped(device_type)}"
    assert kubelet_mounts(env.vm) == []

    # Restaged elsewhere: the same data, from the image (the first mapping is gone).
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    assert read_payload(env.vm, target, block) == digest
    volume.unpublish(target)
    volume.unstage(staging)
    assert env.mapped(device_type) == ""
    assert kubelet_mounts(env.vm) == []


@pytest.mark.parametrize("access, size_mb", [("ext4", 64), ("xfs", 320), ("block", 64)])
def test_krbd_is_auto_choice_and_round_trips(vm_env: VmEnv, make_volume, access: str, size_mb: int) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(size_mb)  # no mounter: the node default, --mounter=auto
    round_trip(vm_env, volume, access, "krbd", "/dev/rbd")
    log = vm_env.plugin.log()
    assert "node default mapper" in log and "mounter=krbd" in log.replace('"', "").replace(": ", "=")


@pytest.mark.parametrize("access, size_mb", [("ext4", 64), pytest.param("block", 64, marks=pytest.mark.long)])
def test_rbd_nbd_round_trips(vm_env: VmEnv, make_volume, access: str, size_mb: int) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(size_mb, mounter="rbd-nbd")
    round_trip(vm_env, volume, access, "rbd-nbd", "/dev/nbd")
