"""DeleteVolume moves a live, unused image to the trash by hand (cephcsi.ceph.trash_move), and
leaves to librbd every image whose move needs its checks. A move cut short between its steps
leaves one of the shapes a killed `RBD.trash_move` leaves; the retried delete finishes each."""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pytest
import rbd

from cephcsi.ceph import encoding, trash_move
from cephcsi.ceph.connection import ConnectionCache
from cephcsi.ceph.credentials import Credentials
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.settings import CephSettings
from cephcsi.volumes.manager import CreateRequest, Volume, VolumeManager
from cephcsi.volumes.parameters import VolumeParameters
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, journal_entries
from tests.integration.controller.pool_state import admin_ioctx, image_state, read_pool, wait_for_pool

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

NAMES = ("id object", "directory")
SHAPES = [frozenset(kept) for n in range(3) for kept in itertools.combinations(NAMES, n)]


@pytest.fixture
def manager(config_file: str) -> Iterator[VolumeManager]:
    made = VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings()), "default")
    yield made
    made.connections.close_all()


def _create(manager: VolumeManager, cluster: CephTestCluster, **params: str) -> tuple[Volume, str, str]:
    """A volume, its image id once journaled (the release lands behind the answer) and its
    request name."""
    request = create_request(cluster, None, 8 << 20, **params)
    volume = manager.create(CreateRequest(
        name=request.name, parameters=VolumeParameters.parse(dict(request.parameters)), size=8 << 20,
        required_bytes=8 << 20, limit_bytes=0, credentials=Credentials.from_secrets(cluster.secrets),
    ))
    deadline = time.monotonic() + 10
    while not (image_id := journal_entries(cluster, request.name)[1].get("csi.imageid", "")):
        assert time.monotonic() < deadline, journal_entries(cluster, request.name)
        time.sleep(0.05)
    return volume, image_id, request.name


def _trash_moves_by_librbd(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real: Callable[..., None] = rbd.RBD.trash_move

    def counted(self: rbd.RBD, ioctx: object, name: str, delay: int = 0) -> None:
        calls.append(name)
        real(self, ioctx, name, delay)

    monkeypatch.setattr(rbd.RBD, "trash_move", counted)
    return calls


@pytest.mark.parametrize("features", ["layering", "layering,exclusive-lock,object-map,fast-diff"])
def test_an_unused_volume_is_moved_without_librbd(
    features: str, manager: VolumeManager, ceph_cluster: CephTestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = read_pool(ceph_cluster)
    by_librbd = _trash_moves_by_librbd(monkeypatch)
    volume, _, _ = _create(manager, ceph_cluster, imageFeatures=features)
    manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
    assert by_librbd == []
    wait_for_pool(ceph_cluster, baseline)


def test_a_journaled_volume_is_moved_by_librbd(
    manager: VolumeManager, ceph_cluster: CephTestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = read_pool(ceph_cluster)
    by_librbd = _trash_moves_by_librbd(monkeypatch)
    volume, _, _ = _create(manager, ceph_cluster, imageFeatures="layering,exclusive-lock,journaling")
    manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
    assert by_librbd == [volume.image_name]
    wait_for_pool(ceph_cluster, baseline)


@pytest.mark.parametrize("kept", SHAPES, ids=lambda kept: "+".join(sorted(kept)) or "neither")
def test_a_delete_finishes_a_move_cut_short(
    kept: frozenset[str], manager: VolumeManager, ceph_cluster: CephTestCluster
) -> None:
    """The MOVING entry written, then the id object and the directory entry removed as far as
    `kept` says: every shape a kill between the steps (or between the two removals, which are
    sent together) can leave. One retried DeleteVolume finishes it."""
    baseline = read_pool(ceph_cluster)
    volume, image_id, request_name = _create(manager, ceph_cluster)
    name = volume.image_name
    with admin_ioctx(ceph_cluster) as io:
        trash_move.add_entry(io, name, image_id, time.time())
        if "id object" not in kept:
            io.remove_object(f"rbd_id.{name}")
        if "directory" not in kept:
            io.execute("rbd_directory", "rbd", "dir_remove_image", encoding.string(name) + encoding.string(image_id))
    state = image_state(ceph_cluster, name, image_id)
    assert state.trash is not None and state.header and (state.id_object, state.directory) == (
        "id object" in kept, "directory" in kept)

    manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
    assert journal_entries(ceph_cluster, request_name)[1] == {}
    wait_for_pool(ceph_cluster, baseline)
