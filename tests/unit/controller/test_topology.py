"""topologyConstrainedPools: parsing, validation and ceph-csi's matching order (pure)."""
import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.csi.controller import requirements_of
from cephcsi.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted
from cephcsi.volumes import placement, topology
from cephcsi.volumes.clones import ContentSource
from cephcsi.volumes.parameters import VolumeParameters
from cephcsi.volumes.topology import Requirements, TopologyPool
from cephcsi.volumes.volume_id import VolumeId

pytestmark = pytest.mark.unit

POOLS = json.dumps([
    {"poolName": "east", "dataPool": "east-ec",
     "domainSegments": [{"domainLabel": "region", "value": "r1"}, {"domainLabel": "zone", "value": "a"}]},
    {"poolName": "west", "domainSegments": [{"domainLabel": "zone", "value": "b"}]},
])
A = {"topology.rbd.csi.ceph.com/zone": "a", "topology.rbd.csi.ceph.com/region": "r1"}
B = {"topology.rbd.csi.ceph.com/zone": "b"}
C = {"topology.rbd.csi.ceph.com/zone": "c"}


def test_parse_reads_pools_data_pools_and_segments_and_newlines() -> None:
    pools = topology.parse(POOLS.replace(", ", ",\n"))
    assert pools == (TopologyPool("east", "east-ec", (("region", "r1"), ("zone", "a"))),
                     TopologyPool("west", "", (("zone", "b"),)))


@pytest.mark.parametrize("text, fragment", [
    ("{", "not valid JSON"),
    ("[]", "non-empty list"),
    ('{"poolName": "p"}', "non-empty list"),
    ('["p"]', "[0] must be an object"),
    ('[{"domainSegments": [{"domainLabel": "zone", "value": "a"}]}]', "[0].poolName"),
    ('[{"poolName": "p"}]', "[0].domainSegments"),
    ('[{"poolName": "p", "domainSegments": []}]', "[0].domainSegments"),
    ('[{"poolName": "p", "domainSegments": [{"value": "a"}]}]', "domainLabel"),
    ('[{"poolName": "p", "domainSegments": [{"domainLabel": "zone"}]}]', "value"),
    ('[{"poolName": "p", "dataPool": 3, "domainSegments": [{"domainLabel": "zone", "value": "a"}]}]', "dataPool"),
])
def test_parse_refuses_what_is_wrong_by_name(text: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        topology.parse(text)
    assert fragment in caught.value.message and topology.KEY in caught.value.message


def test_a_pool_matches_when_every_segment_matches_by_the_key_after_its_slash() -> None:
    east, west = topology.parse(POOLS)
    assert east.matches(A) and not east.matches(B)
    assert not east.matches({"topology.rbd.csi.ceph.com/zone": "a"})  # region missing
    assert east.matches({"zone": "a", "other.io/region": "r1", "x/host": "n1"})
    assert west.matches(B) and not west.matches(A)


def test_preferred_topologies_come_before_requisite_and_each_tries_the_pools_in_order() -> None:
    pools = topology.parse(POOLS)
    chosen = topology.choose(pools, Requirements(preferred=(C, B), requisite=(A,)))
    assert chosen.pool.pool == "west" and chosen.segments == B
    chosen = topology.choose(pools, Requirements(requisite=(C, A, B)))
    assert chosen.pool.pool == "east" and chosen.segments == A


def test_no_match_is_resource_exhausted_naming_the_pools_and_the_request() -> None:
    with pytest.raises(ResourceExhausted) as caught:
        topology.choose(topology.parse(POOLS), Requirements(preferred=(C,), requisite=(C,)))
    assert "east, west" in caught.value.message and "'c'" in caught.value.message


def test_match_pool_checks_only_the_named_pool() -> None:
    pools = topology.parse(POOLS)
    requirements = Requirements(preferred=(B,), requisite=(A, B))
    found = topology.match_pool(pools, requirements, "east")
    assert found is not None and found.segments == A
    assert topology.match_pool(pools, Requirements(requisite=(B,)), "east") is None
    assert topology.match_pool(pools, requirements, "elsewhere") is None


def test_parameters_carry_the_pools_and_refuse_bad_pool_names() -> None:
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: POOLS})
    assert [p.pool for p in params.topology_pools] == ["east", "west"]
    bad = POOLS.replace('"west"', '"we st"')
    with pytest.raises(InvalidArgument, match="not a valid pool name"):
        VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: bad})


def test_accessible_topology_is_the_matched_requirement_or_none() -> None:
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: POOLS})
    requirements = Requirements(preferred=(A,))
    assert placement.accessible(params, requirements, "east") == A
    assert placement.accessible(params, requirements, "rbd") is None
    assert placement.accessible(params, None, "east") is None
    plain = VolumeParameters.parse({"clusterID": "c", "pool": "rbd"})
    assert placement.accessible(plain, requirements, "east") is None


def test_requirements_of_a_request() -> None:
    request = csi_pb2.CreateVolumeRequest(name="n")
    assert requirements_of(request) is None
    request.accessibility_requirements.requisite.append(csi_pb2.Topology(segments=B))
    request.accessibility_requirements.preferred.append(csi_pb2.Topology(segments=A))
    assert requirements_of(request) == Requirements(preferred=(A,), requisite=(B,))


def test_capacity_of_a_segment_is_asked_of_its_pool() -> None:
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", "dataPool": "rbd-ec", topology.KEY: POOLS})
    east = placement.for_segment(params, A)
    assert east is not None and (east.pool, east.data_pool) == ("east", "east-ec")
    west = placement.for_segment(params, B)
    assert west is not None and (west.pool, west.data_pool) == ("west", "")
    assert placement.for_segment(params, C) is None
    assert placement.for_segment(params, None) is params
    plain = VolumeParameters.parse({"clusterID": "c", "pool": "rbd"})
    assert placement.for_segment(plain, C) is plain


POOL_IDS = {"rbd": 1, "east": 2, "west": 3}


class _Session:
    """Pool handles named by their pool (pure placement logic: no cluster needed)."""

    def __init__(self, pools: set[str]) -> None:
        self.pools = pools

    @contextlib.contextmanager
    def ioctx(self, pool: str) -> Iterator[str]:
        if pool not in self.pools:
            raise NotFound(f"pool {pool!r}")
        yield pool

    def pool_name(self, pool_id: int) -> str | None:
        return next((name for name, known in POOL_IDS.items() if known == pool_id and name in self.pools), None)


def _source(kind: str, pool: str) -> ContentSource:
    return ContentSource(kind, VolumeId("c", POOL_IDS[pool], "5f1c1a0e-8d3b-4f5e-9a7c-2b6d4e8f0a11").encode())


def _place(params: VolumeParameters, requirements: Requirements | None, reserved: str | None,
           release: bool = False, source: ContentSource | None = None) -> tuple[VolumeParameters, list[str]]:
    released: list[str] = []

    def undo(pool: str) -> bool:
        released.append(pool)
        return release

    def has_name(io: Any) -> bool:
        return bool(io == reserved)

    session: Any = _Session({"rbd", "east", "west"})
    placed = placement.place(session, params, requirements, source, has_name, undo)
    return placed, released


def test_a_retry_reserved_in_a_class_pool_that_is_a_topology_pool_gets_that_entry() -> None:
    params = VolumeParameters.parse({"clusterID": "c", "pool": "east", topology.KEY: POOLS})
    placed, released = _place(params, Requirements(preferred=(B, A)), "east")
    assert (placed.pool, placed.data_pool, released) == ("east", "east-ec", [])
    plain_pool = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", "dataPool": "rbd-ec", topology.KEY: POOLS})
    assert _place(plain_pool, Requirements(preferred=(B,)), "rbd") == (plain_pool, [])


def test_a_reservation_the_requirements_no_longer_match_is_released_only_without_an_image() -> None:
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: POOLS})
    placed, released = _place(params, Requirements(requisite=(B,)), "east", release=True)
    assert (placed.pool, released) == ("west", ["east"])
    with pytest.raises(AlreadyExists, match="'east'"):
        _place(params, Requirements(requisite=(B,)), "east", release=False)


def test_a_restore_goes_to_its_snapshots_pool_which_must_match_whatever_is_preferred() -> None:
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: POOLS})
    placed, _ = _place(params, Requirements(preferred=(B, A)), None, source=_source("snapshot", "east"))
    assert (placed.pool, placed.data_pool) == ("east", "east-ec")
    with pytest.raises(ResourceExhausted, match="source snapshot is in pool 'east'"):
        _place(params, Requirements(requisite=(B,)), None, source=_source("snapshot", "east"))


def test_a_volume_clone_is_placed_by_the_requirements_like_a_new_volume_whatever_its_sources_pool() -> None:
    """ceph-csi places a volume clone by the requirements and clones it across pools."""
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: POOLS})
    placed, _ = _place(params, Requirements(requisite=(B,)), None, source=_source("volume", "east"))
    assert (placed.pool, placed.data_pool) == ("west", "")
    # The source's pool matching too does not make it win over the preferred topology.
    placed, _ = _place(params, Requirements(preferred=(B, A)), None, source=_source("volume", "east"))
    assert placed.pool == "west"
    placed, _ = _place(params, Requirements(requisite=(A,)), None, source=_source("volume", "west"))
    assert (placed.pool, placed.data_pool) == ("east", "east-ec")
    # A source outside every topology pool (another class's volume) is no obstacle either.
    placed, _ = _place(params, Requirements(requisite=(B,)), None, source=_source("volume", "rbd"))
    assert placed.pool == "west"
    with pytest.raises(ResourceExhausted, match="topologyConstrainedPools"):
        _place(params, Requirements(requisite=(C,)), None, source=_source("volume", "east"))


def test_a_volume_clone_reserved_in_a_matching_pool_stays_there() -> None:
    """The reserved-name rules come first: a retry of a clone finds it where it began."""
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: POOLS})
    placed, released = _place(params, Requirements(preferred=(B, A)), "east", source=_source("volume", "west"))
    assert (placed.pool, released) == ("east", [])
    placed, released = _place(params, Requirements(requisite=(B,)), "east", release=True,
                              source=_source("volume", "east"))
    assert (placed.pool, released) == ("west", ["east"])


def test_no_requirements_use_the_class_pool_and_warn_once_naming_the_opt_in(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "_unconstrained_warned", threading.Event())
    params = VolumeParameters.parse({"clusterID": "c", "pool": "rbd", topology.KEY: POOLS})
    with caplog.at_level(logging.WARNING, logger=placement.__name__):
        assert _place(params, None, None) == (params, [])
        assert _place(params, Requirements(), None) == (params, [])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "--feature-gates=Topology=true" in warnings[0] and "--domainlabels" in warnings[0]


def test_the_controller_advertises_topology_only_when_opted_in_with_the_feature_gate() -> None:
    from cephcsi.cli.args import parse_settings
    from cephcsi.cli.wiring import advertises_topology

    controller = ["--mode=controller", "--endpoint=unix:///tmp/x.sock"]
    node = ["--mode=node", "--nodeid=n1", "--endpoint=unix:///tmp/x.sock"]
    assert not advertises_topology(parse_settings(controller))
    assert not advertises_topology(parse_settings([*controller, "--domainlabels=zone"]))
    assert advertises_topology(parse_settings([*controller, "--feature-gates=Topology=true"]))
    assert not advertises_topology(parse_settings([*controller, "--feature-gates=Topology=false"]))
    assert advertises_topology(parse_settings([*node, "--domainlabels=zone"]))
    assert not advertises_topology(parse_settings([*node, "--feature-gates=Topology=true"]))
    with pytest.raises(SystemExit):
        parse_settings([*controller, "--feature-gates=Topolgy=true"])
