"""--extra-create-metadata: the claim/PV names external-provisioner adds to CreateVolume's
parameters end up as RBD image metadata under ceph-csi's key names, idempotently, written
behind a new volume's answer and kept in its journal record until then (a kill in between is
repaired by a retry or `cephcsi audit --repair`); ROX mount capabilities are accepted by
CreateVolume."""
from __future__ import annotations

import json
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.ceph import omap
from tests.ceph.fixtures import CephTestCluster
from tests.integration.audit.seed import admin_namespace, run_audit, write_config
from tests.integration.controller.helpers import Mode, create_request, image_of, journal_entries, mount_cap, until_ok
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.controller.snapshot_helpers import delete_all, from_snapshot, from_volume, snapshot_request
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

OWNER = {"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "shop",
         "csi.storage.k8s.io/pv/name": "pvc-0b5c"}


PENDING = "cephcsi.pending-metadata."


def image_meta(cluster: CephTestCluster, image: str) -> dict[str, str]:
    out = cluster.admin("rbd", "image-meta", "list", "--format", "json", f"{cluster.pool}/{image}")
    return dict(json.loads(out or "{}"))


def pending_in(record: dict[str, str]) -> dict[str, str]:
    return {k[len(PENDING):]: v for k, v in record.items() if k.startswith(PENDING)}


def wait_until(check: Any, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_owner_keys_become_image_metadata(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster, name="pvc-0b5c")
    request.parameters.update(OWNER)
    volume = driver.controller.CreateVolume(request).volume
    image = image_of(volume.volume_id)
    # Just after the answer, with the lease's release: the keys go to the new image's header
    # in one class call (no image open), the id that call read is journaled, and the record's
    # copy of the keys goes.
    image_id = ceph_cluster.admin("rados", "-p", ceph_cluster.pool, "get", f"rbd_id.{image}", "-")[4:]
    wait_until(lambda: journal_entries(ceph_cluster, "pvc-0b5c")[1].get("csi.imageid") == image_id,
               "the image id never reached the journal")
    assert image_meta(ceph_cluster, image) == OWNER
    assert pending_in(journal_entries(ceph_cluster, "pvc-0b5c")[1]) == {}
    # A retry (same name) finds the volume and rewrites nothing; the context never carries the keys.
    assert driver.controller.CreateVolume(request).volume.volume_id == volume.volume_id
    assert image_meta(ceph_cluster, image) == OWNER
    assert not any(k.startswith("csi.storage.k8s.io/") for k in volume.volume_context)
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def test_without_the_flag_no_metadata(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume
    assert image_meta(ceph_cluster, image_of(volume.volume_id)) == {}
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def test_read_only_many_filesystem_is_created(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster)
    del request.volume_capabilities[:]
    request.volume_capabilities.extend([mount_cap(), mount_cap(mode=Mode.MULTI_NODE_READER_ONLY)])
    volume = driver.controller.CreateVolume(request).volume
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def _owned_request(cluster: CephTestCluster, name: str) -> csi_pb2.CreateVolumeRequest:
    request = create_request(cluster, name=name)
    request.parameters.update({**OWNER, "csi.storage.k8s.io/pvc/name": name, "csi.storage.k8s.io/pv/name": name})
    return request


def _record(io: Any, name: str) -> dict[str, str]:
    uuid = (omap.read(io, "csi.volumes.default") or {})[f"csi.volume.{name}"]
    return omap.read(io, f"csi.volume.{uuid}") or {}


def _metadata(io: Any, image: str) -> dict[str, str]:
    with rbd.Image(io, image, read_only=True) as opened:
        return dict(opened.metadata_list())


def test_owner_keys_a_kill_kept_from_the_image_are_written_by_the_retry_or_the_audit(
        ceph_cluster: CephTestCluster, tmp_path: Path) -> None:
    # A rados namespace of its own: the audit's repair must see only this test's volumes.
    namespace = f"meta-{uuidlib.uuid4().hex[:8]}"
    config = write_config(ceph_cluster, str(tmp_path / "config.json"), namespace)
    with admin_namespace(ceph_cluster, namespace) as io:
        creator = DriverProcess(config, mode="controller", env={"CEPHCSI_FAILPOINTS": "create.release-behind:pause=60"},
                                args=["--journal-lock-timeout=2s"]).start()
        healthy = DriverProcess(config, mode="controller", args=["--journal-lock-timeout=2s"])
        try:
            retried, audited = _owned_request(ceph_cluster, "pvc-retried"), _owned_request(ceph_cluster, "pvc-audited")
            volumes = [creator.controller.CreateVolume(r, timeout=60).volume for r in (retried, audited)]
            assert creator.process is not None
            creator.process.kill()  # both answered; their metadata steps were still held back
            creator.process.wait(10)
            for request, volume in zip((retried, audited), volumes):
                wanted = {k: v for k, v in request.parameters.items() if k.startswith("csi.storage.k8s.io/")}
                assert pending_in(_record(io, request.name)) == wanted, "the record keeps the keys"
                assert _metadata(io, image_of(volume.volume_id)) == {}, "the kill came before the image got them"

            healthy.start()
            # ABORTED until the killed creator's lease lapses (2 s); then the same volume, keys written.
            again = until_ok(lambda: healthy.controller.CreateVolume(retried, timeout=60)).volume
            assert again.volume_id == volumes[0].volume_id
            assert _metadata(io, image_of(again.volume_id))["csi.storage.k8s.io/pvc/name"] == "pvc-retried"
            assert pending_in(_record(io, "pvc-retried")) == {}

            audited_image = image_of(volumes[1].volume_id)
            rc, doc, _ = run_audit(ceph_cluster, config)
            assert rc == 1 and [(f["kind"], f["subject"], f["fix"]) for f in doc["findings"]] == \
                [("metadata-pending", audited_image, "copy-pending-metadata")], doc["findings"]
            rc, doc, _ = run_audit(ceph_cluster, config, "--repair")
            assert doc["findings"][0]["repair"]["outcome"] == "repaired", doc["findings"]
            assert _metadata(io, audited_image)["csi.storage.k8s.io/pvc/name"] == "pvc-audited"
            assert pending_in(_record(io, "pvc-audited")) == {}
            rc, doc, _ = run_audit(ceph_cluster, config)
            assert rc == 0 and doc["findings"] == []
            for volume in volumes:
                healthy.controller.DeleteVolume(
                    csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets), timeout=60)
        finally:
            creator.cleanup()
            healthy.cleanup()


def test_restores_and_clones_get_their_owner_keys_and_retries_rewrite_nothing(
        driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    c = driver.controller
    source = c.CreateVolume(create_request(ceph_cluster), timeout=60).volume
    snapshot = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
    made = []
    for kind, request in (("restore", from_snapshot(ceph_cluster, snapshot.snapshot_id)),
                          ("clone", from_volume(ceph_cluster, source.volume_id, size=16 << 20))):  # grown too
        owner = {**OWNER, "csi.storage.k8s.io/pvc/name": kind, "csi.storage.k8s.io/pv/name": request.name}
        request.parameters.update(owner)
        volume = c.CreateVolume(request, timeout=60).volume
        made.append(volume.volume_id)
        assert image_meta(ceph_cluster, image_of(volume.volume_id)) == owner, kind
        assert pending_in(journal_entries(ceph_cluster, request.name)[1]) == {}, "clones keep nothing pending"
        assert c.CreateVolume(request, timeout=60).volume.volume_id == volume.volume_id
        assert image_meta(ceph_cluster, image_of(volume.volume_id)) == owner, kind
    delete_all(driver, ceph_cluster, [snapshot.snapshot_id], [*made, source.volume_id])
    # Parents wait in the trash for their clones' purges: the pool is left as found before the
    # next test takes its own baseline.
    assert wait_for_pool(ceph_cluster, baseline, timeout=150) == baseline
