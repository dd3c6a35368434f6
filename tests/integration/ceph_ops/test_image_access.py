"""cephcsi.ceph.image_access on a real pool: what "the image does not exist" and "the image is
busy" look like to cephcsi.volumes, which no longer names librbd's exceptions itself."""
from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import rados
import rbd

from cephcsi.ceph import image_access, layering

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


@pytest.fixture
def image(io: rados.Ioctx) -> Iterator[str]:
    name = f"access-{uuid.uuid4().hex[:8]}"
    rbd.RBD().create(io, name, 4 << 20, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
    yield name
    try:
        rbd.RBD().remove(io, name)
    except rbd.ImageNotFound:
        pass


def test_an_existing_image_is_opened_and_a_missing_one_is_none(io: rados.Ioctx, image: str) -> None:
    assert image_access.if_exists(io, lambda opened: int(opened.size()), image, read_only=True) == 4 << 20
    assert image_access.if_exists(io, lambda opened: int(opened.size()), f"{image}-missing") is None


def test_an_image_gone_while_in_use_is_none(io: rados.Ioctx, image: str) -> None:
    def gone(opened: rbd.Image) -> int:
        raise rbd.ImageNotFound("removed under the open handle")

    assert image_access.if_exists(io, gone, image) is None


def test_other_failures_are_not_taken_for_a_missing_image(io: rados.Ioctx, image: str) -> None:
    with pytest.raises(rbd.ReadOnlyImage):
        image_access.if_exists(io, lambda opened: opened.resize(8 << 20), image, read_only=True)


def test_a_trashed_image_is_opened_by_id(io: rados.Ioctx, image: str) -> None:
    with rbd.Image(io, image) as opened:
        image_id = str(opened.id())
        opened.create_snap("kept")
    rbd.RBD().trash_move(io, image, 0)
    try:
        snaps = image_access.if_exists_by_id(io, layering.list_snaps, image_id)
        assert snaps is not None and [s.name for s in snaps] == ["kept"]
        assert image_access.if_exists_by_id(io, layering.list_snaps, "0000deadbeef") is None
    finally:
        with rbd.Image(io, image_id=image_id) as opened:
            opened.remove_snap("kept")
        rbd.RBD().trash_remove(io, image_id)


def test_a_remove_waits_out_a_watch_that_ends(io: rados.Ioctx, image: str) -> None:
    holder = rbd.Image(io, image)  # a read-write open watches the header
    closer = threading.Timer(0.5, holder.close)
    closer.start()
    try:
        image_access.remove_waiting_for_watchers(io, image, wait=20)
    finally:
        closer.join()
    assert image_access.if_exists(io, lambda opened: True, image) is None


def test_a_remove_gives_up_on_a_watch_that_lasts(io: rados.Ioctx, image: str) -> None:
    with rbd.Image(io, image):
        with pytest.raises(rbd.ImageBusy):
            image_access.remove_waiting_for_watchers(io, image, wait=0.3)
    assert image_access.if_exists(io, lambda opened: True, image) is True
