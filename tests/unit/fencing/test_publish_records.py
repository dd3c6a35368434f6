"""Pure parts of publishing and fencing: ceph-csi's metadata keys read as holders, node id
checks, Ceph client address forms and blocklist matching, and the node's address report."""
from __future__ import annotations

import pytest

from cephcsi.ceph import blocklist, publish_keys
from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import InvalidArgument
from cephcsi.node.client_address import AddressReporter, monitor_endpoints, source_address
from cephcsi.node.requests import StageRequest, VolumeAccess
from cephcsi.node.stage_record import ImageSpec
from cephcsi.volumes import publish
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

VOL = "0001-0004-test-0000000000000001-9f4d1c2e-0000-4000-8000-000000000001"
OTHER = "0001-0004-test-0000000000000001-9f4d1c2e-0000-4000-8000-000000000002"


def test_holders_read_ceph_csi_keys_of_this_volume_only() -> None:
    meta = {
        publish.address_key(VOL, "node-a"): "10.0.0.5",
        publish.user_key(VOL, "node-a"): "csi",
        publish.address_key(OTHER, "node-x"): "10.0.0.9",  # copied from a clone's parent
        publish.early_address_key("node-b"): "",
        "csi.storage.k8s.io/pvc/name": "data",
    }
    assert publish.holders(meta, VOL) == {"node-a": "10.0.0.5", "node-b": ""}
    assert publish.node_keys(meta, VOL, "node-a") == sorted([publish.address_key(VOL, "node-a"),
                                                             publish.user_key(VOL, "node-a")])
    assert publish.address_key(VOL, "n") == f".rbd.csi.ceph.com/clientaddress/{VOL}/n"
    assert publish.user_key(VOL, "n") == f".rbd.csi.ceph.com/userid/{VOL}/n"
    assert publish.early_address_key("n") == ".rbd.csi.ceph.com/clientAddress/n"


@pytest.mark.parametrize("node", ["", "a/b", "has space", "x" * 254, "nul\x00"])
def test_node_ids_that_cannot_be_ours_are_invalid(node: str) -> None:
    with pytest.raises(InvalidArgument, match="node_id"):
        publish.check_node_id(node)


def test_local_nodes_know_only_their_own() -> None:
    assert publish.LocalNodes(frozenset({"me"})).exists("me") is True
    assert publish.LocalNodes(frozenset({"me"})).exists("other") is False
    assert publish.LocalNodes().exists("other") is None
    assert publish.LocalNodes().out_of_service("me") is False


@pytest.mark.parametrize(("given", "normal"), [
    ("10.0.0.5", "10.0.0.5"),
    ("10.0.0.5:0/123", "10.0.0.5:0/123"),
    ("v2:10.0.0.5:0/123", "10.0.0.5:0/123"),
    ("any:10.0.0.5:0/0", "10.0.0.5:0/0"),
    ("fd00::5", "fd00::5"),
    ("[fd00::5]:0/7", "[fd00::5]:0/7"),
])
def test_address_forms(given: str, normal: str) -> None:
    assert blocklist.normalise(given) == normal


@pytest.mark.parametrize("bad", ["node-a", "10.0.0.5:x/1", "10.0.0.500", ""])
def test_not_addresses(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        blocklist.normalise(bad)


def test_blocklist_matching_by_instance_or_whole_ip() -> None:
    entries = {"10.0.0.5:0/0": "2027-01-01", "10.0.0.6:0/42": "2027-01-01"}
    assert blocklist.blocks(entries, "10.0.0.5:0/999")  # the whole IP
    assert blocklist.blocks(entries, "10.0.0.6:0/42")
    assert not blocklist.blocks(entries, "10.0.0.6:0/43")
    assert not blocklist.blocks(entries, "10.0.0.7:0/1")
    assert blocklist.host_of("[fd00::5]:0/7") == "fd00::5"


def test_monitor_strings() -> None:
    assert monitor_endpoints("10.0.0.1:6789,10.0.0.2") == [("10.0.0.1", 6789), ("10.0.0.2", 6789)]
    assert monitor_endpoints("[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]") == [("10.0.0.1", 3300), ("10.0.0.1", 6789)]
    assert monitor_endpoints("mon.example:6789") == []
    assert source_address("127.0.0.1:6789") == "127.0.0.1"
    assert source_address("mon.example") is None


def stage_request(pool: str = "rbd") -> StageRequest:
    return StageRequest(VOL, "/staging", "c", "127.0.0.1:6789", ImageSpec(pool, "csi-vol-1"),
                        Credentials("csi", "AQDsecretkey=="), VolumeAccess("mount", "ext4"))


def test_the_node_reports_its_address_once_per_pool_without_the_key_in_argv() -> None:
    runner = FakeRunner()
    reporter = AddressReporter("node-a", runner, 10.0)
    reporter.report(stage_request())
    reporter.report(stage_request())
    reporter.report(stage_request("other"))
    assert len(runner.calls) == 2
    argv = runner.calls[0].argv
    assert argv[:2] == ["rados", "--id"] and argv[-4:] == ["setomapval", publish_keys.NODE_ADDRESSES, "node-a", "127.0.0.1"]
    assert "AQDsecretkey==" not in " ".join(argv)
    assert [mode for mode, _ in runner.calls[0].files.values()] == [0o600]


def test_a_failed_report_does_not_fail_the_stage_and_is_retried() -> None:
    runner = FakeRunner(lambda argv: (1, "", "error connecting"))
    reporter = AddressReporter("node-a", runner, 10.0)
    reporter.report(stage_request())
    reporter.report(stage_request())
    assert len(runner.calls) == 2
