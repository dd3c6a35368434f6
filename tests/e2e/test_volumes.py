"""A volume's whole life on the real node, asserted in Kubernetes, on the node and in Ceph:
claim → PV + image + journal → pod writes → pod deleted (unpublished, unstaged) → a new pod
reads the data back → claim deleted → PV, image, journal and node state gone."""
from __future__ import annotations

import uuid
from typing import Any

import pytest
import rados
import rbd

from tests.e2e.checks import ceph_volume, node_leftovers, wait_ceph_gone, wait_node_clean, watchers
from tests.e2e.env import IMAGE, STORAGE_CLASS, XFS_CLASS, E2EEnv
from tests.e2e.kube import image_name, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

# sh as PID 1 ignores SIGTERM unless trapped; `sleep & wait` lets the trap run at once, so a
# pod deletion takes a moment instead of the whole grace period.
IDLE = "trap 'exit 0' TERM; sleep infinity & wait"


def fs_type(env: E2EEnv, namespace: str, pod: str, path: str = "/data") -> str:
    """The filesystem type the pod sees at path (from its /proc/mounts)."""
    for line in env.kube.exec_in(namespace, pod, "cat /proc/mounts").splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1] == path:
            return fields[2]
    return ""


def attachments_of(env: E2EEnv, pv: dict[str, Any]) -> list[dict[str, Any]]:
    name = pv["metadata"]["name"]
    return [a for a in env.kube.attachments() if a["spec"]["source"].get("persistentVolumeName") == name]


def read_image(env: E2EEnv, image: str, length: int) -> bytes:
    """The first bytes of the RBD image, read by client.admin straight from Ceph."""
    ceph = env.ceph
    client = rados.Rados(rados_id="admin", conf={"mon_host": ceph.mon_host, "key": ceph.admin_key})
    client.connect(timeout=30)
    try:
        with client.open_ioctx(ceph.pool) as ioctx, rbd.Image(ioctx, image, read_only=True) as img:
            return bytes(img.read(0, length))
    finally:
        client.shutdown()


def provision(env: E2EEnv, namespace: str, claim: str, storage_class: str = STORAGE_CLASS,
              size: str = "64Mi", block: bool = False) -> dict[str, Any]:
    """Create a claim, wait for Bound, and check the volume is complete in Ceph; its PV."""
    env.kube.create_pvc(namespace, claim, storage_class, size=size, block=block)
    pv = env.kube.wait_bound(namespace, claim)
    assert pv["spec"]["csi"]["driver"] == "rbd.csi.ceph.com"
    volume = ceph_volume(env.ceph, pv)
    assert volume.complete, volume
    return pv


def delete_claim(env: E2EEnv, namespace: str, claim: str, pv: dict[str, Any]) -> None:
    """Delete the claim; the PV, its attachment, the image, the journal and every node trace
    must go."""
    env.kube.delete_pvc(namespace, claim)
    env.kube.wait_pv_gone(pv["metadata"]["name"])
    wait_ceph_gone(env.ceph, pv)
    wait_for("no VolumeAttachment of the PV", lambda: not attachments_of(env, pv), timeout=60)
    assert not node_leftovers(pv, image_name(pv))


def test_filesystem_volume_survives_its_pod(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex
    pv = provision(e2e, namespace, "data")
    image = image_name(pv)

    kube.create_pod(namespace, "writer", IMAGE, f"echo {token} > /data/token && sync && {IDLE}", "data")
    kube.wait_pod_ready(namespace, "writer")
    assert kube.wait_written(namespace, "writer", "/data/token") == token
    assert fs_type(e2e, namespace, "writer") == "ext4"
    assert watchers(e2e.ceph, image), "a mapped image has a watcher: the node's rbd-fuse"
    assert [a["status"].get("attached") for a in attachments_of(e2e, pv)] == [True]

    kube.delete_pod(namespace, "writer")
    # The kubelet unstages once no pod uses the volume: nothing left on the node, no watcher.
    wait_node_clean(pv, image)
    wait_for("no watcher on the image", lambda: not watchers(e2e.ceph, image), timeout=60)

    kube.create_pod(namespace, "reader", IMAGE, IDLE, "data")
    kube.wait_pod_ready(namespace, "reader")
    assert kube.exec_in(namespace, "reader", "cat /data/token").strip() == token
    kube.delete_pod(namespace, "reader")

    delete_claim(e2e, namespace, "data", pv)


def test_block_volume_survives_its_pod(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex  # 32 bytes, written at offset 0 of the raw device
    pv = provision(e2e, namespace, "raw", block=True)
    image = image_name(pv)

    write = (f"printf %s {token} > /tmp/token && "
             "dd if=/tmp/token of=/dev/e2e-block bs=32 count=1 conv=notrunc,fsync 2>/dev/null && "
             f"{IDLE}")
    kube.create_pod(namespace, "writer", IMAGE, write, "raw", block=True)
    kube.wait_pod_ready(namespace, "writer")
    read = "dd if=/dev/e2e-block bs=32 count=1 2>/dev/null"
    assert kube.exec_in(namespace, "writer", read) == token
    assert kube.exec_in(namespace, "writer", "test -b /dev/e2e-block && echo block").strip() == "block"
    kube.delete_pod(namespace, "writer")
    wait_node_clean(pv, image)
    # Unmapped and flushed: the bytes are in the RBD image itself.
    assert read_image(e2e, image, 32) == token.encode()

    kube.create_pod(namespace, "reader", IMAGE, IDLE, "raw", block=True)
    kube.wait_pod_ready(namespace, "reader")
    assert kube.exec_in(namespace, "reader", read) == token
    kube.delete_pod(namespace, "reader")

    delete_claim(e2e, namespace, "raw", pv)


def test_xfs_volume(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex
    # mkfs.xfs refuses filesystems under 300 MB; the image is thin, so the size costs nothing.
    pv = provision(e2e, namespace, "xfs", storage_class=XFS_CLASS, size="320Mi")
    image = image_name(pv)

    kube.create_pod(namespace, "writer", IMAGE, f"echo {token} > /data/token && sync && {IDLE}", "xfs")
    kube.wait_pod_ready(namespace, "writer")
    assert fs_type(e2e, namespace, "writer") == "xfs"
    assert kube.exec_in(namespace, "writer", "cat /data/token").strip() == token
    kube.delete_pod(namespace, "writer")
    wait_node_clean(pv, image)

    delete_claim(e2e, namespace, "xfs", pv)
