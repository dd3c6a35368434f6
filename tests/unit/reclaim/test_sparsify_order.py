"""The controller's sparsify decisions without a cluster: an image in use is not measured (the
usage walk reads the whole image), and an encrypted volume — by its journal record or its image's
metadata — is never sparsified. The librbd calls themselves run on a real pool in
tests/integration/ceph_ops/test_sparsify.py and tests/integration/sidecars/test_reclaimspace.py."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import rbd

from cephcsi.ceph import sparsify
from cephcsi.volumes import reclaim
from cephcsi.volumes.journal import Record

pytestmark = pytest.mark.unit

MiB = 1 << 20


class FakeImage:
    """The calls sparsify_open makes on an open image, recorded."""

    def __init__(self, watchers: int) -> None:
        self.watchers = watchers
        self.calls: list[str] = []

    def watchers_list(self) -> list[dict[str, Any]]:
        self.calls.append("watchers")
        return [{"id": n} for n in range(self.watchers)]

    def size(self) -> int:
        return 8 * MiB

    def diff_iterate(self, offset: int, length: int, from_snapshot: None, iterate: Callable[[int, int, bool], None],
                     include_parent: bool, whole_object: bool) -> None:
        self.calls.append("diff_iterate")
        iterate(0, 4 * MiB, True)

    def stat(self) -> dict[str, int]:
        return {"order": 22}

    def sparsify(self, sparse_size: int) -> None:
        self.calls.append(f"sparsify {sparse_size}")


def test_an_image_in_use_is_skipped_before_it_is_measured() -> None:
    image = FakeImage(watchers=2)  # ours and a mapped node's
    done = sparsify.sparsify_open("img", cast(rbd.Image, image))
    assert done.in_use and done.reclaimed == 0
    assert image.calls == ["watchers"]  # no usage walk for an image left alone


def test_an_image_only_we_watch_is_measured_and_sparsified() -> None:
    image = FakeImage(watchers=1)
    done = sparsify.sparsify_open("img", cast(rbd.Image, image))
    assert not done.in_use
    assert image.calls == ["watchers", "diff_iterate", f"sparsify {4 * MiB}", "diff_iterate"]


@pytest.mark.parametrize(("extra", "metadata", "expected"), [
    ((), {}, False),
    ((("csi.volume.encryptKMS", "vault-1"), ("csi.volume.encryptionType", "block")), {}, True),
    ((), {"rbd.csi.ceph.com/encrypted": "encrypted"}, True),  # ceph-csi's record keys may live elsewhere
    ((), {".rbd.csi.ceph.com/encrypted": "encryptionPrepared"}, True),  # the older key
    ((), {"rbd.csi.ceph.com/dek": ""}, False),
])
def test_encrypted_volumes_are_known_by_record_or_image(extra: tuple[tuple[str, str], ...], metadata: dict[str, str],
                                                        expected: bool) -> None:
    assert reclaim.encrypted(Record("uuid", "csi-vol-x", "csi-vol-uuid", extra=extra), metadata) is expected
