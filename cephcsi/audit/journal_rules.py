"""The journal rules: findings about name keys and journal records, for the volume journal and
(on cephcsi.audit.classify_snaps' view) the snapshot journal; pure, no I/O. Shared by
cephcsi.audit.classify and classify_snaps, so neither imports the other's rules."""
from __future__ import annotations

from dataclasses import replace

from cephcsi.audit.model import RECORD_PREFIXES, Finding, Fix, JournalType, Kind, RecordView, Snapshot, TrashView


def trash_by_id(snap: Snapshot) -> dict[str, TrashView]:
    return {entry.image_id: entry for entry in snap.trash}


def image_id_of(snap: Snapshot, record: RecordView) -> str:
    return record.image_id or snap.directory.get(record.image_name) or snap.id_objects.get(record.image_name, "")


def image_is_live(snap: Snapshot, name: str, image_id: str) -> bool:
    """Openable by name and not on its way to the trash (imagestate.ImageState.live)."""
    return bool(image_id) and image_id in snap.headers and name in snap.id_objects and \
        image_id not in trash_by_id(snap)


def pv_block(snap: Snapshot, uuid: str, image_name: str) -> str:
    """Why an action that touches this volume's image must wait for a person, or ''."""
    names = snap.pvs_naming(uuid, image_name)
    return f"PersistentVolume {', '.join(names)} names it" if names else ""


SPLIT = ("a ceph-csi volume journaled in another pool than its image (topologyConstrainedPools): "
         "never repaired automatically; inspect both pools")


def _split_findings(snap: Snapshot) -> list[Finding]:
    """Name keys pointing into another pool: consistent unless their record or image is gone.
    A key with nothing behind it is released (the repair re-checks both pools); a record whose
    image is gone is only reported: removing it would change two pools."""
    found: list[Finding] = []
    for name, key in sorted(snap.remote_keys.items()):
        if not key.image_pool:
            found.append(Finding(Kind.DANGLING_KEY, name, f"name key points at volume {key.uuid} in a pool that "
                                 "no longer exists", uuid=key.uuid, name=name, fix=Fix.RELEASE_SPLIT_KEY))
        elif not key.record_pool:
            found.append(Finding(Kind.DANGLING_KEY, name, f"name key points at volume {key.uuid} in pool "
                                 f"{key.image_pool!r}, but no journal record names it", uuid=key.uuid, name=name,
                                 fix=Fix.RELEASE_SPLIT_KEY))
        elif key.image_state == "gone":
            found.append(Finding(Kind.DANGLING_RECORD, name, f"journal record {key.uuid} (in pool "
                                 f"{key.record_pool!r}) names image {key.image_name!r} in pool {key.image_pool!r}, "
                                 "which is gone", uuid=key.uuid, name=name, image_name=key.image_name,
                                 why_not=SPLIT))
    for name, value in sorted(snap.malformed_keys.items()):
        found.append(Finding(Kind.DANGLING_KEY, name, f"name key holds {value!r}, neither a uuid nor "
                             "<pool id>/<uuid>", name=name, why_not="not a value cephcsi or ceph-csi writes"))
    return found


def journal_findings(snap: Snapshot) -> list[Finding]:
    """The findings of the journal `snap.journal` names, each tagged with it."""
    return [replace(f, journal=snap.journal) for f in _journal_findings(snap)]


def _journal_findings(snap: Snapshot) -> list[Finding]:
    found: list[Finding] = _split_findings(snap)
    for name, uuid in sorted(snap.name_keys.items()):
        record = snap.records.get(uuid)
        if record is None or not record.name:
            found.append(Finding(Kind.DANGLING_KEY, name, f"name key points at journal record {uuid}, which "
                                 f"{'holds no name' if record else 'does not exist'}",
                                 uuid=uuid, name=name, fix=Fix.RELEASE_KEY))
        elif record.name != name:
            found.append(Finding(Kind.NAME_MISMATCH, name, f"name key points at record {uuid}, which belongs to "
                                 f"{record.name!r}", uuid=uuid, name=name,
                                 why_not="the journal cannot say which is right; inspect both names"))
        else:
            found.extend(_dangling_record(snap, record))
            found.extend(_pending_metadata(snap, record))
            found.extend(_missing_key(snap, record))
    for uuid in sorted(snap.split_named):
        # A record here whose name key is in the pool its csi.journalpool names: judged by its
        # image (here), and only reported.
        found.extend(replace(f, fix=None, why_not=SPLIT) for f in _dangling_record(snap, snap.records[uuid]))
    referenced = set(snap.name_keys.values()) | snap.foreign_uuids | snap.split_named | set(snap.split_records) | \
        {key.uuid for key in snap.remote_keys.values() if key.record_pool}
    for uuid, record in sorted(snap.records.items()):
        if uuid not in referenced:
            finding = _orphan_record(snap, record)
            if record.journal_pool:
                # ceph-csi's topology records: their image may be in a pool this one does not say.
                finding = replace(finding, fix=None, why_not=SPLIT)
            found.append(finding)
    return found


def _dangling_record(snap: Snapshot, record: RecordView) -> list[Finding]:
    """A named record whose image is gone (not live, not in the trash)."""
    image_id = image_id_of(snap, record)
    if image_is_live(snap, record.image_name, image_id) or (image_id and image_id in trash_by_id(snap)):
        return []
    blocked = pv_block(snap, record.uuid, record.image_name) or _kms_block(record)
    return [Finding(Kind.DANGLING_RECORD, record.name, f"journal record {record.uuid} names image "
                    f"{record.image_name!r}, which is gone", uuid=record.uuid, name=record.name,
                    image_name=record.image_name, image_id=image_id,
                    fix=None if blocked else Fix.REMOVE_RECORD, why_not=blocked)]


def _kms_block(record: RecordView) -> str:
    """Why an encrypted volume's record must not simply go: it is the only thing naming the KMS
    that may keep the volume's passphrase (a create killed after the key, before the image;
    cephcsi.volumes.encrypted). The audit has neither the KMS configuration nor its secrets;
    DeleteVolume has both and removes the key before the record."""
    if record.encryption_kms in ("", "default"):
        return ""
    return (f"encrypted with KMS {record.encryption_kms!r}, which may still keep its passphrase: delete it with "
            "DeleteVolume (or retry its claim), which removes the key and then the record")


def _missing_key(snap: Snapshot, record: RecordView) -> list[Finding]:
    """An encrypted volume's live image without an encryption state, no call holding its lease:
    its create was killed between the image and its passphrase. Not repaired: only the
    StorageClass secret or the KMS can make the passphrase, and the claim's retried CreateVolume
    (or the provisioner's clean-up of a deleted claim) does."""
    if not record.encryption_kms or record.image_name not in snap.encryption_states or \
            snap.encryption_states[record.image_name] or \
            f"{RECORD_PREFIXES[JournalType.VOLUME]}{record.uuid}" in snap.leases_held:
        return []
    image_id = image_id_of(snap, record)
    if not image_is_live(snap, record.image_name, image_id):
        return []
    return [Finding(Kind.KEY_MISSING, record.image_name, f"encrypted volume {record.name!r} (KMS "
                    f"{record.encryption_kms!r}) has no passphrase on its image: a CreateVolume killed before it "
                    "kept the key", uuid=record.uuid, name=record.name, image_name=record.image_name, image_id=image_id,
                    why_not="only the StorageClass secret or the KMS can make the passphrase: a retry of the claim's "
                    "CreateVolume does (the provisioner retries); with no claim, delete the volume")]


def _pending_metadata(snap: Snapshot, record: RecordView) -> list[Finding]:
    """A live volume whose record still keeps metadata for its image, and no call holds the
    lease (a create in flight writes it before releasing)."""
    if not record.pending_metadata or f"{RECORD_PREFIXES[JournalType.VOLUME]}{record.uuid}" in snap.leases_held:
        return []
    image_id = image_id_of(snap, record)
    if not image_is_live(snap, record.image_name, image_id):
        return []  # nothing to copy it to; a gone image is its own finding
    keys = ", ".join(key for key, _ in record.pending_metadata)
    return [Finding(Kind.METADATA_PENDING, record.image_name, f"journal record {record.uuid} keeps metadata "
                    f"({keys}) that a create killed after answering did not write to the image",
                    uuid=record.uuid, name=record.name, image_name=record.image_name, image_id=image_id,
                    fix=Fix.COPY_METADATA)]


def _orphan_record(snap: Snapshot, record: RecordView) -> Finding:
    subject = f"{RECORD_PREFIXES[snap.journal]}{record.uuid}"
    if not record.name:
        return Finding(Kind.ORPHAN_RECORD, subject, "empty journal record object (a lock left by a killed "
                       "create) that no name key points at", uuid=record.uuid, fix=Fix.REMOVE_RECORD)
    image_id = image_id_of(snap, record)
    detail = f"journal record of {record.name!r} (image {record.image_name!r}) that no name key points at"
    if image_is_live(snap, record.image_name, image_id):
        return Finding(Kind.ORPHAN_RECORD, subject, detail, uuid=record.uuid, name=record.name,
                       image_name=record.image_name, image_id=image_id,
                       why_not="its image is live; find out who uses it before removing anything")
    blocked = pv_block(snap, record.uuid, record.image_name) or _kms_block(record)
    return Finding(Kind.ORPHAN_RECORD, subject, detail, uuid=record.uuid, name=record.name,
                   image_name=record.image_name, image_id=image_id,
                   fix=None if blocked else Fix.REMOVE_RECORD, why_not=blocked)
