"""The claim worker: provision a volume and its PV for a claim, or clean up after a deleted one.
The provisioning finalizer keeps the claim from going between CreateVolume and its PV, and every
step is idempotent (same name, same journal entry, same PV). Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import CephCSIError, Internal, InvalidArgument, NotFound, OperationInFlight
from cephcsi.kube.events import NORMAL, WARNING
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import metrics, objects
from cephcsi.sidecars.calls import Stopping
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner import datasource, names, secrets, topology
from cephcsi.sidecars.provisioner.claims import Action, decide, selected_node, waits_for_consumer
from cephcsi.sidecars.provisioner.context import ProvisionerContext
from cephcsi.sidecars.provisioner.names import storage_class_name
from cephcsi.sidecars.provisioner.outcome import Outcome, classify, describe
from cephcsi.sidecars.provisioner.pvspec import ClassSecrets, build
from cephcsi.sidecars.provisioner.request import plan, strip_reserved
from cephcsi.volumes.parameters import VolumeParameters

log = logging.getLogger(__name__)


class ClaimWorker:
    def __init__(self, ctx: ProvisionerContext, stop: threading.Event) -> None:
        self.ctx = ctx
        self.stop = stop
        self.finalizer = names.provisioning_finalizer(ctx.driver_name)

    def process(self, key: str) -> None:
        with request_scope():
            claim = self.ctx.claims.get(key)
            if claim is None:
                return  # gone; an unfinished one could not have gone (finalizer)
            pv_name = names.volume_name(objects.uid(claim))
            # A source claim of a clone being deleted: release it once no clone needs it.
            datasource.release_clone_protection(self.ctx, claim)
            storage_class = self.ctx.storage_class(storage_class_name(claim))
            decision = decide(claim, storage_class, self.ctx.volumes.get(pv_name) is not None, self.ctx.driver_name)
            if decision.action is Action.PROVISION and self._own_pv_exists_live(pv_name, objects.uid(claim)):
                decision = decide(claim, storage_class, True, self.ctx.driver_name)
            if decision.action is Action.SKIP:
                log.debug("claim skipped", extra=fields(claim=key, why=decision.reason))
            elif decision.action is Action.RELEASE:
                self.ctx.api.remove_pvc_finalizer(objects.namespace(claim), objects.name(claim), self.finalizer)
                log.info("provisioning finalizer released", extra=fields(claim=key, why=decision.reason))
            elif decision.action is Action.CLEANUP:
                self.cleanup(claim, storage_class, decision.reason)
            elif decision.action is Action.FAIL:
                error = InvalidArgument(decision.reason)
                self._failed(claim, error, started=time.monotonic(), storage_class=storage_class)
                raise error
            else:
                assert storage_class is not None  # decide() fails claims without a class
                self.provision(claim, storage_class)

    # ---- provisioning -----------------------------------------------------------------------------

    def provision(self, claim: KubeObject, storage_class: KubeObject) -> None:
        key = objects.key(claim)
        started = time.monotonic()
        self.ctx.events.event(claim, NORMAL, "Provisioning",
                              f'External provisioner is provisioning volume for claim "{key}"')
        try:
            pv_name = self._provision(claim, storage_class)
        except Stopping:
            raise
        except Exception as error:
            self._failed(claim, error, started, storage_class)
            raise
        if pv_name is None:
            return
        elapsed = time.monotonic() - started
        class_name = storage_class_name(claim)
        metrics.PROVISION_TOTAL.labels(class_name).inc()
        metrics.PROVISION_DURATION.labels(class_name).observe(elapsed)
        metrics.OPERATIONS.labels("provision", "success").observe(elapsed)
        self.ctx.events.event(claim, NORMAL, "ProvisioningSucceeded", f"Successfully provisioned volume {pv_name}")
        log.info("volume provisioned", extra=fields(claim=key, pv=pv_name, seconds=round(elapsed, 3)))

    def _provision(self, claim: KubeObject, storage_class: KubeObject) -> str | None:
        """Steps 1-5; the PV name, or None when the claim went away meanwhile (cleaned up)."""
        ctx = self.ctx
        planned = plan(claim, storage_class, ctx.request_options)
        class_secrets = ClassSecrets.resolve(planned.class_parameters, planned.name, claim)
        secret_values = self._read_secret(class_secrets.get(secrets.PROVISIONER))
        accessibility = self._accessibility(claim, storage_class)
        namespace, name, uid = objects.namespace(claim), objects.name(claim), objects.uid(claim)
        if not objects.has_finalizer(claim, self.finalizer):
            ctx.api.add_pvc_finalizer(namespace, name, self.finalizer)
        request = planned.to_proto(ctx.request_options, secret_values, accessibility)
        request.mutable_parameters.update(self._class_parameters(claim))
        content_source = datasource.resolve(ctx, claim, planned)
        if content_source is not None:
            request.volume_content_source.CopyFrom(content_source)
        response = ctx.calls.run("CreateVolume", planned.name,
                                 lambda: ctx.controller.CreateVolume(request, None), self.stop)
        volume = response.volume
        if volume.capacity_bytes and volume.capacity_bytes < planned.required_bytes:
            raise Internal(f"created volume has {volume.capacity_bytes} bytes, less than the "
                           f"{planned.required_bytes} requested")
        current = ctx.claim_by_uid(objects.key(claim), uid)
        if current is None or objects.deleting(current):
            self.cleanup(current or claim, storage_class, "claim was deleted while its volume was being created")
            return None
        pv = build(claim, storage_class, planned, volume, class_secrets, ctx.pv_options)
        if ctx.api.create_pv(pv) is None:
            self._adopt(planned.name, uid)
        ctx.api.remove_pvc_finalizer(namespace, name, self.finalizer)
        datasource.release_after_clone(ctx, claim)
        return planned.name

    def _own_pv_exists_live(self, pv_name: str, uid: str) -> bool:
        """Whether the API server already has this claim's PV although the informer has not.

        An update of the claim right after our PV create (the PV controller's annotations, our
        finalizer removal) can reach the worker before the PV's own watch event. Provisioning
        again would be harmless (CreateVolume is idempotent and the PV is adopted) but would count
        and report a second provisioning. A PV of another claim under this name is left to the
        provisioning path, which reports it.
        """
        existing = self.ctx.api.get_pv(pv_name)
        return existing is not None and _claim_uid(existing) == uid

    def _adopt(self, pv_name: str, uid: str) -> None:
        existing = self.ctx.api.get_pv(pv_name)
        if existing is None:
            raise OperationInFlight(f"PersistentVolume {pv_name} exists and vanished again; retry")
        owner = _claim_uid(existing)
        if owner != uid:
            raise Internal(f"PersistentVolume {pv_name} exists but belongs to claim uid {owner!r}, not {uid!r}")
        log.info("adopted an existing PV (created by an earlier attempt)", extra=fields(pv=pv_name))

    def _class_parameters(self, claim: KubeObject) -> dict[str, str]:
        """The parameters of the claim's VolumeAttributesClass (CreateVolume's
        mutable_parameters); a class that does not exist (yet) or is another driver's fails
        the attempt, retried as external-provisioner retries it."""
        name = str(objects.spec(claim).get("volumeAttributesClassName") or "")
        if not name:
            return {}
        vac = self.ctx.api.get_volume_attributes_class(name)
        if vac is None:
            raise NotFound(f"VolumeAttributesClass {name!r} named by the claim does not exist")
        driver = str(vac.get("driverName") or "")
        if driver != self.ctx.driver_name:
            raise InvalidArgument(f"VolumeAttributesClass {name!r} is for driver {driver!r}, not {self.ctx.driver_name!r}")
        return {str(k): str(v) for k, v in (vac.get("parameters") or {}).items()}

    def _read_secret(self, ref: secrets.SecretRef | None) -> dict[str, str]:
        if ref is None:
            return {}
        try:
            return self.ctx.api.read_secret(ref.namespace, ref.name)
        except NotFound:
            raise InvalidArgument(f'failed to get secrets: secrets "{ref.name}" not found in namespace '
                                  f'"{ref.namespace}"') from None

    def _accessibility(self, claim: KubeObject, storage_class: KubeObject) -> csi_pb2.TopologyRequirement | None:
        ctx = self.ctx
        if not ctx.pv_options.topology or ctx.nodes is None or ctx.csinodes is None:
            return None
        node_name = selected_node(claim)
        if node_name:
            node = ctx.nodes.get(node_name)
            if node is None:
                raise NotFound(f'failed to get target node: node "{node_name}" not found')
        else:
            node = None
        nodes, csinodes = ctx.nodes, ctx.csinodes
        pairs = ((n, csinodes.get(objects.name(n)) or {}) for n in nodes.list())
        return topology.requirement(ctx.driver_name, storage_class, node,
                                    ctx.csinodes.get(node_name) if node_name else None, pairs,
                                    ctx.topology_policy, objects.name(claim))

    def _failed(self, claim: KubeObject, error: BaseException, started: float,
                storage_class: KubeObject | None = None) -> None:
        class_name = storage_class_name(claim)
        may_reschedule = waits_for_consumer(storage_class) and bool(selected_node(claim))
        outcome = classify(error, may_reschedule)
        metrics.PROVISION_FAILED.labels(class_name).inc()
        metrics.OPERATIONS.labels("provision", _OUTCOME_LABELS[outcome]).observe(time.monotonic() - started)
        message = f'failed to provision volume with StorageClass "{class_name}": {describe(error)}'
        self.ctx.events.event(claim, WARNING, "ProvisioningFailed", message)
        log.warning("provisioning failed", exc_info=not isinstance(error, CephCSIError),
                    extra=fields(claim=objects.key(claim), outcome=outcome.value, error=describe(error)))
        if outcome is Outcome.RESCHEDULE:
            # The node has no room: let the scheduler pick another (its removal re-queues the claim).
            self.ctx.api.remove_pvc_annotation(objects.namespace(claim), objects.name(claim), names.ANN_SELECTED_NODE)
            log.info("selected node cleared to reschedule", extra=fields(claim=objects.key(claim)))

    # ---- clean-up of claims deleted before their PV existed --------------------------------------

    def cleanup(self, claim: KubeObject, storage_class: KubeObject | None, why: str) -> None:
        key, pv_name = objects.key(claim), names.volume_name(objects.uid(claim))
        if self.ctx.calls.busy(pv_name):
            raise OperationInFlight(f"a CSI call for {pv_name} is still running; clean-up waits for it")
        if self.ctx.api.get_pv(pv_name) is not None:
            # The PV exists after all (our cache was behind): the PV's reclaim policy decides.
            self._release(claim)
            return
        started = time.monotonic()
        try:
            deleted = self._delete_orphan(claim, storage_class, pv_name)
        except _CannotClean as error:
            metrics.CLEANUPS.labels("abandoned").inc()
            self.ctx.events.event(claim, WARNING, "ProvisioningCleanupFailed",
                                  f"volume {pv_name} may remain in the Ceph pool: {error}")
            log.error("cannot clean up after a deleted claim; releasing it anyway",
                      extra=fields(claim=key, volume=pv_name, error=str(error)))
            self._release(claim)
            return
        except Stopping:
            raise
        except Exception as error:
            metrics.CLEANUPS.labels("error").inc()
            log.warning("clean-up after a deleted claim failed; will retry",
                        extra=fields(claim=key, volume=pv_name, error=describe(error)))
            raise
        metrics.CLEANUPS.labels("deleted" if deleted else "nothing").inc()
        metrics.OPERATIONS.labels("cleanup", "success").observe(time.monotonic() - started)
        log.info("claim deleted before its PV existed: cleaned up", extra=fields(
            claim=key, volume=pv_name, volume_deleted=deleted, why=why))
        self._release(claim)

    def _delete_orphan(self, claim: KubeObject, storage_class: KubeObject | None, pv_name: str) -> bool:
        ctx = self.ctx
        if storage_class is None:
            raise _CannotClean(f'StorageClass "{storage_class_name(claim)}" is gone, so the pool is unknown')
        class_parameters = {str(k): str(v) for k, v in (storage_class.get("parameters") or {}).items()}
        try:
            parameters = VolumeParameters.parse(strip_reserved(class_parameters))
            ref = secrets.secret_ref(secrets.PROVISIONER, class_parameters, pv_name, claim)
        except InvalidArgument:
            return False  # CreateVolume refuses such a class: nothing was created
        secret_values: dict[str, str] = {}
        if ref is not None:  # a class without a provisioner secret: the call goes without one
            try:
                secret_values = ctx.api.read_secret(ref.namespace, ref.name)
            except NotFound:
                raise _CannotClean(f'provisioner secret "{ref.namespace}/{ref.name}" is gone') from None
        volume_id = ctx.controller.find_volume(pv_name, parameters, Credentials.from_secrets(secret_values))
        if volume_id is None:
            return False
        request = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=secret_values)
        ctx.calls.run("DeleteVolume", pv_name, lambda: ctx.controller.DeleteVolume(request, None), self.stop)
        return True

    def _release(self, claim: Mapping[str, Any]) -> None:
        # Unconditional: the object we hold may predate our own finalizer patch, and removing an
        # absent finalizer is a no-op patch.
        self.ctx.api.remove_pvc_finalizer(objects.namespace(claim), objects.name(claim), self.finalizer)


def _claim_uid(pv: KubeObject) -> str:
    return str((objects.spec(pv).get("claimRef") or {}).get("uid") or "")


class _CannotClean(Exception):
    """What is needed to find or delete the volume is gone; retrying cannot help."""


_OUTCOME_LABELS = {Outcome.IN_PROGRESS: "in_progress", Outcome.RESCHEDULE: "rescheduled", Outcome.FINAL: "final_error"}
