"""Kubernetes helpers for the e2e scenarios: objects as plain dicts, waits with deadlines.

Every wait polls with a deadline and fails with what it last saw (phase, events), so a failing
scenario says why without digging through logs. `exec_in` goes through the real kubectl binary
(apiserver → kubelet → containerd), like a user would.
"""
from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client
from kubernetes.client import ApiException

T = TypeVar("T")
DRIVER = "rbd.csi.ceph.com"
DEPLOY_NAMESPACE = "ceph-csi-rbd"
CONTROLLER_LABELS = "app.kubernetes.io/name=cephcsi,app.kubernetes.io/component=controller"
NODE_LABELS = "app.kubernetes.io/name=cephcsi,app.kubernetes.io/component=node"


def wait_for(what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.5,
             explain: Callable[[], str] | None = None) -> T:
    """Poll check() until truthy and return it; AssertionError naming `what`, the last value and
    `explain()` (e.g. the object's events) on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = ""
            if explain is not None:
                try:
                    detail = "\n" + explain()
                except Exception as error:  # noqa: BLE001 - diagnostics only
                    detail = f"\n(explain failed: {error})"
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {value!r}){detail}")
        time.sleep(interval)


def _json(response: Any) -> Any:
    return json.loads(response.data)


@dataclass
class Kube:
    """Thin typed access to the objects the scenarios use, as the admin."""

    api: kubernetes.client.ApiClient
    kubectl_argv: list[str]
    """kubectl with --kubeconfig, for exec and apply -k."""

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api)

    @property
    def storage(self) -> kubernetes.client.StorageV1Api:
        return kubernetes.client.StorageV1Api(self.api)

    @property
    def apps(self) -> kubernetes.client.AppsV1Api:
        return kubernetes.client.AppsV1Api(self.api)

    def _get(self, call: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = _json(call(*args, _preload_content=False))
            return result
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    # ---- kubectl --------------------------------------------------------------------------

    def kubectl(self, *args: str, timeout: float = 120.0, input_text: str | None = None) -> str:
        proc = subprocess.run([*self.kubectl_argv, *args], capture_output=True, text=True,
                              timeout=timeout, check=False, input=input_text)
        if proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def exec_in(self, namespace: str, pod: str, script: str, timeout: float = 60.0) -> str:
        """Run `sh -c script` in the pod's first container; its stdout."""
        return self.kubectl("-n", namespace, "exec", pod, "--", "sh", "-c", script, timeout=timeout)

    def wait_written(self, namespace: str, pod: str, path: str, timeout: float = 60.0) -> str:
        """The content of a file the pod's own script writes, once it is there. A pod is Ready as
        soon as its container starts, which can be well before its script has run (seconds on a
        busy node): a test that reads or snapshots the data must wait for it first."""
        return wait_for(f"{path} written in {namespace}/{pod}",
                        lambda: self.exec_in(namespace, pod, f"cat {path} 2>/dev/null || true").strip(), timeout)

    # ---- namespaces ------------------------------------------------------------------------

    def create_namespace(self, prefix: str = "e2e") -> str:
        """A fresh namespace whose `default` ServiceAccount exists (pods need it for admission)."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        wait_for(f"ServiceAccount {name}/default", lambda: self._get(
            self.core.read_namespaced_service_account, "default", name), timeout=60)
        return name

    def namespace_exists(self, name: str) -> bool:
        return self._get(self.core.read_namespace, name) is not None

    def delete_namespace(self, name: str) -> None:
        try:
            self.core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise

    # ---- claims and volumes ----------------------------------------------------------------

    def create_pvc(self, namespace: str, name: str, storage_class: str, size: str = "64Mi",
                   block: bool = False, access_mode: str = "ReadWriteOnce", volume_name: str = "") -> None:
        """A claim of the class ("" and `volume_name`: a claim of that pre-provisioned PV)."""
        spec: dict[str, Any] = {
            "accessModes": [access_mode],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": size}},
            "volumeMode": "Block" if block else "Filesystem",
        }
        if volume_name:
            spec["volumeName"] = volume_name
        self.core.create_namespaced_persistent_volume_claim(namespace, {"metadata": {"name": name}, "spec": spec})

    def pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    def pvcs(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = _json(self.core.list_namespaced_persistent_volume_claim(
            namespace, _preload_content=False))["items"]
        return items

    def wait_bound(self, namespace: str, name: str, timeout: float = 90.0) -> dict[str, Any]:
        """Wait for the claim to be Bound; its PV."""
        def bound() -> dict[str, Any] | None:
            claim = self.pvc(namespace, name)
            if claim and claim.get("status", {}).get("phase") == "Bound":
                return self.pv(claim["spec"]["volumeName"])
            return None
        return wait_for(f"PVC {namespace}/{name} Bound", bound, timeout,
                        explain=lambda: self.events(namespace, name))

    def delete_pvc(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_persistent_volume_claim(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise

    def pv(self, name: str) -> dict[str, Any] | None:
        return self._get(self.core.read_persistent_volume, name)

    def create_pv(self, doc: dict[str, Any]) -> None:
        self.core.create_persistent_volume(doc)

    def delete_pv(self, name: str) -> None:
        try:
            self.core.delete_persistent_volume(name)
        except ApiException as error:
            if error.status != 404:
                raise

    def pvs(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = _json(self.core.list_persistent_volume(_preload_content=False))["items"]
        return items

    def attachments(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = _json(self.storage.list_volume_attachment(_preload_content=False))["items"]
        return items

    def wait_pv_gone(self, name: str, timeout: float = 90.0) -> None:
        wait_for(f"PV {name} deleted", lambda: self.pv(name) is None, timeout,
                 explain=lambda: json.dumps(self.pv(name), indent=1)[-2000:])

    # ---- pods ---------------------------------------------------------------------------------

    def create_pod(self, namespace: str, name: str, image: str, script: str, claim: str,
                   block: bool = False, read_only: bool = False, node: str = "") -> None:
        """A pod running `sh -c script` as root with the claim at /data (or the raw device at
        /dev/e2e-block for a Block claim), on `node` if given (else where the scheduler puts
        it). Root: a Block device node is root:disk 0660."""
        container: dict[str, Any] = {
            "name": "main",
            "image": image,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script],
            "securityContext": {"runAsUser": 0, "runAsGroup": 0},
        }
        if block:
            container["volumeDevices"] = [{"name": "data", "devicePath": "/dev/e2e-block"}]
        else:
            container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        pod: dict[str, Any] = {
            "metadata": {"name": name},
            "spec": {
                "containers": [container],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}],
                "terminationGracePeriodSeconds": 5,
                "enableServiceLinks": False,
                "automountServiceAccountToken": False,
            },
        }
        if node:
            pod["spec"]["nodeName"] = node
        self.core.create_namespaced_pod(namespace, pod)

    def node(self, name: str) -> dict[str, Any] | None:
        return self._get(self.core.read_node, name)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self.core.read_namespaced_pod, name, namespace)

    def pods(self, namespace: str, labels: str = "") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = _json(self.core.list_namespaced_pod(
            namespace, label_selector=labels, _preload_content=False))["items"]
        return items

    def wait_pod_ready(self, namespace: str, name: str, timeout: float = 120.0) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            if pod is None:
                return None
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return pod
            return None
        return wait_for(f"pod {namespace}/{name} Ready", ready, timeout,
                        explain=lambda: self.events(namespace, name))

    def delete_pod(self, namespace: str, name: str, timeout: float = 90.0) -> None:
        """Delete and wait until the object is gone: the kubelet has unpublished and unstaged."""
        try:
            self.core.delete_namespaced_pod(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise
        wait_for(f"pod {namespace}/{name} gone", lambda: self.pod(namespace, name) is None, timeout,
                 explain=lambda: self.events(namespace, name))

    def events(self, namespace: str, name: str) -> str:
        """The object's events, oldest first, one per line (diagnostics for failed waits)."""
        items = _json(self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}", _preload_content=False))["items"]
        lines = [f"{e.get('type')} {e.get('reason')}: {e.get('message')}" for e in items]
        return "events:\n  " + "\n  ".join(lines) if lines else "no events"

    # ---- the driver's own objects -------------------------------------------------------------

    def csinode(self, node: str) -> dict[str, Any] | None:
        return self._get(self.storage.read_csi_node, node)

    def csinode_drivers(self, node: str) -> list[str]:
        csinode = self.csinode(node)
        if csinode is None:
            return []
        return [d["name"] for d in csinode.get("spec", {}).get("drivers") or []]

    def lease_holder(self) -> str:
        lease = self._get(kubernetes.client.CoordinationV1Api(self.api).read_namespaced_lease,
                          DRIVER.replace(".", "-"), DEPLOY_NAMESPACE)
        return str((lease or {}).get("spec", {}).get("holderIdentity") or "")

    def ready_pods(self, labels: str) -> list[dict[str, Any]]:
        """Running, Ready, not terminating pods of the driver with these labels."""
        found = []
        for pod in self.pods(DEPLOY_NAMESPACE, labels):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                found.append(pod)
        return found

    def wait_driver_ready(self, node: str, timeout: float = 180.0) -> None:
        """Both controller replicas and the node plugin Ready, and the node plugin registered
        with the kubelet (CSINode lists the driver)."""
        wait_for("2 controller replicas Ready", lambda: len(self.ready_pods(CONTROLLER_LABELS)) >= 2, timeout,
                 explain=lambda: self._pods_report(CONTROLLER_LABELS))
        wait_for("the node plugin Ready", lambda: len(self.ready_pods(NODE_LABELS)) >= 1, timeout,
                 explain=lambda: self._pods_report(NODE_LABELS))
        wait_for(f"CSINode {node} listing {DRIVER}", lambda: DRIVER in self.csinode_drivers(node), timeout)

    def _pods_report(self, labels: str) -> str:
        lines = []
        for pod in self.pods(DEPLOY_NAMESPACE, labels):
            name = pod["metadata"]["name"]
            statuses = pod.get("status", {}).get("containerStatuses") or []
            lines.append(f"{name}: {pod.get('status', {}).get('phase')} {json.dumps(statuses)[:800]}")
            lines.append(self.events(DEPLOY_NAMESPACE, name))
        return "\n".join(lines) or "no pods"

    def logs(self, pod: str, namespace: str = DEPLOY_NAMESPACE, previous: bool = False) -> str:
        try:
            return str(self.core.read_namespaced_pod_log(pod, namespace, previous=previous))
        except ApiException as error:
            return f"(no logs: {error.status})"


def volume_uuid(pv: dict[str, Any]) -> str:
    """The object uuid in a cephcsi volume id (its last 36 characters, ceph-csi's layout)."""
    handle: str = pv["spec"]["csi"]["volumeHandle"]
    return handle[-36:]


def image_name(pv: dict[str, Any]) -> str:
    """The RBD image behind a PV: the driver publishes it in volumeAttributes (imageName);
    otherwise the default prefix + uuid."""
    attributes = pv["spec"]["csi"].get("volumeAttributes") or {}
    return str(attributes.get("imageName") or f"csi-vol-{volume_uuid(pv)}")


def kubectl_argv(kubectl: Path, kubeconfig: Path) -> list[str]:
    return [str(kubectl), f"--kubeconfig={kubeconfig}"]
