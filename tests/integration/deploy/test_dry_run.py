"""Every object of deploy/ (the rendered kustomization and the examples) is accepted by a real
kube-apiserver: server-side apply, dry-run, strict field validation. The pod templates are
also dry-run as Pods, which runs pod admission (Pod Security, priority classes)."""
from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from tests.controlplane.cluster import ControlPlane
from tests.controlplane import snapshot_crds as crds
from tests.integration.deploy.conftest import Applier
from tests.unit.deploy import manifests as m

pytestmark = [pytest.mark.integration, pytest.mark.kube]

RENDERED = m.render()
EXAMPLES = [obj for path in sorted(m.EXAMPLES.glob("*.yaml")) for obj in m.load_docs(path)]


@pytest.fixture
def snapshot_crds(control_plane: ControlPlane) -> None:
    """The external-snapshotter CRDs (kubernetes-csi/external-snapshotter) installed and served:
    the ClusterRole names their resources, which a bare apiserver does not serve. They stay
    installed (tests.controlplane.snapshot_crds)."""
    crds.ensure_installed(control_plane)


def test_namespace_object_dry_runs(admin_applier: Applier) -> None:
    namespace = copy.deepcopy(m.find(RENDERED, "Namespace"))
    namespace["metadata"]["name"] = "cephcsi-dry-run-only"
    reply = admin_applier.apply(namespace, dry_run=True)
    assert reply["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.parametrize("obj", [o for o in RENDERED if o["kind"] != "Namespace"], ids=lambda o: "/".join(m.key(o)))
def test_install_object_is_accepted(obj: dict[str, Any], admin_applier: Applier, deploy_namespace: str) -> None:
    reply = admin_applier.apply(obj, dry_run=True)
    resource = admin_applier.resource(obj)
    assert resource.namespaced == (obj["kind"] not in m.CLUSTER_SCOPED), "CLUSTER_SCOPED in manifests.py is wrong"
    if resource.namespaced:
        assert reply["metadata"]["namespace"] == deploy_namespace == m.kustomization()["namespace"]
    assert reply["metadata"]["name"] == obj["metadata"]["name"]


@pytest.mark.parametrize("obj", EXAMPLES, ids=lambda o: "/".join(m.key(o)))
def test_example_object_is_accepted(obj: dict[str, Any], admin_applier: Applier, deploy_namespace: str) -> None:
    reply = admin_applier.apply(obj, dry_run=True)
    if obj["kind"] == "Secret":
        assert reply["metadata"]["namespace"] == deploy_namespace


def test_dry_run_rejects_a_misspelt_field(admin_applier: Applier, deploy_namespace: str) -> None:
    """Strict validation is on: the checks above would catch a typo in a field name."""
    daemonset = copy.deepcopy(m.find(RENDERED, "DaemonSet"))
    mount = daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    mount["mountPropogation"] = mount.pop("mountPropagation", "Bidirectional")
    with pytest.raises(kubernetes.client.ApiException) as caught:
        admin_applier.apply(daemonset, dry_run=True)
    # Server-side apply reports a field outside the schema as 500 "failed to create typed
    # patch object ... field not declared in schema" (apiserver behaviour), not 422.
    body = str(caught.value.body)
    assert (caught.value.status or 0) >= 400 and "mountPropogation" in body and "not declared in schema" in body, body


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_pod_template_is_admitted_as_a_pod(kind: str, admin_applier: Applier, deploy_namespace: str) -> None:
    """Pod admission runs on Pods only: Pod Security (the namespace's label must admit the
    privileged node plugin) and Priority (the priorityClassName must exist)."""
    workload = m.find(RENDERED, kind)
    template = workload["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"dry-run-{kind.lower()}", "namespace": deploy_namespace,
                     "labels": template["metadata"]["labels"]},
        "spec": copy.deepcopy(template["spec"]),
    }
    reply = admin_applier.apply(pod, dry_run=True)
    assert reply["spec"]["priorityClassName"] == template["spec"]["priorityClassName"]
    assert reply["spec"]["priority"] >= 2_000_000_000, "system-*-critical priority resolved"


def test_pod_security_would_refuse_the_node_plugin_without_the_namespace_label(
    control_plane: ControlPlane, admin_applier: Applier
) -> None:
    """Why namespace.yaml carries the privileged label (this test can fail if PSA is off)."""
    name = "cephcsi-psa-baseline"
    core = kubernetes.client.CoreV1Api(admin_applier.dynamic.client)
    core.create_namespace({"metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    try:
        template = m.find(RENDERED, "DaemonSet")["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "node-plugin", "namespace": name},
               "spec": copy.deepcopy(template["spec"])}
        with pytest.raises(kubernetes.client.ApiException) as caught:
            admin_applier.apply(pod, dry_run=True)
        assert caught.value.status == 403 and "violates PodSecurity" in str(caught.value.body)
    finally:
        core.delete_namespace(name)


def test_rbac_rules_name_real_resources_and_verbs(control_plane: ControlPlane, snapshot_crds: None) -> None:
    """RBAC accepts any string, so a misspelt resource ('volumeattachment') would silently
    grant nothing. Check every rule against the apiserver's discovery (with the snapshot CRDs
    installed: their resources are served only then)."""
    with control_plane.api_client() as client:
        discovered: dict[tuple[str, str], set[str]] = {}
        groups = client.call_api("/apis", "GET", response_type="object", auth_settings=["BearerToken"],
                                 _return_http_data_only=True)
        paths = {"": "/api/v1"}
        for group in groups["groups"]:
            paths[group["name"]] = f"/apis/{group['preferredVersion']['groupVersion']}"
        for group_name, path in paths.items():
            listing = client.call_api(path, "GET", response_type="object", auth_settings=["BearerToken"],
                                      _return_http_data_only=True)
            for resource in listing["resources"]:
                discovered[(group_name, resource["name"])] = set(resource.get("verbs") or [])
    for obj in RENDERED:
        for rule in obj.get("rules") or []:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    assert (group, resource) in discovered, f"{m.key(obj)}: no resource {group or 'core'}/{resource}"
                    unsupported = set(rule["verbs"]) - discovered[(group, resource)]
                    assert not unsupported, f"{m.key(obj)}: {group or 'core'}/{resource} has no verbs {unsupported}"


def test_priority_classes_exist(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as client:
        scheduling = kubernetes.client.SchedulingV1Api(client)
        for kind in ("Deployment", "DaemonSet"):
            name = m.find(RENDERED, kind)["spec"]["template"]["spec"]["priorityClassName"]
            scheduling.read_priority_class(name)


MICROK8S = Path(__file__).resolve().parents[3] / "overlays" / "microk8s"
MICROK8S_KUBELET = "/var/snap/microk8s/common/var/lib/kubelet"


@pytest.fixture(scope="module")
def microk8s_rendered() -> list[dict[str, Any]]:
    """overlays/microk8s/ rendered by the real `kubectl kustomize` (the e2e node's kubectl, built
    by the set-up command), as `kubectl apply -k overlays/microk8s/` would send it."""
    from tests.e2e.kubenode import node_binaries

    kubectl = node_binaries() / "kubectl"
    out = subprocess.run([str(kubectl), "kustomize", str(MICROK8S)], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    return [obj for obj in yaml.safe_load_all(out) if obj]


def test_microk8s_overlay_moves_every_kubelet_path(microk8s_rendered: list[dict[str, Any]]) -> None:
    """The overlay's `test` ops pin deploy/'s paths; here: nothing of the node plugin still names
    /var/lib/kubelet outside MicroK8s' folder, and every other object is deploy/'s unchanged."""
    daemonset = next(o for o in microk8s_rendered if o["kind"] == "DaemonSet")
    text = yaml.safe_dump(daemonset).replace(MICROK8S_KUBELET, "")
    assert "/var/lib/kubelet" not in text
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert f"--kubelet-dir={MICROK8S_KUBELET}" in container["args"]
    assert f"--kubelet-registration-path={MICROK8S_KUBELET}/plugins/rbd.csi.ceph.com/csi.sock" in container["args"]
    for mount in container["volumeMounts"]:
        if mount["mountPath"].startswith(MICROK8S_KUBELET):
            # Same path inside and out: the kubelet hands the plugin host paths.
            volume = next(v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
            assert volume["hostPath"]["path"] == mount["mountPath"]
    others = {m.key(o): o for o in microk8s_rendered if o["kind"] != "DaemonSet"}
    assert others == {m.key(o): o for o in RENDERED if o["kind"] != "DaemonSet"}


def test_microk8s_overlay_is_accepted(microk8s_rendered: list[dict[str, Any]], admin_applier: Applier,
                                      deploy_namespace: str) -> None:
    daemonset = next(o for o in microk8s_rendered if o["kind"] == "DaemonSet")
    reply = admin_applier.apply(daemonset, dry_run=True)
    assert reply["metadata"]["namespace"] == deploy_namespace


MIGRATION = Path(__file__).resolve().parents[3] / "overlays" / "migration"


def test_migration_overlay_holds_the_node_plugin_back_and_is_accepted(admin_applier: Applier,
                                                                        deploy_namespace: str) -> None:
    """overlays/migration/ (docs/migrate-from-ceph-csi.md, step 2), rendered by the real kubectl:
    the node DaemonSet the apiserver accepts only schedules onto nodes labelled cephcsi.migrated=true."""
    from tests.e2e.kubenode import node_binaries

    out = subprocess.run([str(node_binaries() / "kubectl"), "kustomize", str(MIGRATION)], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    daemonset = next(o for o in yaml.safe_load_all(out) if o and o["kind"] == "DaemonSet")
    reply = admin_applier.apply(daemonset, dry_run=True)
    assert reply["metadata"]["namespace"] == deploy_namespace
    assert reply["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux",
                                                                  "cephcsi.migrated": "true"}
