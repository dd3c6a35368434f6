"""The Kubernetes claim flow on a real kernel: a VM node (stock Debian kernel, tests/vm) runs
containerd and a kubelet that join the e2e control plane (tests/vm/kube_node.py); the deploy/
DaemonSet puts the shipped image there as the node plugin, whose `--mounter=auto` picks krbd.

A claim is bound, a pod pinned to the VM node writes to it through a krbd device, the claim is
grown while the pod runs (ControllerExpandVolume by the embedded resizer, then the kubelet's
NodeExpandVolume: online resize2fs, which the host node cannot do) and the pod sees the bigger
filesystem; then pod and claim go and nothing is left mapped or mounted in the VM.

The krbd claim is encrypted (issue 33), as a user sets it up from docs/encryption.md: the
example KMS ConfigMap (deploy/examples/kms-config.yaml, its `metadata` KMS), a StorageClass with
`encrypted: "true"` and that `encryptionKMSID`, and the passphrase in the class's Secret. The
shipped image's cryptsetup formats LUKS2 at the first stage, the image holds only ciphertext, the
claim grows online through `cryptsetup resize`, a VolumeSnapshot of it restores into a claim a
second pod reads the data back from, and neither the class passphrase nor the volume's own
(unwrapped from the image metadata) appears in the node or controller plugin logs. Nothing of
either claim is left: images, krbd devices, dm-crypt mappings.

The encrypted class also limits write IOPS (`baseWriteIops`, QOS_WRITE_IOPS) and names a
node-publish secret, so krbd QoS (cephcsi.node.io_max) is in force: the pod's cgroup has the
io.max rule for the dm-crypt device at publish, its 4 KiB O_DIRECT writes run at most 1.5× the
limit, and faster once the rule is taken off by hand (what makes them slow is the rule).

The same flow (without the snapshot) runs again, unencrypted, through rbd-nbd, chosen by a
StorageClass's `mounter: rbd-nbd`; there the same read of the image finds the plain text, so the
ciphertext check above can fail. The rbd-nbd daemon runs in the node plugin's container and binds the device through the kernel's netlink interface
(Tentacle's rbd-nbd always does where the kernel has it); on resize it reconfigures the device's
size through netlink, which Linux 6.1 honours, so the filesystem grows online there too.

The demo (scripts/demo.sh --node=vm) runs there too: tests/e2e/demo.py's steps with its pods
pinned to the VM node, checked as tests/e2e/test_demo.py checks them on the host node, and its
claims mapped by krbd.

Runs after every other e2e scenario (the module is not in conftest's MODULE_ORDER): while the VM
node exists, the scheduler could place other scenarios' pods on it. Skips, saying why, where the
VM tier cannot run (no qemu, not root, no VM image).
"""
from __future__ import annotations

import json
import logging
import secrets
import io
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client
import pytest
import yaml

from cephcsi.encryption.kms.secrets import unwrap
from cephcsi.encryption.volume_keys import DEK_KEY, ENCRYPTED, STATE_KEY
from tests.e2e.checks import ceph_volume
from tests.e2e.demo import Demo
from tests.e2e.env import DEPLOY, IMAGE, SECRET, STORAGE_CLASS, E2EEnv, storage_class
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, DRIVER, NODE_LABELS, image_name, wait_for
from tests.e2e.snapshot_addon import GROUP, VERSION, example_snapshot_class, start_snapshot_addon
from tests.e2e.test_expansion import df_bytes, grow, wait_resized
from tests.e2e.test_qos import write_rate
from tests.e2e.test_snapshots import READY_TIMEOUT, content, snapshot
from tests.e2e.test_volumes import IDLE, delete_claim, fs_type, provision, read_image
from tests.e2e.test_demo import check_demo
from tests.e2e.vm_node import joined_vm_node, patience, wait_plugin
from tests.vm.conftest import MAX_CONCURRENT_SESSIONS, image_or_skip
from tests.vm.kube_node import VmKubelet
from tests.vm.machine import VmNode, scaled

log = logging.getLogger(__name__)

# In the long tier: about 8 minutes of the e2e node under TCG, which CI's 90 minutes cannot hold beside
# the rest; the ci tier proves the real-kernel paths through tests/vm and the kubelet flow on the host node.
pytestmark = [pytest.mark.e2e, pytest.mark.vm, pytest.mark.long, pytest.mark.timeout(900, func_only=True)]

MI = 1 << 20
STAGING_ROOT = "/var/lib/kubelet/plugins/kubernetes.io/csi"
NBD_CLASS = "csi-rbd-sc-nbd"
"""The e2e StorageClass with `mounter: rbd-nbd` (the node's `--mounter=auto` picks krbd)."""
LUKS_CLASS = "csi-rbd-sc-luks"
"""The e2e StorageClass made encrypted as docs/encryption.md says (krbd through `--mounter=auto`)."""
LUKS_SECRET = "csi-rbd-secret-luks"
"""The class's Secret: the e2e cephx user plus `encryptionPassphrase`."""
LUKS_SNAPSHOT_CLASS = "csi-rbd-snapclass-luks"
KMS_EXAMPLE = DEPLOY / "examples" / "kms-config.yaml"
KMS_ID = "secrets-metadata-test"
"""The example's `metadata` KMS without secretName: the per-volume passphrase is wrapped with the
StorageClass Secret's encryptionPassphrase and kept in the image metadata."""
KMS_FILE = "/etc/ceph-csi-encryption-kms-config/config.json"
LUKS_MAGIC = b"LUKS\xba\xbe"
QOS_WRITE_IOPS = 40
"""The encrypted class's write IOPS limit, enforced for krbd by the pod cgroup's io.max."""


@dataclass(frozen=True)
class Luks:
    """The encrypted class's set-up: its names and the Secret's passphrase."""

    storage_class: str
    snapshot_class: str
    passphrase: str = field(repr=False)  # never in a failure report
    example_snapshot_class: str = ""
    """The add-on's VolumeSnapshotClass of deploy/examples (unencrypted), for the demo."""


@pytest.fixture(scope="module")
def luks(e2e: E2EEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Luks]:
    """The KMS ConfigMap of deploy/examples, the class's Secret and StorageClass, the snapshot
    add-on (with the example VolumeSnapshotClass) and a VolumeSnapshotClass with the same Secret
    (a snapshot re-keeps the passphrase). Made before the VM node boots, so its plugin starts
    with the ConfigMap mounted."""
    image_or_skip("VM node")  # skip before anything is made
    kube, ceph = e2e.kube, e2e.ceph
    kms_config = yaml.safe_load(KMS_EXAMPLE.read_text())
    assert kms_config["metadata"]["namespace"] == DEPLOY_NAMESPACE
    assert json.loads(kms_config["data"]["config.json"])[KMS_ID]["encryptionKMSType"] == "metadata"
    kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(kms_config))
    passphrase = secrets.token_urlsafe(24)
    kube.core.create_namespaced_secret(DEPLOY_NAMESPACE, {  # through the API: no passphrase in argv
        "metadata": {"name": LUKS_SECRET},
        "stringData": {"userID": ceph.user, "userKey": ceph.key, "encryptionPassphrase": passphrase}})
    doc = storage_class(ceph, LUKS_CLASS)
    params = doc["parameters"]
    params.update({"encrypted": "true", "encryptionKMSID": KMS_ID})
    for key, value in list(params.items()):
        if key.endswith("-secret-name"):
            assert value == SECRET, (key, value)
            params[key] = LUKS_SECRET
    # krbd QoS: publish reads the image's limits with the node-publish secret.
    params["csi.storage.k8s.io/node-publish-secret-name"] = LUKS_SECRET
    params["csi.storage.k8s.io/node-publish-secret-namespace"] = params["csi.storage.k8s.io/node-stage-secret-namespace"]
    params["baseWriteIops"] = str(QOS_WRITE_IOPS)
    kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
    addon = start_snapshot_addon(e2e, tmp_path_factory.mktemp("snapctl-vm") / "snapshot-controller.log")
    custom = kubernetes.client.CustomObjectsApi(kube.api)
    try:
        snapclass = example_snapshot_class(ceph.cluster_id)
        snapclass["metadata"]["name"] = LUKS_SNAPSHOT_CLASS
        snapclass["parameters"]["csi.storage.k8s.io/snapshotter-secret-name"] = LUKS_SECRET
        custom.create_cluster_custom_object(GROUP, VERSION, "volumesnapshotclasses", snapclass)
        yield Luks(LUKS_CLASS, LUKS_SNAPSHOT_CLASS, passphrase, addon.class_name)
    finally:
        try:
            addon.stop()
        finally:
            kube.kubectl("delete", "--ignore-not-found", "volumesnapshotclass", LUKS_SNAPSHOT_CLASS)
            kube.kubectl("delete", "--ignore-not-found", "storageclass", LUKS_CLASS)
            # A claim a failed test left is deleted at e2e's uninstall, which needs the Secret
            # (and the KMS section the volume names); the namespace goes with the e2e node.
            if not [pv for pv in kube.pvs() if pv["spec"].get("storageClassName") == LUKS_CLASS]:
                kube.kubectl("-n", DEPLOY_NAMESPACE, "delete", "--ignore-not-found", "secret", LUKS_SECRET)
                kube.kubectl("-n", DEPLOY_NAMESPACE, "delete", "--ignore-not-found", "configmap",
                             kms_config["metadata"]["name"])


@pytest.fixture(scope="module")
def vm_kube(e2e: E2EEnv, luks: Luks) -> Iterator[VmKubelet]:
    image = image_or_skip("VM node")
    with joined_vm_node(e2e, image, lambda: e2e.namespaces) as node:
        if node is None:
            pytest.skip(f"VM node: {MAX_CONCURRENT_SESSIONS} other test sessions run VM nodes on this machine")
        yield node


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


def crypt_mappings(vm: VmNode) -> dict[str, tuple[int, list[str]]]:
    """The VM's device-mapper devices: name -> (size in bytes, the block devices under it)."""
    out = vm.check("for d in /sys/block/dm-*; do [ -e \"$d/dm/name\" ] && "
                   "echo \"$(cat $d/dm/name) $(cat $d/size) $(ls $d/slaves | tr '\\n' ' ')\"; done; true",
                   timeout=60)
    found = {}
    for line in out.splitlines():
        name, sectors, *slaves = line.split()
        found[name] = (int(sectors) * 512, slaves)
    return found


def vm_data_path(vm: VmNode) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    """What the VM's kernel still holds of volumes: krbd images, /sys/bus/rbd devices, connected
    nbd devices, staging mounts, device-mapper devices (dm-crypt mappings)."""
    # No rbd module loaded yet (nothing mapped since boot): no /sys/bus/rbd.
    devices = vm.check("[ ! -d /sys/bus/rbd ] || ls /sys/bus/rbd/devices", timeout=60).split()
    staged = [line for line in vm.check("cat /proc/mounts", timeout=60).splitlines() if f" {STAGING_ROOT}/" in line]
    return krbd_images(vm), devices, nbd_connected(vm), staged, sorted(crypt_mappings(vm))


def wait_vm_clean(vm: VmNode) -> None:
    wait_for("nothing mapped, open or staged in the VM", lambda: vm_data_path(vm) == ([], [], [], [], []),
             scaled(120), interval=2.0, explain=lambda: repr(vm_data_path(vm)))


def check_mapped(vm: VmNode, mapper: str, image: str, crypt: str = "") -> str:
    """The device `mapper` maps `image` on, checked against the staging mount: on that device,
    or on the dm-crypt mapping `crypt` (a LUKS device opened on it) when given."""
    staged = vm.check(f"findmnt -rn -o SOURCE,TARGET | grep ' {STAGING_ROOT}/' || true", timeout=60).split()
    assert len(staged) == 2, staged
    source = staged[0]
    if crypt:
        assert source == f"/dev/mapper/{crypt}", staged
        mappings = crypt_mappings(vm)
        assert list(mappings) == [crypt], mappings
        backing = mappings[crypt][1]
        assert len(backing) == 1, mappings
        device = f"/dev/{backing[0]}"
    else:
        assert crypt_mappings(vm) == {}
        device = source
    if mapper == "krbd":
        assert krbd_images(vm) == [image]
        assert device.startswith("/dev/rbd"), (staged, device)
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


@dataclass(frozen=True)
class Case:
    """A mapper, the StorageClass whose claims it maps, and the encrypted class's set-up when
    that class is encrypted."""

    mapper: str
    storage_class: str
    luks: Luks | None = None


@pytest.fixture(params=["krbd", "rbd-nbd"])
def mounter(request: pytest.FixtureRequest, e2e: E2EEnv, luks: Luks) -> Iterator[Case]:
    """krbd: the encrypted class (the node's `--mounter=auto`, krbd on this kernel); rbd-nbd: one
    like the e2e class with `mounter: rbd-nbd`."""
    if request.param == "krbd":
        yield Case("krbd", luks.storage_class, luks)
        return
    doc = storage_class(e2e.ceph, NBD_CLASS)
    doc["parameters"]["mounter"] = "rbd-nbd"
    e2e.kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
    try:
        yield Case("rbd-nbd", NBD_CLASS)
    finally:
        e2e.kube.kubectl("delete", "--ignore-not-found", "storageclass", NBD_CLASS)


def image_meta(e2e: E2EEnv, image: str) -> dict[str, str]:
    out = e2e.ceph.admin("rbd", "image-meta", "list", f"{e2e.ceph.pool}/{image}", "--format", "json")
    return dict(json.loads(out or "{}"))


def volume_passphrase(e2e: E2EEnv, luks: Luks, pv: dict[str, Any]) -> str:
    """The volume's LUKS passphrase, unwrapped from its image metadata with the class Secret's
    (the `metadata` KMS); checks the state the node left."""
    meta = image_meta(e2e, image_name(pv))
    assert meta.get(STATE_KEY) == ENCRYPTED, meta
    return unwrap(luks.passphrase, pv["spec"]["csi"]["volumeHandle"], meta[DEK_KEY], "the test's Secret")


def wait_kms_config(e2e: E2EEnv, pod: dict[str, Any]) -> None:
    """The KMS ConfigMap's file in the pod (the kubelet projects a new ConfigMap on its next sync)."""
    name = pod["metadata"]["name"]
    wait_for(f"{KMS_FILE} in {name}", lambda: KMS_ID in e2e.kube.exec_in(
        DEPLOY_NAMESPACE, name, f"cat {KMS_FILE} 2>/dev/null || true"), scaled(120), interval=2.0)


def create_snapshot(e2e: E2EEnv, namespace: str, claim: str, snapshot_class: str) -> str:
    """A VolumeSnapshot `snap` of the claim, readyToUse; its content's name."""
    custom = kubernetes.client.CustomObjectsApi(e2e.kube.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VolumeSnapshot", "metadata": {"name": "snap"},
        "spec": {"volumeSnapshotClassName": snapshot_class, "source": {"persistentVolumeClaimName": claim}}})
    wait_for("VolumeSnapshot readyToUse",
             lambda: (snapshot(custom, namespace, "snap").get("status") or {}).get("readyToUse") is True,
             READY_TIMEOUT, interval=1.0,
             explain=lambda: f"{snapshot(custom, namespace, 'snap').get('status')}\n"
                             f"{e2e.kube.events(namespace, 'snap')}\n{controller_logs(e2e)}")
    return str(snapshot(custom, namespace, "snap")["status"]["boundVolumeSnapshotContentName"])


def delete_snapshot(e2e: E2EEnv, namespace: str, content_name: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(e2e.kube.api)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", "snap")
    wait_for("VolumeSnapshot and its content deleted",
             lambda: not snapshot(custom, namespace, "snap") and not content(custom, content_name), timeout=120,
             explain=lambda: repr(content(custom, content_name).get("status")))


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
                                                       mounter: Case) -> None:
    kube, vm, luks = e2e.kube, vm_kube.vm, mounter.luks
    plugin = wait_plugin(e2e, vm_kube)
    if luks is not None:
        for pod in [plugin, *kube.ready_pods(CONTROLLER_LABELS)]:
            wait_kms_config(e2e, pod)
    token = uuid.uuid4().hex
    try:
        pv = provision(e2e, namespace, "data", mounter.storage_class, size="64Mi")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{controller_logs(e2e)}") from None
    image = image_name(pv)
    crypt = f"luks-rbd-{pv['spec']['csi']['volumeHandle']}" if luks else ""

    write = (f"echo {token} > /data/token && head -c 4194304 /dev/urandom > /data/blob && "
             f"sha256sum /data/blob > /data/blob.sum && sync && {IDLE}")
    kube.create_pod(namespace, "app", IMAGE, write, "data", node=vm_kube.name)
    kube.wait_pod_ready(namespace, "app", timeout=scaled(300))
    assert kube.wait_written(namespace, "app", "/data/token", timeout=scaled(60)) == token
    assert fs_type(e2e, namespace, "app") == "ext4"
    device = check_mapped(vm, mounter.mapper, image, crypt)
    if luks:
        check_io_max(e2e, vm, namespace, "app", crypt)
    # The pod's sync reached the image: what Ceph holds is ciphertext behind a LUKS header on
    # the encrypted claim, and the plain token on the other (the check can fail).
    written = read_image(e2e, image, 64 * MI)
    if luks:
        assert written.startswith(LUKS_MAGIC), written[:16]
        assert token.encode() not in written, "the token is in the encrypted image in plain text"
        header = 64 * MI - crypt_mappings(vm)[crypt][0]
        assert header > 0
    else:
        assert token.encode() in written, "the unencrypted image does not hold the token the pod synced"
    before = df_bytes(e2e, namespace, "app")
    assert 0 < before <= 64 * MI
    started_pod = (kube.pod(namespace, "app") or {})["metadata"]["uid"]

    grow(e2e, namespace, "data", 160)
    pv = wait_resized(e2e, namespace, "data", 160)
    assert int(vm.check(f"blockdev --getsize64 {device}", timeout=60)) == 160 * MI, device
    if luks:
        # The dm-crypt mapping grew with its device (`cryptsetup resize` at NodeExpandVolume).
        assert crypt_mappings(vm)[crypt][0] == 160 * MI - header
    after = df_bytes(e2e, namespace, "app")
    # ext4 grown online by the whole difference, less the metadata of its new block groups
    # (measured: 54.7 MiB -> 144.4 MiB for 64 -> 160 MiB).
    assert before + 80 * MI <= after <= 160 * MI, (before, after)
    assert kube.exec_in(namespace, "app", "cat /data/token").strip() == token
    kube.exec_in(namespace, "app", "sha256sum -c /data/blob.sum && echo more > /data/after-growth && sync")
    pod = kube.pod(namespace, "app") or {}
    assert pod["metadata"]["uid"] == started_pod, "the pod ran through the growth"
    assert all(s.get("restartCount") == 0 for s in pod["status"].get("containerStatuses") or [])

    content_name = passphrase = ""
    if luks:  # a snapshot of the grown claim while its pod runs (after the pod's sync)
        passphrase = volume_passphrase(e2e, luks, pv)
        content_name = create_snapshot(e2e, namespace, "data", luks.snapshot_class)

    kube.delete_pod(namespace, "app", timeout=scaled(120))
    # The pod object goes once the kubelet has unpublished; it unstages (unmount, close, unmap) after.
    wait_vm_clean(vm)
    if luks:
        restore_and_read(e2e, vm_kube, namespace, luks, token, passphrase)
        delete_snapshot(e2e, namespace, content_name)
    if luks:
        for pod in [plugin, *kube.pods(DEPLOY_NAMESPACE, CONTROLLER_LABELS)]:
            name = pod["metadata"]["name"]
            text = kube.logs(name)
            assert text.strip(), f"no log from {name}"
            assert luks.passphrase not in text, f"the class Secret's encryptionPassphrase is in {name}'s log"
            assert passphrase not in text, f"the volume's LUKS passphrase is in {name}'s log"
    delete_claim(e2e, namespace, "data", pv)


def check_io_max(e2e: E2EEnv, vm: VmNode, namespace: str, pod: str, crypt: str) -> None:
    """The pod's cgroup limits the dm-crypt device its filesystem is on to the class's write
    IOPS, and that rule is what holds its O_DIRECT writes back (~15 s)."""
    uid = (e2e.kube.pod(namespace, pod) or {})["metadata"]["uid"]
    majmin = vm.check(f"lsblk -dno MAJ:MIN /dev/mapper/{crypt}", timeout=60).strip()
    found = vm.check(f"ls -d /sys/fs/cgroup/kubepods/pod{uid} /sys/fs/cgroup/kubepods/*/pod{uid} 2>/dev/null; true",
                     timeout=60).split()
    assert len(found) == 1, f"pod {uid}'s cgroup: {found}"
    io_max = found[0] + "/io.max"
    rule = f"{majmin} rbps=max wbps=max riops=max wiops={QOS_WRITE_IOPS}"
    assert rule in vm.check(f"cat {io_max}", timeout=60).splitlines(), vm.check(f"cat {io_max}", timeout=60)
    write_rate(e2e, namespace, pod)  # allocates the file's blocks once
    throttled = write_rate(e2e, namespace, pod)
    vm.check(f"echo '{majmin} wiops=max' > {io_max}", timeout=60)
    lifted = write_rate(e2e, namespace, pod)
    log.info("krbd QoS: %.1f writes/s under wiops=%d, %.1f/s without the rule", throttled, QOS_WRITE_IOPS, lifted)
    assert throttled <= 1.5 * QOS_WRITE_IOPS, (throttled, lifted)
    assert lifted >= 1.5 * throttled, (throttled, lifted)
    vm.check(f"echo '{rule}' > {io_max}", timeout=60)  # the rest of the flow under the class's limit


def restore_and_read(e2e: E2EEnv, vm_kube: VmKubelet, namespace: str, luks: Luks, token: str,
                     passphrase: str) -> None:
    """A claim restored from `snap` opens (with the source's LUKS passphrase, re-kept for its own
    id) in a pod on the VM node that reads the source's data back; then it goes, leaving nothing."""
    kube, vm = e2e.kube, vm_kube.vm
    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "restored"},
        "spec": {"storageClassName": luks.storage_class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "160Mi"}},
                 "dataSource": {"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": "snap"}}})
    restored = kube.wait_bound(namespace, "restored", timeout=scaled(120))
    kube.create_pod(namespace, "reader", IMAGE, IDLE, "restored", node=vm_kube.name)
    kube.wait_pod_ready(namespace, "reader", timeout=scaled(300))
    image = image_name(restored)
    check_mapped(vm, "krbd", image, f"luks-rbd-{restored['spec']['csi']['volumeHandle']}")
    assert volume_passphrase(e2e, luks, restored) == passphrase
    assert kube.exec_in(namespace, "reader", "cat /data/token").strip() == token
    kube.exec_in(namespace, "reader", "sha256sum -c /data/blob.sum && test -s /data/after-growth")
    kube.delete_pod(namespace, "reader", timeout=scaled(120))
    wait_vm_clean(vm)
    written = read_image(e2e, image, 64 * MI)
    assert written.startswith(LUKS_MAGIC) and token.encode() not in written
    delete_claim(e2e, namespace, "restored", restored)


def test_the_demo_on_the_vm_node_maps_with_krbd(e2e: E2EEnv, vm_kube: VmKubelet, namespace: str, luks: Luks) -> None:
    """scripts/demo.sh --node=vm: the demo's steps (tests/e2e/demo.py) with its pods pinned to the
    VM node, where the claim is mapped by krbd and ext4 grows online; then nothing is left there."""
    wait_plugin(e2e, vm_kube)
    out = io.StringIO()
    try:
        result = Demo(e2e, out, namespace=namespace, snapshot_class=luks.example_snapshot_class,
                      node=vm_kube.name, fstype="ext4", patience=patience()).run()
    finally:
        print(out.getvalue())
        e2e.kube.kubectl("-n", namespace, "delete", "volumesnapshots", "--all", "--wait=false")
    transcript = out.getvalue()
    check_demo(result, transcript, namespace)
    assert result.mounter == "krbd" and result.fstype == "ext4", transcript
    assert f"kubernetes.io/hostname: {vm_kube.name}" in transcript, transcript
    pods = {pod["metadata"]["name"]: pod["spec"].get("nodeName") for pod in e2e.kube.pods(namespace)}
    assert set(pods.values()) == {vm_kube.name} and len(pods) == 2, pods
    # The device the pod's filesystem is on is a krbd one, and the VM's kernel maps both claims.
    assert result.device.startswith("/dev/rbd"), transcript
    assert len(krbd_images(vm_kube.vm)) == 2, krbd_images(vm_kube.vm)
    for pod in pods:
        e2e.kube.delete_pod(namespace, pod, timeout=scaled(120))
    wait_vm_clean(vm_kube.vm)
