"""The modify worker: one claim key at a time, external-resizer v2's VolumeAttributesClass steps.

Decide → read the class → InProgress (resourceVersion-guarded) → ControllerModifyVolume with
the class's parameters and the controller-modify (else controller-expand) secret → the PV's and
the claim's class recorded. Idempotent across crashes and leader changes; INVALID_ARGUMENT is
Infeasible. Steps and error handling: docs/design/sidecars.md, "sidecars/resizer/modifier.py".
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.errors import FailedPrecondition, InvalidArgument, NotFound
from cephcsi.kube.clock import rfc3339_seconds
from cephcsi.kube.events import NORMAL, WARNING
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import metrics, objects
from cephcsi.sidecars.calls import Stopping
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.outcome import describe
from cephcsi.sidecars.resizer import modify_status as ms
from cephcsi.sidecars.resizer.worker import ResizerContext

log = logging.getLogger(__name__)

ANN_MODIFY_SECRET_NAME = "volume.kubernetes.io/controller-modify-secret-name"
ANN_MODIFY_SECRET_NAMESPACE = "volume.kubernetes.io/controller-modify-secret-namespace"
INFEASIBLE_RETRY_SECONDS = 300.0
"""An Infeasible class is tried again after this long (external-resizer's slow set), or at once
when the claim's spec names another class."""


def _now() -> str:
    return rfc3339_seconds(datetime.now(timezone.utc))


class ModifyMemory:
    """What external-resizer keeps in memory: claims whose last call may have half-applied
    their class (finish that class first), and when a class last proved infeasible."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.uncertain: set[str] = set()
        self.infeasible_at: dict[str, float] = {}

    def is_uncertain(self, key: str) -> bool:
        with self._lock:
            return key in self.uncertain

    def note(self, key: str, uncertain: bool, infeasible: bool) -> None:
        with self._lock:
            (self.uncertain.add if uncertain else self.uncertain.discard)(key)
            if infeasible:
                self.infeasible_at[key] = time.monotonic()
            else:
                self.infeasible_at.pop(key, None)

    def recently_infeasible(self, key: str) -> bool:
        with self._lock:
            at = self.infeasible_at.get(key)
        return at is not None and time.monotonic() - at < INFEASIBLE_RETRY_SECONDS


class ModifyWorker:
    def __init__(self, ctx: ResizerContext, stop: threading.Event, memory: ModifyMemory) -> None:
        self.ctx = ctx
        self.stop = stop
        self.memory = memory

    def process(self, key: str) -> None:
        with request_scope():
            claim = self.ctx.claims.get(key)
            if claim is None or not ms.needs_modify(claim):
                return
            pv = self.ctx.volumes.get(str(objects.spec(claim).get("volumeName") or ""))
            if pv is None or not self._ours(pv, claim):
                return
            classes = ms.Classes.of(claim)
            step = ms.decide(classes, self.memory.is_uncertain(key))
            if step.kind == "none":
                return
            if step.kind == "rolled-back":
                if ms.has_modifying_condition(claim):
                    self.ctx.events.event(claim, NORMAL, ms.EVENT_CANCELLED, "Cancelled modify.")
                    self.ctx.writer.patch_claim_status(claim, ms.rolled_back(claim), check_version=False)
                return
            if (classes.state == ms.INFEASIBLE and classes.target == step.vac
                    and self.memory.recently_infeasible(key)):
                log.debug("class was infeasible; retried later or when the claim changes", extra=fields(claim=key))
                return
            self.modify(claim, pv, step.vac)

    def _ours(self, pv: KubeObject, claim: KubeObject) -> bool:
        spec = objects.spec(pv)
        ref = spec.get("claimRef") or {}
        return (str((spec.get("csi") or {}).get("driver") or "") == self.ctx.driver_name
                and ref.get("uid") == objects.uid(claim) and ref.get("namespace") == objects.namespace(claim))

    def modify(self, claim: KubeObject, pv: KubeObject, vac_name: str) -> None:
        key, started = objects.key(claim), time.monotonic()
        # Read by name when needed, not cached by an informer: the loops' start waits for every
        # informer, so a cluster without the v1 API (or a Role without the rule) would stall
        # every loop; this way only class changes fail, with the API's error.
        vac = self.ctx.api.get_volume_attributes_class(vac_name)
        if vac is None:
            message = f"VAC {vac_name!r} does not exist."
            self.ctx.events.event(claim, WARNING, ms.EVENT_FAILED, message)
            if ms.Classes.of(claim).state != ms.IN_PROGRESS:
                self.ctx.writer.patch_claim_status(claim, ms.marked(claim, ms.PENDING, vac_name, _now()),
                                                   check_version=True)
            raise NotFound(f"VolumeAttributesClass {vac_name!r} does not exist (claim {key} waits for it)")
        claim = self.ctx.writer.patch_claim_status(claim, ms.marked(claim, ms.IN_PROGRESS, vac_name, _now()),
                                                   check_version=True)
        self.ctx.events.event(claim, NORMAL, ms.EVENT_MODIFY,
                              f"external resizer is modifying volume {objects.name(claim)} with vac {vac_name}")
        try:
            driver = str(vac.get("driverName") or "")
            if driver != self.ctx.driver_name:
                raise InvalidArgument(f"VolumeAttributesClass {vac_name!r} is for driver {driver!r}, "
                                      f"not {self.ctx.driver_name!r}")
            self._call(pv, {str(k): str(v) for k, v in (vac.get("parameters") or {}).items()})
        except Stopping:
            raise
        except Exception as error:
            self._failed(claim, vac_name, error, started)
            raise
        self.memory.note(key, uncertain=False, infeasible=False)
        # The PV first: a crash between the two leaves the claim InProgress, and the retry
        # repeats both (external-resizer's order).
        self.ctx.writer.set_pv_class(pv, vac_name)
        self.ctx.writer.patch_claim_status(claim, ms.completed(claim, vac_name), check_version=False)
        self.ctx.events.event(claim, NORMAL, ms.EVENT_SUCCESS,
                              f"external resizer modified volume {objects.name(claim)} with vac {vac_name} successfully")
        metrics.OPERATIONS.labels("modify", "success").observe(time.monotonic() - started)
        log.info("volume modified", extra=fields(claim=key, pv=objects.name(pv), vac=vac_name))

    def _call(self, pv: KubeObject, parameters: dict[str, str]) -> None:
        csi: dict[str, Any] = dict(objects.spec(pv).get("csi") or {})
        request = csi_pb2.ControllerModifyVolumeRequest(
            volume_id=str(csi.get("volumeHandle") or ""), mutable_parameters=parameters, secrets=self._secrets(pv))
        controller = self.ctx.controller
        self.ctx.calls.run("ControllerModifyVolume", objects.name(pv),
                           lambda: controller.ControllerModifyVolume(request, None), self.stop)

    def _secrets(self, pv: KubeObject) -> dict[str, str]:
        annotations = objects.meta(pv).get("annotations") or {}
        name, namespace = annotations.get(ANN_MODIFY_SECRET_NAME), annotations.get(ANN_MODIFY_SECRET_NAMESPACE)
        what = "the PV's controller-modify-secret annotations"
        if not name:
            ref = objects.spec(pv).get("csi", {}).get("controllerExpandSecretRef") or {}
            name, namespace = ref.get("name"), ref.get("namespace")
            what = "the PV's spec.csi.controllerExpandSecretRef"
        if not name:
            return {}
        try:
            return self.ctx.api.read_secret(str(namespace or ""), str(name))
        except NotFound:
            raise FailedPrecondition(f'failed to get controller-modify secret: secret "{name}" not found in namespace '
                                     f'"{namespace}" (named by {what})') from None

    def _failed(self, claim: KubeObject, vac_name: str, error: BaseException, started: float) -> None:
        key = objects.key(claim)
        message = describe(error)
        final, infeasible = ms.is_final(error), ms.is_infeasible(error)
        self.memory.note(key, uncertain=not final, infeasible=infeasible)
        metrics.OPERATIONS.labels("modify", "final_error" if final else "in_progress").observe(
            time.monotonic() - started)
        log.warning("volume modify failed", extra=fields(claim=key, vac=vac_name, error=message, final=final))
        self.ctx.events.event(claim, WARNING, ms.EVENT_FAILED,
                              message if final else f"{message}. Still modifying to VAC {vac_name}")
        try:
            update = (ms.marked(claim, ms.INFEASIBLE, vac_name, _now(), message) if infeasible
                      else ms.retry_error(claim, message, _now()))
            self.ctx.writer.patch_claim_status(claim, update, check_version=False)
        except Exception as patch_error:  # noqa: BLE001 - the modify error is what the caller must see
            log.warning("could not record the modify failure in the claim's status",
                        extra=fields(claim=key, error=str(patch_error)))
