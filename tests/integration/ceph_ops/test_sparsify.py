"""cephcsi.ceph.sparsify on a real pool: zeros written through librbd come back to the pool
(`rbd du` drops), data stays, and an image another client watches is left alone."""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import rados
import rbd

from cephcsi.ceph import sparsify
from cephcsi.errors import NotFound
from tests.ceph.fixtures import CephTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

MiB = 1 << 20
FEATURES = (rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_EXCLUSIVE_LOCK | rbd.RBD_FEATURE_OBJECT_MAP
            | rbd.RBD_FEATURE_FAST_DIFF)


@pytest.fixture
def image(io: rados.Ioctx) -> Iterator[str]:
    name = f"sparse-{uuid.uuid4().hex[:8]}"
    rbd.RBD().create(io, name, 64 * MiB, old_format=False, features=FEATURES, order=22)
    yield name
    try:
        rbd.RBD().remove(io, name)
    except rbd.ImageNotFound:
        pass


def du(cluster: CephTestCluster, name: str) -> int:
    """USED of `rbd du` for the image, as an operator would read it."""
    doc = json.loads(cluster.admin("rbd", "du", "--format", "json", f"{cluster.pool}/{name}"))
    return int(next(entry["used_size"] for entry in doc["images"] if entry["name"] == name))


def write(io: rados.Ioctx, name: str, offset: int, data: bytes) -> None:
    with rbd.Image(io, name) as opened:
        for start in range(0, len(data), 4 * MiB):
            opened.write(data[start:start + 4 * MiB], offset + start)
        opened.flush()


def test_zero_objects_are_returned_to_the_pool_and_data_stays(
        io: rados.Ioctx, image: str, ceph_cluster: CephTestCluster) -> None:
    write(io, image, 0, b"\0" * (32 * MiB))
    write(io, image, 40 * MiB, b"kept" * MiB)  # 4 MiB of data in one object
    assert du(ceph_cluster, image) == 36 * MiB

    done = sparsify.sparsify(io, image)

    assert not done.in_use
    assert (done.used_before, done.used_after, done.reclaimed) == (36 * MiB, 4 * MiB, 32 * MiB)
    assert du(ceph_cluster, image) == 4 * MiB
    with rbd.Image(io, image, read_only=True) as opened:
        assert opened.read(40 * MiB, 4 * MiB) == b"kept" * MiB
        assert opened.read(0, MiB) == b"\0" * MiB
    again = sparsify.sparsify(io, image)  # nothing left to return: a repeat changes nothing
    assert (again.used_before, again.reclaimed) == (4 * MiB, 0)


def test_an_image_another_client_watches_is_left_alone(
        io: rados.Ioctx, image: str, ceph_cluster: CephTestCluster) -> None:
    write(io, image, 0, b"\0" * (8 * MiB))
    with rbd.Image(io, image) as user:  # a read-write open watches the image, like a mapped device
        user.size()
        done = sparsify.sparsify(io, image)
    assert done.in_use and done.reclaimed == 0
    assert du(ceph_cluster, image) == 8 * MiB


def test_a_missing_image_is_not_found(io: rados.Ioctx) -> None:
    with pytest.raises(NotFound):
        sparsify.sparsify(io, f"sparse-missing-{uuid.uuid4().hex[:8]}")
