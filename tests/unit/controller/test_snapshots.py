"""Pure parts of snapshots and clones: parameters, sizes, the flatten policy's limits, the
protobuf conversions and ListSnapshots paging."""
from __future__ import annotations

from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.cli.args import parse_settings
from cephcsi.csi.snapshots import content_source, content_source_message, snapshot_message
from cephcsi.errors import ConfigError, InvalidArgument, OperationInFlight, OutOfRange
from cephcsi.volumes import snapshot_list
from cephcsi.volumes.clones import ContentSource, target_size
from cephcsi.volumes.flatten import FlattenPolicy
from cephcsi.volumes.snapshots import Snapshot, SnapshotParameters
from cephcsi.volumes.volume_id import VolumeId

pytestmark = pytest.mark.unit
MiB = 1 << 20


def test_snapshot_parameters() -> None:
    assert SnapshotParameters.parse({}).name_prefix == "csi-snap-"
    parsed = SnapshotParameters.parse({"clusterID": "c", "pool": "p", "snapshotNamePrefix": "bk-",
                                       "csi.storage.k8s.io/snapshotter-secret-name": "s"})
    assert (parsed.cluster_id, parsed.pool, parsed.name_prefix) == ("c", "p", "bk-")
    with pytest.raises(InvalidArgument, match="unknown snapshot parameter"):
        SnapshotParameters.parse({"imageFeatures": "layering"})
    with pytest.raises(InvalidArgument, match="snapshotNamePrefix"):
        SnapshotParameters.parse({"snapshotNamePrefix": "a/b"})


class _Request:
    def __init__(self, required: int, limit: int, size: int) -> None:
        self.required_bytes, self.limit_bytes, self.size = required, limit, size


@pytest.mark.parametrize(("required", "limit", "size", "source", "expected"), [
    (0, 0, 1 << 30, 16 * MiB, 16 * MiB),           # no size asked: the source's
    (8 * MiB, 0, 8 * MiB, 16 * MiB, 16 * MiB),     # smaller than the source: the source's
    (32 * MiB, 0, 32 * MiB, 16 * MiB, 32 * MiB),   # larger: grown
    (16 * MiB, 16 * MiB, 16 * MiB, 16 * MiB, 16 * MiB),
])
def test_target_size(required: int, limit: int, size: int, source: int, expected: int) -> None:
    request: Any = _Request(required, limit, size)
    assert target_size(request, source) == expected


def test_target_size_below_the_source_is_out_of_range() -> None:
    request: Any = _Request(4 * MiB, 8 * MiB, 8 * MiB)
    with pytest.raises(OutOfRange, match="at least as large"):
        target_size(request, 16 * MiB)


def test_flatten_policy_limits_are_checked() -> None:
    FlattenPolicy()
    for bad in ({"soft_depth": 9, "hard_depth": 8}, {"hard_depth": 16}, {"min_snapshots": 500}):
        with pytest.raises(ConfigError):
            FlattenPolicy(**bad)


def test_flags() -> None:
    s = parse_settings(["--mode=controller", "--rbdsoftmaxclonedepth=2", "--rbdhardmaxclonedepth=3",
                        "--minsnapshotsonimage=10", "--maxsnapshotsonimage=20"]).snapshots
    assert (s.soft_max_clone_depth, s.hard_max_clone_depth, s.min_snapshots_on_image, s.max_snapshots_on_image) == (2, 3, 10, 20)
    assert parse_settings(["--mode=controller"]).snapshots.hard_max_clone_depth == 8


def test_content_source_round_trip() -> None:
    request = csi_pb2.CreateVolumeRequest()
    assert content_source(request) is None
    request.volume_content_source.snapshot.snapshot_id = "s1"
    source = content_source(request)
    assert source == ContentSource("snapshot", "s1")
    assert content_source_message(source) == request.volume_content_source
    request.volume_content_source.volume.volume_id = ""
    with pytest.raises(InvalidArgument, match="volume_id is required"):
        content_source(request)


def test_snapshot_message_has_every_field() -> None:
    message = snapshot_message(Snapshot("sid", "vid", 16 * MiB, 1700000000.25, True))
    assert (message.snapshot_id, message.source_volume_id, message.size_bytes, message.ready_to_use) == ("sid", "vid", 16 * MiB, True)
    assert (message.creation_time.seconds, message.creation_time.nanos) == (1700000000, 250000000)


def _ids(count: int) -> list[str]:
    return sorted(VolumeId("c", 1, f"00000000-0000-0000-0000-{i:012d}").encode() for i in range(count))


def test_paging_is_by_last_id(monkeypatch: pytest.MonkeyPatch) -> None:
    found = [Snapshot(i, "v", 1, 0.0, True) for i in _ids(5)]
    monkeypatch.setattr(snapshot_list, "_matching", lambda manager, request: list(reversed(found)))
    manager: Any = object()
    first = snapshot_list.list_snapshots(manager, snapshot_list.ListRequest(max_entries=2))
    assert [s.snapshot_id for s in first.entries] == [s.snapshot_id for s in found[:2]]
    rest = snapshot_list.list_snapshots(manager, snapshot_list.ListRequest(starting_token=first.next_token))
    assert [s.snapshot_id for s in rest.entries] == [s.snapshot_id for s in found[2:]] and not rest.next_token
    with pytest.raises(OperationInFlight, match="starting_token"):
        snapshot_list.list_snapshots(manager, snapshot_list.ListRequest(starting_token="nope"))
    with pytest.raises(InvalidArgument):
        snapshot_list.list_snapshots(manager, snapshot_list.ListRequest(max_entries=-1))
