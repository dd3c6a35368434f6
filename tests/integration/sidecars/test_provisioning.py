"""End to end on a real control plane (etcd, kube-apiserver, kube-controller-manager's PV binder,
attach-detach and protection controllers), real Ceph, and real `cephcsi --mode=controller`
processes with the embedded provisioner and attacher."""
from __future__ import annotations

import time
import uuid

import pytest

from cephcsi._generated import csi_pb2
from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import (
    DRIVER,
    PROVISIONING_FINALIZER,
    PV_FINALIZER,
    images_with,
    journal_names,
    new_prefix,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]


def test_claim_to_bound_pv_attach_detach_and_delete(env: Env, start_controllers: StartControllers,
                                                     kube_namespace: str) -> None:
    (controller,) = start_controllers()
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    storage_class = kube.create_storage_class(ceph, env.secret, prefix=prefix, mountOptions=["discard"])
    claim = kube.create_pvc(kube_namespace, "data", storage_class, size="12Mi")
    uid = claim["metadata"]["uid"]

    bound = wait_for("the claim to be Bound", lambda: (kube.pvc(kube_namespace, "data") or {}).get("status", {}).get("phase") == "Bound")
    assert bound
    pv = kube.pv(f"pvc-{uid}")
    assert pv is not None
    meta, spec = pv["metadata"], pv["spec"]
    assert meta["annotations"]["pv.kubernetes.io/provisioned-by"] == DRIVER
    assert meta["annotations"]["volume.kubernetes.io/provisioner-deletion-secret-name"] == env.secret[1]
    assert meta["annotations"]["volume.kubernetes.io/provisioner-deletion-secret-namespace"] == env.secret[0]
    assert PV_FINALIZER in meta["finalizers"]
    assert spec["capacity"] == {"storage": "12Mi"}
    assert spec["accessModes"] == ["ReadWriteOnce"] and spec["volumeMode"] == "Filesystem"
    assert spec["persistentVolumeReclaimPolicy"] == "Delete" and spec["storageClassName"] == storage_class
    assert spec["mountOptions"] == ["discard"]
    assert spec["claimRef"]["uid"] == uid and spec["claimRef"]["name"] == "data"
    csi = spec["csi"]
    assert csi["driver"] == DRIVER and csi["fsType"] == "ext4"
    assert csi["nodeStageSecretRef"] == {"name": env.secret[1], "namespace": env.secret[0]}
    assert csi["controllerExpandSecretRef"] == {"name": env.secret[1], "namespace": env.secret[0]}
    attributes = csi["volumeAttributes"]
    assert attributes["storage.kubernetes.io/csiProvisionerIdentity"].endswith(f"-{DRIVER}")
    assert attributes["pool"] == ceph.pool and attributes["imageName"].startswith(prefix)
    assert images_with(ceph, prefix) == [attributes["imageName"]]
    assert journal_names(ceph).get(f"pvc-{uid}")
    claim_now = kube.pvc(kube_namespace, "data") or {}
    assert PROVISIONING_FINALIZER not in claim_now["metadata"].get("finalizers", [])
    reasons = [reason for _type, reason, _message in kube.events(kube_namespace, "data")]
    assert "Provisioning" in reasons and "ProvisioningSucceeded" in reasons

    # A pod on a node: the attach-detach controller creates a VolumeAttachment; we attach it.
    node = f"node-{uuid.uuid4().hex[:6]}"
    kube.create_node(node)
    kube.create_pod(kube_namespace, "app", node, "data")
    attachment = wait_for("a VolumeAttachment marked attached", lambda: [
        va for va in kube.attachments()
        if va["spec"]["source"].get("persistentVolumeName") == f"pvc-{uid}" and (va.get("status") or {}).get("attached")])
    assert attachment[0]["spec"]["attacher"] == DRIVER and attachment[0]["spec"]["nodeName"] == node
    # The controller advertises ControllerPublish: the attacher's finalizer holds the attachment
    # until ControllerUnpublish has run (tests/integration/sidecars/test_attacher_publish.py); it is
    # external-attacher's name, so ceph-csi's csi-attacher would take it as its own.
    assert attachment[0]["metadata"].get("finalizers") == ["external-attacher/rbd-csi-ceph-com"]

    # Deleting the claim while attached: the PV is Released but must not be deleted yet.
    kube.delete_pod(kube_namespace, "app")
    wait_for("the VolumeAttachment to go", lambda: not [
        va for va in kube.attachments() if va["spec"]["source"].get("persistentVolumeName") == f"pvc-{uid}"])
    kube.delete_pvc(kube_namespace, "data")
    wait_for("the PV to be deleted", lambda: kube.pv(f"pvc-{uid}") is None)
    wait_for("the image to be deleted", lambda: not images_with(ceph, prefix))
    assert f"pvc-{uid}" not in journal_names(ceph)
    assert controller.metric("controller_persistentvolumeclaim_provision_total", **{"class": storage_class}) == 1.0
    assert controller.metric("controller_persistentvolume_delete_total", **{"class": storage_class}) == 1.0
    status, body = controller.http("/readyz")
    assert status == 200 and '"informers": "ok"' in body
    status, body = controller.http("/healthz")
    assert status == 200 and '"leader-election": "ok"' in body


def test_pv_is_not_deleted_while_attached(env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    start_controllers()
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    storage_class = kube.create_storage_class(ceph, env.secret, prefix=prefix)
    uid = kube.create_pvc(kube_namespace, "data", storage_class)["metadata"]["uid"]
    wait_for("Bound", lambda: (kube.pvc(kube_namespace, "data") or {}).get("status", {}).get("phase") == "Bound")
    # An attachment that outlives its claim (made by hand: the attach-detach controller takes a
    # minute to detach a volume whose claim is gone, which would only slow the test down).
    node = f"node-{uuid.uuid4().hex[:6]}"
    kube.create_node(node)  # ControllerPublish answers NOT_FOUND for a node that does not exist
    attachment = f"csi-{uuid.uuid4().hex}"
    kube.storage.create_volume_attachment({"metadata": {"name": attachment}, "spec": {
        "attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": f"pvc-{uid}"}}})
    wait_for("attached", lambda: [va for va in kube.attachments()
                                  if va["metadata"]["name"] == attachment and (va.get("status") or {}).get("attached")])
    kube.delete_pvc(kube_namespace, "data")
    wait_for("the PV to be Released", lambda: (kube.pv(f"pvc-{uid}") or {}).get("status", {}).get("phase") == "Released")
    wait_for("VolumeFailedDelete naming the node", lambda: [
        m for _t, r, m in kube.events("default", f"pvc-{uid}") if r == "VolumeFailedDelete" and node in m])
    assert images_with(ceph, prefix), "the image of an attached volume must stay"
    assert kube.pv(f"pvc-{uid}") is not None
    kube.storage.delete_volume_attachment(attachment)
    wait_for("the PV to be deleted after detach", lambda: kube.pv(f"pvc-{uid}") is None, timeout=20)
    wait_for("the image to be deleted", lambda: not images_with(ceph, prefix))


def test_bad_parameter_fails_clearly_and_creates_nothing(env: Env, start_controllers: StartControllers,
                                                         kube_namespace: str) -> None:
    start_controllers()
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    storage_class = kube.create_storage_class(ceph, env.secret, prefix=prefix, parameters={"imageFeatures": "fast-diff"})
    kube.create_pvc(kube_namespace, "data", storage_class)
    failures = wait_for("a ProvisioningFailed event", lambda: [
        (t, m) for t, r, m in kube.events(kube_namespace, "data", DRIVER) if r == "ProvisioningFailed"])
    event_type, message = failures[0]
    assert event_type == "Warning"
    assert message == (f'failed to provision volume with StorageClass "{storage_class}": rpc error: code = '
                       "InvalidArgument desc = parameter imageFeatures: fast-diff requires object-map to be listed too")
    claim = kube.pvc(kube_namespace, "data") or {}
    assert claim["status"]["phase"] == "Pending"
    assert not images_with(ceph, prefix) and not kube.pvs_of(kube_namespace)
    # Deleting the failed claim releases it (nothing was created, nothing to clean up).
    kube.delete_pvc(kube_namespace, "data")
    wait_for("the claim to go", lambda: kube.pvc(kube_namespace, "data") is None)
    assert f"pvc-{claim['metadata']['uid']}" not in journal_names(ceph)


def test_missing_secret_is_reported(env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    start_controllers()
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    storage_class = kube.create_storage_class(ceph, (env.secret[0], "no-such-secret"), prefix=prefix)
    kube.create_pvc(kube_namespace, "data", storage_class)
    failures = wait_for("a ProvisioningFailed event", lambda: [
        m for _t, r, m in kube.events(kube_namespace, "data", DRIVER) if r == "ProvisioningFailed"])
    assert 'secrets "no-such-secret" not found' in failures[0]
    assert not images_with(ceph, prefix)
    kube.delete_pvc(kube_namespace, "data")


def test_retain_keeps_the_image(env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    (controller,) = start_controllers()
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    storage_class = kube.create_storage_class(ceph, env.secret, prefix=prefix, reclaimPolicy="Retain")
    uid = kube.create_pvc(kube_namespace, "data", storage_class)["metadata"]["uid"]
    wait_for("Bound", lambda: (kube.pvc(kube_namespace, "data") or {}).get("status", {}).get("phase") == "Bound")
    pv = kube.pv(f"pvc-{uid}") or {}
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert PV_FINALIZER not in pv["metadata"].get("finalizers", [])
    kube.delete_pvc(kube_namespace, "data")
    wait_for("Released", lambda: (kube.pv(f"pvc-{uid}") or {}).get("status", {}).get("phase") == "Released")
    # The admin deletes the PV object too: with Retain the image must survive even that.
    kube.delete_pv(f"pvc-{uid}")
    wait_for("the PV object to go", lambda: kube.pv(f"pvc-{uid}") is None)
    assert len(images_with(ceph, prefix)) == 1 and f"pvc-{uid}" in journal_names(ceph)
    assert "method=DeleteVolume" not in controller.log()
    # The admin's clean-up, through the driver's own socket.
    controller.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(
        volume_id=pv["spec"]["csi"]["volumeHandle"], secrets=ceph.secrets), timeout=30)
    assert not images_with(ceph, prefix)


def test_wait_for_first_consumer_waits_for_the_selected_node(env: Env, start_controllers: StartControllers,
                                                             kube_namespace: str) -> None:
    start_controllers()
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    storage_class = kube.create_storage_class(ceph, env.secret, prefix=prefix, volumeBindingMode="WaitForFirstConsumer")
    uid = kube.create_pvc(kube_namespace, "data", storage_class)["metadata"]["uid"]
    wait_for("the binder's WaitForFirstConsumer event", lambda: [
        r for _t, r, _m in kube.events(kube_namespace, "data") if r == "WaitForFirstConsumer"])
    time.sleep(1)
    assert not images_with(ceph, prefix) and kube.pv(f"pvc-{uid}") is None
    # What the scheduler does once a pod using the claim is placed.
    kube.core.patch_namespaced_persistent_volume_claim(
        "data", kube_namespace, {"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-a"}}})
    wait_for("Bound", lambda: ((kube.pvc(kube_namespace, "data") or {}).get("status") or {}).get("phase") == "Bound")
    assert len(images_with(ceph, prefix)) == 1
    kube.delete_pvc(kube_namespace, "data")
    wait_for("the image to be deleted", lambda: not images_with(ceph, prefix))
