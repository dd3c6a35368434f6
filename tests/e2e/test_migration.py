"""docs/migrate-from-ceph-csi.md walked on the real node, with volumes in use.

Start state, "ceph-csi is installed": cephcsi's controller is scaled to 0 and its node plugin
held back by overlays/migration/ (rendered over this install's config.json, as the e2e env
applies deploy/); ceph-csi's node plugin is the stand-in of tests/e2e/ceph_csi_node.py (its
docstring says why a stand-in and what differs: the mapping). Two claims of a StorageClass in
ceph-csi's example shape are bound to volumes exactly as ceph-csi made them: journal entries in
ceph-csi's order and keys (tests/ceph/ceph_csi_journal.py), image csi-vol-<uuid>, volume id
`0001-<len>-<clusterID>-<pool id>-<uuid>`, PVs as ceph-csi's external-provisioner writes them, and
attachments as its csi-attacher leaves them (played by the test: finalizer + attached; the
finalizer is external-attacher's, which cephcsi's attacher uses too). Pods
write through the stand-in (one ext4 volume, one Block volume).

Then the guide's steps, in order: 2 (apply overlays/migration/: controller up, node plugin held
back), 3 (the attacher continues ceph-csi's attachments as its own: still attached, same
finalizer, no error), 4 (label `pending`, ceph-csi's pod
leaves, label `true`, cephcsi's plugin Ready and registered; the running pods keep their data;
their deletion is NodeUnpublish/NodeUnstage by cephcsi on ceph-csi's layout; new pods are staged
by cephcsi and read what was written under ceph-csi), 5 (apply deploy/, remove the label, the
node plugin is not restarted); last, deleting the claims deletes the ceph-csi volumes entirely
(their attachments detached by cephcsi's attacher, which releases ceph-csi's finalizer).

The shared e2e environment is restored in any case (deploy/ applied, label removed, driver Ready).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ceph.ceph_csi_journal import MiB, CephCsiVolume, journal_as_ceph_csi
from tests.e2e import host
from tests.e2e.ceph_csi_node import DRIVER as STAND_IN_DRIVER
from tests.e2e.ceph_csi_node import REGISTERED, STASH, stash
from tests.e2e.checks import node_leftovers, wait_ceph_gone, watchers
from tests.e2e.env import IMAGE, REPO, E2EEnv, quickstart_config, storage_class, write_overlay
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, DRIVER, NODE_LABELS, Kube, wait_for
from tests.e2e.nodehost import KUBELET_ROOT
from tests.e2e.test_volumes import IDLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600, func_only=True)]

MIGRATION_OVERLAY = REPO / "overlays" / "migration"
LABEL = "cephcsi.migrated"
CEPH_CSI_CLASS = "ceph-csi-rbd-sc"
ATTACHER_FINALIZER = "external-attacher/rbd-csi-ceph-com"
"""What ceph-csi's csi-attacher (≥ 3.15: ControllerPublish) puts on VolumeAttachments and PVs."""
PROVISIONER_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
BLOCK_READ = "dd if=/dev/e2e-block bs=32 count=1 skip={block} 2>/dev/null"
BLOCK_WRITE = ("printf %s {token} > /tmp/t && "
               "dd if=/tmp/t of=/dev/e2e-block bs=32 count=1 seek={block} conv=notrunc,fsync 2>/dev/null")

assert STAND_IN_DRIVER == DRIVER


# ---- ceph-csi's side: class, volumes, attachments, node plugin -------------------------------


def ceph_csi_class(env: E2EEnv) -> dict[str, Any]:
    """ceph-csi's examples/rbd/storageclass.yaml with this cluster's values (it has the same
    parameters as deploy/examples', plus `mountOptions: [discard]`)."""
    doc = storage_class(env.ceph, CEPH_CSI_CLASS)
    doc["metadata"].pop("labels", None)
    doc["mountOptions"] = ["discard"]
    return doc


@dataclass
class Claim:
    name: str
    block: bool
    pv: dict[str, Any]
    volume: CephCsiVolume

    @property
    def pv_name(self) -> str:
        return str(self.pv["metadata"]["name"])

    @property
    def staging(self) -> Path:
        """The kubelet's staging path for this PV (what NodeStageVolume gets)."""
        csi = KUBELET_ROOT / "plugins" / "kubernetes.io" / "csi"
        if self.block:
            return csi / "volumeDevices" / "staging" / self.pv_name
        return csi / DRIVER / hashlib.sha256(self.volume.volume_id.encode()).hexdigest() / "globalmount"


def provisioner_identity() -> str:
    """storage.kubernetes.io/csiProvisionerIdentity as external-provisioner makes it."""
    return f"{int(time.time() * 1000)}-{random.randrange(10000)}-{DRIVER}"


def provision_as_ceph_csi(env: E2EEnv, namespace: str, name: str, sc: dict[str, Any], block: bool,
                          identity: str) -> Claim:
    """The claim, then what ceph-csi's controller and external-provisioner make for it: the
    journaled image for request `pvc-<claim uid>` and the PV, pre-bound to the claim."""
    kube = env.kube
    kube.create_pvc(namespace, name, CEPH_CSI_CLASS, size="64Mi", block=block)
    claim = kube.pvc(namespace, name)
    assert claim is not None
    pv_name = f"pvc-{claim['metadata']['uid']}"
    volume = journal_as_ceph_csi(env.ceph, pv_name, size=64 * MiB, owner=namespace, image_metadata={
        "csi.storage.k8s.io/pv/name": pv_name, "csi.storage.k8s.io/pvc/name": name,
        "csi.storage.k8s.io/pvc/namespace": namespace})
    parameters: dict[str, str] = sc["parameters"]
    secret = {"name": parameters["csi.storage.k8s.io/node-stage-secret-name"],
              "namespace": parameters["csi.storage.k8s.io/node-stage-secret-namespace"]}
    attributes = {k: v for k, v in parameters.items() if not k.startswith("csi.storage.k8s.io/")}
    attributes.update({"journalPool": parameters["pool"], "imageName": volume.image,
                       "storage.kubernetes.io/csiProvisionerIdentity": identity})
    csi: dict[str, Any] = {
        "driver": DRIVER, "volumeHandle": volume.volume_id, "volumeAttributes": attributes,
        "nodeStageSecretRef": secret,
        "controllerExpandSecretRef": {
            "name": parameters["csi.storage.k8s.io/controller-expand-secret-name"],
            "namespace": parameters["csi.storage.k8s.io/controller-expand-secret-namespace"]},
    }
    if not block:
        csi["fsType"] = parameters["csi.storage.k8s.io/fstype"]
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name,
            "annotations": {
                "pv.kubernetes.io/provisioned-by": DRIVER,
                "volume.kubernetes.io/provisioner-deletion-secret-name":
                    parameters["csi.storage.k8s.io/provisioner-secret-name"],
                "volume.kubernetes.io/provisioner-deletion-secret-namespace":
                    parameters["csi.storage.k8s.io/provisioner-secret-namespace"],
            },
            "finalizers": [PROVISIONER_FINALIZER],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "64Mi"},
            "csi": csi,
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": namespace, "name": name,
                         "uid": claim["metadata"]["uid"], "resourceVersion": claim["metadata"]["resourceVersion"]},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": CEPH_CSI_CLASS,
            "volumeMode": "Block" if block else "Filesystem",
            "mountOptions": list(sc["mountOptions"]),
        },
    }
    kube.create_pv(pv)
    bound = kube.wait_bound(namespace, name)
    assert bound["metadata"]["name"] == pv_name
    return Claim(name, block, bound, volume)


def attachments_of(kube: Kube, pv_name: str) -> list[dict[str, Any]]:
    return [a for a in kube.attachments() if a["spec"]["source"].get("persistentVolumeName") == pv_name]


def attach_as_ceph_csi(kube: Kube, pv_name: str) -> None:
    """ceph-csi's csi-attacher for the attachment the attach/detach controller made: its
    finalizer on the attachment and on the PV, then attached."""
    [attachment] = wait_for(f"a VolumeAttachment of {pv_name}", lambda: attachments_of(kube, pv_name), timeout=60)
    name = attachment["metadata"]["name"]
    kube.kubectl("patch", "volumeattachment", name, "--type=merge",
                 "-p", json.dumps({"metadata": {"finalizers": [ATTACHER_FINALIZER]}}))
    kube.kubectl("patch", "pv", pv_name, "--type=json",
                 "-p", json.dumps([{"op": "add", "path": "/metadata/finalizers/-", "value": ATTACHER_FINALIZER}]))
    kube.kubectl("patch", "volumeattachment", name, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"attached": True}}))


@dataclass
class StandIn:
    """The ceph-csi node plugin stand-in as a host process (tests/e2e/ceph_csi_node.py)."""

    work_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, env: E2EEnv) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.ceph_csi_node", f"--node-id={env.node.name}",
                 f"--ceph-conf={env.ceph.conf}", f"--work-dir={self.work_dir}", f"--kubelet-dir={KUBELET_ROOT}"],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for("the kubelet registered ceph-csi's node plugin (stand-in)",
                 lambda: (self.work_dir / REGISTERED).exists() or self.exited(), timeout=60)
        assert not self.exited(), self.log_path.read_text()[-3000:]

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self) -> None:
        """What ceph-csi's pod leaving does to the node: the processes go, mappings stay."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def fuse_dir(self, image: str) -> Path:
        return self.work_dir / image

    def loop_of(self, image: str) -> str:
        backing = str(self.fuse_dir(image) / image)
        [device] = [dev for dev, back in host.loop_devices() if back == backing]
        return device

    def release(self, image: str) -> None:
        """Detach the loop device and stop rbd-fuse: what krbd's unmap would have done."""
        for device in [dev for dev, back in host.loop_devices() if back == str(self.fuse_dir(image) / image)]:
            host.run(["losetup", "-d", device])
        if any(m.mount_point == str(self.fuse_dir(image)) for m in host.mounts()):
            host.run(["umount", str(self.fuse_dir(image))])
        wait_for(f"the stand-in's rbd-fuse of {image} exited",
                 lambda: not host.fuse_daemons_under(str(self.fuse_dir(image))), timeout=30)

    def release_all(self) -> None:
        """Best effort after a failure: lazily, since a pod may still hold a mapping."""
        host.release_data_path(str(self.work_dir))


def device_in_use(device: str) -> list[str]:
    """Why the block device is still in use: mounts of it (a filesystem on it, or a bind of its
    device node), holders, or an exclusive opener (the kernel refuses O_EXCL then)."""
    st = os.stat(device)
    numbers = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    node = "/" + os.path.basename(device)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        left, _, right = line.partition(" - ")
        if fields[2] == numbers or (right.split()[0] == "devtmpfs" and fields[3] == node):
            found.append(f"mounted at {fields[4]}")
    holders = os.listdir(f"/sys/block/{os.path.basename(device)}/holders")
    found += [f"held by {h}" for h in holders]
    try:
        os.close(os.open(device, os.O_RDONLY | os.O_EXCL))
    except OSError as error:
        found.append(f"exclusive open refused: {error.strerror}")
    return found


# ---- the install's side ------------------------------------------------------------------------


def apply_migration_overlay(env: E2EEnv, directory: Path) -> None:
    """`kubectl apply -k overlays/migration/` with this install's config.json, the same way the
    e2e env applies deploy/."""
    write_overlay(directory, quickstart_config(env.ceph), base=MIGRATION_OVERLAY)
    env.kube.kubectl("apply", "-k", str(directory))


def node_daemonset(kube: Kube) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(kube.kubectl("-n", DEPLOY_NAMESPACE, "get", "ds", "cephcsi-node", "-o", "json"))
    return doc


def label_node(kube: Kube, node: str, value: str | None) -> None:
    if value is None:
        kube.kubectl("label", "node", node, f"{LABEL}-")
    else:
        kube.kubectl("label", "node", node, f"{LABEL}={value}", "--overwrite")


def restore_install(env: E2EEnv) -> None:
    """deploy/ applied (controller replicas, no selector), no label, the driver Ready."""
    kube = env.kube
    kube.kubectl("apply", "-k", str(env.overlay))
    kube.kubectl("label", "node", env.node.name, f"{LABEL}-")
    kube.wait_driver_ready(env.node.name)


# ---- pods ----------------------------------------------------------------------------------------


def start_pod(kube: Kube, namespace: str, name: str, claim: Claim, script: str = IDLE) -> None:
    kube.create_pod(namespace, name, IMAGE, script, claim.name, block=claim.block)


def read_tokens(kube: Kube, namespace: str, pod: str, claim: Claim) -> list[str]:
    if claim.block:
        return [kube.exec_in(namespace, pod, BLOCK_READ.format(block=n)) for n in (0, 128)]
    return [kube.exec_in(namespace, pod, f"cat /data/token{n} 2>/dev/null || true").strip() for n in (0, 1)]


def write_token(kube: Kube, namespace: str, pod: str, claim: Claim, index: int, token: str) -> None:
    if claim.block:
        kube.exec_in(namespace, pod, BLOCK_WRITE.format(token=token, block=index * 128))
    else:
        kube.exec_in(namespace, pod, f"echo {token} > /data/token{index} && sync")


def wait_token(kube: Kube, namespace: str, pod: str, claim: Claim, token: str) -> None:
    """The pod's first write (its command runs while the pod already counts as Ready)."""
    wait_for(f"{pod} wrote its token", lambda: read_tokens(kube, namespace, pod, claim)[0] == token, timeout=30)


def check_taken_over(kube: Kube, claim: Claim) -> None:
    """ceph-csi's attachments are the attacher's own (same finalizer): left attached as they were,
    with no attachError and no finalizer of another name; the PV keeps the finalizer too."""
    [attachment] = attachments_of(kube, claim.pv_name)
    status = attachment.get("status") or {}
    assert status.get("attached") is True and not status.get("attachError"), json.dumps(attachment)[:2000]
    assert attachment["metadata"].get("finalizers") == [ATTACHER_FINALIZER], json.dumps(attachment)[:2000]
    assert ATTACHER_FINALIZER in (kube.pv(claim.pv_name) or {})["metadata"].get("finalizers", [])


def wait_unmounted(claim: Claim) -> None:
    wait_for(f"nothing of {claim.pv_name} mounted under the kubelet",
             lambda: not node_leftovers(claim.pv, claim.volume.image).mounts, timeout=60,
             explain=lambda: repr(node_leftovers(claim.pv, claim.volume.image)))


def wait_unwatched(env: E2EEnv, claim: Claim) -> None:
    wait_for(f"no watcher on {claim.volume.image}", lambda: not watchers(env.ceph, claim.volume.image), timeout=60)


# ---- the walk --------------------------------------------------------------------------------------


@pytest.fixture
def stand_in(e2e: E2EEnv) -> Iterator[StandIn]:
    # Short, on tmpfs, outside the kubelet's and cephcsi's folders (as krbd's state is).
    work_dir = Path(tempfile.mkdtemp(prefix="ccsi-", dir="/run"))
    standin = StandIn(work_dir, e2e.work_dir / f"ceph-csi-stand-in-{work_dir.name}.log")
    yield standin
    standin.stop()


def test_migration_guide_with_volumes_in_use(e2e: E2EEnv, namespace: str, stand_in: StandIn) -> None:
    kube, node = e2e.kube, e2e.node.name
    overlay = e2e.work_dir / "migration-overlay"
    sc = ceph_csi_class(e2e)
    pods = {False: "app-fs", True: "app-block"}
    claims: dict[bool, Claim] = {}
    tokens = {block: [uuid.uuid4().hex, uuid.uuid4().hex] for block in (False, True)}
    try:
        # -- Start state: ceph-csi installed, cephcsi not running on the node or the controller.
        apply_migration_overlay(e2e, overlay)
        kube.kubectl("-n", DEPLOY_NAMESPACE, "scale", "deployment", "cephcsi-controller", "--replicas=0")
        wait_for("cephcsi's pods gone", lambda: not kube.pods(DEPLOY_NAMESPACE, NODE_LABELS)
                 and not kube.pods(DEPLOY_NAMESPACE, CONTROLLER_LABELS), timeout=120)
        stand_in.start(e2e)
        wait_for(f"CSINode listing {DRIVER} (ceph-csi's plugin)", lambda: DRIVER in kube.csinode_drivers(node), 60)
        kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(sc))
        identity = provisioner_identity()
        for block in (False, True):
            claims[block] = provision_as_ceph_csi(e2e, namespace, "raw" if block else "data", sc, block, identity)
        for block, claim in claims.items():
            write = BLOCK_WRITE.format(token=tokens[block][0], block=0) if block else \
                f"echo {tokens[block][0]} > /data/token0 && sync"
            start_pod(kube, namespace, pods[block], claim, f"{write} && {IDLE}")
        for claim in claims.values():
            attach_as_ceph_csi(kube, claim.pv_name)
        for block, claim in claims.items():
            kube.wait_pod_ready(namespace, pods[block])
            # ceph-csi's layout on the node, byte for byte where it is a file.
            staged = claim.staging / claim.volume.volume_id
            stash_path = claim.staging / STASH
            assert stash_path.read_bytes() == stash(e2e.ceph.pool, claim.volume.image, "")
            assert stash_path.stat().st_mode & 0o777 == 0o600
            # Block: the device node bound onto the file ceph-csi created.
            assert (staged.is_block_device() if block else staged.is_dir()), staged
            assert any(m.mount_point == str(staged) for m in host.mounts()), f"{staged} is not mounted"
            assert not (claim.staging / "cephcsi-stage.json").exists()
            wait_token(kube, namespace, pods[block], claim, tokens[block][0])

        # -- Step 1 is done (the controller is at 0); step 2: the migration overlay.
        apply_migration_overlay(e2e, overlay)
        kube.kubectl("-n", DEPLOY_NAMESPACE, "rollout", "status", "deployment/cephcsi-controller", "--timeout=180s",
                     timeout=200)
        wait_for("cephcsi-node DESIRED 0", lambda: node_daemonset(kube).get("status", {})
                 .get("desiredNumberScheduled") == 0 and not kube.pods(DEPLOY_NAMESPACE, NODE_LABELS), timeout=60)
        assert stand_in.process is not None and not stand_in.exited()

        # -- Step 3: the attacher continues ceph-csi's attachments as its own. Once it leads, its
        # first pass replays every attachment; a few seconds later nothing may have changed.
        wait_for("the controller's attacher started", lambda: "attacher started" in kube.kubectl(
            "-n", DEPLOY_NAMESPACE, "logs", "-l", CONTROLLER_LABELS, "--tail=-1"), timeout=120)
        time.sleep(5)
        for claim in claims.values():
            check_taken_over(kube, claim)

        # -- Step 4: `pending` sends ceph-csi's plugin away; then `true` lets cephcsi's in.
        label_node(kube, node, "pending")
        time.sleep(2)
        assert not kube.pods(DEPLOY_NAMESPACE, NODE_LABELS), "cephcsi's plugin must not start on `pending`"
        stand_in.stop()  # ceph-csi's DaemonSet pod leaves the node (its affinity: label DoesNotExist)
        wait_for(f"the kubelet deregistered {DRIVER}", lambda: DRIVER not in kube.csinode_drivers(node), timeout=60)
        # The guide's commands, as a script would run them.
        kube.kubectl("label", "node", node, f"{LABEL}=true", "--overwrite")
        wait_for("cephcsi's node pod exists", lambda: kube.kubectl(
            "-n", DEPLOY_NAMESPACE, "get", "pod", "-l", "app.kubernetes.io/component=node", "--field-selector",
            f"spec.nodeName={node}", "-o", "name").strip(), timeout=60)
        kube.kubectl("-n", DEPLOY_NAMESPACE, "wait", "--for=condition=Ready", "pod", "-l",
                     "app.kubernetes.io/component=node", "--field-selector", f"spec.nodeName={node}",
                     "--timeout=120s", timeout=150)
        wait_for(f"CSINode listing {DRIVER} (cephcsi's plugin)", lambda: DRIVER in kube.kubectl(
            "get", "csinode", node, "-o", "jsonpath={.spec.drivers[*].name}").split(), 60)
        [plugin] = kube.ready_pods(NODE_LABELS)

        # The running pods never noticed: their data, and new writes, through ceph-csi's mapping.
        for block, claim in claims.items():
            write_token(kube, namespace, pods[block], claim, 1, tokens[block][1])
            assert read_tokens(kube, namespace, pods[block], claim) == tokens[block]

        # Deleting them: cephcsi unpublishes and unstages ceph-csi's layout.
        for block in claims:
            kube.delete_pod(namespace, pods[block], timeout=120)
        for block, claim in claims.items():
            wait_unmounted(claim)
            assert not (claim.staging / STASH).exists(), "the stash goes with the stage"
            assert not os.path.lexists(claim.staging / claim.volume.volume_id)
            # Left: the stand-in's rbd-fuse + loop mapping, in place of ceph-csi's krbd device.
            # cephcsi's unstage ran the krbd unmap the stash asks for (`rbd device unmap`, which
            # would remove a real krbd device) and found nothing mapped here. So the mapping must
            # now be idle (nothing mounted from it, no opener), and tearing it down by hand is
            # what that unmap would have done.
            device = stand_in.loop_of(claim.volume.image)
            assert device_in_use(device) == [], device_in_use(device)
            stand_in.release(claim.volume.image)
            wait_unwatched(e2e, claim)
            assert not node_leftovers(claim.pv, claim.volume.image)

        # New pods on the same claims: staged by cephcsi, reading what was written under ceph-csi.
        for block, claim in claims.items():
            start_pod(kube, namespace, f"new-{pods[block]}", claim)
        for block, claim in claims.items():
            kube.wait_pod_ready(namespace, f"new-{pods[block]}")
            assert read_tokens(kube, namespace, f"new-{pods[block]}", claim) == tokens[block]
            assert (claim.staging / "cephcsi-stage.json").exists(), "staged by cephcsi, in its layout"

        # -- Step 5: deploy/ again, then the label goes; the node plugin is not restarted.
        kube.kubectl("apply", "-k", str(e2e.overlay))
        selector = node_daemonset(kube)["spec"]["template"]["spec"]["nodeSelector"]
        assert LABEL not in selector, selector
        label_node(kube, node, None)
        time.sleep(5)  # time for the DaemonSet controller to act, if it were going to
        [after] = kube.ready_pods(NODE_LABELS)
        assert after["metadata"]["uid"] == plugin["metadata"]["uid"]
        assert [c["restartCount"] for c in after["status"]["containerStatuses"]] == [0]

        # The claims go: cephcsi's controller deletes the volumes ceph-csi journaled.
        for block, claim in claims.items():
            kube.delete_pod(namespace, f"new-{pods[block]}", timeout=120)
            kube.delete_pvc(namespace, claim.name)
        for claim in claims.values():
            kube.wait_pv_gone(claim.pv_name, timeout=120)
            wait_ceph_gone(e2e.ceph, claim.pv, timeout=120)
            assert f"csi.volume.{claim.volume.uuid}" not in e2e.ceph.objects()
            assert not node_leftovers(claim.pv, claim.volume.image)
    finally:
        stand_in.stop()
        try:
            restore_install(e2e)
        finally:
            for pod in kube.pods(namespace):
                kube.delete_pod(namespace, pod["metadata"]["name"], timeout=120)
            stand_in.release_all()
            host.remove_tree(stand_in.work_dir)  # refuses while an rbd-fuse mount is live
            kube.kubectl("delete", "--ignore-not-found", "storageclass", CEPH_CSI_CLASS)
