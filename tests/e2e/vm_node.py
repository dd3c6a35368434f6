"""The real-kernel VM node (tests/vm/kube_node.py) joined to a running e2e environment, for the
VM e2e module and the demo: whether this machine can run one (the VM tier's own check: qemu,
root, a built image), and its lifetime — boot, join, and on exit release what pods left there,
leave the control plane, power off. `wait_plugin` waits for the deploy/ DaemonSet's pod on it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from tests.e2e.env import E2EEnv
from tests.e2e.kube import DEPLOY_NAMESPACE, NODE_LABELS, wait_for
from tests.vm import kube_disk, network
from tests.vm.conftest import MAX_CONCURRENT_SESSIONS, boot_free_node, built_image, missing_requirement
from tests.vm.kube_node import VmKubelet
from tests.vm.machine import VmImage, VmNode, scaled

log = logging.getLogger(__name__)

VM_MEMORY_MB = 3072
"""The guest's Kubernetes node: kubelet, containerd, the node plugin, a test pod and the page cache."""


def patience() -> float:
    """How many times the host node's timeouts a step on the VM node gets: an emulated CPU (TCG)
    starts containers and maps and formats devices several times slower, the more so under load."""
    return scaled(2.0)


def vm_image() -> tuple[VmImage | None, str]:
    """The VM image when this machine can run the VM node, else None and why not (the checks
    behind tests/vm/conftest.py's image_or_skip)."""
    reason = missing_requirement()
    if reason:
        return None, reason
    image = built_image()
    if image is None:
        return None, "the VM image is not built for the current tests/vm (run ./scripts/setup.sh)"
    return image, ""


@contextlib.contextmanager
def joined_vm_node(env: E2EEnv, image: VmImage, namespaces: Callable[[], list[str]],
                   memory_mb: int = VM_MEMORY_MB) -> Iterator[VmKubelet | None]:
    """A VM node Ready in `env`'s cluster (None when every VM index on this machine is held).
    On exit the pods of `namespaces()` on it are deleted and their volumes detached first, so the
    driver can still delete those volumes once the node is gone."""
    assert env.image_tar is not None
    started = time.monotonic()
    disk = kube_disk.build(env.node.bin_dir / "kubelet", env.node.bin_dir / "pause.tar", env.image_tar)
    log.info("VM node: Kubernetes disk %s ready after %.0fs", disk, time.monotonic() - started)
    workdir = tempfile.mkdtemp(prefix="vmk-", dir="/tmp")
    vm: VmNode | None = None
    node: VmKubelet | None = None
    try:
        vm = boot_free_node(image, workdir, range(MAX_CONCURRENT_SESSIONS), memory_mb, (str(disk),))
        if vm is None:
            yield None
            return
        log.info("VM node %d (%s) booted in %.0fs", vm.index, vm.accel, vm.boot_seconds)
        node = VmKubelet(vm, env.node.plane)
        started = time.monotonic()
        node.start()
        log.info("VM node %s Ready after %.0fs", node.name, time.monotonic() - started)
        yield node
    finally:
        if node is not None:
            release_node(env, node.name, namespaces())
            node.stop()
            vm = node.vm  # a test may have power-cycled it
        if vm is not None:
            vm.stop()
        network.remove_bridge()
        shutil.rmtree(workdir, ignore_errors=True)


def power_cycle(node: VmKubelet) -> float:
    """Boot a powered-off node's VM again, as the same node (its index: address and hostname),
    without joining it yet (`node.start()` does); the boot's seconds. Its disks start from
    their images (`snapshot=on`): a real node keeps /var/lib/kubelet over a reboot, this one
    comes back as if reinstalled, and what memory held (mappings, page cache) is gone on both."""
    old = node.vm
    assert not old.running(), "power the node off first (VmNode.power_off_hard)"
    vm = VmNode(old.image, old.index, old.workdir, old.repo, memory_mb=old.memory_mb, disks=old.disks)
    vm.start()
    node.replace_vm(vm)
    return vm.boot_seconds


def release_node(env: E2EEnv, node: str, namespaces: list[str]) -> None:
    """Before the VM goes: delete the pods of `namespaces` left on it and wait until the driver
    has detached their volumes (a volume still attached to a deleted node is never deleted)."""
    try:
        for namespace in namespaces:
            for pod in env.kube.pods(namespace):
                if pod["spec"].get("nodeName") == node:
                    env.kube.delete_pod(namespace, pod["metadata"]["name"], timeout=scaled(120))
        wait_for(f"no VolumeAttachment on {node}",
                 lambda: not [a for a in env.kube.attachments() if a["spec"].get("nodeName") == node], scaled(120))
    except Exception as error:  # noqa: BLE001 - the caller's own failure says more; the teardown goes on
        log.warning("VM node %s: %s", node, error)


def plugin_pod(env: E2EEnv, node: str) -> dict[str, Any] | None:
    """The DaemonSet's pod on `node`, once Ready."""
    pods = [pod for pod in env.kube.ready_pods(NODE_LABELS) if pod["spec"].get("nodeName") == node]
    return pods[0] if pods else None


def wait_plugin(env: E2EEnv, vm_kube: VmKubelet) -> dict[str, Any]:
    def explain() -> str:
        pods = [p for p in env.kube.pods(DEPLOY_NAMESPACE, NODE_LABELS) if p["spec"].get("nodeName") == vm_kube.name]
        return "\n".join(f"{p['metadata']['name']}: {json.dumps(p.get('status'))[:1500]}\n"
                         f"{env.kube.events(DEPLOY_NAMESPACE, p['metadata']['name'])}" for p in pods) + vm_kube.logs()

    return wait_for(f"the node plugin Ready on {vm_kube.name}", lambda: plugin_pod(env, vm_kube.name),
                    scaled(300), interval=2.0, explain=explain)
