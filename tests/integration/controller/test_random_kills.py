"""Randomized SIGKILL under load: the crashes nobody thought of.

The failpoint tests kill the driver between its own steps; here it is killed at random
instants while 100 creates, then 100 deletes, run 16 at a time, so kills land inside librbd
calls, subprocesses of the gRPC stack, lock renewals, anywhere. Every call is retried until
it succeeds, as a provisioner does. Afterwards the pool must be exactly as before: no image,
no directory entry, no trash entry (once the mgr purged), no journal key or record, no data
object. The creates carry the claim owner keys the shipped deployment sends: whatever instant a
kill hits, each image has its keys or its record still keeps them for a retry or the audit. A
second test mixes the kinds of call in one phase, as a busy cluster does: creates
of new names, deletes of older volumes, and the same create or delete sent twice at once (a
provisioner's retry racing its first attempt).
"""
from __future__ import annotations

import random

import pytest
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.ceph import omap
from cephcsi.volumes.metadata import PV_NAME_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request
from tests.integration.controller.kills import Call, killable, run_phase
from tests.integration.controller.pool_state import admin_ioctx, read_pool, wait_for_pool
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]

VOLUMES = 100
KILLS_PER_PHASE = 3


__all__ = ["killable"]  # the fixture, imported for pytest


def _create(request: csi_pb2.CreateVolumeRequest) -> Call:
    return lambda stub: stub.CreateVolume(request, timeout=30)


def _delete(request: csi_pb2.DeleteVolumeRequest) -> Call:
    return lambda stub: stub.DeleteVolume(request, timeout=30)


PENDING = "cephcsi.pending-metadata."


def _owned_request(cluster: CephTestCluster) -> csi_pb2.CreateVolumeRequest:
    request = create_request(cluster)
    request.parameters.update({PVC_NAME_KEY: request.name, PVC_NAMESPACE_KEY: "kills", PV_NAME_KEY: request.name})
    return request


def _owner_keys_lost(cluster: CephTestCluster, volume_ids: list[str], names: list[str]) -> list[str]:
    """Volumes whose image lacks its owner keys while its record no longer keeps them."""
    lost = []
    with admin_ioctx(cluster) as io:
        for volume_id, name in zip(volume_ids, names):
            uuid = volume_id[-36:]
            record = omap.read(io, f"csi.volume.{uuid}") or {}
            with rbd.Image(io, f"csi-vol-{uuid}", read_only=True) as image:
                metadata = dict(image.metadata_list())
            if metadata.get(PVC_NAME_KEY) != name and record.get(f"{PENDING}{PVC_NAME_KEY}") != name:
                lost.append(f"{name}: image {metadata}, record {record}")
    return lost


def test_random_sigkills_during_creates_and_deletes_leave_the_pool_as_it_was(
    killable: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    requests = [_owned_request(ceph_cluster) for _ in range(VOLUMES)]

    created, create_kills = run_phase(killable, [_create(r) for r in requests], KILLS_PER_PHASE)
    volume_ids = [response.volume.volume_id for response in created]  # type: ignore[attr-defined]
    assert len(set(volume_ids)) == VOLUMES, "one volume per name"
    assert _owner_keys_lost(ceph_cluster, volume_ids, [r.name for r in requests]) == []
    during = read_pool(ceph_cluster)
    # Images new since the baseline (one left by an earlier failed test must not count here).
    images = {name for name in during.directory if name.startswith("csi-vol-") and name not in baseline.directory}
    assert images == {f"csi-vol-{vid[-36:]}" for vid in volume_ids}, "exactly one image per name, none extra"
    assert len(create_kills) == KILLS_PER_PHASE, f"kills during the create phase: {create_kills}"

    deletes = [csi_pb2.DeleteVolumeRequest(volume_id=vid, secrets=ceph_cluster.secrets) for vid in volume_ids]
    _, delete_kills = run_phase(killable, [_delete(d) for d in deletes], KILLS_PER_PHASE)
    assert len(delete_kills) == KILLS_PER_PHASE, f"kills during the delete phase: {delete_kills}"

    # The mgr purges the trash one image at a time, and waits out watches of killed clients.
    after = wait_for_pool(ceph_cluster, baseline, timeout=150)
    assert after == baseline, f"left behind after kills at {create_kills} / {delete_kills}"


MIXED = 40
DUPLICATES = 15


def test_random_sigkills_while_creates_deletes_and_duplicate_calls_run_mixed(
    killable: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    older = [killable.controller.CreateVolume(create_request(ceph_cluster), timeout=60).volume.volume_id
             for _ in range(MIXED)]
    creates = [create_request(ceph_cluster) for _ in range(MIXED)]
    deletes = [csi_pb2.DeleteVolumeRequest(volume_id=vid, secrets=ceph_cluster.secrets) for vid in older]
    calls: list[tuple[str, Call]] = [(r.name, _create(r)) for r in creates]
    calls += [(r.name, _create(r)) for r in random.sample(creates, DUPLICATES)]
    calls += [("", _delete(d)) for d in deletes + random.sample(deletes, DUPLICATES)]
    random.shuffle(calls)

    results, kills = run_phase(killable, [call for _, call in calls], KILLS_PER_PHASE)
    assert len(kills) == KILLS_PER_PHASE, f"kills during the mixed phase: {kills}"
    ids_by_name: dict[str, set[str]] = {}
    for (name, _), result in zip(calls, results):
        if name:
            ids_by_name.setdefault(name, set()).add(result.volume.volume_id)  # type: ignore[attr-defined]
    assert all(len(ids) == 1 for ids in ids_by_name.values()), f"a name answered with two volumes: {ids_by_name}"
    volume_ids = [ids.pop() for ids in ids_by_name.values()]
    during = read_pool(ceph_cluster)
    images = {name for name in during.directory if name.startswith("csi-vol-") and name not in baseline.directory}
    assert images == {f"csi-vol-{vid[-36:]}" for vid in volume_ids}, (
        f"exactly the new names' images, none of the deleted ones, none extra (kills at {kills})")

    for vid in volume_ids:
        killable.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vid, secrets=ceph_cluster.secrets),
                                         timeout=60)
    after = wait_for_pool(ceph_cluster, baseline, timeout=150)
    assert after == baseline, f"left behind after kills at {kills}"
