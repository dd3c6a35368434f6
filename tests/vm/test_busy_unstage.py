"""NodeUnstageVolume while something on the node still holds the krbd volume: a process whose
working directory is inside the staging mount (the filesystem cannot be unmounted), or one that
has the block device open (the kernel refuses `rbd device unmap`). The answer is
FAILED_PRECONDITION saying the volume is busy, the volume stays mapped and usable, and once the
holder is gone the kubelet's retried unstage completes with nothing left mapped."""
from __future__ import annotations

import shlex

import grpc
import pytest

from cephcsi.node.stage_record import FS_DIR
from tests.integration.node.conftest import expect_code
from tests.vm.conftest import VmEnv, VmVolume, block_cap, mount_cap
from tests.vm.guestio import kubelet_mounts, read_payload, stage_record, write_payload

# 900 s: the first test also waits for the VM to boot under TCG (up to ~8 minutes on a loaded host).
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]


def _hold(env: VmEnv, script: str, name: str, proc_link: str, held: str) -> int:
    """Spawn the holder and wait until it really holds `held` (/proc/PID/<proc_link> points there):
    `spawn` returns before the shell has run its first command."""
    pid = env.vm.spawn(script, name)
    env.vm.check(f"for i in $(seq 600); do [ \"$(readlink /proc/{pid}/{proc_link})\" = {shlex.quote(held)} ] && exit 0; "
                 "sleep 0.1; done; exit 1", timeout=90)
    return pid


def _release(env: VmEnv, pid: int) -> None:
    env.vm.run(f"kill {pid} 2>/dev/null; while kill -0 {pid} 2>/dev/null; do sleep 0.1; done", timeout=60)


def test_unstage_of_a_filesystem_held_busy_is_refused_and_retried(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64)
    cap = mount_cap("ext4")
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    digest = write_payload(vm_env.vm, target, block=False)
    volume.unpublish(target)
    record = stage_record(vm_env.vm, staging)
    mount_path = f"{staging}/{FS_DIR}"
    assert record["mapper"] == "krbd" and vm_env.vm.run(f"mountpoint -q {mount_path}").ok, mount_path
    holder = _hold(vm_env, f"cd {shlex.quote(mount_path)} && exec sleep 600", "holder-cwd", "cwd", mount_path)
    try:
        message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.unstage, staging)
        assert "busy" in message and "retry" in message, message
        # Nothing was torn down: still mounted, mapped, recorded — and usable again at once.
        assert volume.image in vm_env.mapped("krbd")
        assert vm_env.vm.run(f"mountpoint -q {mount_path}").ok
        assert stage_record(vm_env.vm, staging)["staged"] is True
        volume.stage(staging, cap)  # the kubelet may stage again meanwhile: idempotent
        target = vm_env.target()
        volume.publish(staging, target, cap)
        assert read_payload(vm_env.vm, target, block=False) == digest
        volume.unpublish(target)
    finally:
        _release(vm_env, holder)
    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""
    assert kubelet_mounts(vm_env.vm) == []


@pytest.mark.long  # the refusal and retry are the filesystem case's; this is the same for a held block device
def test_unstage_of_a_block_device_held_open_is_refused_and_retried(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64)
    cap = block_cap()
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    digest = write_payload(vm_env.vm, target, block=True)
    volume.unpublish(target)
    device = str(stage_record(vm_env.vm, staging)["device"])
    assert device.startswith("/dev/rbd"), device
    # An opener the kernel counts (krbd refuses to unmap a device with a non-zero open count).
    holder = _hold(vm_env, f"exec sleep 600 <{shlex.quote(device)}", "holder-open", "fd/0", device)
    try:
        message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.unstage, staging)
        assert "busy" in message and "then retry" in message and device in message, message
        assert volume.image in vm_env.mapped("krbd"), "the device was unmapped under its opener"
        assert vm_env.vm.run(f"test -e {shlex.quote(staging)}/cephcsi-stage.json").ok, "the stage record went"
        # Usable: a stage (as the kubelet does before a publish) restores whatever unstage undid.
        volume.stage(staging, cap)
        target = vm_env.target()
        volume.publish(staging, target, cap)
        assert read_payload(vm_env.vm, target, block=True) == digest
        volume.unpublish(target)
    finally:
        _release(vm_env, holder)
    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""
    assert kubelet_mounts(vm_env.vm) == []
