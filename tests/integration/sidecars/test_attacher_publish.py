"""The embedded attacher's publishing strategy on the real apiserver, kube-controller-manager
and Ceph cluster: attach → our finalizer on the VolumeAttachment and PV and the publish record
on the image; a second node's attachment of the RWO volume → attachError naming the holder;
detach → record cleared, finalizers gone. Non-graceful node shutdown: the node tainted
`node.kubernetes.io/out-of-service`, its pod force-deleted (what pod GC does) → ControllerUnpublish
blocklists the node's client address before the attachment goes (visible in `ceph osd blocklist
ls`), also when the controller is killed between the blocklist and the release; the taint removed
and the node Ready again → its blocklist entry removed.

No kubelet runs: the test writes the client address a node plugin reports at NodeStage, and
plays pod GC. Addresses are from 10.250.1.0/24, unused by the test cluster (127.0.0.1)."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.ceph.fixtures import CephTestCluster
from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]

FINALIZER = "external-attacher/rbd-csi-ceph-com"  # external-attacher's, as ceph-csi's csi-attacher
TAINT = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
FENCE_SECRET = ("ceph-secrets", "csi-fence-secret")


def image_meta(ceph: CephTestCluster, image: str) -> dict[str, str]:
    return dict(json.loads(ceph.admin("rbd", "image-meta", "list", "--format", "json", f"{ceph.pool}/{image}") or "{}"))


def blocklist(ceph: CephTestCluster) -> list[str]:
    text = ceph.admin("ceph", "osd", "blocklist", "ls", "--format", "json").strip() or "[]"
    entries, _ = json.JSONDecoder().raw_decode(text)
    return [str(e["addr"]) for e in entries]


def fence_secret(env: Env) -> tuple[str, str]:
    """A Secret of a cephx user with the caps fencing needs (profile rbd + `osd blocklist`)."""
    ceph = env.ceph
    key = ceph.admin("ceph", "auth", "get-or-create-key", "client.csi-fence", "mon",
                     'profile rbd, allow command "osd blocklist"', "osd", f"profile rbd pool={ceph.pool}",
                     "mgr", f"profile rbd pool={ceph.pool}").strip()
    namespace, name = FENCE_SECRET
    env.kube.ensure_namespace(namespace)
    try:
        env.kube.core.create_namespaced_secret(namespace, {"metadata": {"name": name},
                                                           "stringData": {"userID": "csi-fence", "userKey": key}})
    except Exception as error:  # noqa: BLE001 - already there from an earlier test
        if getattr(error, "status", None) != 409:
            raise
    return FENCE_SECRET


def attachment_of(env: Env, pv: str, node: str | None = None) -> dict[str, Any] | None:
    found = [va for va in env.kube.attachments() if va["spec"]["source"].get("persistentVolumeName") == pv
             and (node is None or va["spec"]["nodeName"] == node)]
    return found[0] if found else None


def finalizers(obj: dict[str, Any] | None) -> list[str]:
    return list(((obj or {}).get("metadata") or {}).get("finalizers") or [])


def set_ready(env: Env, node: str, ready: bool) -> None:
    env.kube.core.patch_node_status(node, {"status": {"conditions": [{
        "type": "Ready", "status": "True" if ready else "False", "reason": "Test", "message": "set by the test",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})


def provision(env: Env, namespace: str, claim: str) -> tuple[str, str, str]:
    """(PV name, volume handle, image) of a new RWO claim of a class using the fence secret."""
    kube, ceph = env.kube, env.ceph
    storage_class = kube.create_storage_class(ceph, fence_secret(env), prefix=new_prefix())
    uid = kube.create_pvc(namespace, claim, storage_class, size="16Mi")["metadata"]["uid"]
    wait_for("Bound", lambda: ((kube.pvc(namespace, claim) or {}).get("status") or {}).get("phase") == "Bound")
    pv = kube.pv(f"pvc-{uid}") or {}
    handle = pv["spec"]["csi"]["volumeHandle"]
    return f"pvc-{uid}", handle, pv["spec"]["csi"]["volumeAttributes"]["imageName"]


def test_attach_records_the_node_and_a_second_node_is_refused(env: Env, start_controllers: StartControllers,
                                                              kube_namespace: str) -> None:
    start_controllers()
    kube, ceph, suffix = env.kube, env.ceph, uuid.uuid4().hex[:6]
    node_a, node_b = f"pa-{suffix}", f"pb-{suffix}"
    kube.create_node(node_a)
    kube.create_node(node_b)
    pv, handle, image = provision(env, kube_namespace, "data")
    kube.create_pod(kube_namespace, "app", node_a, "data")
    attached = wait_for("attached to node A", lambda: (attachment_of(env, pv, node_a) or {}).get("status", {}).get(
        "attached") and attachment_of(env, pv, node_a))
    assert FINALIZER in finalizers(attached)
    wait_for("the PV finalizer", lambda: FINALIZER in finalizers(kube.pv(pv)))
    assert f".rbd.csi.ceph.com/clientaddress/{handle}/{node_a}" in image_meta(ceph, image)

    # A second attachment to node B (the attach-detach controller itself refuses a second node
    # for an RWO claim, "Multi-Attach error"; a hand-made or stale one must fail in the driver too):
    # attachError naming node A and what to do, and no record for node B.
    kube.storage.create_volume_attachment({"metadata": {"name": f"second-{suffix}"}, "spec": {
        "attacher": "rbd.csi.ceph.com", "nodeName": node_b, "source": {"persistentVolumeName": pv}}})
    error = str(wait_for("attachError on node B", lambda: (((attachment_of(env, pv, node_b) or {}).get("status") or {})
                                                           .get("attachError") or {}).get("message")))
    assert node_a in error and "out-of-service" in error
    assert f".rbd.csi.ceph.com/clientaddress/{handle}/{node_b}" not in image_meta(ceph, image)
    kube.storage.delete_volume_attachment(f"second-{suffix}")
    wait_for("the failed attachment gone", lambda: attachment_of(env, pv, node_b) is None)

    kube.delete_pod(kube_namespace, "app")
    wait_for("detached", lambda: attachment_of(env, pv) is None, timeout=90)
    assert not [k for k in image_meta(ceph, image) if k.startswith(".rbd.csi.ceph.com/")]
    kube.delete_pvc(kube_namespace, "data")
    wait_for("the PV to be deleted", lambda: kube.pv(pv) is None)


def test_out_of_service_node_is_fenced_before_release_and_unfenced_when_back(
        env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    kube, ceph, suffix = env.kube, env.ceph, uuid.uuid4().hex[:6]
    node = f"lost-{suffix}"
    address = f"10.250.1.{int(suffix[:2], 16) % 200 + 10}"
    kube.create_node(node)
    set_ready(env, node, True)
    controllers = start_controllers(environ={"CEPHCSI_FAILPOINTS": "unpublish.after-blocklist"})
    try:
        pv, handle, image = provision(env, kube_namespace, "data")
        kube.create_pod(kube_namespace, "app", node, "data")
        wait_for("attached", lambda: ((attachment_of(env, pv) or {}).get("status") or {}).get("attached"))
        # The node plugin's report at NodeStage (ceph-csi's key): its Ceph client address.
        ceph.admin("rbd", "image-meta", "set", f"{ceph.pool}/{image}",
                   f".rbd.csi.ceph.com/clientaddress/{handle}/{node}", address)

        # The node dies; the operator marks it out of service; pod GC force-deletes its pod.
        set_ready(env, node, False)
        kube.core.patch_node(node, {"spec": {"taints": [TAINT]}})
        kube.delete_pod(kube_namespace, "app")
        # The controller is killed right after the blocklist: the attachment is still held.
        first = controllers[0].process
        assert first is not None
        wait_for("the controller killed at the failpoint", lambda: first.poll() is not None, timeout=60)
        assert any(e.startswith(address) for e in blocklist(ceph))
        assert attachment_of(env, pv) is not None, "released only after the unpublish finished"
        # A new controller finishes it: record gone, attachment released, still blocklisted.
        start_controllers()
        wait_for("released", lambda: attachment_of(env, pv) is None, timeout=90)
        assert not [k for k in image_meta(ceph, image) if node in k]
        assert any(e.startswith(address) for e in blocklist(ceph))

        # Taint removed but the node not Ready yet: still fenced.
        kube.core.patch_node(node, {"spec": {"taints": None}})
        time.sleep(3)  # several attacher passes
        assert any(e.startswith(address) for e in blocklist(ceph))
        # Back and Ready: unfenced.
        set_ready(env, node, True)
        wait_for("the blocklist entry removed", lambda: not any(e.startswith(address) for e in blocklist(ceph)),
                 timeout=60)
        kube.delete_pvc(kube_namespace, "data")
        wait_for("the PV to be deleted", lambda: kube.pv(pv) is None)
    finally:
        for entry in blocklist(ceph):
            if entry.startswith("10.250.1."):
                ceph.admin("ceph", "osd", "blocklist", "rm", entry)
