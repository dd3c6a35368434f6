"""The move to the trash by hand (cephcsi.ceph.trash_move) against a real OSD: the same entry
and the same pool objects as librbd's `RBD.trash_move`, a trash entry librbd then restores and
removes like its own, and every image whose move needs librbd's checks left to librbd."""
from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator

import pytest
import rados
import rbd

from cephcsi.ceph import batch, encoding, imagestate, omap, trash_move
from cephcsi.ceph.imagestate import TrashState

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

MIB = 1 << 20
ALL_MOVABLE = (rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_EXCLUSIVE_LOCK | rbd.RBD_FEATURE_OBJECT_MAP
               | rbd.RBD_FEATURE_FAST_DIFF | rbd.RBD_FEATURE_DEEP_FLATTEN)
TIMESTAMPS = {"create_timestamp", "access_timestamp", "modify_timestamp"}


def _made(io: rados.Ioctx, features: int, prefix: str = "move") -> tuple[str, str]:
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    rbd.RBD().create(io, name, 16 * MIB, old_format=False, features=features)
    with rbd.Image(io, name) as image:
        image.write(b"data", 0)
        return name, str(image.id())


def _entry_without_times(io: rados.Ioctx, name: str, image_id: str) -> bytes:
    """The raw trash entry, its two timestamps zeroed and the name written as a placeholder."""
    raw = (omap.read_raw(io, imagestate.TRASH, (f"id_{image_id}",)) or {})[f"id_{image_id}"]
    _, times_at = encoding.read_string(raw, encoding.STRUCT_HEADER + 1)
    blanked = raw[:times_at] + bytes(16) + raw[times_at + 16:]
    return blanked.replace(name.encode(), b"N" * len(name))


def _times(io: rados.Ioctx, name: str, image_id: str) -> tuple[int, int]:
    raw = (omap.read_raw(io, imagestate.TRASH, (f"id_{image_id}",)) or {})[f"id_{image_id}"]
    _, times_at = encoding.read_string(raw, encoding.STRUCT_HEADER + 1)
    deleted, _, deferment_end, _ = struct.unpack_from("<IIII", raw, times_at)
    return deleted, deferment_end


def _header(io: rados.Ioctx, image_id: str) -> dict[str, bytes]:
    values = omap.read_raw(io, f"rbd_header.{image_id}") or {}
    return {key: value for key, value in values.items() if key not in TIMESTAMPS}


def _listed(io: rados.Ioctx, name: str, image_id: str) -> dict[str, bytes]:
    return omap.read_raw(io, "rbd_directory", (f"name_{name}", f"id_{image_id}")) or {}


def _id_object_exists(io: rados.Ioctx, name: str) -> bool:
    try:
        io.stat(f"rbd_id.{name}")
        return True
    except rados.ObjectNotFound:
        return False


@pytest.mark.parametrize("features", [rbd.RBD_FEATURE_LAYERING, ALL_MOVABLE], ids=["layering", "object-map"])
def test_the_move_writes_what_librbd_writes(io: rados.Ioctx, features: int) -> None:
    by_librbd, librbd_id = _made(io, features)
    by_hand, hand_id = _made(io, features)
    header_before = _header(io, hand_id)
    assert trash_move.Eligibility(io, hand_id).result()

    rbd.RBD().trash_move(io, by_librbd, 0)
    trash_move.move(io, by_hand, hand_id)

    # Both names have the same length, so the entries differ only in the name and the times.
    assert _entry_without_times(io, by_hand, hand_id) == _entry_without_times(io, by_librbd, librbd_id)
    deleted, deferment_end = _times(io, by_hand, hand_id)
    assert deleted == deferment_end > 0  # no delay: purgeable at once, as librbd's with delay 0
    for name, image_id in ((by_librbd, librbd_id), (by_hand, hand_id)):
        assert _listed(io, name, image_id) == {}
        assert not _id_object_exists(io, name)
        entry = imagestate.trash_entry(io, image_id)
        assert entry is not None and entry.state is TrashState.NORMAL and entry.name == name and entry.source == 0
    assert _header(io, hand_id) == header_before  # the header is not touched
    listed = {entry["id"]: entry for entry in rbd.RBD().trash_list(io)}
    assert listed[hand_id]["name"] == by_hand
    assert listed[hand_id]["source"] == listed[librbd_id]["source"]

    # librbd takes the hand-made entry for its own: restored, the image is whole again.
    rbd.RBD().trash_restore(io, hand_id, by_hand)
    with rbd.Image(io, by_hand) as image:
        assert image.read(0, 4) == b"data"
        assert not image.flags() & rbd.RBD_FLAG_OBJECT_MAP_INVALID
    trash_move.move(io, by_hand, hand_id)
    rbd.RBD().trash_remove(io, hand_id)
    rbd.RBD().trash_remove(io, librbd_id)
    assert imagestate.trash_entry(io, hand_id) is None
    assert imagestate.trash_entry(io, librbd_id) is None


def _cleanup(io: rados.Ioctx, name: str) -> None:
    with rbd.Image(io, name) as image:
        for snap in list(image.list_snaps()):
            if snap.get("namespace", rbd.RBD_SNAP_NAMESPACE_TYPE_USER) == rbd.RBD_SNAP_NAMESPACE_TYPE_USER:
                image.remove_snap(snap["name"])
    rbd.RBD().remove(io, name)


@pytest.fixture
def image(io: rados.Ioctx) -> Iterator[tuple[str, str]]:
    name, image_id = _made(io, rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_EXCLUSIVE_LOCK)
    yield name, image_id
    _cleanup(io, name)


def test_a_plain_image_is_movable_by_hand(io: rados.Ioctx, image: tuple[str, str]) -> None:
    assert trash_move.Eligibility(io, image[1]).result()


def test_a_missing_header_is_not(io: rados.Ioctx) -> None:
    assert not trash_move.Eligibility(io, uuid.uuid4().hex[:14]).result()


def test_a_journaled_image_is_left_to_librbd(io: rados.Ioctx, image: tuple[str, str]) -> None:
    name, image_id = image
    with rbd.Image(io, name) as opened:
        opened.update_features(rbd.RBD_FEATURE_JOURNALING, True)
    try:
        assert not trash_move.Eligibility(io, image_id).result()
    finally:
        with rbd.Image(io, name) as opened:
            opened.update_features(rbd.RBD_FEATURE_JOURNALING, False)


def test_a_clone_is_left_to_librbd(io: rados.Ioctx, image: tuple[str, str]) -> None:
    """A clone v2 child has an operation feature (as a group member does)."""
    parent, _ = image
    with rbd.Image(io, parent) as opened:
        opened.create_snap("base")
    child = f"child-{uuid.uuid4().hex[:12]}"
    rbd.RBD().config_set(io, "rbd_default_clone_format", "2")
    try:
        rbd.RBD().clone(io, parent, "base", io, child, features=rbd.RBD_FEATURE_LAYERING)
    finally:
        rbd.RBD().config_remove(io, "rbd_default_clone_format")
    try:
        with rbd.Image(io, child, read_only=True) as opened:
            child_id = str(opened.id())
        assert not trash_move.Eligibility(io, child_id).result()
    finally:
        rbd.RBD().remove(io, child)


def test_an_image_in_a_group_is_left_to_librbd(io: rados.Ioctx, image: tuple[str, str]) -> None:
    name, image_id = image
    group = f"group-{uuid.uuid4().hex[:8]}"
    rbd.RBD().group_create(io, group)
    try:
        rbd.Group(io, group).add_image(io, name)
        assert not trash_move.Eligibility(io, image_id).result()
        rbd.Group(io, group).remove_image(io, name)
    finally:
        rbd.RBD().group_remove(io, group)


def test_a_mirrored_image_is_left_to_librbd(io: rados.Ioctx, image: tuple[str, str]) -> None:
    """librbd disables an image's mirroring before it moves it."""
    name, image_id = image
    before = rbd.RBD().mirror_mode_get(io)
    rbd.RBD().mirror_mode_set(io, rbd.RBD_MIRROR_MODE_IMAGE)
    try:
        with rbd.Image(io, name) as opened:
            opened.mirror_image_enable(rbd.RBD_MIRROR_IMAGE_MODE_SNAPSHOT)
        try:
            assert not trash_move.Eligibility(io, image_id).result()
        finally:
            with rbd.Image(io, name) as opened:
                opened.mirror_image_disable(False)
    finally:
        rbd.RBD().mirror_mode_set(io, before)


def test_the_move_works_in_a_rados_namespace(io: rados.Ioctx) -> None:
    """A namespace has its own directory, trash and mirroring objects; the move writes those."""
    namespace = f"ns-{uuid.uuid4().hex[:8]}"
    rbd.RBD().namespace_create(io, namespace)
    try:
        io.set_namespace(namespace)
        name, image_id = _made(io, rbd.RBD_FEATURE_LAYERING)
        assert trash_move.Eligibility(io, image_id).result()
        trash_move.move(io, name, image_id)
        assert [entry["name"] for entry in rbd.RBD().trash_list(io)] == [name]
        assert rbd.RBD().list(io) == []
        rbd.RBD().trash_restore(io, image_id, name)
        with rbd.Image(io, name) as image:
            assert image.read(0, 4) == b"data"
        rbd.RBD().remove(io, name)
    finally:
        io.set_namespace("")
        rbd.RBD().namespace_remove(io, namespace)


class TrashWatcher:
    """A watch on the pool's `rbd_trash`, as rbd-mirror's trash watcher keeps one."""

    def __init__(self, io: rados.Ioctx) -> None:
        self.payloads: list[bytes] = []
        try:
            io.stat(imagestate.TRASH)
        except rados.ObjectNotFound:
            io.write_full(imagestate.TRASH, b"")  # a watch needs the object; librbd creates it the same way
        self._watch = io.watch(imagestate.TRASH, self._notified)

    def _notified(self, notify_id: int, notifier_id: str, watch_id: int, data: bytes) -> None:
        self.payloads.append(bytes(data))

    def close(self) -> None:
        self._watch.close()


def _wait_for(payloads: list[bytes], count: int) -> None:
    give_up = time.monotonic() + 10
    while len(payloads) < count:
        assert time.monotonic() < give_up, payloads
        time.sleep(0.02)


def test_librbds_trash_notify_is_the_payload_the_module_encodes(io: rados.Ioctx) -> None:
    """What librbd sends to `rbd_trash` watchers after a move: NOTIFY_OP_IMAGE_ADDED, the id and
    the entry as stored (state NORMAL) — byte for byte `trash_watcher_payload`."""
    name, image_id = _made(io, rbd.RBD_FEATURE_LAYERING)
    watcher = TrashWatcher(io)
    try:
        rbd.RBD().trash_move(io, name, 0)
        _wait_for(watcher.payloads, 1)
    finally:
        watcher.close()
    stored = (omap.read_raw(io, imagestate.TRASH, (f"id_{image_id}",)) or {})[f"id_{image_id}"]
    assert [p for p in watcher.payloads if image_id.encode() in p] == [trash_move.trash_watcher_payload(image_id, stored)]
    rbd.RBD().trash_remove(io, image_id)


def test_a_watched_trash_leaves_the_move_and_its_notify_to_librbd(io: rados.Ioctx, image: tuple[str, str]) -> None:
    """The bindings cannot send librbd's binary notify payload, so a trash somebody watches is
    left to librbd, which notifies them; the probe's own notify is acknowledged and ignored."""
    name, image_id = image
    assert trash_move.Eligibility(io, image_id).result()
    watcher = TrashWatcher(io)
    try:
        assert not trash_move.Eligibility(io, image_id).result()
        assert watcher.payloads == [batch.UNKNOWN_NOTIFY.encode()]
    finally:
        watcher.close()
    assert trash_move.Eligibility(io, image_id).result()
