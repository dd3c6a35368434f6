"""The Kubernetes claim flow on a real kernel: a VM node (stock Debian kernel, tests/vm) runs
containerd and a kubelet that join the e2e control plane (tests/vm/kube_node.py); the deploy/
DaemonSet puts the shipped image there as the node plugin, whose `--mounter=auto` picks krbd.

A claim is bound, a pod pinned to the VM node writes to it through a krbd device, the claim is
grown while the pod runs (ControllerExpandVolume by the embedded resizer, then the kubelet's
NodeExpandVolume: online resize2fs, which the host node cannot do) and the pod sees the bigger
filesystem; then pod and claim go and nothing is left mapped or mounted in the VM. The same flow
runs again through rbd-nbd, chosen by a StorageClass's `mounter: rbd-nbd`: the rbd-nbd daemon runs
in the node plugin's container and binds the device through the kernel's netlink interface
(Tentacle's rbd-nbd always does where the kernel has it); on resize it reconfigures the device's
size through netlink, which Linux 6.1 honours, so the filesystem grows online there too.

Runs after every other e2e scenario (the module is not in conftest's MODULE_ORDER): while the VM
node exists, the scheduler could place other scenarios' pods on it. Skips, saying why, where the
VM tier cannot run (no qemu, not root, no VM image).
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.env import IMAGE, STORAGE_CLASS, E2EEnv, storage_class
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, DRIVER, NODE_LABELS, image_name, wait_for
from tests.e2e.test_expansion import df_bytes, grow, wait_resized
from tests.e2e.test_volumes import IDLE, delete_claim, fs_type, provision
from tests.vm import kube_disk, network
from tests.vm.conftest import MAX_CONCURRENT_SESSIONS, boot_free_node, image_or_skip
from tests.vm.kube_node import VmKubelet
from tests.vm.machine import VmNode, scaled

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.e2e, pytest.mark.vm, pytest.mark.timeout(900, func_only=True)]

MI = 1 << 20
VM_MEMORY_MB = 3072
"""The guest's Kubernetes node: kubelet, containerd, the node plugin, a test pod and the page cache."""
STAGING_ROOT = "/var/lib/kubelet/plugins/kubernetes.io/csi"
NBD_CLASS = "csi-rbd-sc-nbd"
"""The e2e StorageClass with `mounter: rbd-nbd` (the node's `--mounter=auto` picks krbd)."""


@pytest.fixture(scope="module")
def vm_kube(e2e: E2EEnv) -> Iterator[VmKubelet]:
    image = image_or_skip("VM node")
    assert e2e.image_tar is not None
    started = time.monotonic()
    disk = kube_disk.build(e2e.node.bin_dir / "kubelet", e2e.node.bin_dir / "pause.tar", e2e.image_tar)
    log.info("VM node: Kubernetes disk %s ready after %.0fs", disk, time.monotonic() - started)
    workdir = tempfile.mkdtemp(prefix="vmk-", dir="/tmp")
    vm: VmNode | None = None
    node: VmKubelet | None = None
    try:
        vm = boot_free_node(image, workdir, range(MAX_CONCURRENT_SESSIONS), VM_MEMORY_MB, (str(disk),))
        if vm is None:
            pytest.skip(f"VM node: {MAX_CONCURRENT_SESSIONS} other test sessions run VM nodes on this machine")
        log.info("VM node %d (%s) booted in %.0fs", vm.index, vm.accel, vm.boot_seconds)
        node = VmKubelet(vm, e2e.node.plane)
        started = time.monotonic()
        node.start()
        log.info("VM node %s Ready after %.0fs", node.name, time.monotonic() - started)
        yield node
    finally:
        if node is not None:
            release_node(e2e, node.name)
            node.stop()
        if vm is not None:
            vm.stop()
        network.remove_bridge()
        shutil.rmtree(workdir, ignore_errors=True)


def release_node(e2e: E2EEnv, node: str) -> None:
    """Before the VM goes: delete the test pods a failed test left on it and wait until the
    driver has detached their volumes, so that e2e's uninstall can delete them (a volume still
    attached to a deleted node is never deleted)."""
    try:
        for namespace in e2e.namespaces:
            for pod in e2e.kube.pods(namespace):
                if pod["spec"].get("nodeName") == node:
                    e2e.kube.delete_pod(namespace, pod["metadata"]["name"], timeout=scaled(120))
        wait_for(f"no VolumeAttachment on {node}",
                 lambda: not [a for a in e2e.kube.attachments() if a["spec"].get("nodeName") == node], scaled(120))
    except Exception as error:  # noqa: BLE001 - the test's own failure says more; the teardown goes on
        log.warning("VM node %s: %s", node, error)


def plugin_pod(e2e: E2EEnv, node: str) -> dict[str, Any] | None:
    """The DaemonSet's pod on `node`, once Ready."""
    pods = [pod for pod in e2e.kube.ready_pods(NODE_LABELS) if pod["spec"].get("nodeName") == node]
    return pods[0] if pods else None


def wait_plugin(e2e: E2EEnv, vm_kube: VmKubelet) -> dict[str, Any]:
    def explain() -> str:
        pods = [p for p in e2e.kube.pods(DEPLOY_NAMESPACE, NODE_LABELS) if p["spec"].get("nodeName") == vm_kube.name]
        return "\n".join(f"{p['metadata']['name']}: {json.dumps(p.get('status'))[:1500]}\n"
                         f"{e2e.kube.events(DEPLOY_NAMESPACE, p['metadata']['name'])}" for p in pods) + vm_kube.logs()

    return wait_for(f"the node plugin Ready on {vm_kube.name}", lambda: plugin_pod(e2e, vm_kube.name),
                    scaled(300), interval=2.0, explain=explain)


def controller_logs(e2e: E2EEnv, lines: int = 30) -> str:
    parts = []
    for pod in e2e.kube.pods(DEPLOY_NAMESPACE, CONTROLLER_LABELS):
        name = pod["metadata"]["name"]
        parts.append(f"--- {name} on {pod['spec'].get('nodeName')} (last {lines} lines)\n"
                     + "\n".join(e2e.kube.logs(name).splitlines()[-lines:]))
    return "\n".join(parts)


def krbd_images(vm: VmNode) -> list[str]:
    """Images mapped through krbd in the VM (`rbd device list`)."""
    out = vm.check("rbd device list -t krbd --format json", timeout=60)
    return [entry["name"] for entry in json.loads(out or "[]")]


def nbd_connected(vm: VmNode) -> list[str]:
    """The VM's nbd devices a daemon serves (the kernel shows `pid` only while one is connected)."""
    out = vm.check("cd /sys/block && for pid in nbd*/pid; do [ -e \"$pid\" ] && echo \"${pid%/pid}\"; done; true",
                   timeout=60)
    return out.split()


def vm_data_path(vm: VmNode) -> tuple[list[str], list[str], list[str], list[str]]:
    """What the VM's kernel still holds of volumes: krbd images, /sys/bus/rbd devices, connected
    nbd devices, staging mounts."""
    devices = vm.check("ls /sys/bus/rbd/devices", timeout=60).split()
    staged = [line for line in vm.check("cat /proc/mounts", timeout=60).splitlines() if f" {STAGING_ROOT}/" in line]
    return krbd_images(vm), devices, nbd_connected(vm), staged


def check_mapped(vm: VmNode, mounter: str, image: str) -> str:
    """The device the staging mount of `image` is on, checked against what `mounter` maps with."""
    staged = vm.check(f"findmnt -rn -o SOURCE,TARGET | grep ' {STAGING_ROOT}/' || true", timeout=60).split()
    assert len(staged) == 2, staged
    device = staged[0]
    if mounter == "krbd":
        assert krbd_images(vm) == [image]
        assert device.startswith("/dev/rbd"), staged
        return device
    assert krbd_images(vm) == []
    name = device.removeprefix("/dev/")
    assert name.startswith("nbd") and nbd_connected(vm) == [name], (staged, nbd_connected(vm))
    # The daemon serving it (in the node plugin's container) maps this image.
    daemon = vm.check(f"tr '\\0' ' ' < /proc/$(cat /sys/block/{name}/pid)/cmdline", timeout=60)
    assert daemon.split()[0].endswith("rbd-nbd") and image in daemon, daemon
    # The image's rbd-nbd (Tentacle) binds through the kernel's netlink interface wherever the
    # kernel offers it, `try-netlink` or not: the device has a `backend` (rbd-nbd's cookie), which
    # an ioctl-bound one lacks. So the growth below is that of a netlink-bound device.
    cookie = vm.check(f"cat /sys/block/{name}/backend 2>/dev/null || true", timeout=60).strip()
    assert cookie, f"{device} is bound through ioctl: the growth below no longer covers netlink"
    return device


@pytest.fixture(params=["krbd", "rbd-nbd"])
def mounter(request: pytest.FixtureRequest, e2e: E2EEnv) -> Iterator[tuple[str, str]]:
    """The mapper under test and the StorageClass whose claims it maps: the e2e class (the node's
    `--mounter=auto`, krbd on this kernel) or one like it with `mounter: rbd-nbd`."""
    if request.param == "krbd":
        yield "krbd", STORAGE_CLASS
        return
    doc = storage_class(e2e.ceph, NBD_CLASS)
    doc["parameters"]["mounter"] = "rbd-nbd"
    e2e.kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
    try:
        yield "rbd-nbd", NBD_CLASS
    finally:
        e2e.kube.kubectl("delete", "--ignore-not-found", "storageclass", NBD_CLASS)


def test_node_plugin_runs_on_the_vm_node(e2e: E2EEnv, vm_kube: VmKubelet) -> None:
    pod = wait_plugin(e2e, vm_kube)
    status = pod["status"]["containerStatuses"][0]
    assert status["image"] == IMAGE, status
    wait_for(f"CSINode {vm_kube.name} listing {DRIVER}", lambda: DRIVER in e2e.kube.csinode_drivers(vm_kube.name),
             scaled(120))
    # --mounter=auto on a kernel with rbd.ko: krbd (on the host node it is rbd-fuse).
    with urllib.request.urlopen(f"http://{vm_kube.vm.address}:8680/metrics", timeout=30) as reply:
        metrics = reply.read().decode()
    assert 'cephcsi_node_mapper_info{mapper="krbd",selection="auto"} 1.0' in metrics, \
        [line for line in metrics.splitlines() if "mapper_info" in line]


def test_claim_grows_online_under_a_pod_on_the_vm_node(e2e: E2EEnv, vm_kube: VmKubelet, namespace: str,
                                                       mounter: tuple[str, str]) -> None:
    kube, vm = e2e.kube, vm_kube.vm
    mapper, storage_class_name = mounter
    wait_plugin(e2e, vm_kube)
    token = uuid.uuid4().hex
    try:
        pv = provision(e2e, namespace, "data", storage_class_name, size="64Mi")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{controller_logs(e2e)}") from None
    image = image_name(pv)

    write = (f"echo {token} > /data/token && head -c 4194304 /dev/urandom > /data/blob && "
             f"sha256sum /data/blob > /data/blob.sum && sync && {IDLE}")
    kube.create_pod(namespace, "app", IMAGE, write, "data", node=vm_kube.name)
    kube.wait_pod_ready(namespace, "app", timeout=scaled(300))
    assert kube.wait_written(namespace, "app", "/data/token", timeout=scaled(60)) == token
    assert fs_type(e2e, namespace, "app") == "ext4"
    device = check_mapped(vm, mapper, image)
    before = df_bytes(e2e, namespace, "app")
    assert 0 < before <= 64 * MI
    started_pod = (kube.pod(namespace, "app") or {})["metadata"]["uid"]

    grow(e2e, namespace, "data", 160)
    pv = wait_resized(e2e, namespace, "data", 160)
    assert int(vm.check(f"blockdev --getsize64 {device}", timeout=60)) == 160 * MI, device
    after = df_bytes(e2e, namespace, "app")
    # ext4 grown online by the whole difference, less the metadata of its new block groups
    # (measured: 54.7 MiB -> 144.4 MiB for 64 -> 160 MiB).
    assert before + 80 * MI <= after <= 160 * MI, (before, after)
    assert kube.exec_in(namespace, "app", "cat /data/token").strip() == token
    kube.exec_in(namespace, "app", "sha256sum -c /data/blob.sum && echo more > /data/after-growth && sync")
    pod = kube.pod(namespace, "app") or {}
    assert pod["metadata"]["uid"] == started_pod, "the pod ran through the growth"
    assert all(s.get("restartCount") == 0 for s in pod["status"].get("containerStatuses") or [])

    kube.delete_pod(namespace, "app", timeout=scaled(120))
    # The pod object goes once the kubelet has unpublished; it unstages (unmount, unmap) after.
    wait_for("nothing mapped or staged in the VM", lambda: vm_data_path(vm) == ([], [], [], []), scaled(120),
             interval=2.0, explain=lambda: repr(vm_data_path(vm)))
    delete_claim(e2e, namespace, "data", pv)
