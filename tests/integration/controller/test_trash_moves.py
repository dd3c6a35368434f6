"""DeleteVolume moves a live, unused image to the trash by hand (cephcsi.ceph.trash_move), and
leaves to librbd every image whose move needs its checks. A move cut short between its steps
leaves one of the shapes a killed `RBD.trash_move` leaves; the retried delete finishes each."""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pytest
import rados
import rbd

from cephcsi.ceph import encoding, imagestate, omap, trash_move, verified
from cephcsi.ceph.connection import ConnectionCache
from cephcsi.ceph.imagestate import TrashState
from cephcsi.ceph.leases import LeaseKeeper
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
def manager(config_file: str, keeper: LeaseKeeper) -> Iterator[VolumeManager]:
    made = VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings()), "default", keeper=keeper)
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


def _unlist(cluster: CephTestCluster, name: str, image_id: str) -> None:
    """What a librbd that writes the directory entry last (ceph/ceph PR 68612) leaves when it is
    killed just before that entry: header and id object, no directory entry."""
    with admin_ioctx(cluster) as io:
        io.execute("rbd_directory", "rbd", "dir_remove_image", encoding.string(name) + encoding.string(image_id))
    state = image_state(cluster, name, image_id)
    assert state.unlisted and state.live and not state.directory


@pytest.fixture
def by_librbd(config_file: str, keeper: LeaseKeeper) -> Iterator[VolumeManager]:
    made = VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings(), hand_writes=verified.Mode.NEVER),
                         "default", keeper=keeper)
    yield made
    made.connections.close_all()


def test_a_retried_create_lists_the_image_a_killed_create_left_unlisted(
    by_librbd: VolumeManager, ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    volume, image_id, request_name = _create(by_librbd, ceph_cluster)
    _unlist(ceph_cluster, volume.image_name, image_id)
    request = create_request(ceph_cluster, None, 8 << 20)
    again = by_librbd.create(CreateRequest(
        name=request_name, parameters=VolumeParameters.parse(dict(request.parameters)), size=8 << 20,
        required_bytes=8 << 20, limit_bytes=0, credentials=Credentials.from_secrets(ceph_cluster.secrets),
    ))
    assert again.volume_id == volume.volume_id
    state = image_state(ceph_cluster, volume.image_name, image_id)
    assert state.live and state.named_consistently
    assert volume.image_name in ceph_cluster.images()
    by_librbd.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
    wait_for_pool(ceph_cluster, baseline)


@pytest.mark.parametrize("mode", [verified.Mode.AUTO, verified.Mode.NEVER])
def test_a_delete_lists_then_removes_an_image_a_killed_create_left_unlisted(
    mode: verified.Mode, config_file: str, ceph_cluster: CephTestCluster, keeper: LeaseKeeper
) -> None:
    """librbd's own trash move refuses a name the directory lacks (ENOENT: the delete would
    never finish); the delete adds the entry first."""
    manager = VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings(), hand_writes=mode), "default",
                            keeper=keeper)
    try:
        baseline = read_pool(ceph_cluster)
        volume, image_id, request_name = _create(manager, ceph_cluster)
        _unlist(ceph_cluster, volume.image_name, image_id)
        manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
        assert journal_entries(ceph_cluster, request_name)[1] == {}
        wait_for_pool(ceph_cluster, baseline)
    finally:
        manager.connections.close_all()


def test_the_flag_never_leaves_create_and_move_to_librbd(
    by_librbd: VolumeManager, ceph_cluster: CephTestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = read_pool(ceph_cluster)
    moves = _trash_moves_by_librbd(monkeypatch)
    creates = _creates_by_librbd(monkeypatch)
    volume, _, _ = _create(by_librbd, ceph_cluster)
    by_librbd.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
    assert (creates, moves) == ([volume.image_name], [volume.image_name])
    wait_for_pool(ceph_cluster, baseline)


def test_an_unverified_cluster_release_leaves_create_and_move_to_librbd(
    config_file: str, ceph_cluster: CephTestCluster, monkeypatch: pytest.MonkeyPatch, keeper: LeaseKeeper
) -> None:
    """The gate reads the cluster's require_osd_release (as the csi user) and the client's
    librbd: with this cluster's release taken off the list, librbd does everything."""
    baseline = read_pool(ceph_cluster)
    monkeypatch.setattr(verified, "VERIFIED", tuple(row for row in verified.VERIFIED if row.name != _release(ceph_cluster)))
    moves = _trash_moves_by_librbd(monkeypatch)
    creates = _creates_by_librbd(monkeypatch)
    manager = VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings()), "default", keeper=keeper)
    try:
        volume, _, _ = _create(manager, ceph_cluster)
        manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
    finally:
        manager.connections.close_all()
    assert (creates, moves) == ([volume.image_name], [volume.image_name])
    wait_for_pool(ceph_cluster, baseline)


def test_the_suites_cluster_and_client_are_verified(ceph_cluster: CephTestCluster) -> None:
    """Every release the suite runs the byte comparisons against must be on the allow-list (and
    the other way round: a row no suite run checks is a claim nobody verifies). Fails for a new
    release until its comparisons pass and it is added to cephcsi.ceph.verified.VERIFIED."""
    release = _release(ceph_cluster)
    assert verified.cluster_verified(release), f"cluster release {release!r} is not in cephcsi.ceph.verified"
    assert verified.client_verified(verified.client_librbd()), verified.client_librbd()


def _release(cluster: CephTestCluster) -> str:
    """The cluster's require_osd_release, read as the driver reads it (the csi user's caps)."""
    import rados

    handle = rados.Rados(rados_id=cluster.user, conf={"mon_host": cluster.mon_host, "key": cluster.key})
    handle.connect(timeout=30)
    try:
        release = verified.read_cluster_release(handle, 30)
    finally:
        handle.shutdown()
    assert release, "the csi user cannot read the OSD map's require_osd_release"
    return release


def _creates_by_librbd(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real: Callable[..., None] = rbd.RBD.create

    def counted(self: rbd.RBD, ioctx: object, name: str, *args: object, **kwargs: object) -> None:
        calls.append(name)
        real(self, ioctx, name, *args, **kwargs)

    monkeypatch.setattr(rbd.RBD, "create", counted)
    return calls


def test_watchers_of_the_trash_get_librbds_notify_of_a_deleted_volume(
    manager: VolumeManager, ceph_cluster: CephTestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client watching `rbd_trash` (as rbd-mirror does) is told of every image a delete moves
    there, with librbd's own payload (NOTIFY_OP_IMAGE_ADDED, the id, the entry): the delete
    leaves the move of a watched trash to librbd (the bindings cannot send that payload)."""
    baseline = read_pool(ceph_cluster)
    by_librbd = _trash_moves_by_librbd(monkeypatch)
    volume, image_id, _ = _create(manager, ceph_cluster)
    payloads: list[bytes] = []
    entries: list[bytes] = []
    with admin_ioctx(ceph_cluster) as io:
        try:
            io.stat(imagestate.TRASH)
        except rados.ObjectNotFound:
            io.write_full(imagestate.TRASH, b"")  # a watch needs the object
        watch = io.watch(imagestate.TRASH, lambda _n, _f, _w, data: payloads.append(bytes(data)))
        try:
            manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
            give_up = time.monotonic() + 10
            while not any(image_id.encode() in p for p in payloads):
                assert time.monotonic() < give_up, payloads
                time.sleep(0.02)
            entries = [raw for key, raw in (omap.read_raw(io, imagestate.TRASH) or {}).items() if key == f"id_{image_id}"]
        finally:
            watch.close()
    assert by_librbd == [volume.image_name]
    # NOTIFY_OP_IMAGE_ADDED (0) for this image; the mgr's purge may follow with IMAGE_REMOVED (1).
    added = [p for p in payloads if image_id.encode() in p and p[6:10] == bytes(4)]
    assert len(added) == 1
    if entries:  # not purged yet: the notify carries the entry as the move left it (NORMAL, the
        # last byte; the mgr's purge may have made it REMOVING since)
        assert added == [trash_move.trash_watcher_payload(image_id, entries[0][:-1] + bytes((TrashState.NORMAL.value,)))]
    wait_for_pool(ceph_cluster, baseline)
