"""The cluster-wide snapshot add-on a user installs once (docs/snapshots.md) on the e2e node: the
CRDs and the upstream snapshot-controller of kubernetes-csi/external-snapshotter (built and
cached by tests/controlplane/snapshotter_build.sh; the controller runs on the host against the
node's apiserver), and deploy/examples/snapshots/snapshotclass.yaml's VolumeSnapshotClass with its
placeholder (clusterID) filled in. cephcsi's controller notices the CRDs by itself (it checks
discovery while they are missing) and starts its embedded snapshotter.

Used by the e2e snapshot scenarios and by the demo (tests/e2e/demo.py).
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

from tests.e2e.env import DEPLOY, E2EEnv
from tests.e2e.kube import wait_for

BUILD = Path(__file__).resolve().parents[1] / "controlplane" / "snapshotter_build.sh"
GROUP, VERSION = "snapshot.storage.k8s.io", "v1"
EXAMPLE = DEPLOY / "examples" / "snapshots" / "snapshotclass.yaml"


def _established(extensions: kubernetes.client.ApiextensionsV1Api, name: str) -> bool:
    conditions = extensions.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def snapshots(custom: kubernetes.client.CustomObjectsApi) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = custom.list_cluster_custom_object(GROUP, VERSION, "volumesnapshots")["items"]
    return items


def example_snapshot_class(cluster_id: str) -> dict[str, Any]:
    """The example's VolumeSnapshotClass with the clusterID a user fills in."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    snapclass: dict[str, Any] = next(d for d in docs if d["kind"] == "VolumeSnapshotClass")
    snapclass["parameters"]["clusterID"] = cluster_id
    return snapclass


@dataclass
class SnapshotAddon:
    """The running add-on; `stop()` waits until every VolumeSnapshot is gone first (the
    controller removes their finalizers; without it their namespaces could never be deleted)."""

    process: subprocess.Popen[bytes]
    custom: kubernetes.client.CustomObjectsApi
    class_name: str

    def stop(self, timeout: float = 120.0) -> None:
        try:
            wait_for("every VolumeSnapshot deleted", lambda: not snapshots(self.custom), timeout=timeout)
        finally:
            self.process.terminate()
            self.process.wait(timeout=30)


def start_snapshot_addon(env: E2EEnv, log_path: Path) -> SnapshotAddon:
    """CRDs installed (those present are kept), the snapshot-controller started, the example
    VolumeSnapshotClass created unless it exists."""
    out = Path(subprocess.run([str(BUILD)], check=True, capture_output=True, text=True,
                              timeout=3600).stdout.strip().splitlines()[-1])
    extensions = kubernetes.client.ApiextensionsV1Api(env.kube.api)
    for path in sorted((out / "crd").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        try:
            extensions.create_custom_resource_definition(body)
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
        name = body["metadata"]["name"]
        wait_for(f"CRD {name} established", lambda: _established(extensions, name), timeout=60)
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(out / "bin" / "snapshot-controller"), f"--kubeconfig={env.node.kubeconfig}",
                                    "--leader-election=false", "--retry-interval-start=500ms",
                                    "--retry-interval-max=5s", "--v=2"], stdout=log, stderr=subprocess.STDOUT)
    custom = kubernetes.client.CustomObjectsApi(env.kube.api)
    snapclass = example_snapshot_class(env.ceph.cluster_id)
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, "volumesnapshotclasses", snapclass)
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            process.terminate()
            raise
    return SnapshotAddon(process=process, custom=custom, class_name=str(snapclass["metadata"]["name"]))
