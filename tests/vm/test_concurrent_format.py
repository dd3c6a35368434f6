"""Two nodes stage one ReadWriteMany Block encrypted volume at the same time (issue 33 review): the
first format of an "encryptionPrepared" volume runs under the volume's cluster lock
(cephcsi.node.encrypted_stage), so exactly one node writes the LUKS header and the other opens it.

Two real-kernel VM nodes (the tier's second node, tests/vm/conftest.py SharedSecondNode), each with its own node plugin.
The test holds the volume's lock (`<volume id>-mutexlock`) from the host until both plugins have
read the state "encryptionPrepared", mapped the image and are waiting for the lock — the race the
lock exists for, made certain instead of left to timing — then releases it. Checked: both stages
succeed, exactly one "LUKS2 header written" across both plugins' logs, both devices carry the same
LUKS UUID, the state is "encrypted", data written through one node's mapping is read back by the
other after it unstages and stages again, and no passphrase is in either log. Without the lock
both nodes format (two headers, the first node's key lost).

Cost: the second node's boot (25-140 s under TCG), shared with test_fencing.py, and about a minute
and a half of calls."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.vm.conftest import SharedSecondNode, VmEnv, VmVolume
from tests.vm.guestio import read_payload, stage_record, write_payload
from tests.vm.machine import scaled
from tests.vm.plugin import GuestPlugin

# In the long tier (a minute on two nodes), out of CI's 90 minutes.
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.long, pytest.mark.timeout(900)]

STATE = "rbd.csi.ceph.com/encrypted"
PASSPHRASE = "cephcsi-vm-concurrent-format-7c1e55"
HOLDER = "test-holds-the-format"
FORMATTED = "LUKS2 header written"
Cap = csi_pb2.VolumeCapability
RWX_BLOCK = Cap(block=Cap.BlockVolume(), access_mode=Cap.AccessMode(mode=Cap.AccessMode.MULTI_NODE_MULTI_WRITER))


@pytest.fixture(scope="module")
def other_env(shared_second_node: SharedSecondNode) -> VmEnv:
    return shared_second_node.env()


def stage(volume: VmVolume, staging: str) -> None:
    volume.plugin.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
        volume_id=volume.volume_id, staging_target_path=staging, volume_capability=RWX_BLOCK,
        secrets={**volume.cluster.secrets, "encryptionPassphrase": PASSPHRASE},
        volume_context=volume.context), timeout=300)


def busy_lock_gets(plugin: GuestPlugin, volume_id: str) -> int:
    """How often the plugin found the volume's lock taken (its debug line of each `rados lock get`)."""
    return sum(1 for line in plugin.log().splitlines()
               if "lock get" in line and f"{volume_id}-mutexlock" in line and " rc=1 " in line)


def test_two_nodes_staging_one_prepared_volume_format_it_once(
        vm_env: VmEnv, other_env: VmEnv, make_volume: Callable[..., VmVolume]) -> None:
    cluster = vm_env.cluster
    volume = make_volume(64, mounter="krbd", encrypted="true", encryptionType="block")
    spec = f"{cluster.pool}/{volume.image}"
    cluster.admin("rbd", "image-meta", "set", spec, STATE, "encryptionPrepared")
    on_other = VmVolume(volume.volume_id, volume.image, volume.context, other_env.plugin, cluster)
    lock = f"{volume.volume_id}-mutexlock"
    formatted_before = sum(env.plugin.log().count(FORMATTED) for env in (vm_env, other_env))

    cluster.admin("rados", "-p", cluster.pool, "lock", "get", volume.volume_id, lock, "--lock-type", "exclusive",
                  "--lock-cookie", HOLDER, "--lock-duration", "300")
    held = True
    stagings = {id(vm_env): vm_env.staging(), id(other_env): other_env.staging()}
    errors: list[BaseException] = []

    def run(one: VmVolume, staging: str) -> None:
        try:
            stage(one, staging)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(volume, stagings[id(vm_env)])),
               threading.Thread(target=run, args=(on_other, stagings[id(other_env)]))]
    try:
        for thread in threads:
            thread.start()
        # Both stages have read "encryptionPrepared" and wait for the lock: the race is certain.
        deadline = time.monotonic() + scaled(120)
        while not (busy_lock_gets(vm_env.plugin, volume.volume_id) and busy_lock_gets(other_env.plugin, volume.volume_id)):
            assert not errors, errors
            assert time.monotonic() < deadline, "the stages never waited for the volume's lock"
            time.sleep(0.5)
        assert cluster.admin("rbd", "image-meta", "get", spec, STATE).strip() == "encryptionPrepared"
        info = json.loads(cluster.admin("rados", "-p", cluster.pool, "lock", "info", volume.volume_id, lock,
                                        "--format", "json"))
        (holder,) = info["lockers"]
        cluster.admin("rados", "-p", cluster.pool, "lock", "break", volume.volume_id, lock, holder["name"],
                      "--lock-cookie", HOLDER)
        held = False
        for thread in threads:
            thread.join(scaled(300))
        assert not errors, [e.details() if isinstance(e, grpc.RpcError) else e for e in errors]

        logs = [env.plugin.log() for env in (vm_env, other_env)]
        assert sum(log.count(FORMATTED) for log in logs) - formatted_before == 1  # one node formatted
        assert cluster.admin("rbd", "image-meta", "get", spec, STATE).strip() == "encrypted"
        devices = [str(stage_record(env.vm, stagings[id(env)])["device"]) for env in (vm_env, other_env)]
        uuids = {env.vm.check(f"cryptsetup luksUUID {device}", timeout=60).strip()
                 for env, device in zip((vm_env, other_env), devices)}
        assert len(uuids) == 1, uuids  # the same header on both nodes
        assert "another node meanwhile" in "".join(logs)  # the loser read the state again, under the lock
        assert json.loads(cluster.admin("rados", "-p", cluster.pool, "lock", "info", volume.volume_id, lock,
                                        "--format", "json")).get("lockers", []) == []  # released

        # Data written through one node's mapping, read through the other's after it opens again.
        target = vm_env.target()
        volume.publish(stagings[id(vm_env)], target, RWX_BLOCK)
        digest = write_payload(vm_env.vm, target, block=True)
        volume.unpublish(target)
        on_other.unstage(stagings[id(other_env)])
        staging = stagings[id(other_env)] = other_env.staging()
        stage(on_other, staging)
        other_target = other_env.target()
        on_other.publish(staging, other_target, RWX_BLOCK)
        assert read_payload(other_env.vm, other_target, block=True) == digest
        on_other.unpublish(other_target)
        assert PASSPHRASE not in "".join(env.plugin.log() for env in (vm_env, other_env))
    finally:
        if held:
            info = json.loads(cluster.admin("rados", "-p", cluster.pool, "lock", "info", volume.volume_id, lock,
                                            "--format", "json"))
            for locker in info.get("lockers", []):
                cluster.admin("rados", "-p", cluster.pool, "lock", "break", volume.volume_id, lock, locker["name"],
                              "--lock-cookie", locker["cookie"])
        for thread in threads:
            if thread.is_alive():
                thread.join(scaled(300))
        for one, env in ((volume, vm_env), (on_other, other_env)):
            try:
                one.unstage(stagings[id(env)])
            except grpc.RpcError:
                pass  # the assertion above is what failed
