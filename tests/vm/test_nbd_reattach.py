"""rbd-nbd across a node-plugin restart (ceph/ceph-csi#2204): a container restart kills the plugin
and the rbd-nbd daemons it started. A netlink-bound device (mapOptions `nbd:try-netlink`) waits in
the kernel for `reattach-timeout`; the restarted plugin re-attaches a daemon and the writer on the
volume goes on with every acknowledged write on the image. A device disconnected meanwhile cannot be
re-attached: the plugin says so, and the next NodeStageVolume stages the volume again cleanly. (Linux 6.1 keeps a netlink device configured after reattach-timeout — only
I/O in the gap fails — and frees it only when something disconnects it: seen in this VM.)"""
from __future__ import annotations

import json
import time

import pytest

from tests.vm.conftest import VmEnv, VmVolume, mount_cap
from tests.vm.guestio import (
    acknowledged,
    kubelet_mounts,
    read_payload,
    stage_record,
    wait_for_progress,
    write_payload,
)
from tests.vm.machine import scaled
from tests.vm.plugin import RUNTIME_DIR

# 900 s: the first test also waits for the VM to boot under TCG (up to ~8 minutes on a loaded host).
# In the long tier (minutes of kills under TCG), out of CI's 90 minutes.
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.long, pytest.mark.timeout(900)]

WRITER = "tests/vm/writer.py"


def _acknowledged(env: VmEnv, ack: str) -> int:
    return acknowledged(env.vm, ack)


def _wait_for_progress(env: VmEnv, ack: str, beyond: int, timeout: float = 120) -> int:
    return wait_for_progress(env.vm, ack, beyond, timeout, lambda: env.plugin.log()[-3000:])


def _ensure_plugin(env: VmEnv) -> None:
    """After a failure between kill and start: the package's other tests need the plugin."""
    if not env.plugin.pid or not env.vm.run(f"kill -0 {env.plugin.pid}", timeout=30).ok:
        env.plugin.start()


def _kill_plugin_and_daemons(env: VmEnv, image: str) -> None:
    """What a container restart does: the plugin and every rbd-nbd it started die (SIGKILL)."""
    entries = json.loads(env.vm.check("rbd device list -t nbd --format json", timeout=60) or "[]")
    pids = [str(e["id"]) for e in entries if e.get("image") == image]
    assert pids, entries
    env.plugin.kill()
    env.vm.check(f"kill -9 {' '.join(pids)}; for p in {' '.join(pids)}; do "
                 "while [ -d /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status; do sleep 0.1; done; done", timeout=60)
    assert image not in env.mapped("nbd")


def _wait_for_log(env: VmEnv, text: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while text not in env.plugin.log():
        assert time.monotonic() < deadline, f"no {text!r} in the plugin log:\n{env.plugin.log()[-4000:]}"
        time.sleep(1)


def _nothing_left(env: VmEnv, device: str) -> None:
    assert env.mapped("nbd") == "", env.mapped("nbd")
    assert kubelet_mounts(env.vm) == []
    name = device.removeprefix("/dev/")
    assert not env.vm.run(f"test -e /sys/block/{name}/backend").ok, f"{device} is still bound in the kernel"
    assert _records(env) == 0, "a re-attach record was left"


def _records(env: VmEnv) -> int:
    return int(env.vm.check(f"ls {RUNTIME_DIR}/nbd 2>/dev/null | wc -l", timeout=30).strip())


def test_writer_survives_plugin_and_rbd_nbd_killed(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64, mounter="rbd-nbd", mapOptions="nbd:try-netlink")
    cap = mount_cap("ext4")
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    device = str(stage_record(vm_env.vm, staging)["device"])
    assert _records(vm_env) == 1, "no re-attach record under --runtime-dir"
    writer = f"{vm_env.vm.repo}/{WRITER}"
    ack, stop = "/root/nbd-writer.ack", "/root/nbd-writer.stop"
    vm_env.vm.check(f"rm -f {ack} {stop}")
    pid = vm_env.vm.spawn(f"exec python3 {writer} {target}/records {ack} {stop}", "writer")
    try:
        before = _wait_for_progress(vm_env, ack, 20)
        _kill_plugin_and_daemons(vm_env, volume.image)
        stalled = _acknowledged(vm_env, ack)
        vm_env.plugin.start()
        _wait_for_log(vm_env, "re-attached")
        assert volume.image in vm_env.mapped("nbd")
        assert stage_record(vm_env.vm, staging)["device"] == device
        # The writer goes on, on the same device and mount, without the kubelet doing anything.
        _wait_for_progress(vm_env, ack, max(before, stalled) + 10)
        # What the kubelet may send after a plugin restart: both find everything in place.
        volume.stage(staging, cap)
        volume.publish(staging, target, cap)
    finally:
        _ensure_plugin(vm_env)
        vm_env.vm.run(f"touch {stop}; while kill -0 {pid} 2>/dev/null; do sleep 0.1; done", timeout=120)
    verdict = vm_env.vm.check(f"python3 {writer} --verify {target}/records {ack}", timeout=60)
    assert verdict.startswith("ok "), verdict
    volume.unpublish(target)
    volume.unstage(staging)
    _nothing_left(vm_env, device)

    # From the image itself: every acknowledged write is there.
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    verdict = vm_env.vm.check(f"python3 {writer} --verify {target}/records {ack}", timeout=60)
    assert verdict.startswith("ok "), verdict
    volume.unpublish(target)
    volume.unstage(staging)
    _nothing_left(vm_env, device)


def test_device_gone_is_reported_and_restaged(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64, mounter="rbd-nbd", mapOptions="nbd:try-netlink")
    cap = mount_cap("ext4")
    staging, target = vm_env.staging(), vm_env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    digest = write_payload(vm_env.vm, target, block=False)
    volume.unpublish(target)
    device = str(stage_record(vm_env.vm, staging)["device"])
    try:
        _kill_plugin_and_daemons(vm_env, volume.image)
        # The device is disconnected while no plugin runs (a node agent's cleanup, an admin's
        # `rbd device unmap`). The mount still holds it, so the kernel keeps its backend and cookie
        # but refuses a new connection (EINVAL): the re-attach fails.
        vm_env.vm.check(f"rbd device unmap -t nbd {device}", timeout=90)
    finally:
        _ensure_plugin(vm_env)
    _wait_for_log(vm_env, "restart the pods using it")
    assert "re-attaching the rbd-nbd device of this volume failed" in vm_env.plugin.log()

    # The kubelet stages it again (a pod restarted): the dead mount is replaced, the data is there.
    volume.stage(staging, cap)
    record = stage_record(vm_env.vm, staging)
    assert record["staged"] is True and volume.image in vm_env.mapped("nbd"), record
    target = vm_env.target()
    volume.publish(staging, target, cap)
    assert read_payload(vm_env.vm, target, block=False) == digest
    volume.unpublish(target)
    volume.unstage(staging)
    _nothing_left(vm_env, str(record["device"]))
