"""Taking over attachments made by another attacher of the same driver name (ceph-csi >= 3.15).

Those ceph-csi releases advertise PUBLISH_UNPUBLISH_VOLUME, so their csi-attacher runs
external-attacher's real handler (pkg/controller/csi_handler.go). After a successful attach it
leaves, on the VolumeAttachment: the finalizer `external-attacher/<sanitised driver>`, the
annotation `csi.alpha.kubernetes.io/node-id`, `status.attached: true` and possibly
`status.attachmentMetadata`; on the PV: the same finalizer. A failed attach leaves the finalizer
with `attached: false` and `status.attachError`. It removes the PV finalizer only once the PV is
being deleted and no VolumeAttachment names it, and the VA finalizer only after a successful
ControllerUnpublish (markAsDetached: status first, then the finalizer).

cephcsi's attacher runs the same real handler (publishing.PublishingAttach) under a finalizer of
its own (`attacher.cephcsi/<driver>`), so once ceph-csi is gone nothing would ever remove ceph-csi's
finalizer: detaches, pod moves and PV deletions would hang. Here:

- a live attachment carrying it is made attached by the strategy (which also publishes it and
  adds cephcsi's finalizer; the trivial strategy only marks it) and ceph-csi's finalizer is
  dropped;
- an attachment being deleted with it is finished as external-attacher finishes a detach
  (status attached=false, errors and metadata cleared, then the finalizer removed);
- a PV of this driver carrying it loses it once no VolumeAttachment names the PV (the guard it
  stood for — "still attached somewhere" — is what the VolumeAttachments themselves say).

The node-id annotation is left alone: harmless, and it records which node the old attacher used.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from cephcsi.kube.informer import Informer
from cephcsi.observability.logging import fields
from cephcsi.sidecars import objects
from cephcsi.sidecars.api import KubeApi

log = logging.getLogger(__name__)

ANN_NODE_ID = "csi.alpha.kubernetes.io/node-id"
ATTACHMENTS_BY_PV_INDEX = "cephcsi-attacher-by-pv"
PV_KEY_PREFIX = "pv/"
"""Work-queue keys for PVs ('/' never appears in a VolumeAttachment name)."""


def legacy_finalizer(driver_name: str) -> str:
    """external-attacher's GetFinalizerName: `external-attacher/` + the sanitised driver name."""
    name = re.sub(r"[^a-zA-Z0-9-]", "-", driver_name)
    return "external-attacher/" + (name + "X" if name.endswith("-") else name)


def attachment_pv(attachment: Mapping[str, Any]) -> list[str]:
    """Index function: the PV a VolumeAttachment attaches."""
    pv = (objects.spec(attachment).get("source") or {}).get("persistentVolumeName")
    return [str(pv)] if pv else []


class LegacyTakeover:
    def __init__(self, api: KubeApi, driver_name: str, attachments: Informer) -> None:
        self.api = api
        self.driver_name = driver_name
        self.finalizer = legacy_finalizer(driver_name)
        self.attachments = attachments

    def wants_volume(self, pv: Mapping[str, Any]) -> bool:
        csi = objects.spec(pv).get("csi") or {}
        return csi.get("driver") == self.driver_name and objects.has_finalizer(pv, self.finalizer)

    def sync_attachment(self, attachment: Mapping[str, Any]) -> None:
        """After the strategy's sync: finish what the old attacher's finalizer still holds."""
        if not objects.has_finalizer(attachment, self.finalizer):
            return
        name = objects.name(attachment)
        if objects.deleting(attachment):
            # external-attacher's markAsDetached order: status, then the finalizer, so the
            # object never disappears looking attached.
            self.api.mark_detached(name)
            self.api.remove_attachment_finalizer(name, self.finalizer)
            log.info("detach of a VolumeAttachment left by another attacher finished", extra=fields(
                attachment=name, node=objects.spec(attachment).get("nodeName"), finalizer=self.finalizer))
            return
        # The strategy has just made it attached (it raises otherwise): detach is deletion from now on.
        self.api.remove_attachment_finalizer(name, self.finalizer)
        log.info("VolumeAttachment taken over from another attacher", extra=fields(
            attachment=name, node=objects.spec(attachment).get("nodeName"), finalizer=self.finalizer))

    def sync_volume(self, pv: Mapping[str, Any]) -> None:
        if not self.wants_volume(pv):
            return
        name = objects.name(pv)
        users = [objects.name(a) for a in self.attachments.by_index(ATTACHMENTS_BY_PV_INDEX, name)]
        if users:
            log.debug("PV still named by VolumeAttachments; keeping the old attacher's finalizer for now",
                      extra=fields(pv=name, attachments=users))
            return
        self.api.remove_pv_finalizer(name, self.finalizer)
        log.info("finalizer of another attacher removed from PV", extra=fields(pv=name, finalizer=self.finalizer))
