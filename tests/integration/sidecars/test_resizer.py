"""The embedded resizer on the real control plane (kube-apiserver's PVC resize admission and
status validation, kcm's PV binder) with real Ceph: a grown claim reaches the state the kubelet
expects (FileSystemResizePending / NodeResizePending) or, for Block, is finished; a failed size
can be lowered (recovery from expansion failure); a leader SIGKILLed between resizing the image
and updating the API objects is finished by the next leader."""
from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import ControllerProcess, new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]
MiB = 1 << 20


def claim_status(env: Env, namespace: str, name: str) -> dict[str, Any]:
    return dict((env.kube.pvc(namespace, name) or {}).get("status") or {})


def bound_pv(env: Env, namespace: str, name: str, size: str = "8Mi", **spec: Any) -> dict[str, Any]:
    claim = env.kube.create_pvc(namespace, name, spec.pop("storage_class"), size=size, **spec)
    pv_name = f"pvc-{claim['metadata']['uid']}"
    wait_for(f"{name} Bound", lambda: claim_status(env, namespace, name).get("phase") == "Bound")
    return env.kube.pv(pv_name) or {}


def grow(env: Env, namespace: str, name: str, size: str) -> None:
    env.kube.core.patch_namespaced_persistent_volume_claim(
        name, namespace, {"spec": {"resources": {"requests": {"storage": size}}}})


def image_size(env: Env, pv: dict[str, Any]) -> int:
    image = pv["spec"]["csi"]["volumeAttributes"]["imageName"]
    return int(json.loads(env.ceph.admin("rbd", "info", "--format", "json", f"{env.ceph.pool}/{image}"))["size"])


def pv_capacity(env: Env, pv: dict[str, Any]) -> str:
    return str(((env.kube.pv(pv["metadata"]["name"]) or {}).get("spec") or {}).get("capacity", {}).get("storage"))


def node_pending(env: Env, namespace: str, name: str, size: str) -> bool:
    status = claim_status(env, namespace, name)
    return (status.get("allocatedResourceStatuses") or {}).get("storage") == "NodeResizePending" \
        and (status.get("allocatedResources") or {}).get("storage") == size


def reasons(env: Env, namespace: str, name: str) -> list[str]:
    return [reason for _type, reason, _message in env.kube.events(namespace, name)]


def test_filesystem_claim_waits_for_the_node_and_block_claim_is_finished(
        env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    start_controllers()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix(), allowVolumeExpansion=True)
    fs_pv = bound_pv(env, kube_namespace, "fs", storage_class=storage_class)
    block_pv = bound_pv(env, kube_namespace, "blk", storage_class=storage_class, volumeMode="Block")

    grow(env, kube_namespace, "fs", "24Mi")
    grow(env, kube_namespace, "blk", "20Mi")
    wait_for("the filesystem claim to wait for the kubelet", lambda: node_pending(env, kube_namespace, "fs", "24Mi"))
    status = claim_status(env, kube_namespace, "fs")
    assert [c["type"] for c in status["conditions"]] == ["FileSystemResizePending"]
    assert status["capacity"]["storage"] == "8Mi"  # the kubelet sets it once the filesystem has grown
    assert pv_capacity(env, fs_pv) == "24Mi" and image_size(env, fs_pv) == 24 * MiB
    wait_for("fs events", lambda: {"Resizing", "FileSystemResizeRequired"} <= set(reasons(env, kube_namespace, "fs")))

    wait_for("the block claim to be finished",
             lambda: claim_status(env, kube_namespace, "blk").get("capacity", {}).get("storage") == "20Mi")
    status = claim_status(env, kube_namespace, "blk")
    assert not status.get("conditions") and not (status.get("allocatedResourceStatuses") or {}).get("storage")
    assert pv_capacity(env, block_pv) == "20Mi" and image_size(env, block_pv) == 20 * MiB
    wait_for("block events", lambda: "VolumeResizeSuccessful" in reasons(env, kube_namespace, "blk"))

    # Grown again while the node step of the first expansion is still pending: that one is
    # finished first (Kubernetes' rule), so nothing changes until the kubelet is done.
    grow(env, kube_namespace, "fs", "32Mi")
    assert not wait_for_quietly(lambda: pv_capacity(env, fs_pv) == "32Mi", 3.0)
    for name in ("fs", "blk"):
        env.kube.delete_pvc(kube_namespace, name)


def wait_for_quietly(check: Any, seconds: float) -> bool:
    try:
        wait_for("", check, timeout=seconds)
        return True
    except AssertionError:
        return False


def test_infeasible_size_then_lowered_request_is_honoured(env: Env, start_controllers: StartControllers,
                                                          kube_namespace: str) -> None:
    start_controllers()
    late_secret = f"late-{new_prefix().rstrip('-')}"
    storage_class = env.kube.create_storage_class(
        env.ceph, env.secret, prefix=new_prefix(), allowVolumeExpansion=True,
        parameters={"csi.storage.k8s.io/controller-expand-secret-name": late_secret})
    pv = bound_pv(env, kube_namespace, "data", storage_class=storage_class)

    grow(env, kube_namespace, "data", "64Mi")
    wait_for("the size to be marked infeasible", lambda: (claim_status(env, kube_namespace, "data")
             .get("allocatedResourceStatuses") or {}).get("storage") == "ControllerResizeInfeasible")
    status = claim_status(env, kube_namespace, "data")
    assert [c["type"] for c in status["conditions"]] == ["ControllerResizeError"]
    assert late_secret in status["conditions"][0]["message"]
    assert "VolumeResizeFailed" in reasons(env, kube_namespace, "data")
    assert image_size(env, pv) == 8 * MiB

    # The user fixes the cause and lowers the request (allowed: still above status.capacity).
    env.kube.create_ceph_secret(env.secret[0], late_secret, env.ceph)
    grow(env, kube_namespace, "data", "16Mi")
    wait_for("the lowered size to be expanded", lambda: node_pending(env, kube_namespace, "data", "16Mi"))
    assert pv_capacity(env, pv) == "16Mi" and image_size(env, pv) == 16 * MiB
    env.kube.delete_pvc(kube_namespace, "data")


def test_leader_killed_between_resize_and_api_updates(env: Env, start_controllers: StartControllers,
                                                      kube_namespace: str) -> None:
    # The first replica SIGKILLs itself right after growing the image (before the PV and the
    # claim are updated); it is started alone so that it is the leader.
    fast_lease = ("--journal-lock-timeout=2s",)
    (doomed,) = start_controllers(1, args=fast_lease, environ={"CEPHCSI_FAILPOINTS": "expand.after-resize"})
    wait_for("the first replica to lead", doomed.is_leader)
    (standby,) = start_controllers(1, args=fast_lease)
    wait_for("the standby's caches to sync", lambda: standby.http("/readyz")[0] == 200)
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix(), allowVolumeExpansion=True)
    pv = bound_pv(env, kube_namespace, "data", storage_class=storage_class)

    grow(env, kube_namespace, "data", "40Mi")
    assert doomed.process is not None
    wait_for("the leader to die mid-resize", lambda: doomed.process is not None and doomed.process.poll() is not None)
    assert doomed.process.returncode == -9
    assert image_size(env, pv) == 40 * MiB and pv_capacity(env, pv) == "8Mi"  # killed between the steps
    status = claim_status(env, kube_namespace, "data")
    assert (status.get("allocatedResourceStatuses") or {}).get("storage") == "ControllerResizeInProgress"

    assert isinstance(standby, ControllerProcess)
    wait_for("the standby to take over", standby.is_leader, timeout=30)
    wait_for("the new leader to finish the resize", lambda: node_pending(env, kube_namespace, "data", "40Mi"), timeout=60)
    assert pv_capacity(env, pv) == "40Mi" and image_size(env, pv) == 40 * MiB
    env.kube.delete_pvc(kube_namespace, "data")
