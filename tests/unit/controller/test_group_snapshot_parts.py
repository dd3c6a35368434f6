"""The pure parts of group snapshots: parameters, ceph-csi's creation time, the member map."""
from __future__ import annotations

import pytest

from cephcsi.errors import InvalidArgument
from cephcsi.volumes.group_snapshots import (
    GROUP_CREATED,
    GROUP_NAME,
    GroupParameters,
    go_time,
    member_ids,
    member_uuid,
    parse_go_time,
)
from cephcsi.volumes.journal import Record

pytestmark = pytest.mark.unit


def test_parameters() -> None:
    parsed = GroupParameters.parse({"clusterID": "c", "pool": "p", "groupNamePrefix": "g-",
                                    "csi.storage.k8s.io/group-snapshotter-secret-name": "s"})
    assert (parsed.cluster_id, parsed.pool, parsed.group_prefix, parsed.snapshot_prefix) == ("c", "p", "g-", "csi-snap-")
    with pytest.raises(InvalidArgument, match="unknown group snapshot parameter"):
        GroupParameters.parse({"imageFeatures": "layering"})
    with pytest.raises(InvalidArgument, match="snapshotNamePrefix"):
        GroupParameters.parse({"snapshotNamePrefix": "a/b"})


def test_go_time_round_trip_and_ceph_csi_forms() -> None:
    assert parse_go_time(go_time(1700000000.25)) == pytest.approx(1700000000.25)
    # Go's MarshalText: nanoseconds, a zone offset or Z.
    assert parse_go_time("2024-11-20T10:11:12.123456789Z") == pytest.approx(1732097472.123456)
    assert parse_go_time("2024-11-20T11:11:12.5+01:00") == pytest.approx(1732097472.5)
    assert parse_go_time("2024-11-20T10:11:12Z") == pytest.approx(1732097472)
    assert parse_go_time("") is None and parse_go_time("yesterday") is None


def test_member_map_is_every_key_but_ceph_csis_fields() -> None:
    record = Record("u", "name", "csi-vol-group-u", extra=(
        (GROUP_NAME, "csi-vol-group-u"), (GROUP_CREATED, "2024-11-20T10:11:12Z"), ("0001-snapid", "csi-snap-x")))
    assert member_ids(record) == {"0001-snapid": "csi-snap-x"}


def test_member_uuids_are_stable_and_distinct() -> None:
    a = member_uuid("6f1c6d33-0b7b-4b53-8bb3-0c4f4c0b1f00", "vol-a")
    assert a == member_uuid("6f1c6d33-0b7b-4b53-8bb3-0c4f4c0b1f00", "vol-a")
    assert a != member_uuid("6f1c6d33-0b7b-4b53-8bb3-0c4f4c0b1f00", "vol-b")
    assert a != member_uuid("7f1c6d33-0b7b-4b53-8bb3-0c4f4c0b1f00", "vol-a")
