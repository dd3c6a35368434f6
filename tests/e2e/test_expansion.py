"""Online expansion on the real node: the claim is grown while its pod runs, and the pod sees the
new size without a restart.

Filesystem: xfs (ext4 cannot grow online on this VM: resize2fs's online path needs
CAP_SYS_RESOURCE, which root lacks here). Two growths in a row: each time the embedded resizer
grows the RBD image (ControllerExpandVolume), the kubelet then calls NodeExpandVolume (loop
device capacity + xfs_growfs), `df` in the pod shows the new size, the data is intact, the
claim's resize conditions clear and status.capacity is the new size.

ext4: online where the node plugin has CAP_SYS_RESOURCE; where it does not (this VM) the
kubelet's NodeExpandVolume fails while mounted and the claim stays FileSystemResizePending, and
the next stage grows the filesystem before mounting it (offline resize2fs needs no capability):
the pod is replaced, the new pod sees the new size and the data, and the claim's resize ends.

Block: the same claim-side checks, and the raw device in the pod reports the new size
(`blockdev --getsize64`).
"""
from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.capabilities import can_grow_ext4_online
from tests.e2e.checks import node_leftovers
from tests.e2e.env import IMAGE, XFS_CLASS, E2EEnv

from tests.e2e.kube import DEPLOY_NAMESPACE, NODE_LABELS, image_name, wait_for
from tests.e2e.test_volumes import IDLE, delete_claim, fs_type, provision

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420, func_only=True)]

MI = 1 << 20
RESIZE_TIMEOUT = 150.0
"""Controller step (leader's resizer) + the kubelet's next look at the pod (syncFrequency 10s)."""


def quantity(mebibytes: int) -> str:
    return f"{mebibytes}Mi"


def grow(env: E2EEnv, namespace: str, claim: str, mebibytes: int) -> None:
    env.kube.core.patch_namespaced_persistent_volume_claim(
        claim, namespace, {"spec": {"resources": {"requests": {"storage": quantity(mebibytes)}}}})


def resize_state(claim: dict[str, Any]) -> dict[str, Any]:
    """What the claim says about its resize (for waits and their failure messages)."""
    status = claim.get("status") or {}
    return {
        "capacity": (status.get("capacity") or {}).get("storage"),
        "allocated": (status.get("allocatedResources") or {}).get("storage"),
        "resizeStatus": status.get("allocatedResourceStatuses") or {},
        "conditions": [(c.get("type"), c.get("message")) for c in status.get("conditions") or []],
    }


def wait_resized(env: E2EEnv, namespace: str, claim: str, mebibytes: int) -> dict[str, Any]:
    """Wait until the claim's status.capacity is the new size, no resize condition or resize
    status is left, and the PV's capacity is the new size; the PV."""
    wanted = quantity(mebibytes)

    def done() -> dict[str, Any] | None:
        pvc = env.kube.pvc(namespace, claim) or {}
        state = resize_state(pvc)
        if state["capacity"] != wanted or state["conditions"] or state["resizeStatus"]:
            return None
        pv = env.kube.pv(pvc["spec"]["volumeName"]) or {}
        return pv if pv.get("spec", {}).get("capacity", {}).get("storage") == wanted else None

    def explain() -> str:
        pvc = env.kube.pvc(namespace, claim) or {}
        pv = env.kube.pv(pvc.get("spec", {}).get("volumeName", "")) or {}
        return (f"claim: {json.dumps(resize_state(pvc))}\n"
                f"PV capacity: {pv.get('spec', {}).get('capacity')}\n{env.kube.events(namespace, claim)}")

    return wait_for(f"PVC {namespace}/{claim} resized to {wanted}", done, RESIZE_TIMEOUT, interval=1.0,
                    explain=explain)


def image_bytes(env: E2EEnv, image: str) -> int:
    info = json.loads(env.ceph.admin("rbd", "info", "-p", env.ceph.pool, image, "--format", "json"))
    return int(info["size"])


def node_expand_log(env: E2EEnv) -> str:
    """The node plugin's log lines about expansion (did the kubelet call NodeExpandVolume?)."""
    lines = []
    for pod in env.kube.pods(DEPLOY_NAMESPACE, NODE_LABELS):
        lines += [line for line in env.kube.logs(pod["metadata"]["name"]).splitlines() if "xpand" in line]
    return "node plugin expansion log:\n  " + ("\n  ".join(lines[-10:]) or "(none)")


def df_bytes(env: E2EEnv, namespace: str, pod: str, path: str = "/data") -> int:
    """The filesystem size `df` shows inside the pod."""
    out = env.kube.exec_in(namespace, pod, f"df -B1 --output=size {path} | tail -n 1")
    return int(out.strip())


def grow_ext4(env: E2EEnv, namespace: str, claim: str, pv: dict[str, Any], mebibytes: int, pod: str,
              command: str) -> None:
    """Grow an ext4 claim (bound to `pv`) that `pod` (running `command`) uses: online where the
    node can, else the controller step, then the pod replaced so the volume's next stage grows it."""
    kube = env.kube
    image = image_name(pv)
    grow(env, namespace, claim, mebibytes)
    if can_grow_ext4_online():
        wait_resized(env, namespace, claim, mebibytes)
        return
    # The controller step completes; the node step cannot while the filesystem is mounted.
    wait_for("the image grown and the claim waiting for the node",
             lambda: image_bytes(env, image) == mebibytes * MI and "FileSystemResizePending" in str(
                 resize_state(kube.pvc(namespace, claim) or {})["conditions"]),
             RESIZE_TIMEOUT, interval=1.0)
    kube.delete_pod(namespace, pod)
    # Unstaged (not only the pod gone): the next pod must get a fresh stage, where it grows.
    wait_for("the volume unstaged from the node", lambda: not node_leftovers(pv, image), timeout=90)
    kube.create_pod(namespace, pod, IMAGE, command, claim)
    kube.wait_pod_ready(namespace, pod)
    wait_resized(env, namespace, claim, mebibytes)


@pytest.mark.long  # online growth on the node is test_block_grows_online's and the ext4 test's; xfs twice is the long tier's
def test_xfs_grows_twice_online(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex
    # mkfs.xfs refuses filesystems under 300 MB; the image is thin, so the sizes cost nothing.
    sizes = [320, 512, 768]
    pv = provision(e2e, namespace, "grow", storage_class=XFS_CLASS, size=quantity(sizes[0]))
    image = image_name(pv)

    write = (f"echo {token} > /data/token && head -c 8388608 /dev/urandom > /data/blob && "
             f"sha256sum /data/blob > /data/blob.sum && sync && {IDLE}")
    kube.create_pod(namespace, "app", IMAGE, write, "grow")
    kube.wait_pod_ready(namespace, "app")
    assert fs_type(e2e, namespace, "app") == "xfs"
    kube.wait_written(namespace, "app", "/data/blob.sum")
    # The part of the device xfs keeps for itself (internal log, headers): `df` shows less than
    # the device, and the log does not grow with the filesystem.
    before = df_bytes(e2e, namespace, "app")
    assert 0 < before <= sizes[0] * MI
    started_pod = (kube.pod(namespace, "app") or {})["metadata"]["uid"]

    for old, size in zip(sizes, sizes[1:]):
        grow(e2e, namespace, "grow", size)
        pv = wait_resized(e2e, namespace, "grow", size)
        assert image_bytes(e2e, image) == size * MI
        after = df_bytes(e2e, namespace, "app")
        # Grown by the whole difference, give or take the headers of the allocation groups
        # xfs_growfs adds.
        assert after <= size * MI and abs(after - (before + (size - old) * MI)) <= 16 * MI, (before, after, size)
        assert kube.exec_in(namespace, "app", "cat /data/token").strip() == token
        kube.exec_in(namespace, "app", "sha256sum -c /data/blob.sum")  # fails (exit 1) on a mismatch
        kube.exec_in(namespace, "app", f"echo {size} > /data/grown-to-{size} && sync")
        before = after

    pod = kube.pod(namespace, "app") or {}
    assert pod["metadata"]["uid"] == started_pod, "the pod ran through both growths"
    assert all(s.get("restartCount") == 0 for s in pod["status"].get("containerStatuses") or [])
    kube.delete_pod(namespace, "app")
    delete_claim(e2e, namespace, "grow", pv)


def test_block_grows_online(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex  # 32 bytes at offset 0 of the raw device
    pv = provision(e2e, namespace, "raw", size="64Mi", block=True)
    image = image_name(pv)

    write = (f"printf %s {token} > /tmp/token && "
             "dd if=/tmp/token of=/dev/e2e-block bs=32 count=1 conv=notrunc,fsync 2>/dev/null && "
             f"{IDLE}")
    kube.create_pod(namespace, "app", IMAGE, write, "raw", block=True)
    kube.wait_pod_ready(namespace, "app")
    read_token = "dd if=/dev/e2e-block bs=32 count=1 2>/dev/null"
    wait_for("the pod's token written", lambda: kube.exec_in(namespace, "app", read_token) == token, timeout=60)
    size_cmd = "blockdev --getsize64 /dev/e2e-block"
    assert int(kube.exec_in(namespace, "app", size_cmd)) == 64 * MI

    grow(e2e, namespace, "raw", 128)
    pv = wait_resized(e2e, namespace, "raw", 128)
    assert image_bytes(e2e, image) == 128 * MI
    wait_for("the pod's block device at 128Mi", lambda: int(kube.exec_in(namespace, "app", size_cmd)) == 128 * MI,
             timeout=60, interval=2.0,
             explain=lambda: f"blockdev in the pod: {kube.exec_in(namespace, 'app', size_cmd).strip()} bytes; "
                             f"RBD image: {image_bytes(e2e, image)} bytes\n{node_expand_log(e2e)}")
    assert kube.exec_in(namespace, "app", read_token) == token
    # The new space is usable: write and read back at the last MiB of the grown device.
    tail = uuid.uuid4().hex
    kube.exec_in(namespace, "app", f"printf %s {tail} > /tmp/tail && "
                                   "dd if=/tmp/tail of=/dev/e2e-block bs=1M seek=127 conv=notrunc,fsync 2>/dev/null")
    assert kube.exec_in(namespace, "app", "dd if=/dev/e2e-block bs=1M skip=127 count=1 2>/dev/null | head -c 32") == tail

    kube.delete_pod(namespace, "app")
    delete_claim(e2e, namespace, "raw", pv)


def test_ext4_grows_online_or_at_the_next_stage(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex
    pv = provision(e2e, namespace, "grow4", size=quantity(64))
    command = f"test -f /data/token || echo {token} > /data/token; sync; {IDLE}"
    kube.create_pod(namespace, "app", IMAGE, command, "grow4")
    kube.wait_pod_ready(namespace, "app")
    assert kube.wait_written(namespace, "app", "/data/token") == token
    assert fs_type(e2e, namespace, "app") == "ext4"
    before = df_bytes(e2e, namespace, "app")

    grow_ext4(e2e, namespace, "grow4", pv, 160, pod="app", command=command)
    after = df_bytes(e2e, namespace, "app")
    # 96 MiB more device; ext4 keeps some of each new block group for its own metadata.
    assert after >= before + 80 * MI, (before, after)
    assert kube.exec_in(namespace, "app", "cat /data/token").strip() == token
    kube.delete_pod(namespace, "app")
    delete_claim(e2e, namespace, "grow4", pv)
