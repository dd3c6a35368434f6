"""GetCapacity on the real cluster: the pool's `ceph df` max_avail, capped by its quota; the
data pool when the class names one; bad classes are INVALID_ARGUMENT; over gRPC without the
embedded sidecars a class cannot be read (no credentials), an empty request is 0."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.cli.wiring import build_controller
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.csi.controller import ControllerServicer
from cephcsi.errors import InvalidArgument
from cephcsi.settings import Settings
from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]
MiB = 1 << 20


class ClusterSecret:
    """The test's stand-in for the Kubernetes Secret reader: the class's secret is the cluster's
    csi user (the sidecar tests read it from a real Secret)."""

    def __init__(self, ceph: CephTestCluster) -> None:
        self.ceph = ceph
        self.asked: list[dict[str, str]] = []

    def credentials_for(self, parameters: Mapping[str, str]) -> Credentials:
        self.asked.append(dict(parameters))
        return Credentials.from_secrets(self.ceph.secrets)


@pytest.fixture(scope="module")
def controller(config_file: str, ceph_cluster: CephTestCluster) -> Iterator[ControllerServicer]:
    keeper = LeaseKeeper()
    settings = Settings(mode="controller", config_file=config_file)
    servicer = build_controller(settings, ClusterRegistry(config_file), keeper)
    servicer.capacity_secrets = ClusterSecret(ceph_cluster)
    try:
        yield servicer
    finally:
        servicer.volumes.connections.close_all()
        keeper.drain(5)


@pytest.fixture(scope="module")
def spare_pool(ceph_cluster: CephTestCluster) -> Iterator[str]:
    """A pool of the test's own, so its quota changes nothing for other tests."""
    name = f"cap-{uuid.uuid4().hex[:6]}"
    ceph_cluster.admin("ceph", "osd", "pool", "create", name, "8", "8", "replicated")
    try:
        # `ceph df` is the mgr's digest of the OSDs' reports: a new pool shows there a few
        # seconds after it exists (longer on a loaded machine).
        deadline = time.monotonic() + 90
        while not any(p["name"] == name for p in json.loads(
                ceph_cluster.admin("ceph", "df", "--format", "json"))["pools"]):
            assert time.monotonic() < deadline, f"pool {name} never showed in `ceph df`"
            time.sleep(1)
        yield name
    finally:
        ceph_cluster.admin("ceph", "osd", "pool", "rm", name, name, "--yes-i-really-really-mean-it")


def max_avail(ceph: CephTestCluster, pool: str) -> int:
    df = json.loads(ceph.admin("ceph", "df", "--format", "json"))
    return int(next(p for p in df["pools"] if p["name"] == pool)["stats"]["max_avail"])


def quota_room(ceph: CephTestCluster, pool: str) -> int:
    quota = json.loads(ceph.admin("ceph", "osd", "pool", "get-quota", pool, "--format", "json"))
    return int(quota["quota_max_bytes"]) - int(quota["current_num_bytes"])


def capacity(controller: ControllerServicer, parameters: Mapping[str, str]) -> int:
    response = controller.GetCapacity(csi_pb2.GetCapacityRequest(parameters=parameters), None)
    return int(response.available_capacity)


def steady(ceph: CephTestCluster, pool: str, read: Callable[[CephTestCluster, str], int],
           controller: ControllerServicer, parameters: Mapping[str, str]) -> tuple[int, int]:
    """(GetCapacity, the admin's figure) from a moment when the admin's figure read the same
    before and after the call (the OSDs report usage every second or so)."""
    for _ in range(20):
        before = read(ceph, pool)
        answer = capacity(controller, parameters)
        if read(ceph, pool) == before:
            return answer, before
    raise AssertionError(f"the figure of pool {pool} did not hold still for one GetCapacity call")


def test_capacity_is_the_pools_max_avail(controller: ControllerServicer, ceph_cluster: CephTestCluster) -> None:
    answer, expected = steady(ceph_cluster, ceph_cluster.pool, max_avail, controller, ceph_cluster.parameters)
    assert answer == expected > 0
    asked = controller.capacity_secrets.asked  # type: ignore[attr-defined]
    assert asked[-1] == ceph_cluster.parameters  # the class's parameters reach the secret source


def test_a_quota_caps_the_capacity_and_the_data_pool_is_what_counts(
        controller: ControllerServicer, ceph_cluster: CephTestCluster, spare_pool: str) -> None:
    on_spare = {"clusterID": ceph_cluster.cluster_id, "pool": spare_pool}
    unlimited, expected = steady(ceph_cluster, spare_pool, max_avail, controller, on_spare)
    assert unlimited == expected > 64 * MiB

    ceph_cluster.admin("ceph", "osd", "pool", "set-quota", spare_pool, "max_bytes", str(64 * MiB))
    try:
        capped, room = steady(ceph_cluster, spare_pool, quota_room, controller, on_spare)
        assert capped == room == 64 * MiB  # nothing stored in the spare pool yet
        # Images in the test pool, data in the spare pool: the data pool's quota is the limit.
        split = {**ceph_cluster.parameters, "dataPool": spare_pool}
        assert capacity(controller, split) == 64 * MiB
    finally:
        ceph_cluster.admin("ceph", "osd", "pool", "set-quota", spare_pool, "max_bytes", "0")
    assert steady(ceph_cluster, spare_pool, max_avail, controller, on_spare)[0] > 64 * MiB


@pytest.mark.parametrize(("parameters", "names"), [
    ({"clusterID": "test-cluster"}, "parameter pool is required"),
    ({"clusterID": "no-such-cluster", "pool": "rbd"}, "parameter clusterID: clusterID 'no-such-cluster'"),
    ({"clusterID": "test-cluster", "pool": "no-such-pool"}, "parameter pool: pool 'no-such-pool' does not exist"),
    ({"clusterID": "test-cluster", "pool": "rbd", "topologyConstrainedPools": "[]"}, "parameter topologyConstrainedPools: must be a non-empty list"),
])
def test_a_class_no_volume_could_come_from_is_invalid(controller: ControllerServicer, ceph_cluster: CephTestCluster,
                                                      parameters: dict[str, str], names: str) -> None:
    parameters = {k: (ceph_cluster.pool if v == "rbd" else v) for k, v in parameters.items()}
    names = names.replace("'rbd'", repr(ceph_cluster.pool))
    with pytest.raises(InvalidArgument, match=names):
        capacity(controller, parameters)


def test_over_grpc_without_sidecars(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    stub = driver.controller
    caps = stub.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest()).capabilities
    assert csi_pb2.ControllerServiceCapability.RPC.GET_CAPACITY in [c.rpc.type for c in caps]
    assert stub.GetCapacity(csi_pb2.GetCapacityRequest()).available_capacity == 0
    with pytest.raises(grpc.RpcError) as failure:
        stub.GetCapacity(csi_pb2.GetCapacityRequest(parameters=ceph_cluster.parameters))
    assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "provisioner-secret-name" in (failure.value.details() or "")
