"""How a VolumeAttachment is attached, chosen from the controller's capabilities.

Without PUBLISH_UNPUBLISH_VOLUME (the rbd case) external-attacher's trivial handler: status
`attached: true`, no finalizer, deletion is the detach. With it, `publishing.PublishingAttach`,
which the wiring picks when the controller advertises it (`publishes`). docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from cephcsi._generated import csi_pb2
from cephcsi.observability.logging import fields
from cephcsi.sidecars import objects
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.objects import KubeObject

log = logging.getLogger(__name__)

_RPC = csi_pb2.ControllerServiceCapability.RPC


class AttachStrategy(Protocol):
    name: str

    def sync(self, attachment: KubeObject) -> None:
        """Bring one VolumeAttachment of this driver to its desired state; raise to retry."""
        ...

    def settled(self, attachment: KubeObject) -> bool:
        """sync() would do nothing with it: the handler leaves it out of the queue (no replay
        of every attached attachment at start or resync)."""
        ...


@runtime_checkable
class VolumeFinalizing(Protocol):
    """A strategy that also finalizes PVs (the publishing one): PV events reach it."""

    def wants_volume(self, pv: Mapping[str, Any]) -> bool: ...

    def sync_volume(self, pv: Mapping[str, Any], attachments: list[KubeObject]) -> None: ...


class TrivialAttach:
    """external-attacher's trivialHandler."""

    name = "trivial"

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def settled(self, attachment: KubeObject) -> bool:
        return not objects.deleting(attachment) and bool(objects.status(attachment).get("attached"))

    def sync(self, attachment: KubeObject) -> None:
        if objects.deleting(attachment):
            return  # nothing to undo: detach completes when the object is gone
        if objects.status(attachment).get("attached"):
            return
        self.api.mark_attached(objects.name(attachment))
        log.info("VolumeAttachment marked attached", extra=fields(
            attachment=objects.name(attachment), node=objects.spec(attachment).get("nodeName"),
            pv=(objects.spec(attachment).get("source") or {}).get("persistentVolumeName")))


def publishes(capabilities: Iterable[csi_pb2.ControllerServiceCapability]) -> bool:
    """Whether the controller advertises PUBLISH_UNPUBLISH_VOLUME (then the publishing strategy runs)."""
    return _RPC.PUBLISH_UNPUBLISH_VOLUME in {c.rpc.type for c in capabilities if c.HasField("rpc")}
