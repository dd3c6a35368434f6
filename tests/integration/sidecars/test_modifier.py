"""The embedded resizer's VolumeAttributesClass flow on the real control plane (kube-apiserver's
PVC status validation, kcm's PV binder) with real Ceph: a class change reaches the image as
librbd QoS configuration and the claim's status records it as external-resizer does; a class
the driver refuses is Infeasible and changes nothing, and setting the claim back rolls it back;
a leader SIGKILLed in the middle of ControllerModifyVolume is finished by the next leader."""
from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import DRIVER, ControllerProcess, new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]


def claim_status(env: Env, namespace: str, name: str) -> dict[str, Any]:
    return dict((env.kube.pvc(namespace, name) or {}).get("status") or {})


def bound_pv(env: Env, namespace: str, name: str, storage_class: str) -> dict[str, Any]:
    claim = env.kube.create_pvc(namespace, name, storage_class)
    wait_for(f"{name} Bound", lambda: claim_status(env, namespace, name).get("phase") == "Bound")
    return env.kube.pv(f"pvc-{claim['metadata']['uid']}") or {}


def create_class(env: Env, name: str, parameters: dict[str, str], driver: str = DRIVER) -> str:
    env.kube.storage.create_volume_attributes_class(
        {"metadata": {"name": name}, "driverName": driver, "parameters": parameters})
    return name


def set_class(env: Env, namespace: str, name: str, vac: str) -> None:
    env.kube.core.patch_namespaced_persistent_volume_claim(name, namespace, {"spec": {"volumeAttributesClassName": vac}})


def qos(env: Env, pv: dict[str, Any]) -> dict[str, str]:
    image = pv["spec"]["csi"]["volumeAttributes"]["imageName"]
    rows = json.loads(env.ceph.admin("rbd", "config", "image", "ls", "--format", "json", f"{env.ceph.pool}/{image}"))
    return {row["name"]: str(row["value"]) for row in rows if row["source"] == "image" and "qos" in row["name"]}


def delete(env: Env, namespace: str, name: str, pv: dict[str, Any]) -> None:
    """Delete the claim and wait for its PV to go, so no later test's controller finds it."""
    env.kube.delete_pvc(namespace, name)
    wait_for(f"PV of {name} deleted", lambda: env.kube.pv(pv["metadata"]["name"]) is None)


def reasons(env: Env, namespace: str, name: str) -> list[str]:
    return [reason for _type, reason, _message in env.kube.events(namespace, name)]


def current(env: Env, namespace: str, name: str) -> str:
    return str(claim_status(env, namespace, name).get("currentVolumeAttributesClassName") or "")


def test_class_change_sets_qos_and_status_infeasible_then_rolled_back(
        env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    start_controllers()
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    pv = bound_pv(env, kube_namespace, "data", storage_class)
    gold = create_class(env, f"{prefix}gold", {"baseReadIops": "2000", "baseWriteBps": "104857600"})

    set_class(env, kube_namespace, "data", gold)
    wait_for("the claim to have the class", lambda: current(env, kube_namespace, "data") == gold)
    status = claim_status(env, kube_namespace, "data")
    assert not status.get("modifyVolumeStatus") and not status.get("conditions")
    assert qos(env, pv) == {"rbd_qos_read_iops_limit": "2000", "rbd_qos_write_bps_limit": "104857600"}
    assert (env.kube.pv(pv["metadata"]["name"]) or {})["spec"]["volumeAttributesClassName"] == gold
    wait_for("events", lambda: {"VolumeModify", "VolumeModifySuccessful"} <= set(reasons(env, kube_namespace, "data")))

    # A class with a key the driver does not know: Infeasible, nothing changed on the image.
    bad = create_class(env, f"{prefix}bad", {"baseReadIops": "10", "readIopsPerGB": "1"})
    set_class(env, kube_namespace, "data", bad)
    wait_for("the class to be infeasible", lambda: (claim_status(env, kube_namespace, "data")
             .get("modifyVolumeStatus") or {}).get("status") == "Infeasible")
    status = claim_status(env, kube_namespace, "data")
    assert status["modifyVolumeStatus"]["targetVolumeAttributesClassName"] == bad
    assert status["currentVolumeAttributesClassName"] == gold
    assert "readIopsPerGB" in status["conditions"][0]["message"]
    assert "VolumeModifyFailed" in reasons(env, kube_namespace, "data")
    assert qos(env, pv) == {"rbd_qos_read_iops_limit": "2000", "rbd_qos_write_bps_limit": "104857600"}

    # Rolled back to the class the volume has: the status is cleared.
    set_class(env, kube_namespace, "data", gold)
    wait_for("the rollback to clear the status",
             lambda: not claim_status(env, kube_namespace, "data").get("modifyVolumeStatus"))
    assert current(env, kube_namespace, "data") == gold
    assert not [c for c in claim_status(env, kube_namespace, "data").get("conditions") or []
                if c["type"] in ("ModifyingVolume", "ModifyVolumeError")]
    delete(env, kube_namespace, "data", pv)


def test_missing_class_is_pending_until_it_exists(env: Env, start_controllers: StartControllers,
                                                  kube_namespace: str) -> None:
    start_controllers()
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    pv = bound_pv(env, kube_namespace, "late", storage_class)
    set_class(env, kube_namespace, "late", f"{prefix}later")
    wait_for("Pending", lambda: (claim_status(env, kube_namespace, "late").get("modifyVolumeStatus") or {})
             .get("status") == "Pending")
    create_class(env, f"{prefix}later", {"baseIops": "300"})
    wait_for("the class to be applied", lambda: current(env, kube_namespace, "late") == f"{prefix}later")
    assert qos(env, pv) == {"rbd_qos_iops_limit": "300"}
    delete(env, kube_namespace, "late", pv)


def test_leader_killed_mid_modify_is_finished_by_the_next(env: Env, start_controllers: StartControllers,
                                                          kube_namespace: str) -> None:
    (doomed,) = start_controllers(1, environ={"CEPHCSI_FAILPOINTS": "modify.between-keys"})
    wait_for("the first replica to lead", doomed.is_leader)
    (standby,) = start_controllers(1)
    wait_for("the standby's caches to sync", lambda: standby.http("/readyz")[0] == 200)
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    pv = bound_pv(env, kube_namespace, "data", storage_class)
    silver = create_class(env, f"{prefix}silver", {"baseIops": "700", "baseBps": "5000000"})

    set_class(env, kube_namespace, "data", silver)
    wait_for("the leader to die mid-modify", lambda: doomed.process is not None and doomed.process.poll() is not None)
    assert doomed.process is not None and doomed.process.returncode == -9
    assert len(qos(env, pv)) < 2  # killed after the first image-meta write
    assert (claim_status(env, kube_namespace, "data").get("modifyVolumeStatus") or {}).get("status") == "InProgress"

    assert isinstance(standby, ControllerProcess)
    wait_for("the standby to take over", standby.is_leader, timeout=30)
    wait_for("the new leader to finish", lambda: current(env, kube_namespace, "data") == silver, timeout=90)
    assert qos(env, pv) == {"rbd_qos_iops_limit": "700", "rbd_qos_bps_limit": "5000000"}
    delete(env, kube_namespace, "data", pv)


def test_claim_created_with_a_class_gets_its_qos_and_the_modify_secret(
        env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    """The provisioner passes the class's parameters as CreateVolume's mutable_parameters (over
    the StorageClass's QoS keys), records the class on the PV (the binder copies it to the
    claim's current class) and the StorageClass's controller-modify secret as PV annotations,
    which the resizer then uses."""
    start_controllers()
    prefix = new_prefix()
    namespace, secret = env.secret
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix, parameters={
        "baseWriteIops": "40", "baseReadIops": "10",
        "csi.storage.k8s.io/controller-modify-secret-name": secret,
        "csi.storage.k8s.io/controller-modify-secret-namespace": namespace})
    bronze = create_class(env, f"{prefix}bronze", {"baseReadIops": "90"})
    claim = env.kube.create_pvc(kube_namespace, "born", storage_class, volumeAttributesClassName=bronze)
    wait_for("Bound", lambda: claim_status(env, kube_namespace, "born").get("phase") == "Bound")
    pv = env.kube.pv(f"pvc-{claim['metadata']['uid']}") or {}
    assert pv["spec"]["volumeAttributesClassName"] == bronze
    assert pv["metadata"]["annotations"]["volume.kubernetes.io/controller-modify-secret-name"] == secret
    assert qos(env, pv) == {"rbd_qos_read_iops_limit": "90", "rbd_qos_write_iops_limit": "40"}
    wait_for("the binder to record the class", lambda: current(env, kube_namespace, "born") == bronze)

    steel = create_class(env, f"{prefix}steel", {"baseIops": "123"})
    set_class(env, kube_namespace, "born", steel)
    wait_for("the new class", lambda: current(env, kube_namespace, "born") == steel)
    assert qos(env, pv) == {"rbd_qos_iops_limit": "123"}  # the class replaces the whole QoS
    delete(env, kube_namespace, "born", pv)
