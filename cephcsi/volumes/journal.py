"""The idempotency journal: request names → object uuids → images, in RADOS omaps, in ceph-csi's
layout (volumes and, with `SNAPSHOTS`, snapshots). Each step is one atomic RADOS op in a
crash-safe order; create and delete of one entry exclude each other across processes through a
cls_lock lease on its record (`locked`), which a killed holder's expires after `lock_seconds`
(ABORTED meanwhile). Design: docs/design/controller.md.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from cephcsi.ceph import image_metadata, images, omap
from cephcsi.ceph.connection import Ioctx
from cephcsi.ceph.leases import Fill, Lease, LeaseKeeper
from cephcsi.errors import Internal, OperationInFlight
from cephcsi.volumes import failpoints

LOCK_NAME = "cephcsi.journal"

RESERVATION_WINDOW = 1.0
"""Seconds between sending a name's reservation and holding its new record within which a
create may trust that nobody released the name meanwhile (`Journal.reserved_within_window`),
and for which anyone releasing a name that has no record holds that record's lease first
(`Journal.release_unrecorded`)."""

NAME_FIELD_VOLUME = "csi.volname"
IMAGE_NAME = "csi.imagename"
IMAGE_ID = "csi.imageid"
OWNER = "csi.volume.owner"
SOURCE = "csi.source"
"""For snapshots and clones: the id of the volume/snapshot they come from."""
PLANNED_IMAGE_ID = "cephcsi.planned-imageid"
"""The id of a new image the driver writes itself (cephcsi.ceph.image_create), journaled with the
record before any of the image's objects exists and replaced by `IMAGE_ID` with the lease's
release once the image is complete. A record that still has it (and no `IMAGE_ID`) belongs to a
create killed in between: its retry and a delete settle the image's objects by this id."""
PENDING_METADATA = "cephcsi.pending-metadata."
"""Prefix of record keys holding image metadata (the claim's owner keys) that a new image gets
after the create has answered (`Hold.journal_image_id_behind`): written with the record, before
the image exists, and removed by the release that follows the metadata write. A record that
still has them after its lease is gone belongs to a process killed in between: a retried
create, or `cephcsi audit --repair`, copies them to the image."""


def pending_metadata_values(metadata: Mapping[str, str]) -> dict[str, str]:
    """The record keys that keep `metadata` until it is on the image."""
    return {f"{PENDING_METADATA}{key}": value for key, value in metadata.items()}


def pending_metadata_in(values: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The image metadata a record's (key, value) pairs keep pending (`PENDING_METADATA`)."""
    return {key[len(PENDING_METADATA):]: value for key, value in values if key.startswith(PENDING_METADATA)}


@dataclass(frozen=True)
class JournalKind:
    directory_prefix: str
    name_key_prefix: str
    record_prefix: str
    name_field: str
    default_image_prefix: str
    """The image name of a record without csi.imagename: ceph-csi added that key later, and its
    older records name the image by this prefix + the uuid (its default naming)."""


VOLUMES = JournalKind("csi.volumes.", "csi.volume.", "csi.volume.", NAME_FIELD_VOLUME, "csi-vol-")
SNAPSHOTS = JournalKind("csi.snaps.", "csi.snap.", "csi.snap.", "csi.snapname", "csi-snap-")


@dataclass(frozen=True)
class Record:
    uuid: str
    name: str
    image_name: str
    image_id: str = ""
    extra: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str = "") -> str:
        return dict(self.extra).get(key, default)

    def pending_metadata(self) -> dict[str, str]:
        """Image metadata this record keeps until it is on the image (`PENDING_METADATA`)."""
        return pending_metadata_in(self.extra)

    @property
    def unjournaled_planned_id(self) -> str:
        """The planned image id while no image id is journaled: a create that wrote the image
        itself was killed before its release, and any of the image's objects may exist."""
        return "" if self.image_id else self.get(PLANNED_IMAGE_ID)


@dataclass(frozen=True)
class Claim:
    """The values of a new record: what `claim_record` writes."""

    name: str
    image_name: str
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hold:
    """What `Journal.locked` yields."""

    lease: Lease
    claimed: Record | None
    """The record, when the `claim` was written by the op that took the hold (else None: call
    `claim_record`, which also handles a record that exists)."""
    found: Record | None = None
    """With `locked(uuid, read=True)`: the record as the hold found it (what `Journal.read`
    would return right after taking it, read in the same round trip)."""

    def ensure_held(self) -> None:
        """Before a step another holder must not see half-done: OperationInFlight once the lease
        may have lapsed (see `Lease.ensure_held`)."""
        self.lease.ensure_held()

    def set_image_id_on_release(self, image_id: str) -> None:
        """Journal the image id in the op that releases the hold (one round trip for both).

        Only where nothing between here and the release depends on the id being stored: a
        crash before the release leaves the id unjournaled, which a retried create and every
        delete (cephcsi.ceph.imagestate finds the id before anything moves the image) handle."""
        self.lease.on_release[IMAGE_ID] = image_id

    def forget_on_release(self, key: str) -> None:
        """Remove the record's `key` with the release."""
        self.lease.on_release[key] = None

    def forget_pending_metadata_on_release(self, record: Record) -> None:
        """Remove the record's pending metadata keys with the release: the caller has put that
        metadata on the image."""
        for key in pending_metadata_values(record.pending_metadata()):
            self.lease.on_release[key] = None

    def journal_image_id_behind(self, image_name: str, known_id: str = "",
                                metadata: Mapping[str, str] | None = None) -> None:
        """Release the hold after the call has answered, journaling the new image's id (read
        from its `rbd_id` object unless `known_id` says it) with the release: both are
        bookkeeping a retry and every delete can do without (see `set_image_id_on_release`),
        so up to two round trips leave the create's answer path (`Lease.release_behind`).

        With `metadata` (which the record keeps under `PENDING_METADATA` keys: the caller
        checks that), the new image's metadata is written first, and those keys are removed by
        the release. A kill or an error before that leaves them in the record."""

        def behind(io: Ioctx) -> dict[str, str | None]:
            failpoints.reach("create.release-behind")
            found = known_id or images.lookup_id(io, image_name)
            values: dict[str, str | None] = {IMAGE_ID: found} if found else {}
            if metadata:
                if not found:
                    raise Internal(f"image {image_name!r} has no id right after it was created")
                image_metadata.set_on_header(io, image_name, found, metadata)
                failpoints.reach("create.metadata-behind")
                values.update(dict.fromkeys(pending_metadata_values(metadata)))
            return values

        self.lease.release_behind(behind)


class Journal:
    """Journal operations within one pool (and rados namespace) for one driver instance."""

    def __init__(self, io: Ioctx, instance_id: str, kind: JournalKind = VOLUMES, lock_seconds: float = 10.0,
                 *, keeper: LeaseKeeper) -> None:
        self.io = io
        self.keeper = keeper
        """The process's lease keeper (built by the composition root): renews this journal's holds."""
        self.kind = kind
        self.instance_id = instance_id
        self.directory = f"{kind.directory_prefix}{instance_id}"
        self.lock_seconds = lock_seconds

    @contextmanager
    def locked(self, uuid: str, claim: Claim | None = None, read: bool = False,
               existing: bool = False) -> Iterator[Hold]:
        """Exclusive, cross-process hold on one volume's journal entry and image.

        Creates the record object if it is missing (cls_lock does): callers check the record
        afterwards and `discard_orphan` one that nothing points to. With `claim` (for a uuid
        this call just reserved, whose record cannot exist yet) the record is written by the
        same op that takes the hold — see `Hold.claimed`. With `read`, the record is read in
        the same round trip as the hold is taken — see `Hold.found` —, and with `existing` as
        well a missing record object raises NotFound instead of being created."""
        obj = self._record_object(uuid)
        fill = None
        if claim is not None:
            fill = Fill(self.kind.name_field, self._record_values(claim))
        with self.keeper.hold(self.io, obj, LOCK_NAME, self.lock_seconds, fill, read=read, existing=existing) as lease:
            if lease is None:
                raise OperationInFlight(
                    f"another operation on journal entry {obj} is in progress (in this or another driver process, "
                    f"or one that was killed: its hold lapses within {self.lock_seconds:g}s); retry later"
                )
            claimed = None
            if claim is not None and lease.filled:
                claimed = Record(uuid, claim.name, claim.image_name, extra=tuple(sorted(claim.extra.items())))
            yield Hold(lease, claimed, self._parse(uuid, lease.values) if read else None)

    def _record_values(self, claim: Claim) -> dict[str, str]:
        return {self.kind.name_field: claim.name, IMAGE_NAME: claim.image_name, **claim.extra}

    def _name_key(self, name: str) -> str:
        return f"{self.kind.name_key_prefix}{name}"

    def _record_object(self, uuid: str) -> str:
        return f"{self.kind.record_prefix}{uuid}"

    def lookup(self, name: str) -> str | None:
        """The uuid reserved for this request name, if any."""
        values = omap.read(self.io, self.directory, (self._name_key(name),))
        return (values or {}).get(self._name_key(name)) or None

    def reserve(self, name: str, proposed_uuid: str) -> str:
        """Reserve the name; returns the uuid that holds it (ours, or a concurrent winner's)."""
        if omap.set_if_absent(self.io, self.directory, self._name_key(name), proposed_uuid):
            return proposed_uuid
        winner = self.lookup(name)
        if winner is None:
            # The winner released it between our two steps (a concurrent delete): try again once.
            if omap.set_if_absent(self.io, self.directory, self._name_key(name), proposed_uuid):
                return proposed_uuid
            winner = self.lookup(name)
        if winner is None:
            raise Internal(f"journal entry for {name!r} keeps changing under concurrent requests; retry")
        return winner

    def claim_record(self, uuid: str, name: str, image_name: str, extra: dict[str, str] | None = None) -> Record:
        """The uuid's record, filling it with these values if it holds none yet.

        Call under `locked(uuid)`, after checking the name still points at `uuid`. What is
        returned is what RADOS holds — what this call just wrote under the lease, or the record
        read back — never made up: if the record vanished, that is an error, not a success."""
        values = self._record_values(Claim(name, image_name, extra or {}))
        obj = self._record_object(uuid)
        # The lease created the object; the guarded write fills it unless a record is there.
        if omap.set_unless_key(self.io, obj, self.kind.name_field, values):
            return Record(uuid, name, image_name, extra=tuple(sorted((extra or {}).items())))
        record = self.read(uuid)
        if record is None:
            raise Internal(f"journal record {obj} disappeared while it was being written; retry")
        if record.name != name:
            raise Internal(
                f"journal record {obj} belongs to {record.name!r}, not {name!r}; "
                "the journal is inconsistent: run `cephcsi audit` before retrying"
            )
        return record

    @staticmethod
    def reserved_within_window(hold: Hold, reserving: float) -> bool:
        """Whether a name this process reserved (sending the reservation at monotonic time
        `reserving`) still points at the uuid whose record `hold` just filled, without reading
        it again: true when the hold was taken within RESERVATION_WINDOW of the reservation.

        Only a releaser of a name without a record could have taken it meanwhile, and every
        such releaser (`release_unrecorded`) locks the record first and keeps the lock for
        RESERVATION_WINDOW before it releases: it sent its lock after it saw our reservation,
        so any lock of ours that was answered within the window reached the OSD before the
        release. Ours landed either first (the releaser then finds the record and releases
        nothing) or while the releaser held the lock (ours then failed: busy). Both are
        durations on one clock each, so clock skew between machines does not matter."""
        return hold.claimed is not None and time.monotonic() - reserving < RESERVATION_WINDOW

    def release_unrecorded(self, name: str, uuid: str, hold: Hold) -> None:
        """Release a name whose record was never written (a create that died between the two),
        under `locked(uuid)` (`hold`), after checking that the name still points at `uuid` and
        the record is absent. Holds the lease for RESERVATION_WINDOW first (see
        `reserved_within_window`), which costs only this rare clean-up a second."""
        remaining = hold.lease.taken_at + RESERVATION_WINDOW - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        hold.ensure_held()
        self.release_name(name, uuid)
        self.discard_orphan(uuid)

    def discard_orphan(self, uuid: str) -> None:
        """Remove a record that no name points at (under `locked(uuid)`): left by a delete that
        released the name but died before removing the record, or made empty by our own lock."""
        self.remove_record(uuid)

    def read(self, uuid: str) -> Record | None:
        """The record, or None when it does not exist. A record object with no name in it (only
        a lock, from a create that died right after locking) reads as None too."""
        return self._parse(uuid, omap.read(self.io, self._record_object(uuid)))

    def _parse(self, uuid: str, stored: dict[str, str] | None) -> Record | None:
        if not stored or not stored.get(self.kind.name_field):
            return None
        values = dict(stored)
        name = values.pop(self.kind.name_field, "")
        image_name = values.pop(IMAGE_NAME, "") or f"{self.kind.default_image_prefix}{uuid}"
        image_id = values.pop(IMAGE_ID, "")
        return Record(uuid, name, image_name, image_id, tuple(sorted(values.items())))

    def set_image_id(self, uuid: str, image_id: str) -> None:
        omap.update(self.io, self._record_object(uuid), {IMAGE_ID: image_id})

    def update(self, uuid: str, values: dict[str, str]) -> None:
        """Set extra keys on an existing record (NotFound if it is gone); under `locked(uuid)`."""
        omap.update(self.io, self._record_object(uuid), values)

    def forget(self, uuid: str, key: str) -> None:
        """Remove one key of the record (under `locked(uuid)`)."""
        omap.remove_keys(self.io, self._record_object(uuid), (key,))

    def forget_pending_metadata(self, record: Record) -> None:
        """Remove the record's pending metadata keys (under `locked(uuid)`), once that metadata
        is on the image."""
        keys = tuple(pending_metadata_values(record.pending_metadata()))
        if keys:
            omap.remove_keys(self.io, self._record_object(record.uuid), keys)

    def uuids(self) -> dict[str, str]:
        """Every request name → uuid of this directory (for listings; one omap read)."""
        values = omap.read(self.io, self.directory) or {}
        prefix = self.kind.name_key_prefix
        return {key[len(prefix):]: uuid for key, uuid in values.items() if key.startswith(prefix)}

    def release_name(self, name: str, uuid: str) -> None:
        """Drop the name → uuid key, but only while it still points at this uuid."""
        omap.remove_if_equal(self.io, self.directory, self._name_key(name), uuid)

    def remove_record(self, uuid: str) -> None:
        self.keeper.remove_object(self.io, self._record_object(uuid))
