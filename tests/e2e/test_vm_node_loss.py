"""Node loss through the real Kubernetes flow on real kernels (issue 34): two VM kubelet nodes
(tests/vm/kube_node.py) join the e2e control plane, whose kube-controller-manager runs every
controller (taint eviction, pod GC, attach-detach) and whose driver is the deploy/ install.

A one-replica StatefulSet writes numbered records to a ReadWriteOnce claim on node A, each
fsynced before the pod logs `ack N`. Then, as docs/troubleshooting.md "Node loss" tells an
operator:
1. A is powered off hard (qemu killed: nothing flushed or unmapped) right after the test read
   the pod's last acknowledgement; Kubernetes marks it NotReady;
2. the operator taints A `node.kubernetes.io/out-of-service`: the pod is evicted and
   force-deleted, the attach-detach controller detaches at once, and the embedded attacher
   blocklists A's address before it releases the attachment;
3. the StatefulSet's pod starts on node B (cordoned until now, so the pod went to A first) and
   reads every record A had acknowledged;
4. A boots again and its kubelet rejoins (the node still out of service); A tries to write to
   the image through librbd (the node-stage cephx identity, A's address): refused, and the image
   holds nothing of it;
5. the operator removes the taint: the attacher lifts A's blocklist entry, the node plugin
   starts on A, and A has nothing mapped, opened or staged.
The claim is created by a class whose `controller-publish` secret names a cephx user with the
blocklist cap (the docs' `ceph auth caps` line); the rest of the class is the example's.

Both mappers: krbd (the node's `--mounter=auto` on this kernel) and rbd-nbd (`mounter:
rbd-nbd`, an exclusive map of an `exclusive-lock` image). Long tier: two VM nodes under TCG,
about 8 minutes per mapper plus both boots. Runs after the other e2e modules (not in
conftest's MODULE_ORDER), like test_vm_node.py.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import pytest
import yaml

from tests.e2e.env import IMAGE, SECRET, E2EEnv, storage_class
from tests.e2e.kube import DEPLOY_NAMESPACE, wait_for
from tests.e2e.test_vm_node import controller_logs, vm_data_path, wait_vm_clean
from tests.e2e.test_volumes import IDLE, delete_claim, provision, read_image
from tests.e2e.vm_node import joined_vm_node, power_cycle, wait_plugin
from tests.vm.conftest import image_or_skip
from tests.vm.kube_node import VmKubelet
from tests.vm.machine import scaled

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.e2e, pytest.mark.vm, pytest.mark.long, pytest.mark.timeout(1800, func_only=True)]

MI = 1 << 20
TAINT = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
FENCE_USER = "csi-fence"
FENCE_SECRET = "csi-rbd-secret-fence"
CLASSES = {"krbd": "csi-rbd-sc-fence", "rbd-nbd": "csi-rbd-sc-fence-nbd"}
RECORD = re.compile(r"^record (\d{8})$", re.MULTILINE)
ACK = re.compile(r"^ack (\d+)$", re.MULTILINE)
WRITER = f"""if [ -e /data/records ]; then {IDLE}; fi
exec python3 -u -c '
import os, time
fd = os.open("/data/records", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
n = 0
while True:
    os.write(fd, b"record %08d\\n" % n)
    os.fsync(fd)
    print("ack", n, flush=True)
    n += 1
    time.sleep(0.02)
'"""
"""Appends fsynced records and acknowledges each on stdout; where the file exists already (the
pod restarted on another node) it only idles, so what that node reads is what A left."""


@dataclass(frozen=True)
class Nodes:
    a: VmKubelet
    """The node that is lost."""
    b: VmKubelet


@pytest.fixture(scope="module")
def fence_classes(e2e: E2EEnv) -> Iterator[None]:
    """The cephx user allowed to blocklist (docs/troubleshooting.md's caps), its Secret, and a
    class per mapper naming it as the controller-publish secret."""
    image_or_skip("VM node")
    kube, ceph = e2e.kube, e2e.ceph
    pools = f"profile rbd pool={ceph.pool}"
    key = ceph.admin("ceph", "auth", "get-or-create-key", f"client.{FENCE_USER}",
                     "mon", 'profile rbd, allow command "osd blocklist"', "osd", pools, "mgr", pools).strip()
    kube.core.create_namespaced_secret(DEPLOY_NAMESPACE, {  # through the API: no key in argv
        "metadata": {"name": FENCE_SECRET}, "stringData": {"userID": FENCE_USER, "userKey": key}})
    for mapper, name in CLASSES.items():
        doc = storage_class(e2e.ceph, name)
        params = doc["parameters"]
        assert params["csi.storage.k8s.io/provisioner-secret-name"] == SECRET
        params["csi.storage.k8s.io/controller-publish-secret-name"] = FENCE_SECRET
        params["csi.storage.k8s.io/controller-publish-secret-namespace"] = DEPLOY_NAMESPACE
        if mapper == "rbd-nbd":
            params["mounter"] = "rbd-nbd"
            params["imageFeatures"] = "layering,exclusive-lock"
        kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
    try:
        yield
    finally:
        for name in CLASSES.values():
            kube.kubectl("delete", "--ignore-not-found", "storageclass", name)
        if not [pv for pv in kube.pvs() if pv["spec"].get("storageClassName") in CLASSES.values()]:
            kube.kubectl("-n", DEPLOY_NAMESPACE, "delete", "--ignore-not-found", "secret", FENCE_SECRET)


@pytest.fixture(scope="module")
def nodes(e2e: E2EEnv, fence_classes: None) -> Iterator[Nodes]:
    image = image_or_skip("VM node")
    with contextlib.ExitStack() as stack:
        joined = []
        for _ in range(2):
            node = stack.enter_context(joined_vm_node(e2e, image, lambda: e2e.namespaces))
            if node is None:
                pytest.skip("VM node loss: two free VM node indexes needed; other sessions hold them")
            joined.append(node)
        for node in joined:
            wait_plugin(e2e, node)
        yield Nodes(*joined)


def blocklisted(e2e: E2EEnv, address: str) -> list[str]:
    text = e2e.ceph.admin("ceph", "osd", "blocklist", "ls", "--format", "json").strip() or "[]"
    entries, _ = json.JSONDecoder().raw_decode(text)
    return [str(e["addr"]) for e in entries if str(e["addr"]).split(":")[0] == address]


def whole_node(entries: list[str]) -> list[str]:
    """The entries that fence every client of an address (`<ip>:0/0` or the bare address)."""
    return [entry for entry in entries if ":" not in entry or entry.endswith(":0/0")]


def node_ready(e2e: E2EEnv, name: str) -> bool:
    node = e2e.kube.node(name) or {}
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def set_taint(e2e: E2EEnv, name: str, on: bool) -> None:
    node = e2e.kube.node(name) or {}
    others = [t for t in (node.get("spec") or {}).get("taints") or [] if t["key"] != TAINT["key"]]
    e2e.kube.core.patch_node(name, {"spec": {"taints": [*others, TAINT] if on else others or None}})


def cordon(e2e: E2EEnv, name: str, on: bool) -> None:
    e2e.kube.core.patch_node(name, {"spec": {"unschedulable": on}})


def writer_set(names: list[str]) -> dict[str, Any]:
    """A one-replica StatefulSet running WRITER on the claim `data`, allowed on `names` only."""
    container = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", WRITER],
                 "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]} for name in names]}}}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "writer"}, "spec": {
        "replicas": 1, "serviceName": "writer", "selector": {"matchLabels": {"app": "writer"}},
        "template": {"metadata": {"labels": {"app": "writer"}}, "spec": {
            "affinity": affinity, "containers": [container], "terminationGracePeriodSeconds": 5,
            "enableServiceLinks": False, "automountServiceAccountToken": False,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}}}


def running_on(e2e: E2EEnv, namespace: str, node: str) -> dict[str, Any] | None:
    """The writer's pod, Ready on `node`."""
    pod = e2e.kube.pod(namespace, "writer-0")
    if not pod or pod["metadata"].get("deletionTimestamp") or pod["spec"].get("nodeName") != node:
        return None
    conditions = (pod.get("status") or {}).get("conditions") or []
    return pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None


def last_ack(e2e: E2EEnv, namespace: str) -> int:
    acks = [int(n) for n in ACK.findall(e2e.kube.logs("writer-0", namespace))]
    return max(acks) if acks else -1


def try_write_from(e2e: E2EEnv, node: VmKubelet, image: str, token: str) -> str:
    """What A's librbd says when it writes `token` into the image with the node-stage identity
    (the key through a 0600 file in the control share, removed at once)."""
    vm, ceph = node.vm, e2e.ceph
    key_name = f"key-{uuid.uuid4().hex[:8]}"
    with open(os.open(vm.host_path(key_name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w",
              encoding="utf-8") as handle:
        handle.write(ceph.key)
    try:
        result = vm.run(f"python3 {vm.repo}/tests/vm/fenced_write.py {ceph.mon_host} {ceph.pool} {image} "
                        f"{ceph.user} {vm.guest_path(key_name)} {token}", timeout=120)
    finally:
        os.unlink(vm.host_path(key_name))
    assert not result.ok, f"the fenced node wrote to the image: {result.stdout} {result.stderr[-2000:]}"
    return (result.stdout.strip() or result.stderr.strip()[-500:])


def bring_back(e2e: E2EEnv, node: VmKubelet) -> None:
    """A powered-off node booted and joined again, untainted, with its node plugin Ready."""
    if not node.vm.running():
        power_cycle(node)
    if not node_ready(e2e, node.name):
        node.start()
    set_taint(e2e, node.name, False)
    wait_plugin(e2e, node)


@pytest.mark.parametrize("mapper", ["krbd", "rbd-nbd"])
def test_powered_off_node_is_fenced_its_pod_moves_with_every_acknowledged_write(
        e2e: E2EEnv, nodes: Nodes, namespace: str, mapper: str) -> None:
    kube, ceph, a, b = e2e.kube, e2e.ceph, nodes.a, nodes.b
    bring_back(e2e, a)
    address = a.vm.address
    pv = provision(e2e, namespace, "data", CLASSES[mapper], size="64Mi")
    image = pv["spec"]["csi"]["volumeAttributes"]["imageName"]
    cordon(e2e, b.name, True)

    def explain() -> str:
        attachments = [(x["spec"]["nodeName"], x.get("status")) for x in kube.attachments()]
        return f"{kube.events(namespace, 'writer-0')}\nattachments: {attachments}\n{controller_logs(e2e)}"

    try:
        kube.apps.create_namespaced_stateful_set(namespace, writer_set([a.name, b.name]))
        wait_for(f"the writer Ready on {a.name}", lambda: running_on(e2e, namespace, a.name), scaled(600),
                 interval=2.0, explain=explain)
        wait_for("100 records acknowledged", lambda: last_ack(e2e, namespace) >= 100, scaled(180), interval=2.0)

        # 1. Power off, right after reading what A acknowledged (each ack follows its fsync).
        acked = last_ack(e2e, namespace)
        a.vm.power_off_hard()
        wait_for(f"{a.name} NotReady", lambda: not node_ready(e2e, a.name), scaled(180), interval=2.0)

        # 2.-3. Out of service: fenced, detached, and the pod starts on B with every acknowledged record.
        set_taint(e2e, a.name, True)
        cordon(e2e, b.name, False)
        wait_for(f"the writer Ready on {b.name}", lambda: running_on(e2e, namespace, b.name), scaled(900),
                 interval=2.0, explain=explain)
        fenced = blocklisted(e2e, address)
        assert whole_node(fenced), f"{a.name}'s address {address} is not blocklisted as a whole: {fenced}"
        assert not [x for x in kube.attachments() if x["spec"]["nodeName"] == a.name]
        text = kube.exec_in(namespace, "writer-0", "cat /data/records", timeout=120)
        found = {int(n) for n in RECORD.findall(text)}
        lost = sorted(set(range(acked + 1)) - found)
        assert not lost, f"acknowledged on {a.name} but not read on {b.name}: {lost[:20]} (of {acked + 1})"
        log.info("%s: %d records acknowledged on %s before its power-off, all %d read on %s; fenced: %s",
                 mapper, acked + 1, a.name, len(found), b.name, fenced)

        # 4. A boots again and its kubelet rejoins (the node still out of service); A tries to
        # write to the image: refused, and nothing of it reaches the image.
        boot = power_cycle(a)
        a.start()
        token = f"fenced-{uuid.uuid4().hex}"
        refusal = try_write_from(e2e, a, image, token)
        log.info("%s: %s booted again in %.0fs; its write: %s", mapper, a.name, boot, refusal)
        # ESHUTDOWN (108): the OSDs refuse a blocklisted client (not a timeout, not a missing key).
        assert "refused" in refusal and "errno 108" in refusal, refusal
        assert token.encode() not in read_image(e2e, image, 64 * MI)

        # 5. The taint goes: A unfenced, its node plugin back, nothing mapped there.
        set_taint(e2e, a.name, False)
        # The whole node's entry goes. One client instance of A's may stay listed until it expires:
        # the lock break of B's exclusive map blocklists the dead lock owner (librbd, rbd-nbd case),
        # which no rebooted client of A's can be.
        wait_for(f"{a.name}'s blocklist entry lifted", lambda: not whole_node(blocklisted(e2e, address)),
                 scaled(120), interval=2.0, explain=lambda: f"{blocklisted(e2e, address)}\n{controller_logs(e2e)}")
        assert set(blocklisted(e2e, address)) <= set(fenced), (blocklisted(e2e, address), fenced)
        wait_plugin(e2e, a)
        assert vm_data_path(a.vm) == ([], [], [], [], [])
        assert running_on(e2e, namespace, b.name), "the pod on B went while A came back"

        kube.apps.delete_namespaced_stateful_set("writer", namespace)
        wait_for("the writer gone", lambda: kube.pod(namespace, "writer-0") is None, scaled(180), interval=2.0)
        wait_vm_clean(b.vm)
        delete_claim(e2e, namespace, "data", pv)
    finally:
        cordon(e2e, b.name, False)
        with contextlib.suppress(kubernetes.client.ApiException):
            kube.apps.delete_namespaced_stateful_set("writer", namespace)
        if not a.vm.running() or whole_node(blocklisted(e2e, address)):
            # A failed step left A down or fenced: back for the next case (and the teardown).
            try:
                bring_back(e2e, a)
            finally:
                for entry in blocklisted(e2e, address):
                    ceph.admin("ceph", "osd", "blocklist", "rm", entry)
