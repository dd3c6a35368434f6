"""ControllerPublish/Unpublish on the real cluster: the publish record in ceph-csi's image
metadata keys, idempotency, the second-writer refusal naming the holder, NOT_FOUND and
INVALID_ARGUMENT cases, and fencing (`ceph osd blocklist`), including a kill between the
blocklist and the record's removal that the retry settles.

Fencing is driven here through `cephcsi.volumes.publish.Publisher` in the test process (the
controller decides to fence from the Node's taint; that decision is covered with the apiserver
in tests/integration/sidecars/test_attacher_publish.py). Addresses are from 10.250.0.0/24, which
nothing in the test cluster uses: the cluster itself runs on 127.0.0.1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.ceph import blocklist, omap
from cephcsi.ceph.publish_keys import FENCE_LEDGER, NODE_ADDRESSES
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import Mode, block_cap, create_request, image_of, mount_cap
from tests.integration.controller.pool_state import admin_ioctx
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

ADDRESS_KEY = ".rbd.csi.ceph.com/clientaddress/{volume}/{node}"
USER_KEY = ".rbd.csi.ceph.com/userid/{volume}/{node}"


def image_meta(cluster: CephTestCluster, image: str) -> dict[str, str]:
    out = cluster.admin("rbd", "image-meta", "list", "--format", "json", f"{cluster.pool}/{image}")
    return dict(json.loads(out or "{}"))


def blocklist_entries(cluster: CephTestCluster) -> list[str]:
    """`ceph osd blocklist ls` (Pacific prints the entries' JSON list, then the range entries')."""
    text = cluster.admin("ceph", "osd", "blocklist", "ls", "--format", "json").strip() or "[]"
    entries, _ = json.JSONDecoder().raw_decode(text)
    return [str(e["addr"]) for e in entries]


def publish(driver: DriverProcess, cluster: CephTestCluster, volume: str, node: str,
            cap: csi_pb2.VolumeCapability | None = None) -> None:
    driver.controller.ControllerPublishVolume(csi_pb2.ControllerPublishVolumeRequest(
        volume_id=volume, node_id=node, volume_capability=cap or mount_cap(), secrets=cluster.secrets))


def unpublish(driver: DriverProcess, cluster: CephTestCluster, volume: str, node: str) -> None:
    driver.controller.ControllerUnpublishVolume(csi_pb2.ControllerUnpublishVolumeRequest(
        volume_id=volume, node_id=node, secrets=cluster.secrets))


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    raise AssertionError("the call succeeded")


def test_publish_records_the_holder_and_refuses_a_second_writer(driver: DriverProcess,
                                                                ceph_cluster: CephTestCluster) -> None:
    caps = driver.controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest())
    assert csi_pb2.ControllerServiceCapability.RPC.PUBLISH_UNPUBLISH_VOLUME in {c.rpc.type for c in caps.capabilities}
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume.volume_id
    image = image_of(volume)
    try:
        publish(driver, ceph_cluster, volume, "node-a")
        publish(driver, ceph_cluster, volume, "node-a")  # idempotent
        meta = image_meta(ceph_cluster, image)
        assert ADDRESS_KEY.format(volume=volume, node="node-a") in meta
        assert meta[USER_KEY.format(volume=volume, node="node-a")] == ceph_cluster.secrets["userID"]
        # A second writer node: refused, naming the holder and what to do.
        code, details = code_of(lambda: publish(driver, ceph_cluster, volume, "node-b"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "node-a" in details and "out-of-service" in details
        # Released by node-a: node-b may have it.
        unpublish(driver, ceph_cluster, volume, "node-a")
        unpublish(driver, ceph_cluster, volume, "node-a")  # idempotent
        assert not [k for k in image_meta(ceph_cluster, image) if "node-a" in k]
        publish(driver, ceph_cluster, volume, "node-b")
        unpublish(driver, ceph_cluster, volume, "node-b")
        assert not [k for k in image_meta(ceph_cluster, image) if k.startswith(".rbd.csi.ceph.com/")]
    finally:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets))


def test_multi_node_block_and_ceph_csi_early_keys(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume.volume_id
    image = image_of(volume)
    try:
        # Block RWX: every node may hold it.
        publish(driver, ceph_cluster, volume, "node-a", block_cap(Mode.MULTI_NODE_MULTI_WRITER))
        publish(driver, ceph_cluster, volume, "node-b", block_cap(Mode.MULTI_NODE_MULTI_WRITER))
        unpublish(driver, ceph_cluster, volume, "node-a")
        unpublish(driver, ceph_cluster, volume, "node-b")
        # ceph-csi's first 3.15 key (no volume id) names a holder too, and unpublish clears it.
        ceph_cluster.admin("rbd", "image-meta", "set", f"{ceph_cluster.pool}/{image}",
                           ".rbd.csi.ceph.com/clientAddress/node-c", "10.250.0.9")
        code, details = code_of(lambda: publish(driver, ceph_cluster, volume, "node-a"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "node-c" in details
        unpublish(driver, ceph_cluster, volume, "node-c")
        assert ".rbd.csi.ceph.com/clientAddress/node-c" not in image_meta(ceph_cluster, image)
        assert "10.250.0.9" not in " ".join(blocklist_entries(ceph_cluster)), "not out of service: no fencing"
    finally:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets))


def test_invalid_and_missing(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume.volume_id
    try:
        assert code_of(lambda: publish(driver, ceph_cluster, volume, ""))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: publish(driver, ceph_cluster, volume, "a/b"))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: publish(driver, ceph_cluster, "", "node-a"))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: driver.controller.ControllerPublishVolume(csi_pb2.ControllerPublishVolumeRequest(
            volume_id=volume, node_id="node-a", secrets=ceph_cluster.secrets)))[0] == grpc.StatusCode.INVALID_ARGUMENT
        gone = volume[:-12] + "000000000000"
        assert code_of(lambda: publish(driver, ceph_cluster, gone, "node-a"))[0] == grpc.StatusCode.NOT_FOUND
        assert code_of(lambda: publish(driver, ceph_cluster, "fake-vol", "node-a"))[0] == grpc.StatusCode.NOT_FOUND
        unpublish(driver, ceph_cluster, gone, "node-a")  # gone counts as unpublished
        unpublish(driver, ceph_cluster, "fake-vol", "node-a")
    finally:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets))


FENCE = textwrap.dedent("""
    import json, sys
    from cephcsi.ceph.connection import ConnectionCache
    from cephcsi.ceph.credentials import Credentials
    from cephcsi.ceph.leases import LeaseKeeper
    from cephcsi.config.clusters import ClusterRegistry
    from cephcsi.settings import CephSettings
    from cephcsi.volumes.manager import VolumeManager
    from cephcsi.volumes.publish import Publisher
    config, op, volume, node, secrets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
    clusters = ClusterRegistry(config)
    connections = ConnectionCache(CephSettings())
    manager = VolumeManager(clusters, connections, "default", keeper=LeaseKeeper())
    publisher = Publisher(clusters, connections, manager.read_record, mon_timeout=10)
    credentials = Credentials.from_secrets(secrets)
    if op == "unpublish":
        print(json.dumps(publisher.unpublish(volume, node, credentials, fence=True)))
    else:
        cluster_id, pool = volume.split("/")
        print(json.dumps(publisher.unfence(cluster_id, pool, node, credentials)))
""")


def fence_call(config: str, secrets: dict[str, str], op: str, volume: str, node: str,
               failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = {"CEPHCSI_FAILPOINTS": failpoints} if failpoints else {}
    return subprocess.run([sys.executable, "-c", FENCE, config, op, volume, node, json.dumps(secrets)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def fence_secrets(cluster: CephTestCluster) -> dict[str, str]:
    """A user with the caps fencing needs (the suite's csi user has `profile rbd` only)."""
    key = cluster.admin("ceph", "auth", "get-or-create-key", "client.csi-fence",
                        "mon", 'profile rbd, allow command "osd blocklist"',
                        "osd", f"profile rbd pool={cluster.pool}", "mgr", f"profile rbd pool={cluster.pool}").strip()
    return {"userID": "csi-fence", "userKey": key}


def test_fencing_blocklists_the_node_and_a_kill_is_settled_by_the_retry(
        driver: DriverProcess, ceph_cluster: CephTestCluster, config_file: str) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume.volume_id
    image = image_of(volume)
    address = "10.250.0.7"
    try:
        publish(driver, ceph_cluster, volume, "lost-node")
        # What the node plugin (or ceph-csi's) reports at NodeStage: its client address.
        ceph_cluster.admin("rbd", "image-meta", "set", f"{ceph_cluster.pool}/{image}",
                           ADDRESS_KEY.format(volume=volume, node="lost-node"), address)
        # With `profile rbd` alone: refused, saying which cap is missing; nothing released.
        plain = fence_call(config_file, ceph_cluster.secrets, "unpublish", volume, "lost-node")
        assert plain.returncode == 1 and 'allow command "osd blocklist"' in plain.stderr, plain.stderr[-2000:]
        assert ADDRESS_KEY.format(volume=volume, node="lost-node") in image_meta(ceph_cluster, image)
        secrets = fence_secrets(ceph_cluster)
        # Killed between the blocklist and the record's removal: blocklisted, record still there.
        killed = fence_call(config_file, secrets, "unpublish", volume, "lost-node", "unpublish.after-blocklist")
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert any(e.startswith(address) for e in blocklist_entries(ceph_cluster))
        assert ADDRESS_KEY.format(volume=volume, node="lost-node") in image_meta(ceph_cluster, image)
        code, _ = code_of(lambda: publish(driver, ceph_cluster, volume, "new-node"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, "not released until the unpublish finished"
        # The retry settles it.
        retried = fence_call(config_file, secrets, "unpublish", volume, "lost-node")
        assert retried.returncode == 0, retried.stderr[-2000:]
        assert json.loads(retried.stdout.strip().splitlines()[-1]) == [address]
        assert not [k for k in image_meta(ceph_cluster, image) if "lost-node" in k]
        publish(driver, ceph_cluster, volume, "new-node")
        # Node back; killed between the blocklist removal and the ledger's: the retry finishes it.
        cut = fence_call(config_file, secrets, "unfence", f"{ceph_cluster.cluster_id}/{ceph_cluster.pool}",
                         "lost-node", "unfence.after-blocklist")
        assert cut.returncode == -9, cut.stderr[-2000:]
        assert not any(e.startswith(address) for e in blocklist_entries(ceph_cluster))
        assert any(k.startswith("lost-node/") for k in ceph_cluster.admin(
            "rados", "-p", ceph_cluster.pool, "listomapkeys", FENCE_LEDGER).split())
        # Its entries go (from the pool's ledger), and only once.
        back = fence_call(config_file, secrets, "unfence", f"{ceph_cluster.cluster_id}/{ceph_cluster.pool}",
                          "lost-node")
        assert back.returncode == 0, back.stderr[-2000:]
        assert json.loads(back.stdout.strip().splitlines()[-1]) == [address]
        assert not any(e.startswith(address) for e in blocklist_entries(ceph_cluster))
        again = fence_call(config_file, secrets, "unfence", f"{ceph_cluster.cluster_id}/{ceph_cluster.pool}",
                           "lost-node")
        assert json.loads(again.stdout.strip().splitlines()[-1]) == []
        unpublish(driver, ceph_cluster, volume, "new-node")
    finally:
        for entry in blocklist_entries(ceph_cluster):
            if entry.startswith("10.250.0."):
                ceph_cluster.admin("ceph", "osd", "blocklist", "rm", entry)
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets))


def test_delete_refused_by_a_watcher_names_its_node_and_a_fenced_one_says_to_retry(
        driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume.volume_id
    image = image_of(volume)
    pool = ceph_cluster.pool
    others: dict[str, str] = {}
    try:
        with admin_ioctx(ceph_cluster) as io, rbd.Image(io, image):  # a read-write open watches the header
            watcher = ceph_cluster.admin("rbd", "status", "--format", "json", f"{pool}/{image}")
            address = json.loads(watcher)["watchers"][0]["address"]
            host = blocklist.host_of(address)
            # Node plugins of other tests in this session reported the same loopback address into
            # the shared pool: set them aside, so the address names node-w alone.
            others = {node: value for node, value in (omap.read(io, NODE_ADDRESSES) or {}).items()
                      if node != "node-w" and value.strip() == host}
            for node in others:
                ceph_cluster.admin("rados", "-p", pool, "rmomapkey", NODE_ADDRESSES, node)
            ceph_cluster.admin("rados", "-p", pool, "setomapval", NODE_ADDRESSES, "node-w", host)
            code, details = code_of(lambda: driver.controller.DeleteVolume(
                csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets)))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "(node node-w)" in details, details
            assert "out of service" in details
            # Fenced (the ledger says the controller blocklisted it): the message says it only has to wait.
            ceph_cluster.admin("rados", "-p", pool, "setomapval", FENCE_LEDGER, f"node-w/{blocklist.host_of(address)}",
                               volume)
            code, details = code_of(lambda: driver.controller.DeleteVolume(
                csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets)))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "node node-w, fenced" in details, details
            assert "nothing to do but retry" in details
    finally:
        ceph_cluster.admin("rados", "-p", pool, "rmomapkey", NODE_ADDRESSES, "node-w")
        for node, value in others.items():
            ceph_cluster.admin("rados", "-p", pool, "setomapval", NODE_ADDRESSES, node, value.strip())
        for key in ceph_cluster.admin("rados", "-p", pool, "listomapkeys", FENCE_LEDGER).split():
            if key.startswith("node-w/"):
                ceph_cluster.admin("rados", "-p", pool, "rmomapkey", FENCE_LEDGER, key)
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets))


def test_fencing_uses_the_address_the_node_plugin_reported(driver: DriverProcess, ceph_cluster: CephTestCluster,
                                                           config_file: str) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume.volume_id
    pool, address = ceph_cluster.pool, "10.250.0.8"
    try:
        publish(driver, ceph_cluster, volume, "rep-node")  # the key holds '' (no ceph-csi node wrote it)
        ceph_cluster.admin("rados", "-p", pool, "setomapval", NODE_ADDRESSES, "rep-node", address)
        fenced = fence_call(config_file, fence_secrets(ceph_cluster), "unpublish", volume, "rep-node")
        assert fenced.returncode == 0, fenced.stderr[-2000:]
        assert json.loads(fenced.stdout.strip().splitlines()[-1]) == [address]
        assert any(e.startswith(address) for e in blocklist_entries(ceph_cluster))
        back = fence_call(config_file, fence_secrets(ceph_cluster), "unfence", f"{ceph_cluster.cluster_id}/{pool}",
                          "rep-node")
        assert json.loads(back.stdout.strip().splitlines()[-1]) == [address]
    finally:
        ceph_cluster.admin("rados", "-p", pool, "rmomapkey", NODE_ADDRESSES, "rep-node")
        for entry in blocklist_entries(ceph_cluster):
            if entry.startswith("10.250.0."):
                ceph_cluster.admin("ceph", "osd", "blocklist", "rm", entry)
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets))
