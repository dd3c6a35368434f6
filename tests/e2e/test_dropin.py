"""ceph-csi's pre-provisioned volumes on the real node: a static PV (volumeHandle = the bare
image name, `staticVolume: "true"`) written by one pod, then the same image as a ReadOnlyMany
volume read by two pods at once: staged read-only without journal replay, published read-only,
never written, never deleted by the driver."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.checks import node_leftovers, wait_node_clean, watchers
from tests.e2e.env import IMAGE, SECRET, E2EEnv
from tests.e2e.kube import DEPLOY_NAMESPACE, wait_for
from tests.e2e.test_volumes import IDLE, fs_type

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


def static_pv(env: E2EEnv, name: str, image: str, access_mode: str) -> dict[str, Any]:
    """The PV ceph-csi's docs/static-pvc.md shows, with this cluster's values."""
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "accessModes": [access_mode],
            "capacity": {"storage": "64Mi"},
            "persistentVolumeReclaimPolicy": "Retain",
            "volumeMode": "Filesystem",
            "storageClassName": "",
            "csi": {
                "driver": "rbd.csi.ceph.com",
                "fsType": "ext4",
                "volumeHandle": image,
                "nodeStageSecretRef": {"name": SECRET, "namespace": DEPLOY_NAMESPACE},
                "volumeAttributes": {"staticVolume": "true", "clusterID": env.ceph.cluster_id,
                                     "pool": env.ceph.pool, "imageFeatures": "layering"},
            },
        },
    }


@pytest.fixture
def static_image(e2e: E2EEnv) -> Iterator[str]:
    """An image made by hand, as an admin does before writing a static PV; removed afterwards."""
    image = f"e2e-static-{uuid.uuid4().hex[:8]}"
    e2e.ceph.admin("rbd", "create", "--size", "64", "--image-feature", "layering", f"{e2e.ceph.pool}/{image}")
    yield image
    wait_for("no watcher on the static image", lambda: not watchers(e2e.ceph, image), timeout=60)
    e2e.ceph.admin("rbd", "rm", f"{e2e.ceph.pool}/{image}")


def claim_static(env: E2EEnv, namespace: str, claim: str, pv: dict[str, Any]) -> None:
    env.kube.create_pv(pv)
    env.kube.create_pvc(namespace, claim, "", access_mode=pv["spec"]["accessModes"][0],
                        volume_name=pv["metadata"]["name"])
    bound = env.kube.wait_bound(namespace, claim)
    assert bound["metadata"]["name"] == pv["metadata"]["name"]


def release_static(env: E2EEnv, namespace: str, claim: str, pv: dict[str, Any], image: str) -> None:
    """Claim deleted → the PV is Released (Retain) and the image stays; then the PV goes too."""
    name = pv["metadata"]["name"]
    env.kube.delete_pvc(namespace, claim)
    wait_for(f"PV {name} Released", lambda: (env.kube.pv(name) or {}).get("status", {}).get("phase") == "Released",
             timeout=60)
    env.kube.delete_pv(name)
    env.kube.wait_pv_gone(name)
    assert image in env.ceph.images(), "the driver never deletes a static volume's image"


def mount_options(env: E2EEnv, namespace: str, pod: str, path: str = "/data") -> list[str]:
    for line in env.kube.exec_in(namespace, pod, "cat /proc/mounts").splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == path:
            return fields[3].split(",")
    return []


def test_static_volume_then_two_read_only_readers(e2e: E2EEnv, namespace: str, static_image: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex
    image = static_image

    # A writer formats and fills the static volume (it holds no filesystem yet).
    writer_pv = static_pv(e2e, f"static-rw-{image}", image, "ReadWriteOnce")
    claim_static(e2e, namespace, "static", writer_pv)
    kube.create_pod(namespace, "writer", IMAGE, f"echo {token} > /data/token && sync && {IDLE}", "static")
    kube.wait_pod_ready(namespace, "writer")
    assert kube.wait_written(namespace, "writer", "/data/token") == token
    assert fs_type(e2e, namespace, "writer") == "ext4"
    kube.delete_pod(namespace, "writer")
    wait_node_clean(writer_pv, image)
    release_static(e2e, namespace, "static", writer_pv, image)

    # The same image as ReadOnlyMany: two readers at once, both read-only, both see the data.
    reader_pv = static_pv(e2e, f"static-rox-{image}", image, "ReadOnlyMany")
    claim_static(e2e, namespace, "shared", reader_pv)
    readers = ("reader-a", "reader-b")
    for pod in readers:
        kube.create_pod(namespace, pod, IMAGE, IDLE, "shared", read_only=True)
    for pod in readers:
        kube.wait_pod_ready(namespace, pod)
        assert kube.exec_in(namespace, pod, "cat /data/token").strip() == token
        assert "ro" in mount_options(e2e, namespace, pod)
        refused = kube.exec_in(namespace, pod, "touch /data/new 2>&1 && echo written || echo refused")
        assert refused.strip().endswith("refused"), refused
    for pod in readers:
        kube.delete_pod(namespace, pod)
    wait_node_clean(reader_pv, image)
    assert not node_leftovers(reader_pv, image)
    release_static(e2e, namespace, "shared", reader_pv, image)
