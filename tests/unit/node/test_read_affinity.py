"""config.json readAffinity, as ceph-csi defines it: parsing, Node labels → crush_location, the
exact krbd argv (this kernel has no rbd module), and the plumbing from the CSI request to the map."""
from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph.credentials import Credentials
from cephcsi.config import read_affinity as config
from cephcsi.config.clusters import ClusterRegistry, parse_clusters
from cephcsi.config.read_affinity import ReadAffinity
from cephcsi.csi.node import NodeServicer
from cephcsi.errors import ConfigError, Unavailable
from cephcsi.node import stage_record
from cephcsi.node.crush_location import CrushLocator
from cephcsi.node.mappers import read_affinity as ra
from cephcsi.node.mappers.base import KRBD, NBD, MapRequest
from cephcsi.node.mappers.krbd import KrbdMapper
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.mounts import Mounter
from cephcsi.node.requests import StageRequest, VolumeAccess
from cephcsi.node.stage_record import ImageSpec, StageRecord
from cephcsi.node.stager import Stager
from cephcsi.settings import NodeSettings, Settings
from tests.unit.node.fakes import FakeRunner
from tests.unit.node.test_csi_node import SECRETS, VOLUME_ID, FakeService, mount_cap
from tests.unit.node.test_rbd_mappers import CREDS, IMAGE, Cluster

pytestmark = pytest.mark.unit

ZONE, REGION, HOST = "topology.kubernetes.io/zone", "topology.kubernetes.io/region", "kubernetes.io/hostname"
RACK = "topology.rook.io/rack"
NODE = {ZONE: "eu-west-1a", REGION: "eu-west", HOST: "node-1.example.com", RACK: "r7", "other": "x"}
ON = ReadAffinity(True, (ZONE, REGION))


def _entry(affinity: Any) -> str:
    return json.dumps([{"clusterID": "c1", "monitors": ["10.0.0.1:6789"], "readAffinity": affinity}])


# -- config.json -----------------------------------------------------------------------------

def test_read_affinity_is_parsed_per_cluster() -> None:
    clusters = parse_clusters(json.dumps([
        {"clusterID": "on", "monitors": ["m:6789"], "readAffinity": {"enabled": True, "crushLocationLabels": [ZONE, HOST]}},
        {"clusterID": "off", "monitors": ["m:6789"], "readAffinity": {"enabled": False, "crushLocationLabels": [ZONE]}},
        {"clusterID": "absent", "monitors": ["m:6789"]},
        {"clusterID": "null", "monitors": ["m:6789"], "readAffinity": None},
    ]))
    assert clusters["on"].read_affinity == ReadAffinity(True, (ZONE, HOST)) and clusters["on"].read_affinity.active
    assert clusters["off"].read_affinity == ReadAffinity(False, (ZONE,)) and not clusters["off"].read_affinity.active
    assert clusters["absent"].read_affinity == clusters["null"].read_affinity == config.DISABLED


@pytest.mark.parametrize("affinity, message", [
    ("yes", "readAffinity must be an object"),
    ({"enabled": "true"}, "enabled must be true or false"),
    ({"enabled": True, "crushLocationLabels": "topology.kubernetes.io/zone"}, "list of Node label keys"),
    ({"enabled": True, "crushLocationLabels": [ZONE, ""]}, "list of Node label keys"),
])
def test_malformed_read_affinity_is_a_config_error(affinity: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_clusters(_entry(affinity))


def test_enabled_without_labels_says_once_that_the_node_flags_decide(caplog: pytest.LogCaptureFixture) -> None:
    """As in ceph-csi: such an entry takes its labels from --crush-location-labels."""
    config._warned.discard("c1")
    caplog.set_level(logging.INFO, logger="cephcsi.config.read_affinity")
    clusters = parse_clusters(_entry({"enabled": True}))
    parse_clusters(_entry({"enabled": True, "crushLocationLabels": []}))
    assert clusters["c1"].read_affinity == ReadAffinity(True, ()) and not clusters["c1"].read_affinity.active
    notes = [r for r in caplog.records if "without crushLocationLabels" in r.getMessage()]
    assert len(notes) == 1  # once per cluster


def test_the_flags_labels_serve_only_entries_enabled_without_their_own() -> None:
    source = Labels(NODE)
    locator = CrushLocator(source, "node-1", fallback_labels=(HOST,))
    assert locator.location(ReadAffinity(True, ())) == (("host", "node-1-example-com"),)
    assert locator.location(ReadAffinity(True, (ZONE,))) == (("zone", "eu-west-1a"),)  # the entry's own win
    assert locator.location(config.DISABLED) == ()  # not enabled in config.json: never, flags or not
    assert CrushLocator(source, "node-1").location(ReadAffinity(True, ())) == ()  # no flags: off


def test_read_affinity_flags() -> None:
    from cephcsi.cli.args import parse_settings

    base = ["--mode=node", "--nodeid=n1", "--endpoint=unix:///tmp/x.sock"]
    on = parse_settings([*base, "--enable-read-affinity", "--crush-location-labels=a/zone, kubernetes.io/hostname"])
    assert on.node.read_affinity_labels == ("a/zone", "kubernetes.io/hostname")
    off = parse_settings([*base, "--crush-location-labels=a/zone"])
    assert off.node.read_affinity_labels == ()  # the labels alone do nothing (ceph-csi's rule)


# -- Node labels → crush_location ---------------------------------------------------------

def test_label_prefix_is_dropped_hostname_becomes_host_and_dots_dashes() -> None:
    assert ra.crush_type(ZONE) == "zone" and ra.crush_type(RACK) == "rack"
    assert ra.crush_type(HOST) == "host" and ra.crush_type("row") == "row"
    location = ra.crush_location([ZONE, HOST, RACK], NODE)
    assert location == (("zone", "eu-west-1a"), ("host", "node-1-example-com"), ("rack", "r7"))


def test_missing_empty_and_duplicate_types_are_skipped_in_label_order() -> None:
    labels = [ZONE, "failure-domain.beta.kubernetes.io/zone", "topology.example.com/room", REGION]
    node = {ZONE: " ", "failure-domain.beta.kubernetes.io/zone": "old-zone", REGION: "eu"}
    assert ra.crush_location(labels, node) == (("zone", "old-zone"), ("region", "eu"))
    assert ra.crush_location([ZONE, "failure-domain.beta.kubernetes.io/zone"], NODE) == (("zone", "eu-west-1a"),)
    assert ra.crush_location([ZONE], {}) == ()


def test_map_options_and_the_users_own_read_placement() -> None:
    location = (("zone", "a"), ("region", "eu"))
    assert ra.map_options(location) == ["read_from_replica=localize", "crush_location=zone:a|region:eu"]
    assert ra.map_options(()) == []
    assert ra.map_options(location, ["queue_depth=128"]) == ra.map_options(location)
    assert ra.map_options(location, ["read_from_replica=balance"]) == []
    assert ra.map_options(location, ["crush_location=zone:b"]) == []


# -- krbd / rbd-nbd argv --------------------------------------------------------------------

def _map_argv(mapper: str, options: list[str], location: ra.CrushLocation, udev: bool = False) -> list[str]:
    runner = FakeRunner(Cluster("/dev/rbd0" if mapper == KRBD else "/dev/nbd0"))
    request = MapRequest("vol", IMAGE, "10.0.0.1:6789", CREDS, options, crush_location=location)
    if mapper == KRBD:
        KrbdMapper(runner, 30.0, lambda p, t: None, 5.0, lambda: udev).map(request)
    else:
        NbdMapper(runner, 30.0, lambda p, t: None, 5.0).map(request)
    argv = runner.calls[1].argv
    keyfile = next(a for a in argv if a.startswith("--keyfile="))
    assert argv[:11] == ["rbd", "device", "map", "--device-type", "krbd" if mapper == KRBD else "nbd",
                         "--pool", "rbd", "--image", "csi-vol-1", "--id", "csi"]
    return argv[argv.index(keyfile) + 1:]


def test_krbd_argv_with_read_affinity() -> None:
    location = (("zone", "eu-west-1a"), ("host", "node-1"))
    assert _map_argv(KRBD, [], location) == [
        "--options", "noudev,read_from_replica=localize,crush_location=zone:eu-west-1a|host:node-1"]
    assert _map_argv(KRBD, ["lock_on_read"], location, udev=True) == [
        "--options", "read_from_replica=localize,crush_location=zone:eu-west-1a|host:node-1,lock_on_read"]


def test_krbd_argv_never_overrides_the_users_read_placement() -> None:
    location = (("zone", "eu-west-1a"),)
    assert _map_argv(KRBD, ["read_from_replica=balance"], location) == ["--options", "noudev,read_from_replica=balance"]
    assert _map_argv(KRBD, ["read_from_replica=localize", "crush_location=zone:z9"], location) == [
        "--options", "noudev,read_from_replica=localize,crush_location=zone:z9"]


def test_rbd_nbd_argv_has_no_read_affinity_as_in_ceph_csi() -> None:
    assert _map_argv(NBD, [], (("zone", "a"),)) == ["--options", "reattach-timeout=300"]


# -- Node labels, cached -------------------------------------------------------------------

class Labels:
    def __init__(self, *answers: dict[str, str] | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    def labels(self, node_name: str) -> dict[str, str]:
        assert node_name == "node-1"
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_locator_reads_labels_once_per_ttl_and_keeps_the_last_on_failure() -> None:
    now = [0.0]
    source = Labels(NODE, Unavailable("api down"), {ZONE: "eu-west-1b"})
    locator = CrushLocator(source, "node-1", ttl=60, clock=lambda: now[0])
    assert locator.location(config.DISABLED) == () and source.calls == 0  # off: no API call
    assert locator.location(ON) == (("zone", "eu-west-1a"), ("region", "eu-west"))
    assert locator.location(ReadAffinity(True, (HOST,))) == (("host", "node-1-example-com"),)
    assert source.calls == 1
    now[0] = 61
    assert locator.location(ON)[0] == ("zone", "eu-west-1a")  # refresh failed: last labels
    now[0] = 200
    assert locator.location(ON)[0] == ("zone", "eu-west-1b")  # relabelled node picked up
    assert source.calls == 3


def test_locator_without_labels_read_yet_fails_unavailable() -> None:
    with pytest.raises(Unavailable):
        CrushLocator(Labels(Unavailable("api down")), "node-1").location(ON)


# -- from NodeStageVolume to the map --------------------------------------------------------

class RecordingMapper:
    def __init__(self, name: str, device: str) -> None:
        self.name, self.device = name, device
        self.requests: list[MapRequest] = []

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        return ""

    def map(self, request: MapRequest) -> str:
        self.requests.append(request)
        return self.device

    def find(self, record: StageRecord) -> str | None:
        return self.device if self.requests else None

    def unmap(self, record: StageRecord) -> None:
        self.requests.clear()


class Choice:
    def __init__(self, mapper: str) -> None:
        self.mapper = mapper

    def for_volume(self, mounter: str) -> str:
        return self.mapper


def _stage(tmp_path: Any, mapper_name: str, affinity: ReadAffinity, map_options: str = "") -> tuple[MapRequest, int]:
    device = os.path.join(tmp_path, "dev")
    open(device, "wb").close()
    staging = os.path.join(tmp_path, "staging")
    runner = FakeRunner(lambda argv: (0, "UUID=1\nTYPE=ext4\nUSAGE=filesystem\n", "") if argv[0] == "blkid" else None)
    mapper, source = RecordingMapper(mapper_name, device), Labels(NODE)
    stager = Stager({mapper_name: mapper}, Choice(mapper_name), Mounter(runner, 10), runner, 10, "",  # type: ignore[arg-type]
                    read_mounts=lambda: [], crush_location=CrushLocator(source, "node-1").location)
    stager.stage(StageRequest(
        volume_id="vol-1", staging_path=staging, cluster_id="c1", monitors="m:6789", image=ImageSpec("rbd", "img"),
        credentials=Credentials("csi", "k"), access=VolumeAccess("mount", fs_type="ext4"), map_options=map_options,
        read_affinity=affinity))
    assert stage_record.load(staging) is not None
    return mapper.requests[0], source.calls


def test_stager_gives_krbd_the_nodes_crush_location(tmp_path: Any) -> None:
    request, calls = _stage(tmp_path, KRBD, ON)
    assert request.crush_location == (("zone", "eu-west-1a"), ("region", "eu-west")) and calls == 1


@pytest.mark.parametrize("mapper, affinity, options", [
    (NBD, ON, ""), (KRBD, config.DISABLED, ""), (KRBD, ReadAffinity(True, ()), ""),
    (KRBD, ON, "krbd:read_from_replica=balance"),
])
def test_stager_reads_no_labels_when_there_is_nothing_to_add(tmp_path: Any, mapper: str, affinity: ReadAffinity,
                                                             options: str) -> None:
    request, calls = _stage(tmp_path, mapper, affinity, options)
    assert request.crush_location == () and calls == 0


def test_stage_request_carries_the_clusters_read_affinity(tmp_path: Any) -> None:
    kubelet = os.path.join(tmp_path, "kubelet")
    os.makedirs(kubelet)
    path = os.path.join(tmp_path, "config.json")
    with open(path, "w") as handle:
        handle.write(_entry({"enabled": True, "crushLocationLabels": [ZONE]}).replace('"c1"', '"ceph"'))
    fake = FakeService()
    settings = Settings(mode="node", node=NodeSettings(node_id="node-1", kubelet_dir=kubelet))
    node = NodeServicer(fake, ClusterRegistry(path), settings)  # type: ignore[arg-type]
    node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
        volume_id=VOLUME_ID, staging_target_path=f"{kubelet}/plugins/st/globalmount", volume_capability=mount_cap(),
        secrets=SECRETS, volume_context={"clusterID": "ceph", "pool": "rbd", "imageName": "csi-vol-1"}), None)
    assert fake.calls[0][1].read_affinity == ReadAffinity(True, (ZONE,))
