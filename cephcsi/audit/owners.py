"""Which claim an image belongs to, from its owner metadata (`--extra-create-metadata`), put on
the findings and on the `--list-images` listing. Pure: scan.read_owners does the reads.

The metadata is what lets a person act on an orphan: a journal record or PV may be gone, but
the image still says "made for claim db/data-0 (pvc-…)". Only images with a header can be
opened, so debris (partial creates, stray names) is never read.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from cephcsi.audit.journal_rules import image_is_live
from cephcsi.audit.model import Finding, ImageEntry, ImageOwner, Snapshot


def image_id_for(snap: Snapshot, finding: Finding) -> str:
    """The id of the image a finding is about ('' when it names no image)."""
    return finding.image_id or snap.directory.get(finding.image_name, "") or \
        snap.id_objects.get(finding.image_name, "")


def finding_targets(snap: Snapshot, findings: Iterable[Finding]) -> list[tuple[str, str]]:
    """(name, id) of every openable image the findings are about, each once."""
    targets: dict[str, str] = {}
    for finding in findings:
        image_id = image_id_for(snap, finding)
        if image_id and image_id in snap.headers:
            targets.setdefault(image_id, finding.image_name)
    return [(name, image_id) for image_id, name in sorted(targets.items())]


def with_owners(snap: Snapshot, findings: Iterable[Finding], owners: Mapping[str, ImageOwner]) -> list[Finding]:
    """The findings, each carrying its image's owner when the image has one."""
    return [replace(f, owner=owners[image_id]) if (image_id := image_id_for(snap, f)) in owners else f
            for f in findings]


def live_images(snap: Snapshot) -> list[tuple[str, str]]:
    """(name, id) of every live image of the pool (namespace), by name."""
    names = sorted(set(snap.directory) | set(snap.id_objects))
    pairs = ((name, snap.directory.get(name) or snap.id_objects.get(name, "")) for name in names)
    return [(name, image_id) for name, image_id in pairs if image_is_live(snap, name, image_id)]


def listing(snap: Snapshot, owners: Mapping[str, ImageOwner]) -> tuple[ImageEntry, ...]:
    """`--list-images`: each live image with the request the journal records for it, the PVs
    naming it (the VolumeSnapshotContents, for a snapshot image) and the owner its metadata
    names."""
    records = [*snap.records.values(), *snap.split_records.values(), *snap.snap_journal.records.values(),
               *snap.snap_journal.split_records.values()]
    requests = {r.image_name: r.name for r in records if r.name and r.image_name}
    snapshots = {r.image_name: uuid for uuid, r in snap.snap_journal.records.items() if r.image_name}
    return tuple(
        ImageEntry(name, image_id, requests.get(name, ""), snap.pvs_naming(snap.uuid_of(name), name),
                   owners.get(image_id),
                   snap.contents_naming(snapshots[name], requests.get(name, "")) if name in snapshots else ())
        for name, image_id in live_images(snap)
    )
