"""A new image written by hand (cephcsi.ceph.image_create) against a real OSD: the same objects
as librbd's `RBD.create` writes, an image librbd then uses like any other, a taken id refused
without touching its owner, and every partial shape a killed attempt can leave settled."""
from __future__ import annotations

import itertools
import uuid

import pytest
import rados
import rbd

from cephcsi.ceph import encoding, image_create, omap
from cephcsi.ceph.image_create import NewImage

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

MIB = 1 << 20
ALL_BY_HAND = (rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_EXCLUSIVE_LOCK | rbd.RBD_FEATURE_OBJECT_MAP
               | rbd.RBD_FEATURE_FAST_DIFF | rbd.RBD_FEATURE_DEEP_FLATTEN)
TIMESTAMPS = {"create_timestamp", "access_timestamp", "modify_timestamp"}


def _name() -> str:
    return f"byhand-{uuid.uuid4().hex[:12]}"


def _objects_of(io: rados.Ioctx, name: str, image_id: str) -> dict[str, object]:
    """Everything of the image in the pool, with its id and name written as placeholders."""
    header = omap.read_raw(io, f"rbd_header.{image_id}") or {}
    listed = omap.read_raw(io, "rbd_directory", (f"name_{name}", f"id_{image_id}")) or {}
    try:
        object_map: bytes | None = io.read(f"rbd_object_map.{image_id}", 1 << 20)
    except rados.ObjectNotFound:
        object_map = None
    return {
        "header": {key: value for key, value in header.items() if key not in TIMESTAMPS | {"object_prefix"}},
        "header keys": sorted(header),
        "object prefix": encoding.read_string(header["object_prefix"])[0].replace(image_id, "ID"),
        "id object": encoding.read_string(io.read(f"rbd_id.{name}", 4096))[0].replace(image_id, "ID"),
        "directory": sorted((key.replace(name, "NAME").replace(image_id, "ID"),
                             encoding.read_string(value)[0].replace(name, "NAME").replace(image_id, "ID"))
                            for key, value in listed.items()),
        "object map": object_map,
    }


def _id_of(io: rados.Ioctx, name: str) -> str:
    with rbd.Image(io, name, read_only=True) as image:
        return str(image.id())


def _nothing_of(io: rados.Ioctx, name: str, image_id: str) -> None:
    assert (omap.read_raw(io, "rbd_directory", (f"name_{name}", f"id_{image_id}")) or {}) == {}
    for obj in (f"rbd_id.{name}", f"rbd_header.{image_id}", f"rbd_object_map.{image_id}"):
        with pytest.raises(rados.ObjectNotFound):
            io.stat(obj)


@pytest.mark.parametrize("features, size", [
    (rbd.RBD_FEATURE_LAYERING, 1 << 30),
    (ALL_BY_HAND & ~rbd.RBD_FEATURE_FAST_DIFF, 5 * MIB + 4096),
    (rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_DEEP_FLATTEN, 64 * MIB),
], ids=["layering", "object-map", "deep-flatten"])
def test_the_objects_are_librbds_and_librbd_uses_the_image(io: rados.Ioctx, features: int, size: int) -> None:
    ours, theirs = _name(), _name()
    image_id = image_create.new_image_id()
    image_create.write(io, NewImage(ours, image_id, size, features, 22))
    rbd.RBD().create(io, theirs, size, old_format=False, features=features)
    try:
        assert _objects_of(io, ours, image_id) == _objects_of(io, theirs, _id_of(io, theirs))
        with rbd.Image(io, ours) as image:
            assert (image.id(), image.size(), image.features()) == (image_id, size, rbd.Image(io, theirs).features())
            image.write(b"x" * 4096, 4096)
            image.create_snap("s")
            image.resize(size + 4 * MIB)
        with rbd.Image(io, ours, read_only=True) as image:
            assert image.read(4096, 4096) == b"x" * 4096
            if features & rbd.RBD_FEATURE_OBJECT_MAP:
                assert not image.flags() & rbd.RBD_FLAG_OBJECT_MAP_INVALID
            image_snaps = [snap["name"] for snap in image.list_snaps()]
        assert image_snaps == ["s"]
        with rbd.Image(io, ours) as image:
            image.remove_snap("s")
    finally:
        rbd.RBD().remove(io, ours)
        rbd.RBD().remove(io, theirs)
    _nothing_of(io, ours, image_id)


def test_an_id_in_use_is_refused_and_its_image_untouched(io: rados.Ioctx) -> None:
    owner, ours = _name(), _name()
    rbd.RBD().create(io, owner, 8 * MIB, old_format=False, features=ALL_BY_HAND)
    try:
        with rbd.Image(io, owner) as image:
            image.write(b"owned" * 100, 0)
        taken = _id_of(io, owner)
        before = _objects_of(io, owner, taken)
        with pytest.raises(image_create.IdTaken):
            image_create.write(io, NewImage(ours, taken, 64 * MIB, rbd.RBD_FEATURE_LAYERING, 22))
        assert _objects_of(io, owner, taken) == before
        with pytest.raises(rados.ObjectNotFound):
            io.stat(f"rbd_id.{ours}")
        assert omap.read_raw(io, "rbd_directory", (f"name_{ours}",)) == {}
        with rbd.Image(io, owner, read_only=True) as image:
            assert image.read(0, 500) == b"owned" * 100
    finally:
        rbd.RBD().remove(io, owner)


def test_an_id_of_an_image_in_the_trash_is_refused_and_a_retry_leaves_that_image_alone(io: rados.Ioctx) -> None:
    owner, ours = _name(), _name()
    rbd.RBD().create(io, owner, 8 * MIB, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
    taken = _id_of(io, owner)
    rbd.RBD().trash_move(io, owner)
    try:
        with pytest.raises(image_create.IdTaken):
            image_create.write(io, NewImage(ours, taken, 64 * MIB, rbd.RBD_FEATURE_LAYERING, 22))
        _nothing_of_ours_beside(io, ours, taken)
        # A killed attempt's name objects pointing at the trashed image's id: settled without
        # touching the image in the trash.
        io.execute("rbd_directory", "rbd", "dir_add_image", encoding.string(ours) + encoding.string(taken))
        with rados.WriteOpCtx() as op:
            op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
            op.execute("rbd", "set_id", encoding.string(taken))
            io.operate_write_op(op, f"rbd_id.{ours}")
        assert image_create.settle(io, ours, taken) is False
        _nothing_of_ours_beside(io, ours, taken)
    finally:
        rbd.RBD().trash_remove(io, taken)


def _nothing_of_ours_beside(io: rados.Ioctx, ours: str, taken: str) -> None:
    io.stat(f"rbd_header.{taken}")
    assert [entry["id"] for entry in rbd.RBD().trash_list(io)].count(taken) == 1
    assert omap.read_raw(io, "rbd_directory", (f"name_{ours}", f"id_{taken}")) == {}
    with pytest.raises(rados.ObjectNotFound):
        io.stat(f"rbd_id.{ours}")


SHAPES = [frozenset(kept) for n in range(3) for kept in itertools.combinations(("directory", "id object", "header"), n)]


@pytest.mark.parametrize("kept", SHAPES, ids=lambda kept: "+".join(sorted(kept)) or "nothing")
def test_settle_removes_every_partial_shape_of_a_killed_attempt(io: rados.Ioctx, kept: frozenset[str]) -> None:
    name, image_id = _name(), image_create.new_image_id()
    image_create.write(io, NewImage(name, image_id, 64 * MIB, ALL_BY_HAND & ~rbd.RBD_FEATURE_FAST_DIFF, 22))
    if "id object" not in kept:
        io.remove_object(f"rbd_id.{name}")
    if "header" not in kept:
        io.remove_object(f"rbd_header.{image_id}")
        io.remove_object(f"rbd_object_map.{image_id}")
    if "directory" not in kept:
        io.execute("rbd_directory", "rbd", "dir_remove_image", encoding.string(name) + encoding.string(image_id))
    assert image_create.settle(io, name, image_id) is False
    _nothing_of(io, name, image_id)
    image_create.write(io, NewImage(name, image_id, 64 * MIB, rbd.RBD_FEATURE_LAYERING, 22))  # the retry's write
    rbd.RBD().remove(io, name)
    _nothing_of(io, name, image_id)


def test_settle_keeps_a_complete_image_and_makes_a_missing_object_map(io: rados.Ioctx) -> None:
    name, image_id = _name(), image_create.new_image_id()
    image_create.write(io, NewImage(name, image_id, 64 * MIB, ALL_BY_HAND, 22))
    expected = io.read(f"rbd_object_map.{image_id}", 4096)
    io.remove_object(f"rbd_object_map.{image_id}")  # killed between the header and its map
    try:
        assert image_create.settle(io, name, image_id) is True
        assert io.read(f"rbd_object_map.{image_id}", 4096) == expected
        with rbd.Image(io, name) as image:
            assert not image.flags() & rbd.RBD_FLAG_OBJECT_MAP_INVALID
    finally:
        rbd.RBD().remove(io, name)
    _nothing_of(io, name, image_id)
