"""The audit's rule for a create killed after its header and id object but before its directory
entry (a librbd that lists a new image last, ceph/ceph PR 68612)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cephcsi.audit.classify import classify
from cephcsi.audit.model import Fix, Kind, TrashView
from cephcsi.audit.repair import ORDER
from cephcsi.ceph.imagestate import TrashState
from tests.unit.audit.test_classify import IMG1, healthy

pytestmark = pytest.mark.unit


def test_our_unlisted_image_is_listed_by_the_repair() -> None:
    found = classify(replace(healthy(), directory={}))
    assert [(f.kind, f.subject, f.image_id, f.fix, f.ours) for f in found] == \
        [(Kind.UNLISTED_IMAGE, IMG1, "id1", Fix.LIST_IMAGE, True)]


def test_an_unlisted_image_not_named_like_ours_is_only_reported() -> None:
    snap = replace(healthy(), id_objects={IMG1: "id1", "other": "id7"}, headers=frozenset({"id1", "id7"}))
    (finding,) = classify(snap)
    assert finding.kind is Kind.UNLISTED_IMAGE and finding.fix is None and not finding.ours


def test_an_image_on_its_way_to_the_trash_is_not_unlisted() -> None:
    """A move that removed the directory entry before the id object: the trash judges it."""
    snap = replace(healthy(), directory={}, trash=(TrashView("id1", IMG1, TrashState.MOVING, 0.0),))
    assert Kind.UNLISTED_IMAGE not in {f.kind for f in classify(snap)}


def test_the_listing_is_repaired_before_anything_that_moves_images() -> None:
    assert ORDER.index(Fix.LIST_IMAGE) < ORDER.index(Fix.FINISH_MOVE) < ORDER.index(Fix.TRASH_ORPHAN)
