"""What an audit reads (a `Snapshot` of one pool/namespace) and what it concludes (`Finding`s
and `Repair`s). Plain frozen dataclasses, so the classification is a pure function that the
unit tests can feed by hand."""
from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cephcsi.ceph.imagestate import TrashState
from cephcsi.volumes import metadata

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class Kind(str, enum.Enum):
    """Every inconsistency the audit knows, by the name scripts see in `--json`."""

    ORPHAN_IMAGE = "orphan-image"
    DANGLING_RECORD = "dangling-record"
    DANGLING_KEY = "dangling-key"
    ORPHAN_RECORD = "orphan-record"
    NAME_MISMATCH = "record-name-mismatch"
    TRASH_MOVING = "trash-moving"
    TRASH_REMOVING = "trash-removing"
    TRASH_UNPURGEABLE = "trash-unpurgeable"
    TRASH_UNQUEUED = "trash-unqueued"
    PARTIAL_CREATE = "partial-create"
    STRAY_HEADER = "stray-header"
    UNLISTED_IMAGE = "unlisted-image"
    """A header and id object without a directory entry: a create killed just before it listed
    the image (a librbd that writes the directory entry last, ceph/ceph PR 68612)."""
    PV_IMAGE_GONE = "pv-image-gone"
    IMAGE_WITHOUT_PV = "image-without-pv"
    TEMP_SNAPSHOT = "temp-snapshot"
    """A `cephcsi-tmp-*` RBD snapshot on a volume, left by a killed CreateSnapshot or clone."""
    UNFINISHED_SNAPSHOT = "unfinished-snapshot"
    """A journaled snapshot image without its restore point: a CreateSnapshot killed after the clone."""
    CONTENT_SNAPSHOT_GONE = "content-snapshot-gone"
    """A VolumeSnapshotContent whose snapshot (journal record or image) is gone."""
    SNAPSHOT_WITHOUT_CONTENT = "snapshot-without-content"
    """A journaled, live snapshot that no VolumeSnapshotContent names (maybe made outside Kubernetes)."""
    METADATA_PENDING = "metadata-pending"
    """A live volume whose record still keeps owner metadata for its image: the create was
    killed after answering, before it wrote that metadata (journal.PENDING_METADATA)."""
    KEY_MISSING = "encryption-key-missing"
    """An encrypted volume whose live image has no encryption state: its CreateVolume was killed
    after the image, before the passphrase was kept (cephcsi.volumes.encrypted). A retry of the
    create settles it; only the KMS and the StorageClass secret can, so the audit only reports."""
    UNFINISHED_GROUP = "unfinished-group-snapshot"
    """A group snapshot record whose CreateVolumeGroupSnapshot never finished (its RBD group still
    exists, or a member snapshot is missing or unfinished), with no call on it."""
    ORPHAN_RBD_GROUP = "orphan-rbd-group"
    """An RBD group named like the driver's temporary group that no group snapshot record names."""
    ORPHAN_GROUP_MEMBER = "orphan-group-member"
    """A member snapshot record of a group snapshot that no group record or name key knows."""


class JournalType(str, enum.Enum):
    """Which of the driver's two journals a finding is about (`journal` in `--json`)."""

    VOLUME = "volume"
    SNAPSHOT = "snapshot"
    GROUP = "group"


RECORD_PREFIXES = {JournalType.VOLUME: "csi.volume.", JournalType.SNAPSHOT: "csi.snap.",
                   JournalType.GROUP: "csi.volume.group."}


class Fix(str, enum.Enum):
    """What `--repair` would do about a finding."""

    RELEASE_KEY = "release-key"
    RELEASE_SPLIT_KEY = "release-split-key"
    """A name key into another pool (ceph-csi's topology layout) that nothing is left of."""
    REMOVE_RECORD = "remove-record"
    FINISH_MOVE = "finish-trash-move-and-purge"
    PURGE = "queue-trash-purge"
    REMOVE_PARTIAL = "remove-partial-create"
    LIST_IMAGE = "add-directory-entry"
    TRASH_ORPHAN = "move-orphan-to-trash"
    REMOVE_TEMP_SNAP = "remove-temporary-snapshot"
    COPY_METADATA = "copy-pending-metadata"
    REMOVE_RBD_GROUP = "remove-rbd-group"
    """The group only: its members leave it and its group snapshots go; no image is touched."""


class Outcome(str, enum.Enum):
    REPAIRED = "repaired"
    RESOLVED = "already-resolved"
    """The re-check under the lock found the problem gone (an operation in flight finished)."""
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class RecordView:
    """One journal record object as read; `name` is '' for an empty object (a lock left by a
    create killed right after locking)."""

    uuid: str
    name: str
    image_name: str = ""
    image_id: str = ""
    journal_pool: str = ""
    """ceph-csi's csi.journalpool (16 hex digits): the pool of the name key, when not this one."""
    source_image: str = ""
    """Snapshot records: csi.source, the image of the volume the snapshot was cut from."""
    pending_metadata: tuple[tuple[str, str], ...] = ()
    """Volume records: image metadata kept until it is on the image (journal.PENDING_METADATA)."""
    planned_image_id: str = ""
    """Volume records: the id a create killed before its release planned for the image it wrote
    itself (journal.PLANNED_IMAGE_ID); any of that image's objects may exist."""
    encryption_kms: str = ""
    """Volume records: csi.volume.encryptKMS, the KMS id of an encrypted volume ('' when plain)."""


@dataclass(frozen=True)
class RemoteKeyView:
    """A name key here whose value is ceph-csi's `<pool id>/<uuid>`: the volume's image (and its
    volume id) is in another pool (cephcsi.volumes.split_journal), as resolved by the scan."""

    name: str
    uuid: str
    image_pool: str
    """'' when no pool has the id any more."""
    record_pool: str = ""
    """Where a record naming `name` and this pool as its journal pool was found; '' if nowhere."""
    image_name: str = ""
    image_state: str = ""
    """'live', 'trash', 'gone' or 'other' (a header without a name: see the image pool's audit)."""


@dataclass(frozen=True)
class TrashView:
    image_id: str
    name: str
    state: TrashState
    deferred_until: float = 0.0
    """Epoch seconds before which librbd refuses a plain purge (`rbd trash mv --expires-at`)."""
    awaits_children: bool = False
    """A parent deleted while clones read through it: librbd purges it after them."""
    children_left: bool = True
    """For a parent (`awaits_children`): it still has snapshots, so clones still read through it.
    False: its clones are gone and librbd did not purge it (its last clone left while a crash
    had the parent's move unfinished, or a purge of that clone was cut short)."""


@dataclass(frozen=True)
class PurgeTask:
    """A `trash remove` task the mgr's rbd_support module holds for an image."""

    image_id: str
    attempts: int = 0
    message: str = ""


@dataclass(frozen=True)
class PVView:
    """A PersistentVolume of this driver, reduced to what names an image."""

    name: str
    uuid: str = ""
    """Journal uuid from the volume handle; '' when the handle is not one of ours (static PV)."""
    image_name: str = ""
    """The volumeAttributes' imageName, when set."""
    phase: str = ""


@dataclass(frozen=True)
class ContentView:
    """A VolumeSnapshotContent of this driver, reduced to what names a snapshot of this pool."""

    name: str
    uuid: str = ""
    """Snapshot journal uuid from the snapshot handle; '' while a dynamic content has none yet."""
    request_name: str = ""
    """The CreateSnapshot name the snapshotter gives a dynamic content ('snapshot-<VolumeSnapshot
    uid>'): it names the journal entry of a create still in progress, before the handle exists."""
    deletion_policy: str = ""
    volume_snapshot: str = ""
    """The bound VolumeSnapshot as namespace/name ('' when unbound)."""
    deleting: bool = False
    """metadata.deletionTimestamp is set: the snapshotter is deleting its snapshot."""


@dataclass(frozen=True)
class ImageSnaps:
    """What one image's header says about its RBD snapshots (read from its omap, no open)."""

    names: tuple[str, ...] = ()
    """Names of its snapshots; those in the trash namespace carry librbd's uuid names."""
    has_children: bool = False
    """Some snapshot of it has clone v2 children: restored or cloned images read through it."""


@dataclass(frozen=True)
class SnapJournalView:
    """The snapshot journal (`csi.snaps.<instance>` → `csi.snap.<uuid>`) of the pool, as read."""

    prefix: str = "csi-snap-"
    """VolumeSnapshotClass snapshotNamePrefix: images named prefix + uuid count as snapshot images."""
    name_keys: Mapping[str, str] = field(default_factory=dict)
    foreign_uuids: frozenset[str] = frozenset()
    """uuids that other instances' directories name, or that ceph-csi journaled for another pool."""
    malformed_keys: Mapping[str, str] = field(default_factory=dict)
    records: Mapping[str, RecordView] = field(default_factory=dict)
    split_records: Mapping[str, RecordView] = field(default_factory=dict)
    """Records ceph-csi wrote to another pool for snapshot images of this pool (a snapshot of a
    volume it journaled apart from its image is journaled the same way)."""
    split_named: frozenset[str] = frozenset()
    """uuids of records here whose name key is in the pool their csi.journalpool names."""

    def uuid_of(self, image_name: str) -> str:
        if not image_name.startswith(self.prefix):
            return ""
        rest = image_name[len(self.prefix):]
        return rest if _UUID.match(rest) else ""


@dataclass(frozen=True)
class GroupRecordView:
    """One group snapshot record (`csi.volume.group.<uuid>`); `name` is '' for an empty object."""

    uuid: str
    name: str
    rbd_group: str = ""
    """csi.groupname: the RBD group its create makes and removes."""
    members: tuple[tuple[str, str], ...] = ()
    """(member snapshot id, its snapshot image name), as the record lists them."""


@dataclass(frozen=True)
class GroupJournalView:
    """The group journal (`csi.groups.<instance>` → `csi.volume.group.<uuid>`) and the pool's RBD groups."""

    prefix: str = "csi-vol-group-"
    """The default groupNamePrefix: RBD groups named prefix + uuid count as the driver's."""
    name_keys: Mapping[str, str] = field(default_factory=dict)
    foreign_uuids: frozenset[str] = frozenset()
    records: Mapping[str, GroupRecordView] = field(default_factory=dict)
    rbd_groups: Mapping[str, tuple[str, ...]] | None = None
    """RBD group name → its member images; None when the groups could not be listed."""

    def uuid_of(self, group_name: str) -> str:
        if not group_name.startswith(self.prefix):
            return ""
        rest = group_name[len(self.prefix):]
        return rest if _UUID.match(rest) else ""


@dataclass(frozen=True)
class Snapshot:
    """Everything one audit read about a pool (namespace), taken without any lock: it may
    catch an operation in flight, which is why every repair re-checks under the journal lock."""

    prefix: str
    name_keys: Mapping[str, str] = field(default_factory=dict)
    """Our journal directory: request name → uuid."""
    foreign_uuids: frozenset[str] = frozenset()
    """uuids that other driver instances' directories (same pool) point at: not ours to judge."""
    remote_keys: Mapping[str, RemoteKeyView] = field(default_factory=dict)
    """Our name keys that point into another pool (ceph-csi topology volumes), by request name."""
    malformed_keys: Mapping[str, str] = field(default_factory=dict)
    """Our name keys whose value is neither a uuid nor `<pool id>/<uuid>`: request name → value."""
    split_records: Mapping[str, RecordView] = field(default_factory=dict)
    """Volumes whose image is in this pool but whose name key and record ceph-csi wrote to
    another pool: uuid → that record (this pool holds an empty object for them)."""
    split_named: frozenset[str] = frozenset()
    """uuids of records here that carry csi.journalpool and that the named pool's key points at."""
    records: Mapping[str, RecordView] = field(default_factory=dict)
    directory: Mapping[str, str] = field(default_factory=dict)
    """rbd_directory: image name → image id."""
    id_objects: Mapping[str, str] = field(default_factory=dict)
    """rbd_id.<name> objects: image name → image id."""
    headers: frozenset[str] = frozenset()
    """Image ids with an rbd_header.<id> object."""
    trash: tuple[TrashView, ...] = ()
    tasks: Mapping[str, PurgeTask] | None = None
    """Trash purges the mgr holds, by image id; None when the mgr could not be asked."""
    pvs: tuple[PVView, ...] | None = None
    """None without a kubeconfig: nothing is known about PersistentVolumes."""
    contents: tuple[ContentView, ...] | None = None
    """VolumeSnapshotContents naming snapshots of this pool; None without a kubeconfig or when the
    API server does not serve them (no snapshot CRDs, so none can exist)."""
    now: float = 0.0
    notes: tuple[str, ...] = ()
    """What could not be read (and so was not judged)."""
    journal: JournalType = JournalType.VOLUME
    """Which journal `name_keys` and `records` are: the snapshot rules judge a view of the
    snapshot journal in this same shape (cephcsi.audit.classify_snaps)."""
    snap_journal: SnapJournalView = field(default_factory=SnapJournalView)
    groups: GroupJournalView = field(default_factory=GroupJournalView)
    image_snaps: Mapping[str, ImageSnaps] = field(default_factory=dict)
    """Live images that have RBD snapshots, by image id."""
    encryption_states: Mapping[str, str] = field(default_factory=dict)
    """Encrypted volumes' images (by name, as listed): their state (rbd.csi.ceph.com/encrypted),
    '' when unset."""
    leases_held: frozenset[str] = frozenset()
    """Journal record objects (`csi.volume.<uuid>`, `csi.snap.<uuid>`) whose lease a call holds
    right now: what they guard is in the middle of a call, not debris."""

    def uuid_of(self, image_name: str) -> str:
        """The journal uuid in a name this driver would give an image, or ''."""
        if not image_name.startswith(self.prefix):
            return ""
        rest = image_name[len(self.prefix):]
        return rest if _UUID.match(rest) else ""

    def record(self, uuid: str) -> RecordView | None:
        """The named record of a volume whose image is in this pool: here, or in the pool
        ceph-csi journaled it in (`split_records`)."""
        here = self.records.get(uuid)
        if here is not None and here.name:
            return here
        return self.split_records.get(uuid, here)

    def pvs_naming(self, uuid: str, image_name: str) -> tuple[str, ...]:
        """Names of the PVs that point at this volume (by handle or imageName attribute)."""
        return tuple(pv.name for pv in self.pvs or () if (uuid and pv.uuid == uuid) or
                     (image_name and pv.image_name == image_name))

    def contents_naming(self, uuid: str, request_name: str) -> tuple[str, ...]:
        """Names of the VolumeSnapshotContents that point at this snapshot (by handle, or by
        request name while their create is in progress)."""
        return tuple(c.name for c in self.contents or () if (uuid and c.uuid == uuid) or
                     (request_name and c.request_name == request_name))


@dataclass(frozen=True)
class ImageOwner:
    """The claim an image was made for, from the owner metadata CreateVolume stores with
    `--extra-create-metadata` (ceph-csi's keys: cephcsi.volumes.metadata). The PV is whatever
    the metadata says, even when no such PV exists any more: that is the point of reading it."""

    pvc_namespace: str = ""
    pvc_name: str = ""
    pv_name: str = ""

    @classmethod
    def from_metadata(cls, values: Mapping[str, str]) -> ImageOwner | None:
        """None when the image carries none of the owner keys (made without the flag, or by hand)."""
        owner = cls(values.get(metadata.PVC_NAMESPACE_KEY, ""), values.get(metadata.PVC_NAME_KEY, ""),
                    values.get(metadata.PV_NAME_KEY, ""))
        return owner if owner != cls() else None

    @property
    def text(self) -> str:
        """"namespace/claim (pv)", as the table shows it."""
        return metadata.owner({metadata.PVC_NAMESPACE_KEY: self.pvc_namespace,
                               metadata.PVC_NAME_KEY: self.pvc_name, metadata.PV_NAME_KEY: self.pv_name})


@dataclass(frozen=True)
class Finding:
    kind: Kind
    subject: str
    """The object a person looks for: an image, a request name, a record, a PV."""
    detail: str
    uuid: str = ""
    name: str = ""
    image_name: str = ""
    image_id: str = ""
    ours: bool = True
    """Provably this driver's (journaled, or named prefix + uuid): the only ones repaired."""
    fix: Fix | None = None
    """What `--repair` would do; None: report only (`why_not` says why)."""
    why_not: str = ""
    owner: ImageOwner | None = None
    """The claim the finding's image carries in its metadata, when it is readable and has any."""
    journal: JournalType | None = JournalType.VOLUME
    """The journal whose entry the finding is about; None for objects of neither (a stray
    header, an image or trash entry not named like the driver's)."""
    rbd_snapshot: str = ""
    """The RBD snapshot (on `image_name`) the finding is about, for temp-snapshot."""


@dataclass(frozen=True)
class ImageEntry:
    """One image of the pool as `--list-images` shows it: what names it, and whose it is."""

    name: str
    image_id: str
    request_name: str = ""
    """The CreateVolume name the journal records for it ('' when no record names the image)."""
    pvs: tuple[str, ...] = ()
    """PersistentVolumes naming it (empty without --kubeconfig)."""
    owner: ImageOwner | None = None
    contents: tuple[str, ...] = ()
    """VolumeSnapshotContents naming it, for a snapshot image (empty without --kubeconfig or
    without the snapshot CRDs)."""


@dataclass(frozen=True)
class Repair:
    finding: Finding
    outcome: Outcome
    action: str
