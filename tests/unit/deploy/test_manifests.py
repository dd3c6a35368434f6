"""deploy/: valid, complete, and consistent with cephcsi's own flag parser, config and parameter
parsers (its RBAC: test_rbac_manifests.py). No cluster needed (tests/integration/deploy/ uses a real
kube-apiserver)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cephcsi import __version__
from cephcsi.ceph.credentials import Credentials, is_cephx_key
from cephcsi.cli.args import parse_settings
from cephcsi.config.clusters import parse_clusters
from cephcsi.errors import InvalidArgument
from cephcsi.observability.http import parse_address
from cephcsi.settings import Settings
from cephcsi.volumes.parameters import VolumeParameters
from tests.unit.deploy import manifests as m

pytestmark = pytest.mark.unit

ALL_FILES = sorted(m.DEPLOY.rglob("*.yaml"))
RENDERED = m.render()
EXAMPLES = [obj for path in sorted(m.EXAMPLES.glob("*.yaml")) for obj in m.load_docs(path)]


def settings_of(container: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> Settings:
    """Parse a container's args exactly as the image's ENTRYPOINT (`cephcsi`) would."""
    assert container.get("command") in (None, ["cephcsi"]), "the image's ENTRYPOINT is cephcsi; do not override it"
    argv = m.expanded_args(container, {"NODE_NAME": "node-1", "POD_NAMESPACE": m.NAMESPACE})
    try:
        return parse_settings(argv)
    except SystemExit:
        pytest.fail(f"cephcsi rejects the args of container {container['name']!r}: {capsys.readouterr().err.strip()}")


def volume_for_mount(spec: dict[str, Any], container: dict[str, Any], mount_path: str) -> dict[str, Any]:
    mounts = {v["mountPath"].rstrip("/"): v for v in container.get("volumeMounts") or []}
    mount = mounts.get(mount_path.rstrip("/"))
    assert mount is not None, f"nothing is mounted at {mount_path}"
    volumes: dict[str, dict[str, Any]] = {v["name"]: v for v in spec.get("volumes") or []}
    return volumes[mount["name"]]


# ---- files and the kustomization ---------------------------------------------------------

@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(m.DEPLOY)))
def test_every_file_is_yaml_objects_with_api_version_kind_and_name(path: Path) -> None:
    docs = m.load_docs(path)
    assert docs, f"{path} has no YAML document"
    if path.name == "kustomization.yaml":
        assert docs[0]["kind"] == "Kustomization"
        return
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: document without apiVersion/kind"
        assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without metadata.name"
        assert "status" not in doc, f"{path}: {doc['kind']} carries a status"


def test_kustomization_lists_every_install_file_and_nothing_else() -> None:
    listed = m.kustomization()["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    on_disk = {p.name for p in m.DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == on_disk, (
        f"not listed: {sorted(on_disk - set(listed))}; listed but missing: {sorted(set(listed) - on_disk)}"
    )
    # The Secret and StorageClass are user-edited examples applied on their own (a re-apply of
    # the install must not reset a real key, and StorageClass parameters are immutable).
    assert not any("examples" in item for item in listed)
    assert {o["kind"] for o in EXAMPLES} >= {"Secret", "StorageClass", "PersistentVolumeClaim", "Pod"}


def test_no_two_objects_share_kind_namespace_and_name() -> None:
    keys = [m.key(o) for o in RENDERED + EXAMPLES]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_rendered_namespaced_objects_are_in_the_kustomization_namespace() -> None:
    namespace = m.kustomization()["namespace"]
    assert namespace == m.NAMESPACE
    assert m.find(RENDERED, "Namespace")["metadata"]["name"] == namespace
    for obj in RENDERED:
        if obj["kind"] not in m.CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == namespace, m.key(obj)
    # The files say the same, so `kubectl apply -f` of one file lands in the same place.
    for path in m.DEPLOY.glob("*.yaml"):
        if path.name == "kustomization.yaml":
            continue
        for obj in m.load_docs(path):
            if obj["kind"] not in m.CLUSTER_SCOPED:
                assert obj["metadata"].get("namespace") == namespace, (path.name, m.key(obj))


def test_namespace_admits_the_privileged_node_plugin() -> None:
    labels = m.find(RENDERED, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_image_is_the_versioned_cephcsi_image_with_a_kustomize_images_entry() -> None:
    entries = m.kustomization()["images"]
    assert entries == [{"name": "cephcsi", "newName": "cephcsi", "newTag": __version__}]
    for obj in RENDERED:
        for container in m.containers(obj):
            assert container["image"] == f"cephcsi:{__version__}", m.key(obj)
            assert container.get("imagePullPolicy") == "IfNotPresent"


def test_images_entry_points_the_image_elsewhere() -> None:
    """The renderer's images transformer, used above, really rewrites (this test can fail)."""
    obj: dict[str, Any] = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "cephcsi:0.1.0"}]}}
    m._set_image(obj["spec"]["containers"][0], [{"name": "cephcsi", "newName": "reg.example/x/cephcsi", "newTag": "9"}])
    assert obj["spec"]["containers"][0]["image"] == "reg.example/x/cephcsi:9"
    assert m.split_image("localhost:5000/cephcsi:1@sha256:ab") == ("localhost:5000/cephcsi", "1", "sha256:ab")


def test_renderer_refuses_kustomize_features_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: []\n")
    with pytest.raises(ValueError, match="patches"):
        m.render(tmp_path)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl binary (the renderer is checked by the other tests)")
def test_renderer_matches_kubectl_kustomize() -> None:
    proc = subprocess.run(["kubectl", "kustomize", str(m.DEPLOY)], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0 and "unknown command" in proc.stderr:
        pytest.skip("this kubectl has no kustomize")
    assert proc.returncode == 0, proc.stderr
    theirs = {m.key(o): o for o in yaml.safe_load_all(proc.stdout) if o}
    ours = {m.key(o): o for o in RENDERED}
    assert set(theirs) == set(ours)
    for k, obj in ours.items():
        assert obj == theirs[k], f"{k} differs from kubectl kustomize"


# ---- container args against cephcsi's own parser ------------------------------------------

@pytest.mark.parametrize("obj", [o for o in RENDERED if list(m.containers(o))], ids=lambda o: o["kind"])
def test_container_args_are_accepted_by_cephcsi(obj: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    for container in m.containers(obj):
        settings_of(container, capsys)


def test_args_check_rejects_unknown_flags_and_undefined_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(pytest.fail.Exception, match="no-such-flag"):
        settings_of({"name": "c", "args": ["--mode=controller", "--no-such-flag=1"]}, capsys)
    with pytest.raises(ValueError, match=r"\$\(NODE_NAME\)"):
        m.expanded_args({"name": "c", "args": ["--nodeid=$(NODE_NAME)"]})


def controller() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    deployment = m.find(RENDERED, "Deployment", "cephcsi-controller")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return deployment, spec, container


def node() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    daemonset = m.find(RENDERED, "DaemonSet", "cephcsi-node")
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return daemonset, spec, container


def test_controller_runs_the_controller_role_with_leader_election(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, container = controller()
    settings = settings_of(container, capsys)
    assert settings.mode == "controller"
    assert set(settings.sidecars.enabled) == {"provisioner", "attacher", "resizer", "snapshotter"}
    assert settings.sidecars.leader_election is True
    assert settings.sidecars.leader_election_namespace == m.NAMESPACE  # from $(POD_NAMESPACE)
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert settings.sidecars.http_endpoint == ":8080"


def test_node_runs_the_node_role_with_its_node_name(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, container = node()
    settings = settings_of(container, capsys)
    assert settings.mode == "node"
    assert settings.sidecars.enabled == ("registrar",)
    assert settings.node.node_id == "node-1"  # $(NODE_NAME)
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


@pytest.mark.parametrize("role", [controller, node], ids=["controller", "node"])
def test_probes_use_the_http_endpoint(role: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, container = role()
    settings = settings_of(container, capsys)
    _, port = parse_address(settings.sidecars.http_endpoint)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    if "readinessProbe" in container:
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


@pytest.mark.parametrize("role", [controller, node], ids=["controller", "node"])
def test_config_json_and_socket_are_mounted_where_the_flags_point(role: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _, spec, container = role()
    settings = settings_of(container, capsys)
    config_dir, _, config_key = settings.config_file.rpartition("/")
    volume = volume_for_mount(spec, container, config_dir)
    assert volume["configMap"]["name"] == "ceph-csi-config"
    configmap = m.find(RENDERED, "ConfigMap", "ceph-csi-config")
    assert config_key in configmap["data"]
    assert settings.endpoint.startswith("unix://")
    socket_dir = settings.endpoint[len("unix://"):].rpartition("/")[0]
    volume_for_mount(spec, container, socket_dir)
    assert settings.driver_name == m.find(RENDERED, "CSIDriver")["metadata"]["name"]


def test_every_volume_mount_names_a_volume_and_every_volume_is_used() -> None:
    for obj in RENDERED + EXAMPLES:
        spec = m.pod_spec(obj)
        if spec is None:
            continue
        volumes = {v["name"] for v in spec.get("volumes") or []}
        used = {mount["name"] for c in m.containers(obj) for mount in c.get("volumeMounts") or []}
        assert used <= volumes, (m.key(obj), used - volumes)
        assert volumes <= used, (m.key(obj), volumes - used)


# ---- controller Deployment ----------------------------------------------------------------

def test_controller_deployment_is_two_replicas_spread_by_hostname() -> None:
    deployment, spec, _ = controller()
    assert deployment["spec"]["replicas"] == 2
    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items(), "anti-affinity must select the controller's own pods"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_controller_is_non_root_read_only_and_unprivileged() -> None:
    _, spec, container = controller()
    pod_sc, sc = spec["securityContext"], container["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == pod_sc["runAsGroup"] == dockerfile_uid()
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not sc.get("privileged")
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    assert not [v for v in spec["volumes"] if "hostPath" in v], "the controller needs no host paths"
    tmp = volume_for_mount(spec, container, "/tmp")
    assert tmp["emptyDir"]["medium"] == "Memory", "key files must not reach a disk"


def test_controller_resources_have_requests_and_a_memory_limit() -> None:
    _, _, container = controller()
    resources = container["resources"]
    assert resources["requests"]["memory"] == "160Mi"  # above the measured 136 MiB burst peak
    assert resources["requests"]["cpu"]
    assert resources["limits"]["memory"] == "512Mi"


def test_controller_service_account_token_is_projected_not_a_secret() -> None:
    _, spec, _ = controller()
    assert spec["serviceAccountName"] == m.CONTROLLER_SA
    assert spec.get("automountServiceAccountToken") is True
    sa = m.find(RENDERED, "ServiceAccount", m.CONTROLLER_SA)
    assert "secrets" not in sa, "no long-lived token Secret"
    assert not [o for o in RENDERED if o["kind"] == "Secret"], "no Secret in the install (tokens are projected)"


# ---- node DaemonSet -------------------------------------------------------------------------

def test_node_plugin_is_privileged_on_the_host_network_and_pid_namespace() -> None:
    _, spec, container = node()
    assert spec["hostNetwork"] is True
    assert spec["hostPID"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert container["securityContext"]["privileged"] is True
    assert container["securityContext"]["runAsUser"] == 0
    assert spec["serviceAccountName"] == m.NODE_SA


def test_node_plugin_host_paths(capsys: pytest.CaptureFixture[str]) -> None:
    _, spec, container = node()
    settings = settings_of(container, capsys)
    mounts = {v["mountPath"]: v for v in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}

    def host_path(mount_path: str) -> str:
        return str(volumes[mounts[mount_path]["name"]]["hostPath"]["path"])

    kubelet = settings.node.kubelet_dir
    # The kubelet finds the socket at the registration path; the driver serves it at --endpoint.
    socket_dir = settings.endpoint[len("unix://"):].rpartition("/")[0]
    assert settings.sidecars.kubelet_registration_path == f"{host_path(socket_dir)}/csi.sock"
    assert host_path(socket_dir) == f"{kubelet}/plugins/{settings.driver_name}"
    # The registrar's socket folder, staging (plugins/) and target (pods/) paths: same path
    # inside and out, and mounts made under staging/target must reach the host.
    assert host_path(f"{kubelet}/plugins_registry") == f"{kubelet}/plugins_registry"
    for sub in ("plugins", "pods"):
        assert host_path(f"{kubelet}/{sub}") == f"{kubelet}/{sub}"
        assert mounts[f"{kubelet}/{sub}"]["mountPropagation"] == "Bidirectional"
    assert host_path(settings.node.state_dir) == settings.node.state_dir
    # /var/log/ceph: ceph-csi's rbd-nbd logs, which un-staging its stages removes or compresses
    # at the path its stash names (cephcsi.node.legacy_stage), so the same path inside and out.
    for path in ("/dev", "/sys", "/lib/modules", "/run/mount", "/var/log/ceph"):
        assert host_path(path) == path
    assert mounts["/lib/modules"]["readOnly"] is True
    tmp = volume_for_mount(spec, container, "/tmp")
    assert tmp["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}
    # hostPath takes path and type only: anything else there is a misplaced key the API server refuses.
    assert all(set(v["hostPath"]) <= {"path", "type"} for v in spec["volumes"] if "hostPath" in v)


def test_nodes_without_lib_modules_still_run_the_plugin() -> None:
    # Type Directory fails the pod ("hostPath type check failed") on a node without
    # /lib/modules; modprobe (kmod, in the image) then finds nothing, and auto falls back.
    _, spec, container = node()
    assert volume_for_mount(spec, container, "/lib/modules")["hostPath"]["type"] in ("DirectoryOrCreate", "")


QUICKSTART = m.REPO / "docs" / "quickstart.md"


def quickstart_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", QUICKSTART.read_text(), flags=re.S)


def test_node_plugin_is_replaced_only_on_delete_and_the_docs_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    # --mounter=auto may pick rbd-nbd/rbd-fuse on a node without the rbd module, and those
    # mappings die with the plugin pod: a RollingUpdate would cut their I/O on every upgrade.
    daemonset, _, container = node()
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert settings_of(container, capsys).node.mounter == "auto"
    text = QUICKSTART.read_text()
    assert "**`OnDelete`**" in text and "cephcsi_node_mapper_info" in text


def test_quickstart_commands_fit_the_update_strategy() -> None:
    # `kubectl rollout status` refuses OnDelete DaemonSets; the install steps must not use it.
    install = QUICKSTART.read_text().split("## 4. Install", 1)[1].split("\n## ", 1)[0]
    assert "rollout status daemonset" not in install
    assert "wait --for=condition=Ready pod -l app.kubernetes.io/component=node" in install
    # The opt-in overlay for krbd-only clusters is a valid patch back to RollingUpdate.
    (overlay,) = [yaml.safe_load(b) for b in quickstart_blocks("yaml") if "overlay/kustomization.yaml" in b]
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": "cephcsi-node"}
    (op,) = yaml.safe_load(patch["patch"])
    assert op["op"] == "replace" and op["path"] == "/spec/updateStrategy"
    assert op["value"]["type"] == "RollingUpdate"


def test_example_pod_ends_on_sigterm() -> None:
    # The container's shell is PID 1, which ignores SIGTERM unless it traps it (an exec'd
    # sleep would too): without the trap, deleting the pod waits out the grace period.
    pod = next(o for o in EXAMPLES if o["kind"] == "Pod")
    (container,) = pod["spec"]["containers"]
    script = " ".join(container.get("command", []) + container.get("args", []))
    assert re.search(r"trap '[^']*exit[^']*' (TERM|SIGTERM|15)", script), script
    assert "sleep infinity &" in script and script.rstrip().endswith("wait"), script
    proc = subprocess.run(["sh", "-n", "-c", container["args"][0]], capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 0, proc.stderr


# ---- CSIDriver, ConfigMap, examples ---------------------------------------------------------

def test_csidriver_matches_ceph_csi() -> None:
    driver = m.find(RENDERED, "CSIDriver")
    assert driver["metadata"]["name"] == "rbd.csi.ceph.com"
    assert driver["spec"]["attachRequired"] is True
    assert driver["spec"]["podInfoOnMount"] is False
    assert driver["spec"]["fsGroupPolicy"] == "File"


def test_config_json_is_ceph_csi_format_with_marked_placeholders() -> None:
    text = m.find(RENDERED, "ConfigMap", "ceph-csi-config")["data"]["config.json"]
    clusters = parse_clusters(text)  # cephcsi's own parser: the driver starts with this file
    assert len(clusters) == 1
    (cluster,) = clusters.values()
    assert "REPLACE" in cluster.cluster_id
    assert all("REPLACE" in mon for mon in cluster.monitors)


def test_storageclass_example_is_accepted_by_cephcsi_and_names_the_example_secret() -> None:
    sc = m.find(EXAMPLES, "StorageClass")
    secret = m.find(EXAMPLES, "Secret")
    assert sc["provisioner"] == m.find(RENDERED, "CSIDriver")["metadata"]["name"]
    params = sc["parameters"]
    VolumeParameters.parse(params)  # refuses unknown parameters, as CreateVolume would
    assert params["imageFeatures"] == "layering"
    assert params["csi.storage.k8s.io/fstype"] == "ext4"
    assert params["pool"]
    config = parse_clusters(m.find(RENDERED, "ConfigMap", "ceph-csi-config")["data"]["config.json"])
    assert params["clusterID"] in config
    for use in ("provisioner", "controller-expand", "node-stage"):
        assert params[f"csi.storage.k8s.io/{use}-secret-name"] == secret["metadata"]["name"]
        assert params[f"csi.storage.k8s.io/{use}-secret-namespace"] == secret["metadata"]["namespace"] == m.NAMESPACE
    assert sc["reclaimPolicy"] == "Delete"
    assert sc["allowVolumeExpansion"] is True
    assert sc["volumeBindingMode"] == "Immediate"
    pvc = m.find(EXAMPLES, "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == sc["metadata"]["name"]


def test_secret_example_is_a_placeholder_never_a_key() -> None:
    secret = m.find(EXAMPLES, "Secret")
    assert "data" not in secret, "stringData only: base64 could hide a real key"
    assert set(secret["stringData"]) == {"userID", "userKey"}
    assert not is_cephx_key(secret["stringData"]["userKey"])
    with pytest.raises(InvalidArgument, match="not a cephx key"):
        Credentials.from_secrets(secret["stringData"])


# aes keys start "AQ" (type 1), Tentacle's aes256k keys "Ag" (type 2).
CEPHX_LIKE = re.compile(r"A[Qg][A-Za-z0-9+/]{36,}={0,2}")


@pytest.mark.parametrize("path", [*ALL_FILES, m.DOCKERFILE, *sorted((m.REPO / "docs").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(m.REPO)))
def test_no_cephx_key_anywhere_in_deploy_docs_or_dockerfile(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not written yet")
    found = [s for s in CEPHX_LIKE.findall(path.read_text(encoding="utf-8")) if is_cephx_key(s)]
    assert not found, f"{path} contains what looks like a real cephx key"


# ---- RBAC ---------------------------------------------------------------------------------------


def dockerfile_uid() -> int:
    users = [line.split()[1] for line in m.DOCKERFILE.read_text().splitlines() if line.startswith("USER ")]
    return int(users[-1].split(":")[0])
