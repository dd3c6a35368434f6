"""The ceph-csi side of the migration walk (tests/e2e/test_migration.py): a StorageClass in
ceph-csi's example shape, volumes and PVs exactly as ceph-csi's controller and external-provisioner
make them, attachments as its csi-attacher leaves them, and its node plugin's stand-in
(tests/e2e/ceph_csi_node.py) run as a host process."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ceph.ceph_csi_journal import MiB, CephCsiVolume, journal_as_ceph_csi
from tests.e2e import host
from tests.e2e.ceph_csi_node import DRIVER as STAND_IN_DRIVER
from tests.e2e.ceph_csi_node import REGISTERED
from tests.e2e.env import REPO, E2EEnv, storage_class
from tests.e2e.kube import DRIVER, Kube, wait_for
from tests.e2e.nodehost import KUBELET_ROOT

CEPH_CSI_CLASS = "ceph-csi-rbd-sc"
ATTACHER_FINALIZER = "external-attacher/rbd-csi-ceph-com"
"""What ceph-csi's csi-attacher (≥ 3.15: ControllerPublish) puts on VolumeAttachments and PVs."""
PROVISIONER_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"

assert STAND_IN_DRIVER == DRIVER


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
