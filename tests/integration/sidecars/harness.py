"""Helpers for the end-to-end tests of the embedded provisioner and attacher: real
`cephcsi --mode=controller` processes (sidecars on) against the test control plane and Ceph."""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kubernetes.client

from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess

DRIVER = "rbd.csi.ceph.com"
LEASE = "rbd-csi-ceph-com"
PV_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
PROVISIONING_FINALIZER = f"{DRIVER}/provisioning"
KCM_CONTROLLERS = (
    "persistentvolume-binder-controller",
    "persistentvolume-attach-detach-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
)
# Short election timings so failover tests take seconds (flags as the Go sidecars spell them).
FAST_ELECTION = ("--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s",
                 "--leader-election-retry-period=500ms")
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(what: str, check: Callable[[], T], timeout: float = 60.0, interval: float = 0.25) -> T:
    """Poll until check() is truthy; its value, or AssertionError naming `what` (and the last value)."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(interval)
        value = check()
    return value


@dataclass
class ControllerProcess(DriverProcess):
    """`cephcsi --mode=controller` with its embedded sidecars on and an HTTP endpoint."""

    http_port: int = field(default_factory=free_port)

    def command(self) -> list[str]:
        argv = [a for a in super().command() if a != "--sidecars=none"]
        return [*argv, f"--http-endpoint=127.0.0.1:{self.http_port}"]

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError:
            return 0, ""

    def metric(self, metric: str, **labels: str) -> float | None:
        """The value of one sample on /metrics, None when absent."""
        _, text = self.http("/metrics")
        for line in text.splitlines():
            if not line.startswith(metric + "{") and not line.startswith(metric + " "):
                continue
            sample, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in sample for k, v in labels.items()):
                return float(value)
        return None

    def is_leader(self) -> bool:
        return self.process is not None and self.process.poll() is None and \
            self.metric("leader_election_master_status", name=LEASE) == 1.0


class Kube:
    """The admin's view of the test cluster, as plain dicts."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.storage = kubernetes.client.StorageV1Api(api_client)
        self.storage_classes: list[str] = []

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)

    def _optional(self, call: Callable[[], Any]) -> dict[str, Any] | None:
        try:
            return self._json(call())  # type: ignore[no-any-return]
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise

    # ---- objects -----------------------------------------------------------------------------

    def ensure_namespace(self, name: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": name}})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise

    def create_ceph_secret(self, namespace: str, name: str, ceph: CephTestCluster) -> None:
        self.ensure_namespace(namespace)
        try:
            self.core.create_namespaced_secret(namespace, {"metadata": {"name": name}, "stringData": ceph.secrets})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise

    def create_storage_class(self, ceph: CephTestCluster, secret: tuple[str, str], *, prefix: str,
                             parameters: dict[str, str] | None = None, **extra: Any) -> str:
        """A class of our driver whose images are named `<prefix><uuid>` (so a test can count its own)."""
        name = f"sc-{uuid.uuid4().hex[:8]}"
        secret_namespace, secret_name = secret
        params = {**ceph.parameters, "volumeNamePrefix": prefix, "csi.storage.k8s.io/fstype": "ext4"}
        for kind in ("provisioner", "node-stage", "controller-expand"):
            params[f"csi.storage.k8s.io/{kind}-secret-name"] = secret_name
            params[f"csi.storage.k8s.io/{kind}-secret-namespace"] = secret_namespace
        params.update(parameters or {})
        self.storage.create_storage_class({"metadata": {"name": name}, "provisioner": DRIVER, "parameters": params,
                                           **extra})
        self.storage_classes.append(name)
        return name

    def delete_storage_classes(self) -> None:
        """The classes this helper created (claims using them should be gone by now)."""
        for name in self.storage_classes:
            try:
                self.storage.delete_storage_class(name)
            except kubernetes.client.ApiException as error:
                if error.status != 404:
                    raise
        self.storage_classes.clear()

    def create_pvc(self, namespace: str, name: str, storage_class: str, size: str = "8Mi", **spec: Any) -> dict[str, Any]:
        body = {"metadata": {"name": name}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}},
            "storageClassName": storage_class, **spec}}
        return self._json(self.core.create_namespaced_persistent_volume_claim(  # type: ignore[no-any-return]
            namespace, body, _preload_content=False))

    def create_pvcs(self, namespace: str, names: Iterable[str], storage_class: str) -> list[dict[str, Any]]:
        """Create many claims at once (a burst), from several threads."""
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda n: self.create_pvc(namespace, n, storage_class), names))

    def pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._optional(lambda: self.core.read_namespaced_persistent_volume_claim(
            name, namespace, _preload_content=False))

    def pvcs(self, namespace: str) -> list[dict[str, Any]]:
        return self._json(self.core.list_namespaced_persistent_volume_claim(  # type: ignore[no-any-return]
            namespace, _preload_content=False))["items"]

    def pv(self, name: str) -> dict[str, Any] | None:
        return self._optional(lambda: self.core.read_persistent_volume(name, _preload_content=False))

    def pvs(self) -> list[dict[str, Any]]:
        return self._json(self.core.list_persistent_volume(_preload_content=False))["items"]  # type: ignore[no-any-return]

    def pvs_of(self, namespace: str) -> list[dict[str, Any]]:
        return [pv for pv in self.pvs() if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace]

    def attachments(self) -> list[dict[str, Any]]:
        return self._json(self.storage.list_volume_attachment(_preload_content=False))["items"]  # type: ignore[no-any-return]

    def events(self, namespace: str, name: str, component: str | None = None) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the Events about object `name` in `namespace`; with `component`,
        only those it reported (kube-controller-manager's PV binder reports ProvisioningFailed too,
        e.g. for a claim that reached it before its StorageClass did)."""
        items = self._json(self.core.list_namespaced_event(namespace, _preload_content=False))["items"]
        return [(e["type"], e["reason"], e["message"]) for e in items if e["involvedObject"].get("name") == name
                and (component is None or (e.get("source") or {}).get("component") == component)]

    def delete_pvc(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_persistent_volume_claim(name, namespace)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise

    def delete_pv(self, name: str) -> None:
        try:
            self.core.delete_persistent_volume(name)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise

    def create_node(self, name: str) -> None:
        # The attach-detach controller manages attachments only for nodes that say so (the
        # kubelet sets this annotation when it registers the node).
        try:
            self.core.create_node({"metadata": {"name": name, "annotations": {
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise

    def create_pod(self, namespace: str, name: str, node: str, claim: str) -> None:
        self.core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "busybox", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}})

    def delete_pod(self, namespace: str, name: str) -> None:
        # No kubelet confirms termination here: delete at once.
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def lease_holder(self, namespace: str) -> str:
        lease = self._optional(lambda: kubernetes.client.CoordinationV1Api(self.client).read_namespaced_lease(
            LEASE, namespace, _preload_content=False))
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def bound(pvcs: list[dict[str, Any]]) -> int:
    return sum(1 for c in pvcs if (c.get("status") or {}).get("phase") == "Bound")


def journal_names(ceph: CephTestCluster) -> dict[str, str]:
    """The journal's request names (csi.volume.<name> → uuid) in the test pool."""
    directory = ceph.omap("csi.volumes.default")
    return {k[len("csi.volume."):]: v for k, v in directory.items() if k.startswith("csi.volume.")}


def images_with(ceph: CephTestCluster, prefix: str) -> list[str]:
    return [image for image in ceph.images() if image.startswith(prefix)]


def new_prefix() -> str:
    return f"t{uuid.uuid4().hex[:6]}-"


def log_has(process: DriverProcess, pattern: str) -> bool:
    return re.search(pattern, process.log()) is not None
