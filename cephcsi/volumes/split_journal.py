"""Volumes ceph-csi journaled in one pool and created in another (its topologyConstrainedPools): found,
grown and deleted, never provisioned. The encodings are pure; the reads never write. Design:
docs/design/controller.md.
"""
from __future__ import annotations

import errno
import logging
import re
from contextlib import ExitStack
from dataclasses import dataclass

from cephcsi.ceph import batch, omap
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import FailedPrecondition, NotFound, PermissionDenied
from cephcsi.observability.logging import fields
from cephcsi.volumes.journal import IMAGE_ID, IMAGE_NAME, JournalKind, Record

log = logging.getLogger(__name__)

JOURNAL_POOL = "csi.journalpool"
"""Record key: the id of the pool holding the name key, when that is not the image's pool."""

POOL_ID_HEX_DIGITS = 16
"""ceph-csi writes pool ids as the hex of their 8 big-endian bytes (int64 → uint64)."""

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_UUID_LENGTH = 36


def _malformed(where: str, value: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"journal value {value!r} of {where} is malformed ({why}); it was not written by cephcsi or ceph-csi "
        "as they are: run `cephcsi audit` and fix the entry by hand"
    )


def encode_pool_id(pool_id: int) -> str:
    """A pool id as ceph-csi stores it in journal values."""
    if pool_id < 0:
        raise ValueError(f"pool id {pool_id} is negative")
    return f"{pool_id:0{POOL_ID_HEX_DIGITS}x}"


def parse_pool_id(text: str, where: str) -> int:
    """The pool id of a 16-hex-digit journal value; FailedPrecondition naming `where` otherwise.

    ceph-csi decodes these as 8 bytes, big endian, read as an int64: other lengths are not its
    output, and a negative id (top bit set) names no pool."""
    if len(text) != POOL_ID_HEX_DIGITS or not _HEX.match(text):
        raise _malformed(where, text, f"a pool id must be {POOL_ID_HEX_DIGITS} hex digits")
    pool_id = int(text, 16)
    if pool_id >= 1 << 63:
        raise _malformed(where, text, "the pool id is negative as a signed 64-bit number")
    return pool_id


@dataclass(frozen=True)
class NameValue:
    """What a name key (`csi.volume.<request name>` in `csi.volumes.<instance>`) holds."""

    uuid: str
    image_pool_id: int | None = None
    """None: the record and image are in the name key's own pool (the usual layout)."""

    def encode(self) -> str:
        if self.image_pool_id is None:
            return self.uuid
        return f"{encode_pool_id(self.image_pool_id)}/{self.uuid}"

    def elsewhere(self, journal_pool_id: int) -> bool:
        """The volume's image (and its id's pool) is not the name key's pool."""
        return self.image_pool_id is not None and self.image_pool_id != journal_pool_id


def parse_name_value(value: str, where: str) -> NameValue:
    """A name key's value: `<uuid>` or `<image pool id, 16 hex>/<uuid>` (ceph-csi tells them apart
    by length: exactly a uuid's 36 characters is the plain form)."""
    if len(value) == _UUID_LENGTH:
        if not _UUID.match(value):
            raise _malformed(where, value, "not a uuid")
        return NameValue(value)
    pool_text, slash, uuid = value.partition("/")
    if not slash:
        raise _malformed(where, value, "neither a uuid nor <pool id>/<uuid>")
    if not _UUID.match(uuid):
        raise _malformed(where, value, "the part after '/' is not a uuid")
    return NameValue(uuid, parse_pool_id(pool_text, where))


# ---- reading the split layout ---------------------------------------------------------------


@dataclass(frozen=True)
class SplitVolume:
    """A volume whose name key is in `journal_pool` while its image is in `image_pool`."""

    record: Record
    record_pool: str
    """Where the record's values are: `journal_pool` (what ceph-csi's code writes) or
    `image_pool` (the layout its comments describe)."""
    journal_pool: str
    image_pool: str
    image_pool_id: int

    @property
    def name_value(self) -> str:
        """The value the name key holds while it points at this volume."""
        return NameValue(self.record.uuid, self.image_pool_id).encode()

    @property
    def record_in_journal_pool(self) -> bool:
        return self.record_pool != self.image_pool


def record_of(values: dict[str, str], uuid: str, kind: JournalKind) -> Record | None:
    """A record from its omap values as `Journal.read` builds it; None without a name."""
    if not values.get(kind.name_field):
        return None
    rest = dict(values)
    name = rest.pop(kind.name_field)
    image_name = rest.pop(IMAGE_NAME, "") or f"{kind.default_image_prefix}{uuid}"
    image_id = rest.pop(IMAGE_ID, "")
    return Record(uuid, name, image_name, image_id, tuple(sorted(rest.items())))


def _pool_id_field(record: Record, where: str) -> int | None:
    text = record.get(JOURNAL_POOL)
    return parse_pool_id(text, where) if text else None


# Reading a pool the credentials may not cover, or one that holds no omaps (an erasure-coded data
# pool): such a pool cannot hold ceph-csi's journal for this user, so it is skipped.
_SKIPPED = (PermissionDenied, NotFound)
_SKIPPED_READS: dict[int, None] = {-errno.EPERM: None, -errno.EACCES: None, -errno.EOPNOTSUPP: None}


def _read_candidates(session: Session, pools: list[str], namespace: str, obj: str
                     ) -> list[tuple[str, int, dict[str, str]]]:
    """(pool, its id, the omap) of `obj` in each of `pools` that has it, read all at once: a
    DeleteVolume of a volume without a record (a retried delete) asks every pool of the
    cluster, one round trip in all instead of one per pool."""
    with ExitStack() as opened:
        reads: list[tuple[str, int, batch.Batch, batch.Pending[dict[str, bytes] | None]]] = []
        try:
            for pool in pools:
                try:
                    io = opened.enter_context(session.ioctx(pool, namespace))
                except _SKIPPED:
                    continue
                submitted = batch.Batch(io)
                reads.append((pool, io.get_pool_id(), submitted, submitted.omap(obj)))
                reads[-1][3].answers.update(_SKIPPED_READS)
        finally:
            # Before any ioctx closes: an op still in flight must not be released under librados.
            for _, _, submitted, _ in reads:
                submitted.wait()
        found = []
        for pool, pool_id, _, pending in reads:
            values = pending.result()
            if values is not None:
                found.append((pool, pool_id, {key: value.decode() for key, value in values.items()}))
        return found


def _pools(session: Session) -> list[str]:
    with ceph_call("list pools"):
        return list(session.rados.list_pools())


def locate(session: Session, io: Ioctx, image_pool: str, kind: JournalKind, uuid: str,
           journal_pool: str | None = None) -> SplitVolume | None:
    """The split volume `uuid` of `image_pool`, or None when it is not one.

    `journal_pool`: where the name key is, when the caller knows (CreateVolume: the request's
    pool); otherwise (an id is all DeleteVolume has) every other pool is tried for a record
    that names itself as its journal pool, which only ceph-csi's step 3 writes. One omap read
    per pool, and only for a volume whose record in its image pool holds no name."""
    image_pool_id = io.get_pool_id()
    namespace = io.get_namespace()
    obj = f"{kind.record_prefix}{uuid}"
    here = omap.read(io, obj)
    local = record_of(here or {}, uuid, kind)
    if local is not None:
        target = _pool_id_field(local, f"{obj} in pool {image_pool!r}")
        if target is None or target == image_pool_id:
            return None  # an ordinary record
        journal = session.pool_name(target)
        if journal is None:
            raise FailedPrecondition(
                f"journal record {obj} in pool {image_pool!r} names journal pool id {target}, which no longer "
                "exists; its name key is gone with it: run `cephcsi audit`"
            )
        return SplitVolume(local, image_pool, journal, image_pool, image_pool_id)
    candidates = [journal_pool] if journal_pool else _pools(session)
    for pool, own_id, values in _read_candidates(session, [p for p in candidates if p != image_pool], namespace, obj):
        record = record_of(values, uuid, kind)
        if record is None:
            continue
        if _pool_id_field(record, f"{obj} in pool {pool!r}") != own_id:
            # Same uuid, but not a record ceph-csi wrote for a volume in `image_pool`: uuids are
            # random, so this is someone else's object; never adopt it.
            log.warning("journal record with this uuid in another pool does not name itself as journal pool",
                        extra=fields(uuid=uuid, pool=pool, image_pool=image_pool))
            continue
        return SplitVolume(record, pool, pool, image_pool, image_pool_id)
    return None
