"""What only a real kernel shows: an image feature krbd cannot map, the node plugin killed while
a krbd volume is in use, and krbd's read-affinity options."""
from __future__ import annotations

import grpc
import pytest

from tests.integration.node.conftest import expect_code
from tests.vm.conftest import VmEnv, VmVolume, block_cap, mount_cap
from tests.vm.guestio import (
    kubelet_mounts,
    read_payload,
    stage_record,
    wait_for_progress,
    write_payload,
)

# 900 s: the first test also waits for the VM to boot under TCG (up to ~8 minutes on a loaded host).
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]


def test_image_feature_krbd_cannot_map_is_a_clear_error_with_nothing_left(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64, features="layering,exclusive-lock,journaling")
    staging = vm_env.staging()
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.stage, staging, mount_cap("ext4"))
    assert "rbd feature disable" in message and "journaling" in message and "rbd-nbd" in message, message
    assert vm_env.mapped("krbd") == ""
    assert kubelet_mounts(vm_env.vm) == []
    assert not vm_env.vm.run(f"test -e {staging}/cephcsi-stage.json").ok, "a stage record was left"

    # The way out the message names: rbd-nbd (librbd) maps the same image.
    other = VmVolume(volume.volume_id, volume.image, {**volume.context, "mounter": "rbd-nbd"},
                     volume.plugin, volume.cluster)
    staging, target = vm_env.staging(), vm_env.target()
    other.stage(staging, block_cap())
    other.publish(staging, target, block_cap())
    digest = write_payload(vm_env.vm, target, block=True)
    assert read_payload(vm_env.vm, target, block=True) == digest
    other.unpublish(target)
    other.unstage(staging)
    assert vm_env.mapped("nbd") == ""


def _wait_for_progress(env: VmEnv, ack: str, beyond: int, timeout: float = 90) -> int:
    return wait_for_progress(env.vm, ack, beyond, timeout)


def test_plugin_killed_under_load_loses_no_acknowledged_write(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64)
    cap = mount_cap("ext4")
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    assert stage_record(vm_env.vm, staging)["mapper"] == "krbd"
    writer = f"{vm_env.vm.repo}/tests/vm/writer.py"
    ack, stop = "/root/writer.ack", "/root/writer.stop"
    vm_env.vm.check(f"rm -f {ack} {stop}")
    pid = vm_env.vm.spawn(f"exec python3 {writer} {target}/records {ack} {stop}", "writer")
    try:
        before = _wait_for_progress(vm_env, ack, 20)
        vm_env.plugin.kill()
        # The kernel keeps the mapping and the mount: I/O goes on without the plugin.
        during = _wait_for_progress(vm_env, ack, before)
        vm_env.plugin.start()
        # The restarted plugin finds the stage and the publish in place (the kubelet re-sends both).
        volume.stage(staging, cap)
        volume.publish(staging, target, cap)
        _wait_for_progress(vm_env, ack, during)
    finally:
        vm_env.vm.run(f"touch {stop}; while kill -0 {pid} 2>/dev/null; do sleep 0.1; done", timeout=60)
    verdict = vm_env.vm.check(f"python3 {writer} --verify {target}/records {ack}", timeout=60)
    assert verdict.startswith("ok "), verdict

    volume.unpublish(target)
    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""
    assert kubelet_mounts(vm_env.vm) == []
    # From the image itself, not the page cache of the first mapping.
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    verdict = vm_env.vm.check(f"python3 {writer} --verify {target}/records {ack}", timeout=60)
    assert verdict.startswith("ok "), verdict
    volume.unpublish(target)
    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""


def test_krbd_accepts_read_affinity_options(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    location = f"host:{vm_env.vm.hostname}"
    volume: VmVolume = make_volume(64, mapOptions=f"krbd:read_from_replica=localize,crush_location={location}")
    staging = vm_env.staging()
    volume.stage(staging, block_cap())
    device = str(stage_record(vm_env.vm, staging)["device"])
    number = device.removeprefix("/dev/rbd")
    config = vm_env.vm.check(f"cat /sys/bus/rbd/devices/{number}/config_info", timeout=30)
    assert "read_from_replica=localize" in config and f"crush_location={location}" in config, config
    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""
