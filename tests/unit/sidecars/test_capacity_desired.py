"""Which CSIStorageCapacity objects capacity tracking wants and which existing ones it keeps (pure logic)."""
from __future__ import annotations

from typing import Any

import pytest

from cephcsi.sidecars.capacity.desired import Item, body, desired, item_of, owned_by, plan, segments

pytestmark = pytest.mark.unit
DRIVER = "rbd.csi.ceph.com"
ZONE = "topology.kubernetes.io/zone"


def csinode(name: str, *drivers: tuple[str, list[str] | None]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"drivers": [{"name": d, "topologyKeys": k} for d, k in drivers]}}


def test_segments_come_from_nodes_where_the_driver_is_registered() -> None:
    nodes = {"a": {"metadata": {"name": "a", "labels": {ZONE: "z1"}}},
             "b": {"metadata": {"name": "b", "labels": {ZONE: "z1"}}},
             "c": {"metadata": {"name": "c", "labels": {}}},
             "d": {"metadata": {"name": "d", "labels": {ZONE: "z2"}}}}
    found = segments(DRIVER, [csinode("a", (DRIVER, [ZONE])), csinode("b", (DRIVER, [ZONE])),
                              csinode("c", (DRIVER, [ZONE])),  # label not there yet: left out
                              csinode("d", ("other.csi", [ZONE])),  # not our driver
                              csinode("gone", (DRIVER, [ZONE]))], nodes.get)
    assert found == [((ZONE, "z1"),)]
    # Registered without keys: one empty segment (an object that selects every node).
    assert segments(DRIVER, [csinode("c", (DRIVER, None))], nodes.get) == [()]
    assert segments(DRIVER, [], nodes.get) == []


def test_only_this_drivers_wait_for_first_consumer_classes_unless_immediate_is_asked_for() -> None:
    classes = [{"metadata": {"name": "wffc"}, "provisioner": DRIVER, "volumeBindingMode": "WaitForFirstConsumer"},
               {"metadata": {"name": "now"}, "provisioner": DRIVER, "volumeBindingMode": "Immediate"},
               {"metadata": {"name": "other"}, "provisioner": "x.csi", "volumeBindingMode": "WaitForFirstConsumer"}]
    assert desired(classes, [()], DRIVER, immediate_binding=False) == {Item("wffc", ())}
    assert desired(classes, [()], DRIVER, immediate_binding=True) == {Item("wffc", ()), Item("now", ())}
    assert desired(classes, [], DRIVER, immediate_binding=True) == set()


def existing(name: str, storage_class: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "storageClassName": storage_class, "nodeTopology": {"matchLabels": labels}}


def test_plan_keeps_one_object_per_item_and_drops_the_rest() -> None:
    wanted = {Item("a", ()), Item("b", ())}
    result = plan(wanted, [existing("csisc-2", "a"), existing("csisc-1", "a"), existing("csisc-3", "gone"),
                           {"metadata": {"name": "csisc-4"}, "storageClassName": "b",
                            "nodeTopology": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}}])
    assert result.matched[Item("a", ())]["metadata"]["name"] == "csisc-1"  # type: ignore[index]
    assert result.matched[Item("b", ())] is None
    assert sorted(o["metadata"]["name"] for o in result.obsolete) == ["csisc-2", "csisc-3", "csisc-4"]


def test_the_object_written_reads_back_as_its_item() -> None:
    item = Item("fast", ((ZONE, "z1"),))
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ctl", "uid": "u1", "controller": True}
    written = body(item, DRIVER, 5 << 30, owner)
    assert item_of(written) == item and written["capacity"] == str(5 << 30)
    assert written["metadata"]["labels"]["csi.storage.k8s.io/managed-by"] == "external-provisioner"
    assert owned_by(written, owner) and not owned_by(written, {**owner, "uid": "u2"}) and owned_by(written, None)
