"""The rotation lock's name (node and controller holders both call rotation_lock_name): ceph-csi's
where an OSD can store it, one digest form where it cannot."""
from __future__ import annotations

import pytest

from cephcsi.ceph.lock_names import MAX_LOCK_NAME, rotation_lock_name

pytestmark = pytest.mark.unit

SHORT_CLUSTER = "0001-0009-rook-ceph-0000000000000001-036a78c5-7f18-4260-b201-c710eafe5da8"
FSID_CLUSTER = ("0001-0024-76203c3d-deaa-47d3-90f3-7e76aea6fab9-0000000000000001-"
                "036a78c5-7f18-4260-b201-c710eafe5da8")


def test_a_short_volume_id_keeps_ceph_csis_name() -> None:
    assert rotation_lock_name(SHORT_CLUSTER) == f"{SHORT_CLUSTER}-mutexlock"


def test_an_fsid_cluster_id_gets_a_name_an_osd_accepts() -> None:
    # Seen on a real OSD: `rados lock get <id> <id>-mutexlock` → (36) File name too long.
    assert len(f"lock.{FSID_CLUSTER}-mutexlock") > 100
    name = rotation_lock_name(FSID_CLUSTER)
    assert len(name) <= MAX_LOCK_NAME and len(f"lock.{name}") <= 100
    assert name.endswith("-mutexlock") and name != rotation_lock_name(FSID_CLUSTER.replace("c710", "c711"))

