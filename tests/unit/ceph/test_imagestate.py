"""The trash-entry decoder and the image-state classification (pure logic)."""
from __future__ import annotations

import struct

import pytest

from cephcsi.ceph.imagestate import ImageState, TrashEntry, TrashState, decode_trash_entry
from cephcsi.volumes import failpoints

pytestmark = pytest.mark.unit


def _spec(name: str, state: int | None, version: int = 2, source: int = 0) -> bytes:
    """A cls_rbd TrashImageSpec as the OSD stores it (values seen on a Ceph 16 pool)."""
    body = bytes([source]) + struct.pack("<I", len(name)) + name.encode() + struct.pack("<IIII", 1, 2, 3, 4)
    if state is not None:
        body += bytes([state])
    return bytes([version, 1]) + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("raw_state, expected", [(0, TrashState.NORMAL), (1, TrashState.MOVING), (2, TrashState.REMOVING)])
def test_decodes_the_trash_state(raw_state: int, expected: TrashState) -> None:
    assert decode_trash_entry("abc", _spec("csi-vol-1", raw_state)) == TrashEntry("abc", "csi-vol-1", expected)


def test_decodes_the_source_of_a_parent_awaiting_its_clones() -> None:
    entry = decode_trash_entry("abc", _spec("csi-vol-1", 0, source=4))
    assert entry.awaits_children and entry.state is TrashState.NORMAL
    assert not decode_trash_entry("abc", _spec("csi-vol-1", 0)).awaits_children


def test_version_one_entries_predate_states_and_are_normal() -> None:
    assert decode_trash_entry("abc", _spec("old", None, version=1)).state is TrashState.NORMAL


def _state(**kw: object) -> ImageState:
    base: dict[str, object] = dict(name="n", image_id="i", id_object=False, directory=False, header=False, trash=None)
    return ImageState(**{**base, **kw})  # type: ignore[arg-type]


def test_classification_of_the_shapes_librbd_leaves() -> None:
    moving = TrashEntry("i", "n", TrashState.MOVING)
    assert _state(id_object=True, directory=True, header=True).live
    assert not _state(id_object=True, directory=True, header=True, trash=moving).live
    assert _state(directory=True).partial_create
    assert _state(directory=True, id_object=True).partial_create
    assert not _state(directory=True, header=True, trash=moving).partial_create
    assert _state().gone
    assert not _state(header=True, trash=TrashEntry("i", "n", TrashState.REMOVING)).gone


def test_failpoints_parse_kill_and_pause() -> None:
    assert failpoints._parse("a, b:pause=1.5,,c") == {"a": None, "b": 1.5, "c": None}
