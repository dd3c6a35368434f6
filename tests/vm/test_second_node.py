"""Two nodes and a hard power-off: groundwork for the fencing issue. A second VM node (booted once,
for this module) stages a krbd volume and writes to it, then loses power (qemu SIGKILLed: nothing
flushed, nothing unmapped). What the fencing work has to deal with, shown on the cluster:

- the dead node's client still watches the image right after the power-off, until the OSD's
  watch timeout (osd_client_watch_timeout, 30 s by default) expires;
- `ceph osd blocklist add` of the address that watch names (what a NetworkFence does) is
  accepted and listed;
- the first node then stages the same volume (krbd breaks the dead owner's exclusive lock) and
  reads back every write the dead node had acknowledged.

Cost: one more boot (25-140 s under TCG) and about a minute of calls and waiting.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

from tests.ceph.fixtures import CephTestCluster
from tests.vm.conftest import MAX_CONCURRENT_SESSIONS, VmEnv, VmVolume, boot_free_node, mount_cap
from tests.vm.guestio import kubelet_mounts, read_payload, stage_record, write_payload
from tests.vm.machine import VmImage, VmNode, scaled
from tests.vm.plugin import GuestPlugin

# 900 s: the first test also waits for both VMs to boot under TCG.
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]

WATCH_TIMEOUT_S = 30  # osd_client_watch_timeout's default; the test cluster keeps it


@pytest.fixture(scope="module")
def second_env(vm_image: VmImage, vm_cluster: CephTestCluster, vm_node: VmNode) -> Iterator[VmEnv]:
    workdir = tempfile.mkdtemp(prefix="vm2-", dir="/tmp")
    node = None
    try:
        others = (index for index in range(2 * MAX_CONCURRENT_SESSIONS) if index != vm_node.index)
        node = boot_free_node(vm_image, workdir, others)
        if node is None:
            pytest.skip("VM tier: no free VM node index for a second node on this machine")
        print(f"\nsecond VM node {node.index} ({node.accel}) ready after {node.boot_seconds:.0f}s")
        guest = GuestPlugin(node, vm_cluster)
        guest.start()
        yield VmEnv(node, guest, vm_cluster)
    finally:
        if node is not None:
            if os.environ.get("KEEP_VM_LOGS"):
                print(node.diagnostics(400), node.read_file("plugin.log"))
            node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def watchers(cluster: CephTestCluster, image: str) -> list[str]:
    """The addresses watching the image (`rbd status`), as the OSDs see them now."""
    status = json.loads(cluster.admin("rbd", "status", "--format", "json", f"{cluster.pool}/{image}"))
    return [str(watcher["address"]) for watcher in status.get("watchers", [])]


def test_hard_power_off_leaves_a_watcher_until_timeout_and_another_node_reads_acknowledged_writes(  # type: ignore[no-untyped-def]
        vm_env: VmEnv, second_env: VmEnv, make_volume) -> None:
    cluster = vm_env.cluster
    volume: VmVolume = make_volume(64)
    on_second = VmVolume(volume.volume_id, volume.image, volume.context, second_env.plugin, cluster)
    cap = mount_cap("ext4")
    staging, target = second_env.staging(), second_env.target()
    on_second.stage(staging, cap)
    on_second.publish(staging, target, cap)
    assert stage_record(second_env.vm, staging)["mapper"] == "krbd"
    digest = write_payload(second_env.vm, target, block=False)  # fsynced: acknowledged
    dead = [address for address in watchers(cluster, volume.image)
            if address.startswith(f"{second_env.vm.address}:")]
    assert len(dead) == 1, watchers(cluster, volume.image)

    second_env.vm.power_off_hard()
    powered_off = time.monotonic()
    # Nothing told the cluster: the dead client still watches the image.
    assert dead[0] in watchers(cluster, volume.image)
    while dead[0] in watchers(cluster, volume.image):
        waited = time.monotonic() - powered_off
        assert waited < scaled(WATCH_TIMEOUT_S + 60), f"the dead node's watch outlived the watch timeout: {waited:.0f}s"
        time.sleep(1)
    gone_after = time.monotonic() - powered_off
    print(f"\nthe powered-off node's watch expired after {gone_after:.0f}s")
    assert gone_after > WATCH_TIMEOUT_S / 2, "the watch went at once: the cluster was told something"

    # What a fence does: blocklist the dead client's address, so it could never write again.
    cluster.admin("ceph", "osd", "blocklist", "add", dead[0])
    try:
        assert dead[0] in cluster.admin("ceph", "osd", "blocklist", "ls")
        staging, target = vm_env.staging(), vm_env.target()
        volume.stage(staging, cap)
        volume.publish(staging, target, cap)
        assert read_payload(vm_env.vm, target, block=False) == digest
        volume.unpublish(target)
        volume.unstage(staging)
        assert vm_env.mapped("krbd") == ""
        assert kubelet_mounts(vm_env.vm) == []
    finally:
        cluster.admin("ceph", "osd", "blocklist", "rm", dead[0])
