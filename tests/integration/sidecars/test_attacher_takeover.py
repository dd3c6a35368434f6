"""After a switch from ceph-csi >= 3.15 (whose csi-attacher runs external-attacher's real
handler): VolumeAttachments and PVs carry the finalizer `external-attacher/rbd-csi-ceph-com`.
On the real apiserver and kube-controller-manager, with objects in exactly the state
external-attacher leaves (csi_handler.go: VA finalizer + `csi.alpha.kubernetes.io/node-id`
annotation + status attached/attachmentMetadata; PV finalizer), cephcsi's embedded attacher takes
them over: a live attachment stays attached and loses the finalizer, an attachment whose detach
hung (deleted while no attacher ran) goes away, and the PV finalizers go once no attachment
names the PV. Also: a static PV with reclaimPolicy Delete is never deleted, and says why."""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube]

DRIVER = "rbd.csi.ceph.com"
OLD = "external-attacher/rbd-csi-ceph-com"
NODE_ID_ANNOTATION = "csi.alpha.kubernetes.io/node-id"


def static_pv(env: Env, name: str, namespace: str, claim: str, policy: str = "Retain") -> None:
    env.kube.core.create_persistent_volume({"metadata": {"name": name}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": policy,
        "storageClassName": "", "volumeMode": "Filesystem", "claimRef": {"namespace": namespace, "name": claim},
        "csi": {"driver": DRIVER, "volumeHandle": f"img-{name}", "fsType": "ext4",
                "volumeAttributes": {"staticVolume": "true", "clusterID": env.ceph.cluster_id, "pool": env.ceph.pool}}}})
    env.kube.core.create_namespaced_persistent_volume_claim(namespace, {"metadata": {"name": claim}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "",
        "volumeName": name}})
    wait_for(f"{claim} Bound", lambda: ((env.kube.pvc(namespace, claim) or {}).get("status") or {}).get("phase") == "Bound")


def attachment_of(env: Env, pv: str) -> dict[str, Any] | None:
    found = [va for va in env.kube.attachments() if va["spec"]["source"].get("persistentVolumeName") == pv]
    return found[0] if found else None


def leave_upstream_state(env: Env, pv: str, node: str) -> str:
    """What external-attacher's csiAttach + markAsAttached leave after a successful attach."""
    found = wait_for(f"the attach-detach controller to create the VolumeAttachment of {pv}", lambda: attachment_of(env, pv))
    assert found is not None
    name = found["metadata"]["name"]
    storage = env.kube.storage
    storage.patch_volume_attachment(name, {"metadata": {"finalizers": [OLD], "annotations": {NODE_ID_ANNOTATION: node}}})
    storage.patch_volume_attachment_status(name, {"status": {"attached": True,
                                                             "attachmentMetadata": {"publishedBy": "ceph-csi"}}})
    env.kube.core.patch_persistent_volume(pv, {"metadata": {"finalizers": [OLD]}})
    return str(name)


def finalizers(obj: dict[str, Any] | None) -> list[str]:
    return list(((obj or {}).get("metadata") or {}).get("finalizers") or [])


def va(env: Env, name: str) -> dict[str, Any] | None:
    try:
        return env.kube._json(env.kube.storage.read_volume_attachment(name, _preload_content=False))  # type: ignore[no-any-return]
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_attachments_left_by_ceph_csi_attacher_are_taken_over(env: Env, start_controllers: StartControllers,
                                                                kube_namespace: str) -> None:
    kube, suffix = env.kube, uuid.uuid4().hex[:6]
    node = f"node-{suffix}"
    kube.create_node(node)
    live_pv, hung_pv = f"live-{suffix}", f"hung-{suffix}"
    static_pv(env, live_pv, kube_namespace, "live")
    static_pv(env, hung_pv, kube_namespace, "hung")
    kube.create_pod(kube_namespace, "live-app", node, "live")
    kube.create_pod(kube_namespace, "hung-app", node, "hung")
    live_va = leave_upstream_state(env, live_pv, node)
    hung_va = leave_upstream_state(env, hung_pv, node)
    # ceph-csi is gone: the pod moves away, the attach-detach controller deletes the attachment,
    # and nobody removes the old attacher's finalizer — the hang the switch used to cause.
    kube.delete_pod(kube_namespace, "hung-app")
    wait_for("the hung detach", lambda: ((va(env, hung_va) or {}).get("metadata") or {}).get("deletionTimestamp"))

    start_controllers()
    wait_for("the hung attachment to be finished", lambda: va(env, hung_va) is None)
    wait_for("the old finalizer to leave the live attachment", lambda: OLD not in finalizers(va(env, live_va)))
    live = va(env, live_va) or {}
    assert live["status"]["attached"] is True
    assert live["metadata"]["annotations"][NODE_ID_ANNOTATION] == node  # left as the old attacher wrote it
    wait_for("the hung PV's old finalizer to go", lambda: OLD not in finalizers(kube.pv(hung_pv)))
    assert OLD in finalizers(kube.pv(live_pv)), "kept while an attachment names the PV"

    # From now on detach is the attachment's deletion, as for cephcsi's own attachments.
    kube.delete_pod(kube_namespace, "live-app")
    wait_for("the live attachment to be detached", lambda: va(env, live_va) is None)
    wait_for("the live PV's old finalizer to go", lambda: OLD not in finalizers(kube.pv(live_pv)))

    # And the PVs can be deleted (Retain: the images stay).
    for claim, pv in (("live", live_pv), ("hung", hung_pv)):
        kube.delete_pvc(kube_namespace, claim)
        wait_for(f"{pv} Released", released(env, pv))
        kube.delete_pv(pv)
        wait_for(f"{pv} deleted", gone(env, pv))


def released(env: Env, pv: str) -> Callable[[], bool]:
    return lambda: ((env.kube.pv(pv) or {}).get("status") or {}).get("phase") == "Released"


def gone(env: Env, pv: str) -> Callable[[], bool]:
    return lambda: env.kube.pv(pv) is None


def test_static_pv_with_delete_policy_is_kept_and_explained(env: Env, start_controllers: StartControllers,
                                                              kube_namespace: str) -> None:
    kube, name = env.kube, f"static-{uuid.uuid4().hex[:6]}"
    start_controllers()
    static_pv(env, name, kube_namespace, "static", policy="Delete")
    kube.delete_pvc(kube_namespace, "static")
    events = wait_for("the StaticVolumeNotDeleted event", lambda: [
        e for e in kube.events("default", name) if e[1] == "StaticVolumeNotDeleted"])
    assert events[0][0] == "Warning" and "persistentVolumeReclaimPolicy" in events[0][2]
    # (Warned as soon as the policy is seen, even while Bound.) Released, and still there:
    wait_for("the PV to be released", lambda: ((kube.pv(name) or {}).get("status") or {}).get("phase")
             in ("Released", "Failed"))
    time.sleep(2)  # several provisioner passes: none deletes it
    assert kube.pv(name) is not None
    kube.core.patch_persistent_volume(name, {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
    kube.delete_pv(name)
    wait_for("the PV to be deleted", lambda: kube.pv(name) is None)
