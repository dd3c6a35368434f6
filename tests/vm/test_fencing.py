"""Node loss on real kernels (issue 34): a hung node is fenced, another node takes its ReadWriteOnce
volume over with every acknowledged byte, and the fenced node's later writes never reach the image.

Two VM nodes: A (the tier's second node, shared with test_concurrent_format.py) and B (the tier's
node). The real controller path: the test control plane (etcd + kube-apiserver) with Node and
CSINode objects for both VMs and a `cephcsi --mode=controller` whose embedded attacher publishes
the VolumeAttachments the test creates as kube-controller-manager would (no kubelet runs in the
VMs; the test makes the kubelet's node calls). For krbd (`exclusive`) and rbd-nbd (`--exclusive`):

1. attached to A, staged and published there; a writer on A fsyncs numbered records;
2. A hangs (its qemu SIGSTOPped: unlike a power-off, its mapping and page cache survive and it
   may wake). Without the taint a VolumeAttachment to B is refused (attachError naming A and the
   out-of-service taint) and the image stays recorded to A only;
3. the out-of-service taint on A and its VolumeAttachment deleted (what kcm does): the attacher
   blocklists A's address before it releases the attachment, and the OSDs drop A's watch;
4. attached to B; B stages at once (A's exclusive lock and watch do not hold it up) and reads
   every record A acknowledged;
5. A wakes (SIGCONT): its writer's next write/fsync fails, and the image holds exactly the
   records it held when A was fenced (scanned on the host with `rbd export`);
6. A's orphaned pod cleaned as the kubelet would (NodeUnpublish, NodeUnstage): they succeed and
   leave nothing mapped or mounted; taint removed and A Ready: its blocklist entry is gone.

Last (it kills node A): the hard power-off groundwork, a dead node's watch outliving the
power-off until the OSD's watch timeout.

Cost: the second node's boot if test_concurrent_format.py did not boot it (25-140 s under TCG),
the control plane if no earlier test started it (~10 s), about 1.5 minutes per mapper and a minute
for the power-off test.
"""
from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph.publish_keys import NODE_ADDRESSES
from tests.ceph.fixtures import CephTestCluster
from tests.controlplane.cluster import ControlPlane
from tests.integration.sidecars.harness import FAST_ELECTION, ControllerProcess, Kube, wait_for
from tests.vm.conftest import MiB, SharedSecondNode, VmEnv, VmVolume, mount_cap
from tests.vm.guestio import acknowledged, kubelet_mounts, read_payload, stage_record, wait_for_progress, write_payload
from tests.vm.machine import VmNode, scaled

# 900 s: the first test may also wait for the second VM to boot under TCG.
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.kube, pytest.mark.timeout(900)]

DRIVER = "rbd.csi.ceph.com"
TAINT = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
SECRET = ("ceph-secrets", "vm-fence-secret")
WRITER = "tests/vm/writer.py"
RECORD = re.compile(rb"record (\d{8})\n")
WATCH_TIMEOUT_S = 30  # osd_client_watch_timeout's default; the test cluster keeps it


@pytest.fixture(scope="module")
def node_a(shared_second_node: SharedSecondNode) -> VmEnv:
    return shared_second_node.env()


@dataclass
class Attacher:
    kube: Kube
    controller: ControllerProcess
    cluster: CephTestCluster

    def attachment(self, name: str) -> dict[str, Any] | None:
        return self.kube._optional(lambda: self.kube.storage.read_volume_attachment(name, _preload_content=False))

    def attach(self, name: str, pv: str, node: str) -> None:
        self.kube.storage.create_volume_attachment({"metadata": {"name": name}, "spec": {
            "attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv}}})

    def wait_attached(self, name: str) -> None:
        wait_for(f"{name} attached", lambda: ((self.attachment(name) or {}).get("status") or {}).get("attached"),
                 timeout=scaled(60))

    def detach(self, name: str, timeout: float = 90) -> None:
        try:
            self.kube.storage.delete_volume_attachment(name)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
        wait_for(f"{name} released", lambda: self.attachment(name) is None, timeout=scaled(timeout))

    def taint(self, node: str, on: bool) -> None:
        self.kube.core.patch_node(node, {"spec": {"taints": [TAINT] if on else None}})

    def set_ready(self, node: str, ready: bool) -> None:
        self.kube.core.patch_node_status(node, {"status": {"conditions": [{
            "type": "Ready", "status": "True" if ready else "False", "reason": "Test", "message": "set by the test",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})

    def register(self, node: str) -> None:
        """What the kubelet and the node-driver-registrar would create for a VM node."""
        self.kube.create_node(node)
        try:
            self.kube.storage.create_csi_node({"metadata": {"name": node}, "spec": {
                "drivers": [{"name": DRIVER, "nodeID": node, "topologyKeys": None}]}})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
        self.set_ready(node, True)

    def blocklist(self) -> list[str]:
        text = self.cluster.admin("ceph", "osd", "blocklist", "ls", "--format", "json").strip() or "[]"
        entries, _ = json.JSONDecoder().raw_decode(text)
        return [str(e["addr"]) for e in entries]

    def fenced(self, address: str) -> list[str]:
        return [e for e in self.blocklist() if e == address or e.startswith(f"{address}:")]


@pytest.fixture(scope="module")
def attacher(control_plane: ControlPlane, vm_cluster: CephTestCluster, node_a: VmEnv,
             vm_node: VmNode) -> Iterator[Attacher]:
    """The controller (embedded attacher) against the control plane and the VMs' cluster, with
    Node and CSINode objects for both VMs and a Secret of a cephx user allowed to fence."""
    workdir = tempfile.mkdtemp(prefix="vmfence-", dir="/tmp")
    config = vm_cluster.write_config(os.path.join(workdir, "config.json"))
    with control_plane.api_client() as admin:
        kube = Kube(admin)
        key = vm_cluster.admin("ceph", "auth", "get-or-create-key", "client.csi-fence", "mon",
                               'profile rbd, allow command "osd blocklist"', "osd", f"profile rbd pool={vm_cluster.pool}",
                               "mgr", f"profile rbd pool={vm_cluster.pool}").strip()
        namespace, name = SECRET
        kube.ensure_namespace(namespace)
        try:
            kube.core.create_namespaced_secret(namespace, {"metadata": {"name": name},
                                                           "stringData": {"userID": "csi-fence", "userKey": key}})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
        lease_namespace = f"le-{uuid.uuid4().hex[:6]}"
        kube.ensure_namespace(lease_namespace)
        process = ControllerProcess(config, mode="controller", args=[
            f"--kubeconfig={control_plane.kubeconfig}", f"--leader-election-namespace={lease_namespace}",
            *FAST_ELECTION, "--rados-osd-op-timeout=10", "--rados-mon-op-timeout=10", "--timeout=30s"])
        process.start(timeout=60)
        try:
            wait_for("the controller to lead", process.is_leader, timeout=60)
            found = Attacher(kube, process, vm_cluster)
            for node in (node_a.vm.hostname, vm_node.hostname):
                found.register(node)
            yield found
        finally:
            if os.environ.get("KEEP_VM_LOGS"):
                print(process.log()[-20000:])
            process.cleanup()


def records_on_image(cluster: CephTestCluster, image: str) -> set[int]:
    """The writer's record numbers in the image's bytes (exported on the host): what reached
    the OSDs, whichever node wrote it. A new image is zeros, and ext4 (data=ordered) journals
    metadata only, so every match is a record written to a data block."""
    with tempfile.TemporaryDirectory(prefix="vmfence-", dir="/tmp") as folder:
        path = os.path.join(folder, "image")
        cluster.admin("rbd", "export", "--no-progress", f"{cluster.pool}/{image}", path, timeout=120)
        with open(path, "rb") as handle:
            return {int(found) for found in RECORD.findall(handle.read())}


def reported_address(cluster: CephTestCluster, node: str) -> str:
    """The client address the node's plugin reported in the pool (cephcsi.node.client_address)."""
    with tempfile.TemporaryDirectory(prefix="vmfence-", dir="/tmp") as folder:
        path = os.path.join(folder, "value")
        cluster.admin("rados", "-p", cluster.pool, "getomapval", NODE_ADDRESSES, node, path)
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()


def image_meta_keys(cluster: CephTestCluster, image: str) -> list[str]:
    text = cluster.admin("rbd", "image-meta", "list", "--format", "json", f"{cluster.pool}/{image}")
    return sorted(json.loads(text or "{}"))


def watchers(cluster: CephTestCluster, image: str) -> list[str]:
    """The addresses watching the image (`rbd status`), as the OSDs see them now."""
    status = json.loads(cluster.admin("rbd", "status", "--format", "json", f"{cluster.pool}/{image}"))
    return [str(watcher["address"]) for watcher in status.get("watchers", [])]


def nothing_mapped(env: VmEnv) -> None:
    assert env.mapped("krbd") == ""
    assert env.mapped("nbd") == ""
    assert env.vm.check("ls /sys/bus/rbd/devices", timeout=30).strip() == ""
    assert kubelet_mounts(env.vm) == []


@pytest.mark.parametrize("mounter, map_options", [
    ("krbd", "krbd:exclusive"),
    pytest.param("rbd-nbd", "", marks=pytest.mark.long),  # the same flow again; rbd-nbd exclusivity is test_exclusive_map's
])
def test_hung_node_is_fenced_and_another_node_takes_over_every_acknowledged_write(
        vm_env: VmEnv, node_a: VmEnv, attacher: Attacher, mounter: str, map_options: str) -> None:
    a, b, cluster = node_a, vm_env, vm_env.cluster
    name_a, name_b = a.vm.hostname, b.vm.hostname
    cap = mount_cap("ext4")
    parameters = {**cluster.parameters, "imageFeatures": "layering,exclusive-lock", "mounter": mounter}
    if map_options:
        parameters["mapOptions"] = map_options
    created = attacher.controller.controller.CreateVolume(csi_pb2.CreateVolumeRequest(
        name=f"pvc-{uuid.uuid4()}", capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MiB),
        volume_capabilities=[cap], parameters=parameters, secrets=cluster.secrets), timeout=60).volume
    context = dict(created.volume_context)
    image = context["imageName"]
    suffix = uuid.uuid4().hex[:6]
    pv, va_a, va_b, va_refused = f"fence-{suffix}", f"a-{suffix}", f"b-{suffix}", f"refused-{suffix}"
    attacher.kube.core.create_persistent_volume({"metadata": {"name": pv}, "spec": {
        "capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "", "volumeMode": "Filesystem",
        "csi": {"driver": DRIVER, "volumeHandle": created.volume_id, "fsType": "ext4", "volumeAttributes": context,
                "controllerPublishSecretRef": {"namespace": SECRET[0], "name": SECRET[1]}}}})
    on_a = VmVolume(created.volume_id, image, context, a.plugin, cluster)
    on_b = VmVolume(created.volume_id, image, context, b.plugin, cluster)
    staging_a, target_a = a.staging(), a.target()
    staging_b, target_b = b.staging(), b.target()
    writer = f"{a.vm.repo}/{WRITER}"
    ack, stop = "/root/fence-writer.ack", "/root/fence-writer.stop"
    stopped = False
    try:
        # 1. Attached to A by the attacher, staged and published there, a writer acknowledging.
        attacher.attach(va_a, pv, name_a)
        attacher.wait_attached(va_a)
        on_a.stage(staging_a, cap)
        on_a.publish(staging_a, target_a, cap)
        assert stage_record(a.vm, staging_a)["mapper"] == mounter
        # A's node plugin reported its client address where the controller looks for it.
        assert reported_address(cluster, name_a) == a.vm.address
        a.vm.check(f"rm -f {ack} {stop}")
        pid = a.vm.spawn(f"exec python3 {writer} {target_a}/records {ack} {stop}", "writer")
        wait_for_progress(a.vm, ack, 20, 120, lambda: a.plugin.log()[-3000:])

        # 2. A hangs. Without the taint, B cannot have the volume: refused, recorded to A only.
        assert a.vm.process is not None
        a.vm.process.send_signal(signal.SIGSTOP)
        hung = time.monotonic()
        stopped = True
        attacher.attach(va_refused, pv, name_b)
        error = str(wait_for("attachError on node B", lambda: (
            ((attacher.attachment(va_refused) or {}).get("status") or {}).get("attachError") or {}).get("message"),
            timeout=scaled(60)))
        assert name_a in error and "out-of-service" in error, error
        assert not ((attacher.attachment(va_refused) or {}).get("status") or {}).get("attached")
        keys = image_meta_keys(cluster, image)
        assert any(k.endswith(f"/{name_a}") for k in keys) and not any(k.endswith(f"/{name_b}") for k in keys), keys
        assert not any(w.startswith(f"{b.vm.address}:") for w in watchers(cluster, image))
        attacher.detach(va_refused)

        # 3. Out of service, and its attachment deleted as kcm does: fenced before released.
        attacher.set_ready(name_a, False)
        attacher.taint(name_a, True)
        fence_started = time.monotonic()
        attacher.detach(va_a)
        # The whole IP (what only the controller adds: a lock break blocklists one instance).
        assert {a.vm.address, f"{a.vm.address}:0/0"} & set(attacher.fenced(a.vm.address)), attacher.blocklist()
        print(f"\n{mounter}: node A fenced and its attachment released after "
              f"{time.monotonic() - fence_started:.1f}s: {attacher.fenced(a.vm.address)}")
        at_fence = records_on_image(cluster, image)
        # The OSDs drop the fenced client's watch at once (a powered-off node's stays for the
        # watch timeout: the last test), so nothing of A's holds up B.
        wait_for("A's watch dropped", lambda: not any(w.startswith(f"{a.vm.address}:") for w in watchers(cluster, image)),
                 timeout=scaled(10))

        # 4. B takes over at once and reads every record A acknowledged.
        attacher.attach(va_b, pv, name_b)
        attacher.wait_attached(va_b)
        started = time.monotonic()
        on_b.stage(staging_b, cap, timeout=scaled(WATCH_TIMEOUT_S + 60))
        staged_in = time.monotonic() - started
        print(f"{mounter}: node B staged the volume in {staged_in:.1f}s ({time.monotonic() - hung:.0f}s after A hung)")
        on_b.publish(staging_b, target_b, cap)
        on_b_view = {int(line.split()[1]) for line in
                     b.vm.check(f"cat {target_b}/records", timeout=60).splitlines() if line.startswith("record ")}
        # The file B sees is what reached the image before the fence (a record whose data block
        # was flushed without the inode size that covers it is on the image but not in the file).
        assert on_b_view and on_b_view <= at_fence, sorted(on_b_view - at_fence)[:10]

        # 5. A wakes: its writer fails, nothing it writes from now on reaches the image.
        a.vm.process.send_signal(signal.SIGCONT)
        stopped = False
        wait_for("A's writer to fail", lambda: not a.vm.run(f"kill -0 {pid}", timeout=30).ok, timeout=scaled(180))
        failure = a.vm.read_file("writer.log")
        assert "OSError" in failure, failure[-2000:]
        acks = {int(n) for n in a.vm.check(f"cat {ack}", timeout=30).split()}
        assert len(acks) > 20 and acks <= on_b_view, sorted(acks - on_b_view)[:10]
        print(f"{mounter}: A acknowledged {len(acks)} records, B read all; A's writer on waking: "
              f"{failure.strip().splitlines()[-1]}")
        on_b.unpublish(target_b)
        on_b.unstage(staging_b)
        assert records_on_image(cluster, image) == at_fence  # not one write of the fenced node

        # 6. A's kubelet cleans its orphaned pod: unpublish and unstage work on the fenced device.
        on_a.unpublish(target_a)
        on_a.unstage(staging_a)
        nothing_mapped(a)
        assert acknowledged(a.vm, ack) == len(acks)
        # Back in service: the taint removed, the node Ready, the attacher unfences it.
        attacher.taint(name_a, False)
        attacher.set_ready(name_a, True)
        wait_for("A's blocklist entries removed", lambda: not attacher.fenced(a.vm.address), timeout=scaled(60))
        attacher.detach(va_b)
        assert [k for k in image_meta_keys(cluster, image) if k.startswith(".rbd.csi.ceph.com/")] == []
    finally:
        if stopped and a.vm.process is not None:
            a.vm.process.send_signal(signal.SIGCONT)
        if a.vm.running():
            a.vm.run(f"touch {stop}", timeout=30)
        for one, staging, target, env in ((on_a, staging_a, target_a, a), (on_b, staging_b, target_b, b)):
            if env.vm.running() and kubelet_mounts(env.vm):
                try:
                    one.unpublish(target)
                    one.unstage(staging)
                except Exception as error:  # noqa: BLE001 - the assertion above is what failed
                    print(f"cleanup on {env.vm.hostname}: {error}")
        for va in (va_refused, va_a, va_b):
            try:
                attacher.detach(va, timeout=60)
            except (AssertionError, kubernetes.client.ApiException) as error:
                print(f"cleanup of {va}: {error}")
        attacher.taint(name_a, False)
        attacher.set_ready(name_a, True)
        for entry in attacher.fenced(a.vm.address):
            cluster.admin("ceph", "osd", "blocklist", "rm", entry)
        attacher.kube.delete_pv(pv)
        try:
            attacher.controller.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(
                volume_id=created.volume_id, secrets=cluster.secrets), timeout=120)
        except Exception as error:  # noqa: BLE001 - the cluster goes with the session
            print(f"cleanup of {image}: {error}")


def test_hard_power_off_leaves_a_watcher_until_timeout_and_another_node_reads_acknowledged_writes(
        vm_env: VmEnv, node_a: VmEnv, make_volume: Callable[..., VmVolume]) -> None:
    """Last in the module: it kills node A. A dead node's client still watches the image right
    after the power-off, until the OSD's watch timeout (osd_client_watch_timeout, 30 s) expires;
    `ceph osd blocklist add` of the address that watch names is accepted and listed; the other
    node then stages the volume (krbd breaks the dead owner's exclusive lock) and reads back every
    write the dead node had acknowledged."""
    cluster = vm_env.cluster
    volume = make_volume(64)
    on_second = VmVolume(volume.volume_id, volume.image, volume.context, node_a.plugin, cluster)
    cap = mount_cap("ext4")
    staging, target = node_a.staging(), node_a.target()
    on_second.stage(staging, cap)
    on_second.publish(staging, target, cap)
    assert stage_record(node_a.vm, staging)["mapper"] == "krbd"
    digest = write_payload(node_a.vm, target, block=False)  # fsynced: acknowledged
    dead = [address for address in watchers(cluster, volume.image)
            if address.startswith(f"{node_a.vm.address}:")]
    assert len(dead) == 1, watchers(cluster, volume.image)

    node_a.vm.power_off_hard()
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
