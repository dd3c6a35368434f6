"""At node plugin start: unstage the volumes Kubernetes no longer stages on this node (issue 34).

A node fenced while it hung can wake with volumes still mapped and mounted that Kubernetes has
since detached from it and attached elsewhere. Its kubelet unstages them if it still knows
them; one that lost its state never calls NodeUnstageVolume, and the mapping stays (a dead
watch, a blocklisted client, a device that errors). The Node's status is Kubernetes' view:
`volumesAttached` (the attach-detach controller's) and `volumesInUse` (the kubelet's). The
kubelet stages only volumes in volumesAttached, so a staged volume in neither list was detached
from this node; it is unstaged as NodeUnstageVolume would, under its locks. One still published
in a pod is kept (unstage refuses it), and without the API nothing is done.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cephcsi.errors import CephCSIError
from cephcsi.node.staged_volumes import stage_records
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

ReadNode = Callable[[str], Mapping[str, Any]]
"""The Node object (as the API returns it) of a node name; raises CephCSIError when unreadable."""


@dataclass(frozen=True)
class Staged:
    volume_id: str
    staging_path: str


@dataclass
class SweepReport:
    unstaged: list[str]
    kept: list[str]
    failed: list[str]


def unique_name(driver_name: str, volume_id: str) -> str:
    """The kubelet's and attach-detach controller's name of a CSI volume in a Node's status."""
    return f"kubernetes.io/csi/{driver_name}^{volume_id}"


def known_to_kubernetes(node: Mapping[str, Any]) -> set[str]:
    """The unique names a Node's status lists as attached to it or in use on it."""
    status = node.get("status") or {}
    names = {str(entry.get("name", "")) for entry in status.get("volumesAttached") or []}
    names.update(str(name) for name in status.get("volumesInUse") or [])
    return names


def stale(staged: Iterable[Staged], known: set[str], driver_name: str) -> list[Staged]:
    return [entry for entry in staged if unique_name(driver_name, entry.volume_id) not in known]


class StaleStageSweep:
    def __init__(self, node_name: str, driver_name: str, kubelet_dir: str, read_node: ReadNode,
                 unstage: Callable[[str, str], None]) -> None:
        self.node_name = node_name
        self.driver_name = driver_name
        self.kubelet_dir = kubelet_dir
        self.read_node = read_node
        self.unstage = unstage

    def run(self) -> SweepReport:
        report = SweepReport([], [], [])
        staged = [Staged(record.volume_id, record.staging_path) for record in stage_records(
            self.kubelet_dir, self.driver_name, block=True, skipped="not checked for a stale stage")]
        if not staged:
            return report
        try:
            known = known_to_kubernetes(self.read_node(self.node_name))
        except CephCSIError as error:
            log.warning("cannot read this node's attached volumes; no stale stage is cleaned up",
                        extra=fields(node=self.node_name, error=error.message))
            return report
        candidates = stale(staged, known, self.driver_name)
        report.kept = [entry.volume_id for entry in staged if entry not in candidates]
        for entry in candidates:
            try:
                self.unstage(entry.volume_id, entry.staging_path)
            except CephCSIError as error:
                # Still published (a pod uses it), or a step failed: the kubelet's own calls handle it.
                log.warning("stale stage left in place", extra=fields(
                    volume_id=entry.volume_id, path=entry.staging_path, error=error.message))
                report.failed.append(entry.volume_id)
                continue
            log.warning("unstaged a volume Kubernetes no longer attaches to this node", extra=fields(
                volume_id=entry.volume_id, path=entry.staging_path, node=self.node_name))
            report.unstaged.append(entry.volume_id)
        return report
