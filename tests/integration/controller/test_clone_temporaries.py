"""The temporary snapshot a clone of a volume cuts on its source (`cephcsi-tmp-<clone uuid>`):
a CreateVolume killed after it and then given up by the CO (the claim deleted; its provisioner
deletes the journaled volume by id) must not leave it on the source. DeleteVolume of the clone
removes it, as a retry of the CreateVolume does; `cephcsi audit` reports one neither reaches
(tests/integration/audit/test_audit_snapshots.py)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of, journal_entries, until_ok
from tests.integration.controller.snapshot_helpers import (delete_all, from_snapshot, from_volume, pattern, read,
                                                          snapshot_request, write)
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


@pytest.fixture
def config(ceph_cluster: CephTestCluster, tmp_path: Path) -> str:
    return ceph_cluster.write_config(tmp_path / "config.json")


@pytest.fixture
def healthy(config: str) -> Iterator[DriverProcess]:
    process = DriverProcess(config, mode="controller", args=["--journal-lock-timeout=2s"])
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


def temporaries(cluster: CephTestCluster, image: str) -> list[str]:
    snaps = json.loads(cluster.admin("rbd", "snap", "ls", "--all", "--format", "json", f"{cluster.pool}/{image}"))
    return [str(s["name"]) for s in snaps if str(s["name"]).startswith("cephcsi-tmp-")]


def test_delete_of_a_clone_killed_after_its_temporary_snapshot_removes_it(
        ceph_cluster: CephTestCluster, config: str, healthy: DriverProcess) -> None:
    source = healthy.controller.CreateVolume(create_request(ceph_cluster), timeout=60).volume
    request = from_volume(ceph_cluster, source.volume_id, name="pvc-clone-tmp-given-up")
    doomed = DriverProcess(config, mode="controller", args=["--journal-lock-timeout=2s"],
                           env={"CEPHCSI_FAILPOINTS": "clone.after-source-snap"})
    doomed.start()
    try:
        with pytest.raises(grpc.RpcError) as caught:
            doomed.controller.CreateVolume(request, timeout=60)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()  # the kill
        assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
    finally:
        doomed.cleanup()
    # What the OSD's watch timeout (30 s) does for the killed controller's watch on the source,
    # at once: the removal of its temporary snapshot need not wait for it.
    status = json.loads(ceph_cluster.admin("rbd", "status", "--format", "json",
                                           f"{ceph_cluster.pool}/{image_of(source.volume_id)}"))
    for watcher in status.get("watchers", []):
        ceph_cluster.admin("ceph", "osd", "blocklist", "add", str(watcher["address"]))
    uuid, record = journal_entries(ceph_cluster, request.name)
    assert uuid and record, "the killed CreateVolume journaled the clone"
    assert temporaries(ceph_cluster, image_of(source.volume_id)) == [f"cephcsi-tmp-{uuid}"]

    # The CO never got an id; its provisioner deletes the journaled volume by the id it names.
    source_id = VolumeId.decode(source.volume_id)
    clone_id = VolumeId(source_id.cluster_id, source_id.pool_id, uuid).encode()
    delete = csi_pb2.DeleteVolumeRequest(volume_id=clone_id, secrets=ceph_cluster.secrets)
    until_ok(lambda: healthy.controller.DeleteVolume(delete, timeout=60), deadline=90,
             also=(grpc.StatusCode.FAILED_PRECONDITION,))
    assert temporaries(ceph_cluster, image_of(source.volume_id)) == []
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    # The source is untouched otherwise and can be cloned and deleted as usual.
    clone = until_ok(lambda: healthy.controller.CreateVolume(request, timeout=60).volume)
    assert temporaries(ceph_cluster, image_of(source.volume_id)) == []
    delete_all(healthy, ceph_cluster, [], [clone.volume_id, source.volume_id])


@pytest.mark.parametrize("kind", ["volume", "snapshot"])
def test_a_repeated_create_of_a_flattened_clone_keeps_its_data(
        ceph_cluster: CephTestCluster, healthy: DriverProcess, kind: str) -> None:
    """CreateVolume may be repeated at any time with the same name (the CSI contract); once a
    clone is flattened (the mgr's flatten task, or an admin's `rbd flatten`) it has no parent link
    any more, which must not make the repeat take it for the debris of a killed clone and
    re-clone it over the data written since."""
    source = healthy.controller.CreateVolume(create_request(ceph_cluster, name=f"pvc-flat-src-{kind}"),
                                             timeout=60).volume
    snapshots: list[str] = []
    if kind == "snapshot":
        snap = healthy.controller.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
        snapshots.append(snap.snapshot_id)
        request = from_snapshot(ceph_cluster, snap.snapshot_id, name="pvc-flat-clone-snapshot")
    else:
        request = from_volume(ceph_cluster, source.volume_id, name="pvc-flat-clone-volume")
    clone = healthy.controller.CreateVolume(request, timeout=60).volume
    ceph_cluster.admin("rbd", "flatten", f"{ceph_cluster.pool}/{image_of(clone.volume_id)}")
    written = pattern(f"written-after-flatten-{kind}")
    write(ceph_cluster, clone.volume_id, written)

    again = healthy.controller.CreateVolume(request, timeout=60).volume
    assert again.volume_id == clone.volume_id
    assert read(ceph_cluster, clone.volume_id, len(written)) == written
    delete_all(healthy, ceph_cluster, snapshots, [clone.volume_id, source.volume_id])
