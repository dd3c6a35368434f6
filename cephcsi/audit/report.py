"""Render an audit for a person (a table) or a script (`--json`). Pure string building."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from cephcsi.audit.model import Finding, ImageEntry, ImageOwner, Outcome, Repair


@dataclass(frozen=True)
class Scope:
    """What was audited, as the report names it."""

    cluster_id: str
    pool: str
    namespace: str
    instance_id: str
    prefix: str
    kubernetes: bool
    snapshot_prefix: str = "csi-snap-"
    snapshot_contents: bool = False
    """VolumeSnapshotContents were read (a kubeconfig, and the API server serves them)."""


@dataclass(frozen=True)
class AuditResult:
    scope: Scope
    findings: tuple[Finding, ...]
    repairs: tuple[Repair, ...] | None
    """None without --repair."""
    notes: tuple[str, ...] = ()
    images: tuple[ImageEntry, ...] | None = None
    """With --list-images: every live image and its owner; None otherwise."""

    @property
    def clean(self) -> bool:
        """Nothing found, or (after --repair) everything found repaired or resolved."""
        if self.repairs is None:
            return not self.findings
        return all(r.outcome in (Outcome.REPAIRED, Outcome.RESOLVED) for r in self.repairs)


def _repair_of(result: AuditResult) -> dict[Finding, Repair]:
    return {repair.finding: repair for repair in result.repairs or ()}


def _repair_line(finding: Finding, repair: Repair | None) -> str:
    if repair is not None:
        return f"{repair.outcome.value}: {repair.action}"
    if finding.fix is None:
        return f"report only: {finding.why_not}" if finding.why_not else "report only"
    return f"--repair would {finding.fix.value}"


def _owner_json(owner: ImageOwner | None) -> dict[str, str] | None:
    if owner is None:
        return None
    return {"pvc_namespace": owner.pvc_namespace, "pvc_name": owner.pvc_name, "pv_name": owner.pv_name}


def _images_json(images: tuple[ImageEntry, ...]) -> list[dict[str, Any]]:
    return [{"name": i.name, "image_id": i.image_id, "request_name": i.request_name, "pvs": list(i.pvs),
             "contents": list(i.contents), "owner": _owner_json(i.owner)} for i in images]


def to_json(result: AuditResult) -> str:
    repairs = _repair_of(result)
    items: list[dict[str, Any]] = []
    for finding in result.findings:
        repair = repairs.get(finding)
        items.append({
            "kind": finding.kind.value, "subject": finding.subject, "detail": finding.detail,
            "uuid": finding.uuid, "name": finding.name, "image_name": finding.image_name,
            "image_id": finding.image_id, "ours": finding.ours,
            "fix": finding.fix.value if finding.fix else None, "why_not": finding.why_not,
            "owner": _owner_json(finding.owner),
            # Added beside the original fields (none renamed): which journal the entry is in,
            # and the RBD snapshot a temp-snapshot finding names.
            "journal": finding.journal.value if finding.journal else None,
            "rbd_snapshot": finding.rbd_snapshot,
            "repair": None if repair is None else {"outcome": repair.outcome.value, "action": repair.action},
        })
    scope = result.scope
    doc = {
        "cluster_id": scope.cluster_id, "pool": scope.pool, "rados_namespace": scope.namespace,
        "instance_id": scope.instance_id, "volume_name_prefix": scope.prefix,
        "snapshot_name_prefix": scope.snapshot_prefix, "kubernetes": scope.kubernetes,
        "snapshot_contents": scope.snapshot_contents,
        "repaired": result.repairs is not None, "clean": result.clean,
        "counts": dict(Counter(f.kind.value for f in result.findings)),
        "findings": items, "notes": list(result.notes),
    }
    if result.images is not None:
        doc["images"] = _images_json(result.images)
    return json.dumps(doc, indent=2, sort_keys=False)


def to_table(result: AuditResult) -> str:
    scope = result.scope
    where = (f"cluster {scope.cluster_id}, pool {scope.pool}"
             f"{f', namespace {scope.namespace}' if scope.namespace else ''}, journal instance {scope.instance_id}")
    lines = [f"cephcsi audit of {where}{'' if scope.kubernetes else ' (PersistentVolumes not checked)'}"]
    lines.extend(f"note: {note}" for note in result.notes)
    if result.images is not None:
        lines.extend(_images_table(result.images))
    if not result.findings:
        lines.append("no inconsistencies found")
        return "\n".join(lines) + "\n"
    repairs = _repair_of(result)
    kind_width = max(len("KIND"), *(len(f.kind.value) for f in result.findings))
    journal_width = len("SNAPSHOT")
    subject_width = min(48, max(len("SUBJECT"), *(len(f.subject) for f in result.findings)))
    lines.append(f"{'KIND':<{kind_width}}  {'JOURNAL':<{journal_width}}  {'SUBJECT':<{subject_width}}  DETAIL")
    indent = " " * (kind_width + journal_width + subject_width + 6)
    for finding in result.findings:
        journal = finding.journal.value if finding.journal else "-"
        lines.append(f"{finding.kind.value:<{kind_width}}  {journal:<{journal_width}}  "
                     f"{finding.subject:<{subject_width}}  {finding.detail}")
        if finding.owner is not None:
            lines.append(f"{indent}owner: {finding.owner.text}")
        lines.append(f"{indent}-> {_repair_line(finding, repairs.get(finding))}")
    counts = Counter(f.kind.value for f in result.findings)
    lines.append(f"{len(result.findings)} finding(s): " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if result.repairs is not None:
        outcomes = Counter(r.outcome.value for r in result.repairs)
        lines.append("repair: " + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())))
    return "\n".join(lines) + "\n"


def _images_table(images: tuple[ImageEntry, ...]) -> list[str]:
    """The --list-images section: one line per live image, '-' for what is unknown."""
    if not images:
        return ["no images"]
    rows = [(i.name, i.request_name or "-", ",".join(i.pvs + i.contents) or "-", i.owner.text if i.owner else "-")
            for i in images]
    heads = ("IMAGE", "REQUEST", "PV / CONTENT", "OWNER (metadata)")
    widths = [max(len(heads[c]), *(len(r[c]) for r in rows)) for c in range(3)]

    def line(cells: tuple[str, str, str, str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells[:3], widths)) + "  " + cells[3]

    return [line(heads), *(line(r) for r in rows), f"{len(images)} image(s)", ""]
