"""The QoS policy's parsing, validation and capacity scaling (cephcsi.volumes.qos): pure logic."""
from __future__ import annotations

import pytest

from cephcsi.errors import InvalidArgument
from cephcsi.volumes import modify, qos

pytestmark = pytest.mark.unit
GiB = 1 << 30


def test_base_only_limits_do_not_scale() -> None:
    policy = qos.parse({"baseReadIops": "2000", "baseWriteBps": "104857600"})
    assert policy.limit_values(100 * GiB) == {"rbd_qos_read_iops_limit": 2000, "rbd_qos_write_bps_limit": 104857600}
    assert policy.metadata(GiB) == {
        "conf_rbd_qos_read_iops_limit": "2000", "rbd_base_qos_read_iops_limit": "2000",
        "conf_rbd_qos_write_bps_limit": "104857600", "rbd_base_qos_write_bps_limit": "104857600",
    }


def test_limits_grow_per_gib_above_the_base_size_and_stop_at_the_maximum() -> None:
    policy = qos.parse({"baseReadIops": "2000", "readIopsPerGiB": "20", "maxReadIops": "3000",
                        "baseWriteIops": "1000", "writeIopsPerGiB": "10", "baseVolSizeBytes": str(20 * GiB)})
    assert policy.limit_values(20 * GiB) == {"rbd_qos_read_iops_limit": 2000, "rbd_qos_write_iops_limit": 1000}
    # 100 GiB: 80 GiB above the base size; partial GiB do not count.
    assert policy.limit_values(100 * GiB + GiB - 1) == {"rbd_qos_read_iops_limit": 3000,
                                                        "rbd_qos_write_iops_limit": 1800}
    assert policy.limit_values(30 * GiB)["rbd_qos_read_iops_limit"] == 2200
    stored = qos.stored(policy.metadata(30 * GiB))
    assert stored == policy  # what is kept on the image is enough to recompute after an expand


def test_ceph_csi_first_spellings_are_accepted() -> None:
    old = qos.parse({"BaseReadIops": "10", "ReadIopsPerGiB": "1", "BaseVolSizeBytes": str(GiB)})
    new = qos.parse({"baseReadIops": "10", "readIopsPerGiB": "1", "baseVolSizeBytes": str(GiB)})
    assert old == new


@pytest.mark.parametrize("parameters, named", [
    ({"baseIops": "1", "bogus": "2"}, "bogus"),
    ({"baseIops": "-1"}, "baseIops='-1'"),
    ({"baseIops": "1.5"}, "baseIops='1.5'"),
    ({"baseIops": str(1 << 63)}, "baseIops="),
    ({"maxIops": "5"}, "maxIops needs baseIops"),
    ({"baseIops": "5", "iopsPerGiB": "1"}, "iopsPerGiB needs baseVolSizeBytes"),
    ({"baseIops": "5", "maxIops": "4"}, "maxIops=4 is below baseIops=5"),
    ({"baseIops": "5", "baseVolSizeBytes": "10"}, "no *PerGiB limit uses it"),
    ({"BaseReadIops": "5", "baseReadIops": "6"}, "same setting"),
])
def test_bad_parameters_are_refused_naming_the_key(parameters: dict[str, str], named: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        qos.parse(parameters)
    assert named in str(caught.value) and "nothing was changed" in str(caught.value)


def test_kubernetes_metadata_keys_are_ignored() -> None:
    assert qos.parse({"baseIops": "5", "csi.storage.k8s.io/pvc/name": "data"}) == qos.parse({"baseIops": "5"})


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(InvalidArgument) as caught:
        qos.parse({"bogus": "1", "baseIops": "x", "maxBps": "3"})
    message = str(caught.value)
    assert "bogus" in message and "baseIops='x'" in message and "maxBps needs baseBps" in message


def test_changes_write_differences_and_remove_limits_the_new_class_drops() -> None:
    current = {"conf_rbd_qos_iops_limit": "5", "rbd_base_qos_iops_limit": "5",
               "conf_rbd_qos_bps_limit": "7", "rbd_base_qos_bps_limit": "7", "csi.volname": "pvc-1"}
    wanted = qos.parse({"baseIops": "5", "baseReadBps": "9"}).metadata(GiB)
    assert qos.changes(current, wanted) == {
        "conf_rbd_qos_read_bps_limit": "9", "rbd_base_qos_read_bps_limit": "9",
        "conf_rbd_qos_bps_limit": None, "rbd_base_qos_bps_limit": None,
    }
    assert qos.changes({**current, **wanted, "conf_rbd_qos_bps_limit": "7"}, {**wanted}) == {
        "conf_rbd_qos_bps_limit": None, "rbd_base_qos_bps_limit": None}
    done = {k: v for k, v in {**current, **wanted}.items() if k not in ("conf_rbd_qos_bps_limit", "rbd_base_qos_bps_limit")}
    assert qos.changes(done, wanted) == {}  # idempotent: nothing left to write


def test_create_policy_overlays_the_attributes_class_per_key() -> None:
    policy = modify.create_policy({"clusterID": "c", "pool": "p", "BaseReadIops": "10", "baseWriteIops": "20"},
                                  {"baseReadIops": "30"})
    assert policy.limit_values(GiB) == {"rbd_qos_read_iops_limit": 30, "rbd_qos_write_iops_limit": 20}
    with pytest.raises(InvalidArgument, match="mutable_parameters: unknown key"):
        modify.create_policy({"clusterID": "c"}, {"clusterID": "x"})
