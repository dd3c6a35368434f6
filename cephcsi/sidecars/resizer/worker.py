"""The resize worker: one claim key at a time, external-resizer's steps in order, each idempotent, so
the next attempt completes whatever a crash or leader change interrupted. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.csi.controller import ControllerServicer
from cephcsi.errors import InvalidArgument, NotFound
from cephcsi.kube.clock import rfc3339_seconds
from cephcsi.kube.events import NORMAL, WARNING, EventRecorder
from cephcsi.kube.informer import Informer
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import metrics, objects
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.calls import CsiCalls, Stopping
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.outcome import describe
from cephcsi.sidecars.provisioner.request import csi_access_mode
from cephcsi.sidecars.resizer import status
from cephcsi.sidecars.resizer.api import ResizerApi

log = logging.getLogger(__name__)

Cap = csi_pb2.VolumeCapability


@dataclass
class ResizerContext:
    driver_name: str
    claims: Informer
    volumes: Informer
    api: KubeApi
    writer: ResizerApi
    events: EventRecorder
    controller: ControllerServicer
    calls: CsiCalls
    multi_writer: bool = False
    """The controller offers SINGLE_NODE_MULTI_WRITER (chooses the CSI mode of ReadWriteOnce)."""
    modify: bool = False
    """Run the VolumeAttributesClass modifier too (cephcsi.sidecars.resizer.modifier)."""


class FinalErrors:
    """Claims whose last expansion failed with a final error in this process: for them a
    lowered request is honoured even while the status still says ControllerResizeInProgress
    (external-resizer keeps the same set in memory; after a restart the next failure refills it)."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def add(self, key: str) -> None:
        with self._lock:
            self._keys.add(key)

    def discard(self, key: str) -> None:
        with self._lock:
            self._keys.discard(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys


def volume_capability(pv: KubeObject, multi_writer: bool) -> csi_pb2.VolumeCapability:
    spec = objects.spec(pv)
    modes = list(spec.get("accessModes") or ["ReadWriteOnce"])
    access = Cap.AccessMode(mode=csi_access_mode(str(modes[0]), multi_writer))
    if spec.get("volumeMode") == "Block":
        return Cap(block=Cap.BlockVolume(), access_mode=access)
    csi = spec.get("csi") or {}
    mount = Cap.MountVolume(fs_type=str(csi.get("fsType") or ""), mount_flags=list(spec.get("mountOptions") or []))
    return Cap(mount=mount, access_mode=access)


def _now() -> str:
    return rfc3339_seconds(datetime.now(timezone.utc))


class ResizeWorker:
    def __init__(self, ctx: ResizerContext, stop: threading.Event, final_errors: FinalErrors) -> None:
        self.ctx = ctx
        self.stop = stop
        self.final_errors = final_errors

    def process(self, key: str) -> None:
        with request_scope():
            claim = self.ctx.claims.get(key)
            if claim is None or not status.needs_resize(claim):
                self.final_errors.discard(key)
                return
            pv = self.ctx.volumes.get(str(objects.spec(claim).get("volumeName") or ""))
            if pv is None or not self._ours(pv, claim):
                return
            sizes = status.Sizes.of(claim, pv)
            chosen = status.plan(sizes, key in self.final_errors)
            if chosen is None:
                log.debug("no controller resize needed", extra=fields(claim=key, resize_status=sizes.resize_status))
                return
            if sizes.resize_status == status.CONTROLLER_INFEASIBLE and sizes.allocated == chosen.size:
                log.info("resize to this size was infeasible; waiting for the request to change",
                         extra=fields(claim=key, bytes=chosen.size))
                return
            self.resize(claim, pv, chosen)

    def _ours(self, pv: KubeObject, claim: KubeObject) -> bool:
        spec = objects.spec(pv)
        ref = spec.get("claimRef") or {}
        return (str((spec.get("csi") or {}).get("driver") or "") == self.ctx.driver_name
                and ref.get("uid") == objects.uid(claim) and ref.get("namespace") == objects.namespace(claim))

    def resize(self, claim: KubeObject, pv: KubeObject, chosen: status.Plan) -> None:
        key, pv_name, started = objects.key(claim), objects.name(pv), time.monotonic()
        if chosen.mark:
            claim = self.ctx.writer.patch_claim_status(claim, status.in_progress(claim, chosen.size, _now()),
                                                       check_version=True)
        self.ctx.events.event(claim, NORMAL, "Resizing", f"External resizer is resizing volume {pv_name}")
        try:
            response = self._expand(pv, chosen.size)
        except Stopping:
            raise
        except Exception as error:
            self._failed(claim, pv_name, error, started)
            raise
        self.final_errors.discard(key)
        size = response.capacity_bytes or chosen.size
        if status.Sizes.of(claim, pv).pv < size:
            self.ctx.writer.grow_pv_capacity(pv, size)
        if response.node_expansion_required:
            self.ctx.writer.patch_claim_status(claim, status.node_pending(claim, _now()), check_version=False)
            self.ctx.events.event(claim, NORMAL, "FileSystemResizeRequired", "Require file system resize of volume on node")
        else:
            self.ctx.writer.patch_claim_status(claim, status.finished(claim, size), check_version=False)
            self.ctx.events.event(claim, NORMAL, "VolumeResizeSuccessful", "Resize volume succeeded")
        metrics.OPERATIONS.labels("resize", "success").observe(time.monotonic() - started)
        log.info("volume resized by the controller", extra=fields(
            claim=key, pv=pv_name, bytes=size, node_expansion_required=response.node_expansion_required))

    def _expand(self, pv: KubeObject, size: int) -> csi_pb2.ControllerExpandVolumeResponse:
        csi: dict[str, Any] = dict(objects.spec(pv).get("csi") or {})
        request = csi_pb2.ControllerExpandVolumeRequest(
            volume_id=str(csi.get("volumeHandle") or ""),
            capacity_range=csi_pb2.CapacityRange(required_bytes=size),
            secrets=self._secrets(csi.get("controllerExpandSecretRef")),
            volume_capability=volume_capability(pv, self.ctx.multi_writer),
        )
        controller = self.ctx.controller
        return self.ctx.calls.run("ControllerExpandVolume", objects.name(pv),
                                  lambda: controller.ControllerExpandVolume(request, None), self.stop)

    def _secrets(self, ref: Any) -> dict[str, str]:
        if not ref:
            return {}
        namespace, name = str(ref.get("namespace") or ""), str(ref.get("name") or "")
        try:
            return self.ctx.api.read_secret(namespace, name)
        except NotFound:
            raise InvalidArgument(f'failed to get controller-expand secret: secret "{name}" not found in namespace '
                                  f'"{namespace}" (named by the PV\'s spec.csi.controllerExpandSecretRef)') from None

    def _failed(self, claim: KubeObject, pv_name: str, error: BaseException, started: float) -> None:
        message = f"resize volume {pv_name} failed: {describe(error)}"
        self.ctx.events.event(claim, WARNING, "VolumeResizeFailed", message)
        final = status.is_final(error)
        metrics.OPERATIONS.labels("resize", "final_error" if final else "in_progress").observe(time.monotonic() - started)
        log.warning("volume resize failed",
                    extra=fields(claim=objects.key(claim), pv=pv_name, error=describe(error), final=final))
        if not final:
            return
        self.final_errors.add(objects.key(claim))
        try:
            self.ctx.writer.patch_claim_status(
                claim, status.failed(claim, message, _now(), status.is_infeasible(error)), check_version=False)
        except Exception as patch_error:  # noqa: BLE001 - the resize error is what the caller must see
            log.warning("could not record the resize failure in the claim's status",
                        extra=fields(claim=objects.key(claim), error=str(patch_error)))
