"""Clone-chain depth on a real pool, read from the headers (cls_rbd parent_get, decoded by hand)
and, when the header's encoding is not one the driver knows, through librbd
(`layering.parent_by_open`): both give the same links and the same depth."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import rados
import rbd

from cephcsi.ceph import encoding, imagestate, layering
from cephcsi.ceph.encoding import UnknownEncoding
from cephcsi.ceph.connection import ConnectionCache, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.settings import CephSettings
from tests.ceph.fixtures import CephTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


@pytest.fixture
def session(ceph_cluster: CephTestCluster, tmp_path: Path) -> Iterator[Session]:
    registry = ClusterRegistry(ceph_cluster.write_config(tmp_path / "config.json"))
    cache = ConnectionCache(CephSettings())
    try:
        with cache.session(registry.get(ceph_cluster.cluster_id), Credentials.from_secrets(ceph_cluster.secrets)) as made:
            yield made
    finally:
        cache.close_all()


@pytest.fixture
def chain(io: rados.Ioctx) -> Iterator[list[tuple[str, str]]]:
    """parent → child → grandchild (clone v2, each cut from a snapshot of the one before)."""
    made: list[tuple[str, str]] = []
    rbd.RBD().config_set(io, "rbd_default_clone_format", "2")
    try:
        name = f"chain-{uuid.uuid4().hex[:8]}-0"
        rbd.RBD().create(io, name, 8 << 20, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
        for level in range(1, 3):
            with rbd.Image(io, name) as image:
                image.create_snap("s")
                made.append((name, str(image.id())))
            child = f"{name[:-2]}-{level}"
            rbd.RBD().clone(io, name, "s", io, child, features=rbd.RBD_FEATURE_LAYERING)
            name = child
        with rbd.Image(io, name, read_only=True) as image:
            made.append((name, str(image.id())))
    finally:
        rbd.RBD().config_remove(io, "rbd_default_clone_format")
    yield made
    for name, _ in reversed(made):
        with rbd.Image(io, name) as image:
            if any(snap["name"] == "s" for snap in image.list_snaps()):
                image.remove_snap("s")
        rbd.RBD().remove(io, name)


def test_an_unknown_parent_encoding_is_read_through_librbd(
    session: Session, io: rados.Ioctx, chain: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    (_, parent_id), (_, child_id), (_, grandchild_id) = chain
    by_header = [layering.header_parent(io, image_id) for image_id in (parent_id, child_id, grandchild_id)]
    assert by_header[0] is None
    assert by_header[1] is not None and by_header[1].image_id == parent_id
    assert by_header[2] is not None and by_header[2].image_id == child_id
    assert [layering.parent_by_open(session, io, image_id) for image_id in (parent_id, child_id, grandchild_id)] \
        == by_header
    assert layering.depth(session, io, grandchild_id) == 2

    monkeypatch.setattr(layering, "PARENT_SPEC_KNOWN", 0)  # as if cls_rbd had bumped the compat version
    with pytest.raises(UnknownEncoding):
        layering.header_parent(io, grandchild_id)
    assert layering.depth(session, io, grandchild_id) == 2
    assert layering.depth(session, io, parent_id) == 0


def test_debris_left_unlisted_is_removed(io: rados.Ioctx) -> None:
    """A clone or create killed before its directory entry (a librbd that lists last): header
    and id object only. `remove_debris` (a clone's retry) takes it out, leaving nothing."""
    name = f"debris-{uuid.uuid4().hex[:8]}"
    rbd.RBD().create(io, name, 8 << 20, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
    with rbd.Image(io, name, read_only=True) as image:
        image_id = str(image.id())
    io.execute("rbd_directory", "rbd", "dir_remove_image", encoding.string(name) + encoding.string(image_id))
    assert imagestate.inspect(io, name, image_id).unlisted
    layering.remove_debris(io, name)
    assert imagestate.inspect(io, name, image_id).gone
    assert [entry for entry in imagestate.trash_entries(io) if entry.image_id == image_id] == []
