"""The whole e2e environment: node + Ceph on the node IP + the project's image + deploy/ installed
the way docs/quickstart.md tells a user to.

`E2EEnv.start()` order and why:
1. the image (scripts/build-image.sh, cached; the slowest step on a fresh machine, done first
   so a broken Dockerfile fails before anything else starts);
2. the node (tests.e2e.kubenode), which also creates the node IP;
3. the Ceph test cluster bound to the node IP (pods cannot reach loopback);
4. the install: a kustomize overlay in a temporary folder that changes only what the quickstart
   says to fill in (config.json: clusterID = the fsid, the monitor address), applied with
   `kubectl apply -k`; the Secret from the cephx user's key; the example StorageClass with
   clusterID and pool filled in (plus an xfs twin for the xfs scenario).
`stop()` removes test namespaces and the install while the driver still runs (so volumes are
unpublished, unstaged and deleted by the driver itself), then the node, then Ceph.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.ceph.fixtures import CephTestCluster
from tests.e2e.containerd import PAUSE_IMAGE
from tests.e2e.kube import DEPLOY_NAMESPACE, DRIVER, Kube, kubectl_argv, wait_for
from tests.e2e.kubenode import KubeNode, NodeSettings, start_node

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BUILD_IMAGE = REPO / "scripts" / "build-image.sh"
CEPH_SCRIPT = REPO / "tests" / "ceph" / "cluster.sh"
IMAGE_ENV = "CEPHCSI_E2E_IMAGE_TAR"
"""Set to a docker-archive tar to skip scripts/build-image.sh (e.g. an image built elsewhere)."""
IMAGE = "docker.io/library/cephcsi:0.1.0"
"""deploy/kustomization.yaml's `cephcsi:0.1.0` as the kubelet resolves it; also the workload
pods' image (it has sh, dd and coreutils; no other image exists without a registry)."""
SECRET = "csi-rbd-secret"
STORAGE_CLASS = "csi-rbd-sc"
"""deploy/examples/storageclass.yaml's name (ext4)."""
XFS_CLASS = "csi-rbd-sc-xfs"


@dataclass
class Timings:
    """Seconds spent in each start-up step (reported by the fixture and the hand-run script)."""

    steps: dict[str, float] = field(default_factory=dict)

    def measure(self, name: str, started: float) -> None:
        self.steps[name] = round(time.monotonic() - started, 1)
        log.info("e2e %s: %.1fs", name, self.steps[name])


def build_image(timeout: float = 3600.0) -> Path:
    """The project's image as a docker-archive tar: $CEPHCSI_E2E_IMAGE_TAR, else built from the
    unmodified Dockerfile by scripts/build-image.sh (which caches every step)."""
    given = os.environ.get(IMAGE_ENV)
    if given:
        return Path(given)
    if not BUILD_IMAGE.exists():
        raise RuntimeError(f"{BUILD_IMAGE} is missing: the e2e tests need it to build the image "
                           f"(or set {IMAGE_ENV} to a docker-archive tar)")
    proc = subprocess.run(["bash", str(BUILD_IMAGE)], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_IMAGE} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    tar = Path(proc.stdout.strip().splitlines()[-1])
    if not tar.is_file():
        raise RuntimeError(f"{BUILD_IMAGE} printed {tar}, which is not a file")
    return tar


def image_to_tag(imported: list[str]) -> str:
    """The imported image to tag as IMAGE ('' when IMAGE is among them): an archive built
    elsewhere may name it differently (a registry prefix, or $CEPHCSI_E2E_IMAGE_TAR), and
    deploy/ asks for IMAGE."""
    if IMAGE in imported:
        return ""
    project = [name for name in imported if name != PAUSE_IMAGE]
    if len(project) != 1:
        raise RuntimeError(f"cannot tell the project's image among {imported}")
    return project[0]


def start_ceph(address: str, directory: Path) -> CephTestCluster:
    """tests/ceph/cluster.sh with its daemons bound to `address`."""
    env = {**os.environ, "CEPH_ADDR": address}
    proc = subprocess.run([str(CEPH_SCRIPT), "start", str(directory)], capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"Ceph test cluster did not start:\n{proc.stderr[-3000:]}")
    values = dict(line.split("=", 1) for line in Path(proc.stdout.strip().splitlines()[-1]).read_text().splitlines())
    return CephTestCluster(
        # The v2 address: a bare "ip:port" that is not the v1 default 6789 is tried as msgr2
        # first, so the v1 one would cost every client a failed handshake.
        directory=values["CEPH_DIR"], conf=values["CEPH_CONF"], mon_host=values["CEPH_MON_V2"],
        pool=values["CEPH_POOL"], user=values["CEPH_CSI_USER"], key=values["CEPH_CSI_KEY"],
        admin_key=values["CEPH_ADMIN_KEY"], cluster_id=values["CEPH_FSID"], pool2=values.get("CEPH_POOL2", ""),
    )


def stop_ceph(directory: Path) -> None:
    subprocess.run([str(CEPH_SCRIPT), "stop", str(directory)], capture_output=True, timeout=120, check=False)


def quickstart_config(ceph: CephTestCluster) -> str:
    """config.json as quickstart step 2 shows it: clusterID = the fsid, a monitor address (the
    v2 one; the quickstart allows either)."""
    return json.dumps([{"clusterID": ceph.cluster_id, "monitors": [ceph.mon_host],
                        "rbd": {"radosNamespace": ""}}], indent=2)


def write_overlay(directory: Path, config_json: str, base: Path = DEPLOY) -> Path:
    """A kustomization over deploy/ (or another base, e.g. overlays/migration/) that replaces only
    config.json. Everything else (image name, namespaces, RBAC, the DaemonSet) is the base as
    shipped."""
    directory.mkdir(parents=True, exist_ok=True)
    patch = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "ceph-csi-config", "namespace": DEPLOY_NAMESPACE},
        "data": {"config.json": config_json},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(patch))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, directory)],
        "patches": [{"path": "config.yaml"}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def storage_class(ceph: CephTestCluster, name: str = STORAGE_CLASS, fstype: str = "ext4") -> dict[str, Any]:
    """deploy/examples/storageclass.yaml with the placeholders a user fills in (clusterID, pool)."""
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "examples" / "storageclass.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["parameters"]["clusterID"] = ceph.cluster_id
    doc["parameters"]["pool"] = ceph.pool
    doc["parameters"]["csi.storage.k8s.io/fstype"] = fstype
    return doc


@dataclass
class E2EEnv:
    """A running node with Ceph and the driver installed; see the module docstring."""

    node: KubeNode
    ceph: CephTestCluster
    kube: Kube
    work_dir: Path
    overlay: Path
    timings: Timings
    image_tar: Path | None = None
    """The project's image archive the node imported."""
    namespaces: list[str] = field(default_factory=list)

    def new_namespace(self) -> str:
        name = self.kube.create_namespace()
        self.namespaces.append(name)
        return name

    def set_config(self, config_json: str) -> None:
        """Re-apply the install with another config.json (what a user does to edit it)."""
        write_overlay(self.overlay, config_json)
        self.kube.kubectl("apply", "-k", str(self.overlay))

    def stop(self) -> list[str]:
        """Uninstall while the driver runs, then stop the node and Ceph; failed steps."""
        failed: list[str] = []
        try:
            self._uninstall()
        except Exception as error:  # noqa: BLE001 - the node must still go down
            log.warning("e2e uninstall failed: %s", error)
            failed.append(f"uninstall: {error}")
        failed.extend(self.node.stop())
        stop_ceph(Path(self.ceph.directory))
        shutil.rmtree(self.work_dir, ignore_errors=True)
        return failed

    def _uninstall(self) -> None:
        """Delete the test namespaces (their pods and claims) and wait until every PV of the
        driver is gone: the driver itself unpublishes, unstages and deletes the volumes. The
        install is not deleted: the node's teardown stops its containers, and etcd goes away."""
        for namespace in self.namespaces:
            self.kube.delete_namespace(namespace)
        wait_for("test namespaces deleted", lambda: not any(self.kube.namespace_exists(n) for n in self.namespaces),
                 timeout=120)
        wait_for("every PV of the driver deleted",
                 lambda: not [pv for pv in self.kube.pvs() if pv["spec"].get("csi", {}).get("driver") == DRIVER],
                 timeout=120)


def start_env(settings: NodeSettings | None = None) -> E2EEnv:
    """Build and start everything (see the module docstring); the caller must call stop()."""
    timings = Timings()
    started = time.monotonic()
    image = build_image()
    timings.measure("image build (cached steps skipped)", started)

    settings = settings or NodeSettings()
    settings = NodeSettings(**{**settings.__dict__, "images": (*settings.images, image)})
    started = time.monotonic()
    node = start_node(settings)
    timings.measure("node start (incl. image import)", started)
    work_dir = Path(tempfile.mkdtemp(prefix="ce2e-", dir="/tmp"))
    try:
        started = time.monotonic()
        ceph = start_ceph(node.ip, work_dir / "ceph")
        timings.measure("ceph start", started)
    except BaseException:
        node.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
        raise
    try:
        untagged = image_to_tag(node.imported)
    except RuntimeError:
        node.stop()
        raise
    if untagged:
        node.tag_image(untagged, IMAGE)
    kube = Kube(node.api_client(), kubectl_argv(node.bin_dir / "kubectl", node.kubeconfig))
    env = E2EEnv(node=node, ceph=ceph, kube=kube, work_dir=work_dir, overlay=work_dir / "overlay",
                 timings=timings, image_tar=image)
    try:
        started = time.monotonic()
        install(env)
        timings.measure("install + rollout", started)
    except BaseException:
        env.stop()
        raise
    return env


def install(env: E2EEnv) -> None:
    """docs/quickstart.md steps 2, 4 and 5 with this cluster's values."""
    ceph, kube = env.ceph, env.kube
    write_overlay(env.overlay, quickstart_config(ceph))
    kube.kubectl("apply", "-k", str(env.overlay))
    # Step 5: the Secret straight from the cephx user's key (created through the API rather
    # than `--from-literal`, which would put the key in a process listing).
    kube.core.create_namespaced_secret(DEPLOY_NAMESPACE, {
        "metadata": {"name": SECRET},
        "stringData": {"userID": ceph.user, "userKey": ceph.key},
    })
    classes = [storage_class(ceph), storage_class(ceph, XFS_CLASS, "xfs")]
    kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(classes))
    kube.wait_driver_ready(env.node.name)
