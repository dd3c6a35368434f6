"""Accessibility requirements as external-provisioner builds them (used only when the plugin
reports topology), with and without --strict-topology / --immediate-topology."""
from __future__ import annotations

from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.errors import FailedPrecondition, Unavailable
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.topology import TopologyPolicy, allowed_segments, requirement
from tests.unit.sidecars.fixtures import DRIVER, storage_class

pytestmark = pytest.mark.unit

STRICT = TopologyPolicy(strict=True)
NOT_IMMEDIATE = TopologyPolicy(immediate=False)


def node(name: str, **labels: str) -> KubeObject:
    return {"metadata": {"name": name, "labels": labels}}


def csinode(*keys: str) -> KubeObject:
    return {"spec": {"drivers": [{"name": "other", "topologyKeys": ["x"]}, {"name": DRIVER, "topologyKeys": list(keys)}]}}


def zones(*names: str) -> list[dict[str, str]]:
    return [{"zone": z} for z in names]


def segments(topologies: Any) -> list[dict[str, str]]:
    return [dict(t.segments) for t in topologies]


def cluster() -> list[tuple[KubeObject, KubeObject]]:
    """Nodes in zones c, a, b, a and one without the driver's labels."""
    return [(node("n3", zone="c"), csinode("zone")), (node("n1", zone="a"), csinode("zone")),
            (node("n2", zone="b"), csinode("zone")), (node("n4", zone="a"), csinode("zone")), (node("n5"), {})]


def allowed(*values: str) -> KubeObject:
    return storage_class(allowedTopologies=[{"matchLabelExpressions": [{"key": "zone", "values": list(values)}]}])


def wffc(selected: KubeObject, sc: KubeObject | None = None, policy: TopologyPolicy = TopologyPolicy(),
         keys: tuple[str, ...] = ("zone",)) -> csi_pb2.TopologyRequirement | None:
    return requirement(DRIVER, sc or storage_class(), selected, csinode(*keys), cluster(), policy, "data")


def test_strict_asks_for_the_selected_nodes_segment_only() -> None:
    req = wffc(node("n2", zone="b", other="z"), policy=STRICT)
    assert req is not None
    assert segments(req.requisite) == zones("b") and segments(req.preferred) == zones("b")


def test_strict_refuses_a_node_outside_the_allowed_topologies() -> None:
    with pytest.raises(FailedPrecondition, match="outside the StorageClass's allowedTopologies"):
        wffc(node("n2", zone="b"), allowed("a", "c"), STRICT)
    req = wffc(node("n2", zone="b"), allowed("a", "b"), STRICT)
    assert req is not None and segments(req.requisite) == zones("b")


def test_not_strict_asks_for_every_nodes_segment_with_the_selected_one_preferred() -> None:
    req = wffc(node("n2", zone="b"))
    assert req is not None
    assert segments(req.requisite) == zones("a", "b", "c"), "sorted and deduplicated, the unlabelled node left out"
    assert segments(req.preferred) == zones("b", "c", "a"), "the requisite list rotated to start at the node's"


def test_not_strict_uses_the_allowed_topologies_when_the_class_has_them() -> None:
    req = wffc(node("n1", zone="a"), allowed("d", "a"))
    assert req is not None
    assert segments(req.requisite) == zones("a", "d") and segments(req.preferred) == zones("a", "d")


def test_not_strict_refuses_a_node_no_allowed_segment_covers() -> None:
    with pytest.raises(FailedPrecondition, match="none of the segments"):
        wffc(node("n2", zone="b"), allowed("a"))


def test_a_selected_node_without_the_label_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="zone"):
        wffc(node("n1"))


def test_a_selected_node_without_topology_keys_waits_instead_of_guessing() -> None:
    """external-provisioner errors (and retries) there: a guess could put the volume out of reach."""
    with pytest.raises(Unavailable, match="no topology keys .* --domainlabels"):
        requirement(DRIVER, storage_class(), node("n1", zone="a"), None, cluster())


def test_allowed_topologies_expand_to_every_combination() -> None:
    terms = [{"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}, {"key": "rack", "values": ["1"]}]}]
    assert allowed_segments(terms) == [{"zone": "a", "rack": "1"}, {"zone": "b", "rack": "1"}]


def test_a_segment_with_fewer_keys_covers_a_node_with_more() -> None:
    """An allowed term names the zone only; the node's segment has zone and rack."""
    req = requirement(DRIVER, allowed("b", "a"), node("n1", zone="a", rack="r1"), csinode("zone", "rack"),
                      [], TopologyPolicy(strict=True), "data")
    assert req is not None and segments(req.requisite) == [{"zone": "a", "rack": "r1"}]


def test_immediate_binding_uses_every_node_of_the_driver() -> None:
    req = requirement(DRIVER, storage_class(), None, None, cluster(), claim_name="data")
    assert req is not None and segments(req.requisite) == zones("a", "b", "c")
    assert sorted(map(str, segments(req.preferred))) == sorted(map(str, zones("a", "b", "c")))


def test_immediate_binding_without_immediate_topology_asks_for_nothing() -> None:
    assert requirement(DRIVER, storage_class(), None, None, cluster(), NOT_IMMEDIATE, "data") is None
    req = requirement(DRIVER, allowed("a"), None, None, cluster(), NOT_IMMEDIATE, "data")
    assert req is not None and segments(req.requisite) == zones("a"), "allowedTopologies still apply"


def test_immediate_binding_with_no_node_registered_waits() -> None:
    with pytest.raises(Unavailable, match="no node has registered topology keys"):
        requirement(DRIVER, storage_class(), None, None, [(node("n1", zone="a"), {})], claim_name="data")


def first_preferred(claim: str) -> str:
    req = requirement(DRIVER, storage_class(), None, None, cluster(), claim_name=claim)
    assert req is not None
    return req.preferred[0].segments["zone"]


def test_immediate_claims_spread_over_the_segments_by_name() -> None:
    """Kubernetes' rule: FNV-1 of the name (a StatefulSet's: of its set name), plus its ordinal."""
    # FNV-1 (32 bits) of "web" is 0x46661985, which is 0 mod 3 → a; the ordinal moves each member on.
    assert [first_preferred(f"data-web-{i}") for i in range(4)] == ["a", "b", "c", "a"]
    assert first_preferred("logs-web-1") == first_preferred("data-web-1"), "one member's claims stay together"
    assert len({first_preferred(f"claim-{i}") for i in range(12)}) == 3
