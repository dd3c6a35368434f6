"""The shipped image against the newer Ceph releases Debian offers, on the real kubelet node
(issue 32): a Reef 18.2.7 cluster and a stock Tentacle 20.2.4 one (aes256k `Ag...` keys, which
only the image's Tentacle client reads) are added to the running install the way an admin adds a
cluster — an entry in ceph-csi-config's config.json (no restart: the driver re-reads the file),
a Secret with that cluster's own csi key, a StorageClass naming its fsid — beside the e2e
environment's Pacific cluster, served by the same controller Deployment and node DaemonSet.

For each release a claim is bound, a pod pinned to the node writes a file through it and a
second pod reads it back after a fresh stage; the bytes are in that cluster's image; pod and
claim go, and the image, its journal entries and its trash entry are gone from that cluster's
pool while nothing of the volume stays mounted, looped or served by rbd-fuse on the node. The
Ceph side is read with the release's own `rbd`/`rados` CLI inside its root: the host's Pacific
client cannot parse Tentacle's keys. Last, no driver container was restarted or replaced since the
clusters were added, and no form of either cluster's keys is in the driver pods' logs.

The clusters come from the cached release roots (tests/ceph/releases.sh, through
tests.ceph.fixtures.start_cluster, in parallel), each on an address of its own — the node IP's
.8 (Reef) and .9 (Tentacle), mirroring the release sessions' 127.0.0.8/.9 — added to the node's
bridge for the module: loopback would do for the node plugin (hostNetwork) but not for the
controller, whose pods live on the CNI bridge. A root that is not built skips the module, naming
the set-up step that builds it. ~1½–2 minutes on a warm machine.
"""
from __future__ import annotations

import base64
import json
import logging
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml

from tests.ceph.fixtures import CephTestCluster, cached_release_root, start_cluster, stop_cluster
from tests.e2e.checks import DIRECTORY, CephVolume, node_leftovers, wait_node_clean, watchers
from tests.e2e.env import IMAGE, E2EEnv, quickstart_config, storage_class
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, NODE_LABELS, image_name, volume_uuid, wait_for
from tests.e2e.test_config import containers
from tests.e2e.test_volumes import IDLE, attachments_of

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

RELEASES = ("reef", "tentacle")
ADDRESS_SUFFIX = {"reef": 8, "tentacle": 9}
"""The last octet of each cluster's address in the node IP's /24."""
CONFIG_MAP = "ceph-csi-config"
CONFIG_PATH = "/etc/ceph-csi-config/config.json"
"""Where deploy/ mounts config.json in both driver pods."""


@dataclass(frozen=True)
class ReleaseCluster:
    """One added cluster and what the admin created for it."""

    ceph: CephTestCluster
    address: str
    secret: str
    storage_class: str


def _admin_out(ceph: CephTestCluster, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The release's own CLI as client.admin, not checked (a missing object is an answer here)."""
    return subprocess.run(ceph.cli(tool, *args), capture_output=True, text=True, timeout=60, check=False)


def release_volume(ceph: CephTestCluster, pv: dict[str, Any]) -> CephVolume:
    """tests.e2e.checks.ceph_volume read through the release's CLI instead of the host's rados."""
    name, uid = image_name(pv), volume_uuid(pv)
    key = _admin_out(ceph, "rados", "-p", ceph.pool, "getomapval", DIRECTORY, f"csi.volume.{pv['metadata']['name']}", "-")
    record = _admin_out(ceph, "rados", "-p", ceph.pool, "stat", f"csi.volume.{uid}")
    return CephVolume(
        image=name,
        uuid=uid,
        image_exists=name in ceph.images(),
        directory_key=key.stdout.strip() if key.returncode == 0 else None,
        record_exists=record.returncode == 0,
        in_trash=any(entry.get("name") == name for entry in ceph.trash()),
    )


def image_bytes(ceph: CephTestCluster, image: str) -> bytes:
    """The whole image as the release's `rbd export` reads it (the claims are 64 MiB and thin)."""
    out = subprocess.run(ceph.cli("rbd", "export", "--no-progress", f"{ceph.pool}/{image}", "-"),
                         capture_output=True, timeout=120, check=True)
    return out.stdout


def key_forms(key: str) -> list[str]:
    """The ways a cephx key can be written out: the base64 key, and its secret (after the 2-byte
    type, 8-byte creation time and 2-byte length) in base64 and in hex."""
    secret = base64.b64decode(key)[12:]
    assert len(secret) >= 16, "not a cephx key"
    return [key, base64.b64encode(secret).decode(), secret.hex(), secret.hex(" ")]


def _missing_roots() -> list[str]:
    return [release for release in RELEASES if cached_release_root(release) is None]


def _ip(argv: list[str], check: bool = True) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"ip {' '.join(argv)} failed: {proc.stderr}")


def _start_clusters(addresses: dict[str, str], directories: dict[str, str]) -> dict[str, CephTestCluster]:
    """Both clusters at once (each start is mostly waiting on its daemons); a failed start fails
    the test with the script's own words."""
    with ThreadPoolExecutor(max_workers=len(RELEASES)) as pool:
        futures = {r: pool.submit(start_cluster, directories[r], r, "stock", addresses[r]) for r in RELEASES}
    started: dict[str, CephTestCluster] = {}
    errors = []
    for release, future in futures.items():
        try:
            started[release] = future.result()
        except subprocess.CalledProcessError as error:
            errors.append(f"Ceph {release} on {addresses[release]}: {error.stderr}")
    if errors:
        pytest.fail("could not start the release clusters:\n" + "\n".join(errors))
    # clusterID = the fsid, as docs/quickstart.md says an install names its clusters.
    return {r: replace(c, cluster_id=c.admin("ceph", "fsid").strip()) for r, c in started.items()}


def _wait_pods_see(e2e: E2EEnv, fsids: list[str]) -> None:
    """Every driver pod's mounted config.json lists the added clusters (the kubelet refreshes
    ConfigMap volumes every sync period): claims created before that would only sit in the
    provisioner's retry backoff."""
    pods = [p["metadata"]["name"] for labels in (CONTROLLER_LABELS, NODE_LABELS)
            for p in e2e.kube.ready_pods(labels)]
    assert len(pods) >= 3, pods

    def stale() -> list[str]:
        return [pod for pod in pods
                if not all(f in e2e.kube.exec_in(DEPLOY_NAMESPACE, pod, f"cat {CONFIG_PATH}") for f in fsids)]

    wait_for("config.json with the added clusters in every driver pod", lambda: not stale(), timeout=150,
             interval=2, explain=lambda: f"stale: {stale()}")


def _wait_volumes_released(e2e: E2EEnv, cluster_ids: set[str]) -> None:
    """Before the clusters stop: every PV of theirs gone (a failed test leaves its namespace to
    the fixture, whose deletion the driver serves only while the clusters run)."""
    def left() -> list[str]:
        return [pv["metadata"]["name"] for pv in e2e.kube.pvs()
                if (pv["spec"].get("csi") or {}).get("volumeAttributes", {}).get("clusterID") in cluster_ids]
    try:
        wait_for("the release clusters' PVs deleted", lambda: not left(), timeout=150, interval=2)
    except AssertionError as error:
        log.warning("stopping the release clusters with PVs left: %s", error)


@dataclass(frozen=True)
class Releases:
    """The added clusters by release, and the driver's containers when they were added."""

    clusters: dict[str, ReleaseCluster]
    driver_containers: dict[str, tuple[str, int]]


@pytest.fixture(scope="module")
def releases(e2e: E2EEnv) -> Iterator[Releases]:
    missing = _missing_roots()
    if missing:
        pytest.skip("Ceph release roots not built: " + ", ".join(
            f"{r} (scripts/setup.sh step 'building the Ceph {r} root', i.e. tests/ceph/releases.sh build {r})"
            for r in missing))
    kube = e2e.kube
    bridge = e2e.node.settings.node_bridge
    network = e2e.node.ip.rsplit(".", 1)[0]
    addresses = {r: f"{network}.{ADDRESS_SUFFIX[r]}" for r in RELEASES}
    directories = {r: tempfile.mkdtemp(prefix=f"ce2e-{r[:4]}-", dir="/tmp") for r in RELEASES}
    added: list[str] = []
    original = kube.core.read_namespaced_config_map(CONFIG_MAP, DEPLOY_NAMESPACE).data["config.json"]
    clusters: dict[str, ReleaseCluster] = {}
    try:
        for address in addresses.values():
            _ip(["addr", "add", f"{address}/32", "dev", bridge])
            added.append(address)
        began = time.monotonic()
        started = _start_clusters(addresses, directories)
        log.info("release clusters up in %.1fs: %s", time.monotonic() - began,
                 {r: f"{c.version} {c.key_type} on {c.mon_host}" for r, c in started.items()})
        entries = json.loads(original)
        for release, ceph in started.items():
            cluster = ReleaseCluster(ceph=ceph, address=addresses[release], secret=f"csi-rbd-secret-{release}",
                                     storage_class=f"csi-rbd-sc-{release}")
            clusters[release] = cluster
            entries.extend(json.loads(quickstart_config(ceph)))
            # Through the API, not `kubectl create secret --from-literal` (the key would be in argv).
            kube.core.create_namespaced_secret(DEPLOY_NAMESPACE, {
                "metadata": {"name": cluster.secret}, "stringData": ceph.secrets})
            sc = storage_class(ceph, cluster.storage_class)
            for name in sc["parameters"]:
                if name.endswith("-secret-name"):
                    sc["parameters"][name] = cluster.secret
            kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(sc))
        before = containers(e2e)
        began = time.monotonic()
        e2e.set_config(json.dumps(entries, indent=2))
        _wait_pods_see(e2e, [c.ceph.cluster_id for c in clusters.values()])
        log.info("config.json with both clusters in every driver pod after %.1fs", time.monotonic() - began)
        yield Releases(clusters, before)
    finally:
        _wait_volumes_released(e2e, {c.ceph.cluster_id for c in clusters.values()})
        e2e.set_config(original)
        for cluster in clusters.values():
            kube.kubectl("delete", "--ignore-not-found", "storageclass", cluster.storage_class)
            kube.kubectl("-n", DEPLOY_NAMESPACE, "delete", "--ignore-not-found", "secret", cluster.secret)
        with ThreadPoolExecutor(max_workers=len(RELEASES)) as pool:
            list(pool.map(stop_cluster, directories.values()))
        for directory in directories.values():
            shutil.rmtree(directory, ignore_errors=True)
        for address in added:
            _ip(["addr", "del", f"{address}/32", "dev", bridge], check=False)


@pytest.mark.parametrize("release", RELEASES)
def test_provision_stage_and_delete(e2e: E2EEnv, namespace: str, releases: Releases, release: str) -> None:
    cluster = releases.clusters[release]
    ceph, kube = cluster.ceph, e2e.kube
    assert ceph.release == release and (ceph.key_type == "aes256k") == (release == "tentacle"), ceph.key_type
    token = uuid.uuid4().hex

    kube.create_pvc(namespace, "data", cluster.storage_class)
    pv = kube.wait_bound(namespace, "data", timeout=120)
    assert pv["spec"]["csi"]["volumeAttributes"]["clusterID"] == ceph.cluster_id
    image = image_name(pv)
    volume = release_volume(ceph, pv)
    assert volume.complete, volume

    node = e2e.node.name
    kube.create_pod(namespace, "writer", IMAGE, f"echo {token} > /data/token && sync && {IDLE}", "data", node=node)
    kube.wait_pod_ready(namespace, "writer")
    assert kube.wait_written(namespace, "writer", "/data/token") == token
    assert watchers(ceph, image), f"no watcher on {image}: the node's rbd-fuse should hold it open"
    kube.delete_pod(namespace, "writer")
    wait_node_clean(pv, image)
    wait_for("no watcher on the image", lambda: not watchers(ceph, image), timeout=60)
    # Unstaged and flushed: the file's bytes are in this release's image, not anywhere else.
    assert token.encode() in image_bytes(ceph, image)

    kube.create_pod(namespace, "reader", IMAGE, IDLE, "data", node=node)
    kube.wait_pod_ready(namespace, "reader")
    assert kube.exec_in(namespace, "reader", "cat /data/token").strip() == token
    kube.delete_pod(namespace, "reader")
    wait_node_clean(pv, image)

    kube.delete_pvc(namespace, "data")
    kube.wait_pv_gone(pv["metadata"]["name"])
    wait_for(f"{image} and its journal gone from the {release} pool", lambda: release_volume(ceph, pv).gone,
             timeout=90, explain=lambda: repr(release_volume(ceph, pv)))
    wait_for("no VolumeAttachment of the PV", lambda: not attachments_of(e2e, pv), timeout=60)
    assert not node_leftovers(pv, image)


def test_driver_logs_hold_no_key(e2e: E2EEnv, releases: Releases) -> None:
    """Neither cluster's csi or admin key, in any form, in any driver container's log (current
    and, after a restart, previous). No container was restarted or replaced since the clusters
    were added (the config edit needs none, docs/quickstart.md step 2), so these logs are all the
    driver printed while it served them."""
    assert containers(e2e) == releases.driver_containers, "a driver container was restarted or replaced"
    logs: dict[str, str] = {}
    for labels in (CONTROLLER_LABELS, NODE_LABELS):
        for pod in e2e.kube.pods(DEPLOY_NAMESPACE, labels):
            name = pod["metadata"]["name"]
            logs[name] = e2e.kube.logs(name)
            if any(s.get("restartCount") for s in pod["status"].get("containerStatuses") or []):
                logs[f"{name} (previous)"] = e2e.kube.logs(name, previous=True)
    assert len(logs) >= 3 and all(logs.values()), {name: len(text) for name, text in logs.items()}
    for release, cluster in releases.clusters.items():
        # The logs read are the ones that served these clusters (else the check proves nothing).
        assert any(cluster.ceph.cluster_id in text for text in logs.values()), f"no log names the {release} cluster"
        for which, key in (("csi", cluster.ceph.key), ("admin", cluster.ceph.admin_key)):
            for form in key_forms(key):
                leaked = [name for name, text in logs.items() if form in text]
                assert not leaked, f"the {release} {which} key is in the logs of {leaked}"
