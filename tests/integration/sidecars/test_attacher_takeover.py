"""After a switch from ceph-csi >= 3.15 (whose csi-attacher runs external-attacher's real
handler): VolumeAttachments and PVs carry the finalizer `external-attacher/rbd-csi-ceph-com`,
which is also the embedded attacher's own. On the real apiserver and kube-controller-manager, with
objects in exactly the state external-attacher leaves (csi_handler.go: VA finalizer +
`csi.alpha.kubernetes.io/node-id` annotation + status attached/attachmentMetadata; PV finalizer),
cephcsi's attacher simply continues: a live attachment stays attached with the finalizer, an
attachment whose detach hung (deleted while no attacher ran) is finished, a live one is detached
normally when its pod goes, and the PVs can then be deleted. Objects carrying the name an
unreleased development build used (`attacher.cephcsi/...`) are moved to the right one. Also: a
static PV with reclaimPolicy Delete is never deleted, and says why."""
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
FINALIZER = "external-attacher/rbd-csi-ceph-com"
INTERIM = "attacher.cephcsi/rbd-csi-ceph-com"
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


def leave_upstream_state(env: Env, pv: str, node: str, finalizer: str = FINALIZER) -> str:
    """What external-attacher's csiAttach + markAsAttached leave after a successful attach."""
    found = wait_for(f"the attach-detach controller to create the VolumeAttachment of {pv}", lambda: attachment_of(env, pv))
    assert found is not None
    name = found["metadata"]["name"]
    storage = env.kube.storage
    storage.patch_volume_attachment(name, {"metadata": {"finalizers": [finalizer],
                                                        "annotations": {NODE_ID_ANNOTATION: node}}})
    storage.patch_volume_attachment_status(name, {"status": {"attached": True,
                                                             "attachmentMetadata": {"publishedBy": "ceph-csi"}}})
    env.kube.core.patch_persistent_volume(pv, {"metadata": {"finalizers": [finalizer]}})
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


def test_attachments_left_by_ceph_csi_attacher_are_its_own(env: Env, start_controllers: StartControllers,
                                                            kube_namespace: str) -> None:
    kube, suffix = env.kube, uuid.uuid4().hex[:6]
    node = f"node-{suffix}"
    kube.create_node(node)
    live_pv, hung_pv, dev_pv = f"live-{suffix}", f"hung-{suffix}", f"dev-{suffix}"
    for pv, claim in ((live_pv, "live"), (hung_pv, "hung"), (dev_pv, "dev")):
        static_pv(env, pv, kube_namespace, claim)
        kube.create_pod(kube_namespace, f"{claim}-app", node, claim)
    live_va = leave_upstream_state(env, live_pv, node)
    hung_va = leave_upstream_state(env, hung_pv, node)
    dev_va = leave_upstream_state(env, dev_pv, node, finalizer=INTERIM)
    # ceph-csi is gone: the pod moves away and the attach-detach controller deletes the
    # attachment; nobody runs the detach until an attacher of this driver is back.
    kube.delete_pod(kube_namespace, "hung-app")
    wait_for("the hung detach", lambda: ((va(env, hung_va) or {}).get("metadata") or {}).get("deletionTimestamp"))

    start_controllers()
    wait_for("the hung attachment to be finished", lambda: va(env, hung_va) is None)
    wait_for("the interim name to be replaced", lambda: finalizers(va(env, dev_va)) == [FINALIZER]
             and FINALIZER in finalizers(kube.pv(dev_pv)) and INTERIM not in finalizers(kube.pv(dev_pv)))
    time.sleep(2)  # several attacher passes: the live attachment is left exactly as ceph-csi left it
    live = va(env, live_va) or {}
    assert live["status"]["attached"] is True and finalizers(live) == [FINALIZER]
    assert live["status"].get("attachmentMetadata") == {"publishedBy": "ceph-csi"}
    assert live["metadata"]["annotations"][NODE_ID_ANNOTATION] == node
    assert (va(env, dev_va) or {})["status"]["attached"] is True
    # PV finalizers stay until the PVs are deleted, as external-attacher keeps them.
    assert FINALIZER in finalizers(kube.pv(live_pv)) and FINALIZER in finalizers(kube.pv(hung_pv))

    # Detach is the ordinary one: ControllerUnpublish, then status and finalizer.
    for claim, name in (("live", live_va), ("dev", dev_va)):
        kube.delete_pod(kube_namespace, f"{claim}-app")
        wait_for(f"the {claim} attachment to be detached", detached(env, name))

    # And the PVs can be deleted (Retain: the images stay): the finalizer goes with the last attachment.
    for claim, pv in (("live", live_pv), ("hung", hung_pv), ("dev", dev_pv)):
        kube.delete_pvc(kube_namespace, claim)
        wait_for(f"{pv} Released", released(env, pv))
        kube.delete_pv(pv)
        wait_for(f"{pv} deleted", gone(env, pv))


def detached(env: Env, attachment: str) -> Callable[[], bool]:
    return lambda: va(env, attachment) is None


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
