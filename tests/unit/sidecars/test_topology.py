"""Accessibility requirements (used only when the plugin reports topology)."""
from __future__ import annotations

import pytest

from cephcsi.errors import FailedPrecondition
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.topology import allowed_segments, requirement
from tests.unit.sidecars.fixtures import DRIVER, storage_class

pytestmark = pytest.mark.unit


def node(name: str, **labels: str) -> KubeObject:
    return {"metadata": {"name": name, "labels": labels}}


def csinode(*keys: str) -> KubeObject:
    return {"spec": {"drivers": [{"name": "other", "topologyKeys": ["x"]}, {"name": DRIVER, "topologyKeys": list(keys)}]}}


def test_selected_node_segment() -> None:
    req = requirement(DRIVER, storage_class(), node("n1", zone="a", other="z"), csinode("zone"))
    assert req is not None
    assert [dict(t.segments) for t in req.requisite] == [{"zone": "a"}]
    assert [dict(t.segments) for t in req.preferred] == [{"zone": "a"}]


def test_selected_node_without_the_label() -> None:
    with pytest.raises(FailedPrecondition, match="zone"):
        requirement(DRIVER, storage_class(), node("n1"), csinode("zone"))


def test_no_topology_keys_means_no_requirement() -> None:
    assert requirement(DRIVER, storage_class(), node("n1", zone="a"), None) is None


def test_allowed_topologies_expand_to_every_combination() -> None:
    terms = [{"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}, {"key": "rack", "values": ["1"]}]}]
    assert allowed_segments(terms) == [{"zone": "a", "rack": "1"}, {"zone": "b", "rack": "1"}]


def test_immediate_binding_uses_every_node_of_the_driver() -> None:
    pairs = [(node("n1", zone="a"), csinode("zone")), (node("n2", zone="a"), csinode("zone")),
             (node("n3", zone="b"), csinode("zone")), (node("n4"), {})]
    req = requirement(DRIVER, storage_class(), None, None, pairs)
    assert req is not None and [dict(t.segments) for t in req.requisite] == [{"zone": "a"}, {"zone": "b"}]
