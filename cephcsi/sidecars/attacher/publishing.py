"""external-attacher's real handler (pkg/controller/csi_handler.go), for a controller that
advertises PUBLISH_UNPUBLISH_VOLUME.

Attach: finalizers on the VolumeAttachment and PV, ControllerPublishVolume, attached=true with
the publish context (else attachError). Detach: ControllerUnpublishVolume, attached=false, then
the finalizer (else detachError). Finalizer name and secrets as external-attacher's, so ceph-csi
attachments carry over: docs/design/sidecars.md, "sidecars/attacher/publishing.py".
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.csi.controller import ControllerServicer
from cephcsi.errors import CephCSIError, InvalidArgument, NotFound
from cephcsi.kube.informer import Informer
from cephcsi.observability.logging import fields
from cephcsi.sidecars import objects
from cephcsi.sidecars.attacher.api import AttacherApi
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner import names
from cephcsi.sidecars.resizer.worker import volume_capability

log = logging.getLogger(__name__)

NODE_ID_ANNOTATION = "csi.volume.kubernetes.io/nodeid"
"""On a Node: JSON {driver: node id}, written by the kubelet's plugin registration."""


def finalizer_for(driver_name: str) -> str:
    """external-attacher's GetFinalizerName: `external-attacher/` + the driver name with every
    character outside [a-zA-Z0-9-] turned into '-', and an 'X' after a trailing '-'."""
    name = re.sub(r"[^a-zA-Z0-9-]", "-", driver_name)
    return "external-attacher/" + (name + "X" if name.endswith("-") else name)


def interim_finalizer_for(driver_name: str) -> str:
    """The name an unreleased development build used; tolerated, replaced by `finalizer_for`'s."""
    return "attacher.cephcsi/" + re.sub(r"[^a-zA-Z0-9-]", "-", driver_name).strip("-")


def node_id_of(node_name: str, driver_name: str, csinodes: Informer | None, nodes: Informer | None) -> str:
    """The node's CSI node id: its CSINode entry, the kubelet's annotation, else its name (the
    node plugin's --nodeid defaults to the node name)."""
    csinode = csinodes.get(node_name) if csinodes is not None else None
    for driver in (objects.spec(csinode).get("drivers") or []) if csinode else []:
        if driver.get("name") == driver_name and driver.get("nodeID"):
            return str(driver["nodeID"])
    node = nodes.get(node_name) if nodes is not None else None
    raw = objects.annotations_of(node).get(NODE_ID_ANNOTATION) if node else None
    if raw:
        try:
            found = json.loads(raw).get(driver_name)
        except (ValueError, AttributeError):
            found = None
        if found:
            return str(found)
    return node_name


class PublishingAttach:
    name = "publishing"

    def __init__(self, api: AttacherApi, driver_name: str, controller: ControllerServicer, calls: CsiCalls,
                 volumes: Informer, *, csinodes: Informer | None = None, nodes: Informer | None = None,
                 multi_writer: bool = True) -> None:
        self.api = api
        self.driver_name = driver_name
        self.finalizer = finalizer_for(driver_name)
        self.interim = interim_finalizer_for(driver_name)
        self.controller = controller
        self.calls = calls
        self.volumes = volumes
        self.csinodes = csinodes
        self.nodes = nodes
        self.multi_writer = multi_writer

    # ---- VolumeAttachments ---------------------------------------------------------------------

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        return objects.has_finalizer(obj, self.finalizer) or objects.has_finalizer(obj, self.interim)

    def settled(self, attachment: KubeObject) -> bool:
        return (not objects.deleting(attachment) and bool(objects.status(attachment).get("attached"))
                and objects.has_finalizer(attachment, self.finalizer)
                and not objects.has_finalizer(attachment, self.interim))

    def sync(self, attachment: KubeObject) -> None:
        if objects.deleting(attachment):
            if self._ours(attachment):
                self._detach(attachment)
            return
        if objects.status(attachment).get("attached") and self._ours(attachment):
            # Attached by this attacher or by ceph-csi's (same finalizer, same publish record):
            # external-attacher has nothing to do here either.
            self._rename_finalizer(attachment)
            return
        self._attach(attachment)

    def _rename_finalizer(self, attachment: KubeObject) -> None:
        """The interim name → external-attacher's, the new one first so it is never unguarded."""
        if not objects.has_finalizer(attachment, self.interim):
            return
        name = objects.name(attachment)
        if not objects.has_finalizer(attachment, self.finalizer):
            self.api.add_attachment_finalizer(name, self.finalizer)
        self.api.remove_attachment_finalizer(name, self.interim)
        log.info("VolumeAttachment finalizer renamed", extra=fields(
            attachment=name, old=self.interim, new=self.finalizer))

    def _attach(self, attachment: KubeObject) -> None:
        name = objects.name(attachment)
        pv = self._pv(attachment)
        if not objects.has_finalizer(attachment, self.finalizer):
            self.api.add_attachment_finalizer(name, self.finalizer)
        if objects.has_finalizer(attachment, self.interim):
            self.api.remove_attachment_finalizer(name, self.interim)
        if pv is not None and not objects.has_finalizer(pv, self.finalizer):
            self.api.add_pv_finalizer(objects.name(pv), self.finalizer)
        try:
            request = self._publish_request(attachment, pv)
            response = self.calls.run("ControllerPublishVolume", request.volume_id,
                                      lambda: self.controller.ControllerPublishVolume(request, None))
        except CephCSIError as error:
            self.api.save_attach_error(name, str(error))
            raise
        self.api.mark_attached(name, dict(response.publish_context))
        log.info("VolumeAttachment attached", extra=fields(
            attachment=name, node=objects.spec(attachment).get("nodeName"), volume=request.volume_id))

    def _detach(self, attachment: KubeObject) -> None:
        name = objects.name(attachment)
        spec = objects.spec(attachment)
        csi = self._csi_source(attachment, self._pv(attachment))
        if csi is not None:
            request = csi_pb2.ControllerUnpublishVolumeRequest(
                volume_id=str(csi.get("volumeHandle") or ""),
                node_id=node_id_of(str(spec.get("nodeName") or ""), self.driver_name, self.csinodes, self.nodes),
                secrets=self._secrets(csi, self._pv(attachment)))
            try:
                self.calls.run("ControllerUnpublishVolume", request.volume_id,
                               lambda: self.controller.ControllerUnpublishVolume(request, None))
            except CephCSIError as error:
                self.api.save_detach_error(name, str(error))
                raise
        # markAsDetached: status first, then the finalizer (and the interim name, if it is there).
        self.api.mark_detached(name)
        for finalizer in (self.finalizer, self.interim):
            if objects.has_finalizer(attachment, finalizer):
                self.api.remove_attachment_finalizer(name, finalizer)
        log.info("VolumeAttachment detached", extra=fields(attachment=name, node=spec.get("nodeName")))

    # ---- PersistentVolumes ---------------------------------------------------------------------

    def wants_volume(self, pv: Mapping[str, Any]) -> bool:
        """Only a PV sync_volume could change: being deleted, or with the interim finalizer."""
        return self._ours(pv) and (objects.deleting(pv) or objects.has_finalizer(pv, self.interim))

    def sync_volume(self, pv: Mapping[str, Any], attachments: list[KubeObject]) -> None:
        """external-attacher's PV rule: its finalizer goes once the PV is being deleted and no
        VolumeAttachment names it; before that, only the interim name is replaced."""
        name = objects.name(pv)
        present = [f for f in (self.finalizer, self.interim) if objects.has_finalizer(pv, f)]
        if not present:
            return
        if objects.deleting(pv) and not attachments:
            for finalizer in present:
                self.api.remove_pv_finalizer(name, finalizer)
            log.info("attacher finalizer removed from PV", extra=fields(pv=name))
            return
        if self.interim in present and not objects.deleting(pv):  # (no finalizer can be added then)
            if self.finalizer not in present:
                self.api.add_pv_finalizer(name, self.finalizer)
            self.api.remove_pv_finalizer(name, self.interim)
            log.info("PV finalizer renamed", extra=fields(pv=name, old=self.interim, new=self.finalizer))

    # ---- requests ------------------------------------------------------------------------------

    def _pv(self, attachment: KubeObject) -> KubeObject | None:
        pv_name = (objects.spec(attachment).get("source") or {}).get("persistentVolumeName")
        return self.volumes.get(str(pv_name)) if pv_name else None

    @staticmethod
    def _csi_source(attachment: KubeObject, pv: KubeObject | None) -> Mapping[str, Any] | None:
        if pv is not None:
            return objects.spec(pv).get("csi")
        inline = (objects.spec(attachment).get("source") or {}).get("inlineVolumeSpec") or {}
        return inline.get("csi")

    def _publish_request(self, attachment: KubeObject, pv: KubeObject | None) -> csi_pb2.ControllerPublishVolumeRequest:
        spec = objects.spec(attachment)
        pv_name = (spec.get("source") or {}).get("persistentVolumeName")
        if pv is None and pv_name:
            raise NotFound(f'PersistentVolume "{pv_name}" of VolumeAttachment "{objects.name(attachment)}" is not '
                           "in the cache yet (or was deleted); retrying")
        csi = self._csi_source(attachment, pv)
        if csi is None:
            raise InvalidArgument(f'VolumeAttachment "{objects.name(attachment)}" names no CSI volume')
        source: KubeObject = pv if pv is not None else {"spec": (spec.get("source") or {}).get("inlineVolumeSpec")}
        return csi_pb2.ControllerPublishVolumeRequest(
            volume_id=str(csi.get("volumeHandle") or ""),
            node_id=node_id_of(str(spec.get("nodeName") or ""), self.driver_name, self.csinodes, self.nodes),
            volume_capability=volume_capability(source, self.multi_writer),
            readonly=bool(csi.get("readOnly")),
            secrets=self._secrets(csi, pv),
            volume_context={str(k): str(v) for k, v in (csi.get("volumeAttributes") or {}).items()},
        )

    def secrets_of_volume(self, pv: KubeObject) -> dict[str, str]:
        return self._secrets(objects.spec(pv).get("csi") or {}, pv)

    def _secrets(self, csi: Mapping[str, Any], pv: KubeObject | None) -> dict[str, str]:
        refs: list[tuple[str, str]] = []
        for field in ("controllerPublishSecretRef",):
            ref = csi.get(field) or {}
            if ref.get("name"):
                refs.append((str(ref.get("namespace") or "default"), str(ref["name"])))
        annotations = objects.annotations_of(pv) if pv is not None else {}
        if annotations.get(names.ANN_DELETION_SECRET_NAME):
            refs.append((str(annotations.get(names.ANN_DELETION_SECRET_NAMESPACE) or "default"),
                         str(annotations[names.ANN_DELETION_SECRET_NAME])))
        ref = csi.get("nodeStageSecretRef") or {}
        if ref.get("name"):
            refs.append((str(ref.get("namespace") or "default"), str(ref["name"])))
        if not refs:
            return {}
        namespace, name = refs[0]
        try:
            return self.api.read_secret(namespace, name)
        except NotFound:
            raise NotFound(f'secret "{namespace}/{name}" for ControllerPublish/Unpublish not found') from None
