"""Crashes *inside* librbd calls, and create/delete races between two driver processes.

Each half-done state below is produced for real: a child process runs the librbd call and is
SIGKILLed at a random instant, until the pool shows the state (see cephcsi.ceph.imagestate for
the shapes found this way). Then the driver's retry must leave nothing behind: no directory
entry, no trash entry (after the mgr purges), no journal object.
"""
from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.ceph import images, imagestate
from cephcsi.ceph.imagestate import ImageState, TrashState
from tests.ceph.fixtures import CephTestCluster
from cephcsi.ceph.connection import ConnectionCache
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.settings import CephSettings
from cephcsi.volumes.manager import VolumeManager
from cephcsi.volumes.parameters import VolumeParameters
from cephcsi.volumes.volume_id import VolumeId
from tests.integration.controller.helpers import create_request, image_of, journal_entries, until_ok
from tests.integration.controller.pool_state import (
    admin_ioctx,
    image_state,
    kill_inside,
    read_pool,
    read_pool_without_others,
    until_state,
    wait_for_pool,
)
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]


@pytest.fixture
def controller(fresh_driver: Callable[..., DriverProcess]) -> DriverProcess:
    return fresh_driver()


def _delete(driver: DriverProcess, cluster: CephTestCluster, volume_id: str) -> None:
    """Delete as a provisioner does: retried, also on FAILED_PRECONDITION (a watch on the image;
    a killed child's is gone at once: kill_inside blocklists it)."""
    request = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=cluster.secrets)
    until_ok(lambda: driver.controller.DeleteVolume(request, timeout=60), deadline=90,
             also=(grpc.StatusCode.FAILED_PRECONDITION,))


def _creator(driver: DriverProcess, cluster: CephTestCluster) -> Callable[[], tuple[str, str]]:
    def make() -> tuple[str, str]:
        volume = driver.controller.CreateVolume(create_request(cluster), timeout=60).volume
        return volume.volume_id, image_of(volume.volume_id)

    return make


def _moving(state: ImageState) -> bool:
    return state.trash is not None and state.trash.state is TrashState.MOVING


def test_delete_finishes_a_trash_move_killed_inside_librbd(controller: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    """MOVING entries are what the mgr's purge fails on forever (EUCLEAN); the old driver
    removed the journal anyway and leaked them."""
    baseline = read_pool(ceph_cluster)
    seen: set[tuple[bool, bool]] = set()
    # Each MOVING shape lasts about a millisecond, and where it falls in the call moves from run
    # to run and with the machine's load: a fixed sweep of the first 30 ms missed it in CI (once
    # with 80 and once with 240 attempts). So the kill instant is searched for: the shapes lie
    # between the latest kill that left the image untouched and the earliest that left the move
    # finished, and each attempt narrows that window.
    window = [0.0, 0.08]

    def search(_vid: str, name: str) -> None:
        delay = random.uniform(window[0], window[1])
        kill_inside(ceph_cluster, "trash_move", name, delay=delay)
        state = image_state(ceph_cluster, name)
        if state.trash is None:
            window[0] = max(window[0], delay)
        elif not _moving(state):
            window[1] = min(window[1], delay)
        if window[1] - window[0] < 0.002:  # timing noise crossed the bounds: widen again
            window[0], window[1] = max(0.0, window[0] - 0.005), window[1] + 0.005

    for _ in range(2):  # two MOVING shapes at least (with/without the directory entry)
        volume_id, state = until_state(
            _creator(controller, ceph_cluster),
            search,
            lambda s: _moving(s) and (s.directory, s.id_object) not in seen,
            ceph_cluster,
            lambda vid: _delete(controller, ceph_cluster, vid),
            attempts=240,
        )
        seen.add((state.directory, state.id_object))
        _delete(controller, ceph_cluster, volume_id)
    # A killed trash_move's watch on the header would hold the mgr's purge (EBUSY, retried after
    # 30 s, then 60 s) until the OSD's watch timeout; kill_inside blocklisted the child.
    assert wait_for_pool(ceph_cluster, baseline, timeout=150) == baseline


def test_a_create_that_takes_over_a_name_finishes_a_remove_killed_inside_librbd(
    controller: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    """An attempt that removed its partial image by name (`images.remove_headerless`,
    `layering.remove_debris`) with `RBD.remove` and was killed inside it leaves the image in a
    REMOVING trash entry and its name free. The retried CreateVolume makes a new image under
    that name; the entry must be finished then, not leaked (found by the random SIGKILL test
    for the header-less case; this is the shape `RBD.remove` leaves)."""
    baseline = read_pool(ceph_cluster)
    requests: dict[str, csi_pb2.CreateVolumeRequest] = {}
    attempt = itertools.count()

    def make() -> tuple[str, str]:
        request = create_request(ceph_cluster)
        volume = controller.controller.CreateVolume(request, timeout=60).volume
        requests[volume.volume_id] = request
        return volume.volume_id, image_of(volume.volume_id)

    def sweep(_vid: str, name: str) -> None:
        kill_inside(ceph_cluster, "remove", name, delay=next(attempt) % 40 * 0.001 + random.uniform(0, 0.001))

    volume_id, state = until_state(
        make, sweep,
        lambda s: s.trash is not None and s.trash.state is TrashState.REMOVING and not s.directory,
        ceph_cluster, lambda vid: _delete(controller, ceph_cluster, vid), attempts=160,
    )
    name = image_of(volume_id)
    # The retry: its name and record are there, its image is not (a killed client's watch on
    # the trashed image would make the removal busy until the OSD expired it: blocklisted).
    again = until_ok(lambda: controller.controller.CreateVolume(requests[volume_id], timeout=60), deadline=90,
                     also=(grpc.StatusCode.FAILED_PRECONDITION,)).volume
    assert again.volume_id == volume_id
    with admin_ioctx(ceph_cluster) as io:
        assert [entry for entry in imagestate.trash_entries(io) if entry.name == name] == []
    assert name in ceph_cluster.images()
    _delete(controller, ceph_cluster, volume_id)
    assert wait_for_pool(ceph_cluster, baseline, timeout=150) == baseline


def test_delete_finishes_a_remove_killed_while_it_moved_the_image_to_the_trash(
    controller: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    """`RBD.remove` (used on debris, and by an admin's `rbd rm`) first moves the image to a trash
    entry of source REMOVING. Killed after the image left the directory but before that entry
    became NORMAL, neither `trash_move` nor `remove` resumes it (librbd only resumes source
    USER), and DeleteVolume answered NOT_FOUND on every retry (found by the test above in CI).
    The shape lasts about a millisecond, so the kill instant is searched for: it lies where the
    image leaves the directory, between the latest kill that left it there and the earliest
    that did not. On a busy machine the start-up of `rbd rm` jitters by more than the window, so
    the search may need a few hundred attempts (each a create, a killed `rbd rm` and a delete);
    on a quiet one, a few."""
    baseline = read_pool(ceph_cluster)
    earliest_gone, latest_there = 0.08, 0.0

    def search(_vid: str, name: str) -> None:
        nonlocal earliest_gone, latest_there
        delay = random.uniform(latest_there, earliest_gone)
        kill_inside(ceph_cluster, "remove", name, delay=delay)
        state = image_state(ceph_cluster, name)
        if state.directory:
            latest_there = max(latest_there, delay)
        elif not _moving(state):
            earliest_gone = min(earliest_gone, delay)
        if earliest_gone - latest_there < 0.002:  # timing noise crossed the bounds: widen again
            latest_there, earliest_gone = max(0.0, latest_there - 0.005), earliest_gone + 0.005

    volume_id, state = until_state(
        _creator(controller, ceph_cluster), search,
        lambda s: _moving(s) and not s.directory and s.trash is not None and s.trash.moved_by_remove,
        ceph_cluster, lambda vid: _delete(controller, ceph_cluster, vid), attempts=300,
    )
    _delete(controller, ceph_cluster, volume_id)
    # The delete finished the move: the entry is no longer MOVING (its purge may still be queued
    # with the mgr, and until it ends `rbd ls` lists the name, as librbd lists every entry of
    # source REMOVING; on a busy machine the assertion that the name was not listed failed).
    left = image_state(ceph_cluster, image_of(volume_id))
    assert not left.directory and not _moving(left), left
    # A killed remove's watch on the header went with the child's blocklisting (kill_inside).
    assert wait_for_pool(ceph_cluster, baseline, timeout=150) == baseline


def test_delete_finishes_a_trash_removal_killed_inside_librbd(controller: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)

    def trash_then_crash(volume_id: str, name: str) -> None:
        with admin_ioctx(ceph_cluster) as io:
            image_id = rbd.Image(io, name, read_only=True).id()
            rbd.RBD().trash_move(io, name, 0)
        kill_inside(ceph_cluster, "trash_remove", name, image_id, max_delay=0.05)

    volume_id, state = until_state(
        _creator(controller, ceph_cluster),
        trash_then_crash,
        lambda s: s.trash is not None and s.trash.state is TrashState.REMOVING,
        ceph_cluster,
        lambda vid: _delete(controller, ceph_cluster, vid),
    )
    _delete(controller, ceph_cluster, volume_id)
    # The killed child's watch on the header would keep the mgr's removal busy until it expired
    # (30 s): kill_inside blocklisted the child.
    assert wait_for_pool(ceph_cluster, baseline, timeout=150) == baseline


def test_partial_create_is_completed_by_create_and_removed_by_delete(
    controller: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    """Debris of a create killed inside librbd: a directory entry (and id object) without a
    header. The old driver's delete saw no image and dropped the journal, leaking it."""
    baseline = read_pool(ceph_cluster)

    def remove_then_crash_create(volume_id: str, name: str) -> None:
        with admin_ioctx(ceph_cluster) as io:
            rbd.RBD().remove(io, name)
        kill_inside(ceph_cluster, "create", name, max_delay=0.03)

    for retry_create_first in (True, False):
        request = create_request(ceph_cluster)

        def make() -> tuple[str, str]:
            volume = controller.controller.CreateVolume(request, timeout=60).volume
            return volume.volume_id, image_of(volume.volume_id)

        volume_id, state = until_state(
            make, remove_then_crash_create, lambda s: s.partial_create, ceph_cluster,
            lambda vid: _delete(controller, ceph_cluster, vid),
        )
        if retry_create_first:
            again = controller.controller.CreateVolume(request, timeout=60).volume
            assert again.volume_id == volume_id
            with admin_ioctx(ceph_cluster) as io, rbd.Image(io, image_of(volume_id), read_only=True) as image:
                assert image.size() == request.capacity_range.required_bytes
        _delete(controller, ceph_cluster, volume_id)
        assert wait_for_pool(ceph_cluster, baseline) == baseline


def _partial_create(cluster: CephTestCluster, name: str) -> imagestate.ImageState:
    """Kill `RBD.create` of `name` until it leaves debris without a header: kills swept (with
    jitter) over the call's first 40 ms, each looked at once what the killed client had sent
    has landed. The window is a few ms wide and moves with the machine's load."""
    for attempt in range(240):
        kill_inside(cluster, "create", name, delay=(attempt % 80) * 0.0005 + random.uniform(0, 0.0005))
        time.sleep(0.3)
        with admin_ioctx(cluster) as io:
            state = imagestate.inspect(io, name)
            if state.partial_create:
                return state
            if not state.gone:
                rbd.RBD().remove(io, name)  # created in full (or not at all): try again
    raise AssertionError(f"no partial create of {name} in 240 kills")


def test_partial_create_debris_is_removed_without_the_trash(ceph_cluster: CephTestCluster) -> None:
    """`images.remove_headerless`, which create and delete use for a create killed before its
    header: the id object, then the directory entry, never through the trash. librbd's
    `remove` took the debris through the trash, and a kill inside it left a trash entry that no
    retry looked for once the create made a new image under the name (found by the random
    SIGKILL test). The shape between its two steps, a directory entry alone, is removed too; a
    complete image is refused."""
    baseline = read_pool(ceph_cluster)
    name = f"csi-vol-{uuid.uuid4()}"
    _partial_create(ceph_cluster, name)
    with admin_ioctx(ceph_cluster) as io:
        images.remove_headerless(io, name)
        assert imagestate.inspect(io, name).gone
    assert read_pool_without_others(ceph_cluster, baseline, {name}) == baseline

    state = _partial_create(ceph_cluster, name)
    with admin_ioctx(ceph_cluster) as io:
        if state.id_object:
            io.remove_object(f"rbd_id.{name}")  # as if killed between the two steps
        left = imagestate.inspect(io, name)
        assert left.partial_create and left.directory and not left.id_object
        images.remove_headerless(io, name)
        assert imagestate.inspect(io, name).gone
        images.remove_headerless(io, name)  # nothing left: a no-op
    assert read_pool_without_others(ceph_cluster, baseline, {name}) == baseline

    with admin_ioctx(ceph_cluster) as io:
        rbd.RBD().create(io, name, 8 << 20, old_format=False, features=1)
        complete = images.remove_headerless(io, name)
        assert complete is not None and complete.size == 8 << 20
        assert imagestate.inspect(io, name).live
        rbd.RBD().remove(io, name)
    assert read_pool_without_others(ceph_cluster, baseline, {name}) == baseline


def test_create_and_delete_of_one_name_exclude_each_other_across_processes(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    """Process A deletes the volume and pauses after removing the image; process B creates the
    same name meanwhile. B must not adopt the dying journal entry (the old driver returned the
    dying volume's id with a record made up in memory, and leaked B's image)."""
    baseline = read_pool(ceph_cluster)
    deleter = fresh_driver({"CEPHCSI_FAILPOINTS": "delete.after-image:pause=2"})
    creator = fresh_driver()
    request = create_request(ceph_cluster)
    first = creator.controller.CreateVolume(request, timeout=60).volume

    done = threading.Event()
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            _delete(deleter, ceph_cluster, first.volume_id)
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            errors.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=delete)
    thread.start()
    with pytest.raises(grpc.RpcError) as caught:
        # Issued while the deleter holds the volume (it pauses for 2 s after removing the image).
        threading.Event().wait(0.8)
        creator.controller.CreateVolume(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.ABORTED, caught.value.details()
    done.wait(30)
    thread.join()
    assert not errors, errors
    second = until_ok(lambda: creator.controller.CreateVolume(request, timeout=60)).volume
    assert second.volume_id != first.volume_id, "the new volume must not reuse the deleted journal entry"
    with admin_ioctx(ceph_cluster) as io, rbd.Image(io, image_of(second.volume_id), read_only=True):
        pass  # its image exists
    _delete(creator, ceph_cluster, second.volume_id)
    assert wait_for_pool(ceph_cluster, baseline) == baseline


def test_find_releases_a_name_whose_create_died_before_the_record(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, keeper: LeaseKeeper
) -> None:
    """A claim deleted mid-provisioning is cleaned up through find → DeleteVolume; a name
    reserved by a create killed before its record was written used to stay forever."""
    baseline = read_pool(ceph_cluster)
    request = create_request(ceph_cluster)
    crashing = fresh_driver({"CEPHCSI_FAILPOINTS": "create.after-reserve"})
    with pytest.raises(grpc.RpcError):
        crashing.controller.CreateVolume(request, timeout=60)
    assert read_pool(ceph_cluster) != baseline  # the reserved name key
    manager = _manager(crashing.config_file, keeper)
    params = VolumeParameters.parse(dict(request.parameters))
    credentials = Credentials.from_secrets(ceph_cluster.secrets)
    found = until_ok(lambda: manager.find(request.name, params, credentials))
    assert found is None
    assert wait_for_pool(ceph_cluster, baseline) == baseline


def test_create_never_returns_a_volume_whose_name_a_concurrent_find_released(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, keeper: LeaseKeeper
) -> None:
    """A create pauses between reserving the name and locking the record; meanwhile another
    process's find() (the provisioner cleaning up a claim deleted mid-provisioning) sees a name
    without a record, takes it for a dead create's and releases it. The create must not go on
    under the released name: its volume would have no name key, and the next CreateVolume of the
    same name would make a second image (the first one leaking)."""
    baseline = read_pool(ceph_cluster)
    creator = fresh_driver({"CEPHCSI_FAILPOINTS": "create.after-reserve:pause=2"})
    request = create_request(ceph_cluster)
    creating = _Creating(creator, request)
    reserved = _reserved_uuid(ceph_cluster, request.name)
    assert journal_entries(ceph_cluster, request.name)[1] == {}, "the create must still be paused before its record"
    found = until_ok(lambda: _manager(creator.config_file, keeper).find(
        request.name, VolumeParameters.parse(dict(request.parameters)), Credentials.from_secrets(ceph_cluster.secrets)))
    assert found is None  # released: to find(), a name without a record is a dead create's
    volume = creating.result()
    uuid, record = journal_entries(ceph_cluster, request.name)
    assert uuid == VolumeId.decode(volume.volume_id).object_uuid != reserved
    assert record.get("csi.volname") == request.name
    again = creator.controller.CreateVolume(request, timeout=60).volume
    assert again.volume_id == volume.volume_id, "a retried create must find the same volume, not make a second"
    _delete(creator, ceph_cluster, volume.volume_id)
    assert wait_for_pool(ceph_cluster, baseline) == baseline


def test_a_create_that_skips_its_name_recheck_never_loses_its_name_to_a_concurrent_find(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, keeper: LeaseKeeper
) -> None:
    """The same race inside RESERVATION_WINDOW: a create that takes its record's lease within
    the window of its reservation does not read its name again (cephcsi.volumes.journal
    `reserved_within_window`), so a find() that saw the name without a record must not release
    it under the create. Whichever lands first, the name ends up pointing at the volume the
    create answered with, and find() never reports a volume other than that one."""
    baseline = read_pool(ceph_cluster)
    creator = fresh_driver({"CEPHCSI_FAILPOINTS": "create.after-reserve:pause=0.3"})
    finder = _manager(creator.config_file, keeper)
    parameters = VolumeParameters.parse(dict(create_request(ceph_cluster).parameters))
    credentials = Credentials.from_secrets(ceph_cluster.secrets)
    assert finder.find("warm-up-the-connection", parameters, credentials) is None
    for _ in range(3):
        request = create_request(ceph_cluster)
        creating = _Creating(creator, request)
        _reserved_uuid(ceph_cluster, request.name)
        found = until_ok(lambda: finder.find(request.name, parameters, credentials))
        volume = creating.result()
        assert found in (None, volume.volume_id)
        uuid, record = journal_entries(ceph_cluster, request.name)
        assert uuid == VolumeId.decode(volume.volume_id).object_uuid
        assert record.get("csi.volname") == request.name
        assert creator.controller.CreateVolume(request, timeout=60).volume.volume_id == volume.volume_id
        _delete(creator, ceph_cluster, volume.volume_id)
    assert wait_for_pool(ceph_cluster, baseline) == baseline


class _Creating:
    """A CreateVolume retried as a CO does, on a thread of its own; `result()` joins it."""

    def __init__(self, driver: DriverProcess, request: csi_pb2.CreateVolumeRequest) -> None:
        self._volumes: list[csi_pb2.Volume] = []
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(driver, request))
        self._thread.start()

    def _run(self, driver: DriverProcess, request: csi_pb2.CreateVolumeRequest) -> None:
        try:
            self._volumes.append(until_ok(lambda: driver.controller.CreateVolume(request, timeout=60)).volume)
        except BaseException as error:  # noqa: BLE001 - reported by result()
            self._errors.append(error)

    def result(self) -> csi_pb2.Volume:
        self._thread.join(60)
        assert not self._errors, self._errors
        (volume,) = self._volumes
        return volume


def _reserved_uuid(cluster: CephTestCluster, name: str, timeout: float = 30) -> str:
    give_up = time.monotonic() + timeout
    while (uuid := journal_entries(cluster, name)[0]) is None:
        assert time.monotonic() < give_up, f"no name key for {name!r} after {timeout} s"
        time.sleep(0.05)
    return uuid


def _manager(config_file: str, keeper: LeaseKeeper) -> VolumeManager:
    return VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings()), "default", journal_lock_seconds=2,
                         keeper=keeper)
