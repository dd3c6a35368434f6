"""Pure helpers of the Kubernetes sections: the PV a zero-cost provisioner writes, sizes,
deletion figures (no control plane started)."""
from __future__ import annotations

import pytest

from bench.kube import Deletion, size_text
from bench.kubestats import burst
from bench.kube_floors import bound_pv

pytestmark = pytest.mark.unit


def test_the_zero_cost_pv_is_bound_to_the_claim_by_uid() -> None:
    pv = bound_pv("bench-x-data", "ns", "data", "uid-1", "1024Mi", "cls")
    spec = pv["spec"]
    assert spec["claimRef"] == {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "ns",
                                "name": "data", "uid": "uid-1"}
    assert spec["storageClassName"] == "cls" and spec["persistentVolumeReclaimPolicy"] == "Retain"
    assert spec["capacity"] == {"storage": "1024Mi"} and spec["accessModes"] == ["ReadWriteOnce"]


def test_size_text() -> None:
    assert size_text(1 << 30) == "1024Mi"
    assert size_text(1) == "1Mi"


def test_deletion_to_json() -> None:
    d = Deletion(pv_gone=burst({"a": 0.0}, {"a": 1.5}), pvs_left=[], images_gone_s=1.0, images_left=[],
                 trash_empty_s=3.0, errors=[])
    doc = d.to_json()
    assert doc["pv_gone"]["all_s"] == 1.5 and doc["trash_empty_s"] == 3.0
    assert Deletion(None, ["a"], None, ["img"], None, ["x"]).to_json()["pv_gone"] is None
