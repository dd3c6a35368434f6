"""The idempotency journal: request names → object uuids → images, in RADOS omaps.

Layout (compatible with ceph-csi's, so its volumes can be found and deleted here):

    csi.volumes.<instance>    directory   key  csi.volume.<request name> = <uuid>
    csi.volume.<uuid>         record      keys csi.volname, csi.imagename, csi.imageid, ...

Snapshots use the same two-level shape under csi.snaps.<instance> / csi.snap.<uuid>
(`SNAPSHOTS`), so clones and snapshots reuse this code unchanged.

Crash safety comes from the order of steps, each one atomic RADOS op:

    create:  directory key (set-if-absent)  →  record (exclusive create)  →  image  →  image id
    delete:  image (to trash, purge)  →  directory key (remove-if-ours)  →  record

A retry after a crash between any two steps finds the earlier steps' results and completes the
rest: the directory key is written first, so there is never a record or image without a name
pointing at it, and the record is removed last, so a retried delete still knows the image's
name. A lost race (two replicas reserving one name) is settled by set-if-absent: the loser
adopts the winner's uuid, so one name never gets two images.
"""
from __future__ import annotations

from dataclasses import dataclass

import rados

from cephcsi.ceph import omap
from cephcsi.errors import Internal

NAME_FIELD_VOLUME = "csi.volname"
IMAGE_NAME = "csi.imagename"
IMAGE_ID = "csi.imageid"
OWNER = "csi.volume.owner"
SOURCE = "csi.source"
"""For snapshots and clones: the id of the volume/snapshot they come from."""


@dataclass(frozen=True)
class JournalKind:
    directory_prefix: str
    name_key_prefix: str
    record_prefix: str
    name_field: str


VOLUMES = JournalKind("csi.volumes.", "csi.volume.", "csi.volume.", NAME_FIELD_VOLUME)
SNAPSHOTS = JournalKind("csi.snaps.", "csi.snap.", "csi.snap.", "csi.snapname")


@dataclass(frozen=True)
class Record:
    uuid: str
    name: str
    image_name: str
    image_id: str = ""
    extra: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str = "") -> str:
        return dict(self.extra).get(key, default)


class Journal:
    """Journal operations within one pool (and rados namespace) for one driver instance."""

    def __init__(self, io: rados.Ioctx, instance_id: str, kind: JournalKind = VOLUMES) -> None:
        self.io = io
        self.kind = kind
        self.directory = f"{kind.directory_prefix}{instance_id}"

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

    def ensure_record(self, uuid: str, name: str, image_name: str, extra: dict[str, str] | None = None) -> Record:
        """The uuid's record, creating it with these values if it does not exist yet."""
        values = {self.kind.name_field: name, IMAGE_NAME: image_name, **(extra or {})}
        if not omap.create_exclusive(self.io, self._record_object(uuid), values):
            record = self.read(uuid)
            if record is not None:
                if record.name != name:
                    raise Internal(
                        f"journal record {self._record_object(uuid)} belongs to {record.name!r}, not {name!r}; "
                        "the journal is inconsistent, inspect it before retrying"
                    )
                return record
        return Record(uuid, name, image_name, extra=tuple((extra or {}).items()))

    def read(self, uuid: str) -> Record | None:
        values = omap.read(self.io, self._record_object(uuid))
        if values is None:
            return None
        name = values.pop(self.kind.name_field, "")
        image_name = values.pop(IMAGE_NAME, "")
        image_id = values.pop(IMAGE_ID, "")
        return Record(uuid, name, image_name, image_id, tuple(sorted(values.items())))

    def set_image_id(self, uuid: str, image_id: str) -> None:
        omap.update(self.io, self._record_object(uuid), {IMAGE_ID: image_id})

    def release_name(self, name: str, uuid: str) -> None:
        """Drop the name → uuid key, but only while it still points at this uuid."""
        omap.remove_if_equal(self.io, self.directory, self._name_key(name), uuid)

    def remove_record(self, uuid: str) -> None:
        omap.remove_object(self.io, self._record_object(uuid))
