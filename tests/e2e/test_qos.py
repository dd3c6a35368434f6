"""A VolumeAttributesClass change throttles (and un-throttles) a running pod on the real node.

The node plugin maps with rbd-fuse here (librbd in userspace), so librbd's QoS limits are
enforced in the mapping process. The claim is created with a class limiting write IOPS; a pod
does small O_DIRECT writes and its rate is measured (dd's own timing); then the claim's
`volumeAttributesClassName` is changed to a class with a limit far above what the node can do,
the embedded resizer applies it (ControllerModifyVolume, the claim's current class), and the same
pod, still running and never restarted, writes well above the old limit: the open image in
rbd-fuse took the new configuration without a remap (librbd refreshes its configuration on the
header-update notice the metadata write sends).

Why writes: the loop device over the rbd-fuse file does buffered I/O on that file, so reads can
be served from the page cache without reaching librbd; a FUSE write (no writeback cache) goes to
rbd-fuse synchronously, one 4 KiB O_DIRECT write → one librbd write → one token of the limit.

The margins: librbd's token bucket starts full, its burst is the limit itself when
`rbd_qos_write_iops_burst` is 0 (the default), and ext4's journal commits take tokens too; so
N writes under a limit L take at least (N - L) / L seconds, i.e. the measured rate is at most
N / ((N - L) / L) — 1.25 L for N = 5 L. Asserted: at most 1.5 L throttled, and at least 4 L and
3× the throttled rate after the change (the node, unthrottled, does hundreds per second even
on two busy cores; the figures are printed).
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from tests.e2e.env import IMAGE, STORAGE_CLASS, E2EEnv
from tests.e2e.kube import DRIVER, image_name, wait_for
from tests.e2e.test_volumes import IDLE, delete_claim

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240, func_only=True)]

LIMIT = 40
"""Write IOPS of the slow class."""
WRITES = 5 * LIMIT
"""4 KiB O_DIRECT writes per measurement: ~4 s throttled, well under 1 s unthrottled."""
FAST = 100000
"""Write IOPS of the fast class: far above anything the node does."""
MODIFY_TIMEOUT = 90.0


def create_class(env: E2EEnv, name: str, parameters: dict[str, str]) -> None:
    env.kube.storage.create_volume_attributes_class(
        {"metadata": {"name": name}, "driverName": DRIVER, "parameters": parameters})


def delete_class(env: E2EEnv, name: str) -> None:
    try:
        env.kube.storage.delete_volume_attributes_class(name)
    except Exception:  # noqa: BLE001 - cleanup only; a leftover class costs nothing
        pass


def image_qos(env: E2EEnv, image: str) -> dict[str, str]:
    rows = json.loads(env.ceph.admin("rbd", "config", "image", "ls", "--format", "json", f"{env.ceph.pool}/{image}"))
    return {row["name"]: str(row["value"]) for row in rows if row["source"] == "image" and "qos" in row["name"]}


def write_rate(env: E2EEnv, namespace: str, pod: str) -> float:
    """4 KiB O_DIRECT writes per second over the same file region (allocated by the first run),
    as dd measures them."""
    out = env.kube.exec_in(namespace, pod, f"dd if=/dev/zero of=/data/qos bs=4096 count={WRITES} "
                                           "oflag=direct conv=notrunc 2>&1", timeout=120)
    # "819200 bytes (819 kB, 800 KiB) copied, 4.87 s, 168 kB/s"
    match = re.search(r"copied, ([0-9.]+) s", out)
    assert match, f"no timing in dd's output: {out!r}"
    return WRITES / max(float(match.group(1)), 1e-3)


def current_class(env: E2EEnv, namespace: str, claim: str) -> str:
    status: dict[str, Any] = (env.kube.pvc(namespace, claim) or {}).get("status") or {}
    return str(status.get("currentVolumeAttributesClassName") or "")


def test_class_change_lifts_the_limit_of_a_running_pod(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    suffix = uuid.uuid4().hex[:6]
    slow, fast = f"e2e-slow-{suffix}", f"e2e-fast-{suffix}"
    create_class(e2e, slow, {"baseWriteIops": str(LIMIT)})
    create_class(e2e, fast, {"baseWriteIops": str(FAST)})
    try:
        kube.core.create_namespaced_persistent_volume_claim(namespace, {
            "metadata": {"name": "qos"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                     "volumeAttributesClassName": slow, "resources": {"requests": {"storage": "64Mi"}}}})
        pv = kube.wait_bound(namespace, "qos")
        image = image_name(pv)
        assert image_qos(e2e, image) == {"rbd_qos_write_iops_limit": str(LIMIT)}
        wait_for("the claim's current class", lambda: current_class(e2e, namespace, "qos") == slow, timeout=60)

        kube.create_pod(namespace, "app", IMAGE, IDLE, "qos")
        kube.wait_pod_ready(namespace, "app")
        started = (kube.pod(namespace, "app") or {})["metadata"]["uid"]
        write_rate(e2e, namespace, "app")  # allocates the file's blocks (journal writes) once
        throttled = write_rate(e2e, namespace, "app")

        kube.core.patch_namespaced_persistent_volume_claim(
            "qos", namespace, {"spec": {"volumeAttributesClassName": fast}})
        wait_for(f"the claim's current class {fast}", lambda: current_class(e2e, namespace, "qos") == fast,
                 MODIFY_TIMEOUT, interval=1.0, explain=lambda: kube.events(namespace, "qos"))
        assert image_qos(e2e, image) == {"rbd_qos_write_iops_limit": str(FAST)}
        lifted = write_rate(e2e, namespace, "app")

        print(f"\nQoS e2e: limit {LIMIT} write IOPS; measured {throttled:.1f}/s under {slow}, "
              f"{lifted:.1f}/s after the change to {fast} ({lifted / throttled:.1f}x)")
        assert throttled <= 1.5 * LIMIT, f"not throttled: {throttled:.1f} writes/s under a limit of {LIMIT}"
        assert lifted >= 4 * LIMIT and lifted >= 3 * throttled, (
            f"the new class is not in force in the running pod: {lifted:.1f} writes/s after the change, "
            f"{throttled:.1f} before, old limit {LIMIT}")

        pod = kube.pod(namespace, "app") or {}
        assert pod["metadata"]["uid"] == started, "the pod ran through the change"
        assert all(s.get("restartCount") == 0 for s in pod["status"].get("containerStatuses") or [])
        kube.delete_pod(namespace, "app")
        delete_claim(e2e, namespace, "qos", pv)
    finally:
        delete_class(e2e, slow)
        delete_class(e2e, fast)
