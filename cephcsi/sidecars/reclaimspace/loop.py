"""The reclaim-space schedule loop (controller leader only).

Every --reclaimspace-poll-interval, for each cached claim whose schedule is due: sparsify its
image through the CSI call pool, then record `reclaimspace.cephcsi.ceph.io/last-run` and
`…/last-result` on the claim (one merge patch) with an Event; nodes trim from that record.
One volume at a time; an unwritten record is retried before that claim is sparsified again.
Why: docs/design/sidecars.md, "sidecars/reclaimspace/loop.py".
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cephcsi.ceph import sparsify
from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import CephCSIError, FailedPrecondition
from cephcsi.kube.events import NORMAL, WARNING, EventRecorder
from cephcsi.kube.informer import Informer
from cephcsi.observability.logging import fields
from cephcsi.sidecars import objects
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.calls import CsiCalls, Stopping
from cephcsi.sidecars.provisioner import secrets
from cephcsi.sidecars.reclaimspace import due
from cephcsi.sidecars.reclaimspace.api import ReclaimApi
from cephcsi.volumes import reclaim

log = logging.getLogger(__name__)
_NAMESPACES_PATIENCE = 60.0
"""Seconds the Namespace informer may take to list before a warning says why claims wait."""

Sparsify = Callable[[str, Credentials], sparsify.Sparsified]


@dataclass
class ReclaimContext:
    driver_name: str
    claims: Informer
    volumes: Informer
    classes: Informer
    api: KubeApi
    writer: ReclaimApi
    events: EventRecorder
    calls: CsiCalls
    sparsify: Sparsify
    poll_interval: float = 60.0
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    namespaces: Informer | None = None
    """Namespaces, for their schedule annotation (None: only claims' and classes' schedules).
    This loop's own informer, started with the loop and not one of the factory's: the factory's
    all gate every controller loop on their sync, and an install whose ClusterRole predates the
    namespaces grant would never sync it (provisioning would stop for the sake of a schedule)."""


class ReclaimSpaceLoop:
    def __init__(self, ctx: ReclaimContext) -> None:
        self.ctx = ctx
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._refused: set[tuple[str, str]] = set()
        """(claim uid, schedule) already reported as unreadable: one Warning, not one per poll."""
        self._unrecorded: dict[str, _Record] = {}
        """Claim uid → the run whose record (patch and event) has not been written yet."""
        self._namespaces_since = 0.0
        """Monotonic time the Namespace informer was started (0: not yet)."""
        self._namespaces_warned = False

    def start(self, stop: threading.Event) -> None:
        self._stop = stop
        if self.ctx.namespaces is not None and not self._namespaces_since:
            # Kept across leadership terms (an Informer does not restart after stop()); its
            # threads are daemons that end with the process.
            self.ctx.namespaces.start()
            self._namespaces_since = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="reclaimspace", daemon=True)
        self._thread.start()
        log.info("reclaim-space schedule started", extra=fields(poll_seconds=self.ctx.poll_interval))

    def stop(self, timeout: float) -> bool:
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as error:  # noqa: BLE001 - the loop outlives one bad pass
                log.error("reclaim-space pass failed", extra=fields(error=str(error)))
            self._stop.wait(self.ctx.poll_interval)

    def reconcile(self) -> list[str]:
        """One pass; the claims (namespace/name) whose run was recorded."""
        ctx = self.ctx
        now = ctx.now()
        done: list[str] = []
        claims = sorted(ctx.claims.list(), key=objects.key)
        present = {objects.uid(claim) for claim in claims}
        namespace_of = self._namespace_lookup()
        for uid in [uid for uid in self._unrecorded if uid not in present]:
            del self._unrecorded[uid]  # the claim is gone: nothing to record on
        for claim in claims:
            if self._stop.is_set():
                break
            pending = self._unrecorded.get(objects.uid(claim))
            if pending is not None:
                if self._record(pending):
                    done.append(pending.claim_key)
                continue  # recorded now, or still not: either way not run again this pass
            decision = due.decide(claim, ctx.driver_name, _getter(ctx.volumes), _getter(ctx.classes), now,
                                  namespace_of=namespace_of)
            if isinstance(decision, due.Refused):
                self._refuse(decision)
            elif isinstance(decision, due.Due):
                if self._run_one(decision, now):
                    done.append(decision.claim_key)
        return done

    def _namespace_lookup(self) -> due.KubeLookup | None:
        """The Namespace lookup for this pass; None while the Namespace informer waits for its
        first list (a claim without its own schedule waits too, as its Namespace's may override
        its class's). Past the patience the Namespaces count as unannotated: an install upgraded
        without the new RBAC keeps its claims' and classes' schedules (the order before Namespace
        schedules existed) instead of stopping every class-scheduled claim."""
        ctx = self.ctx
        if ctx.namespaces is None:
            return _nothing
        if ctx.namespaces.has_synced():
            return _getter(ctx.namespaces)
        if self._namespaces_since and time.monotonic() - self._namespaces_since > _NAMESPACES_PATIENCE:
            if not self._namespaces_warned:
                self._namespaces_warned = True
                log.warning("reclaim space: Namespaces cannot be listed, so Namespace schedules are ignored (claim "
                            "and StorageClass schedules apply); grant the controller get/list/watch on namespaces "
                            "(deploy/controller-rbac.yaml)",
                            extra=fields(waited_seconds=round(time.monotonic() - self._namespaces_since)))
            return _nothing
        return None

    def _refuse(self, refused: due.Refused) -> None:
        marker = (objects.uid(refused.claim), refused.schedule)
        if marker in self._refused:
            return
        self._refused.add(marker)
        log.warning("reclaim-space schedule refused", extra=fields(claim=refused.claim_key, error=refused.reason))
        self.ctx.events.event(refused.claim, WARNING, "ReclaimSpaceScheduleInvalid", refused.reason)

    def _run_one(self, item: due.Due, now: datetime) -> bool:
        """Run and record one due claim; False when nothing was recorded (yet)."""
        ctx = self.ctx
        try:
            credentials = self._credentials(item)
            result = ctx.calls.run("ReclaimSpace", item.volume_id,
                                   lambda: ctx.sparsify(item.volume_id, credentials), self._stop)
        except Stopping:
            return False  # the term ends: nothing recorded, the next leader runs it
        except CephCSIError as error:
            outcome, event_type, message = f"error: {error.message}", WARNING, error.message
            log.warning("reclaim space failed", extra=fields(claim=item.claim_key, error=error.message))
        else:
            if result.encrypted:
                outcome = "skipped: encrypted (its ciphertext holds no zeros to return)"
            elif result.in_use:
                outcome = "skipped: in use (the node that stages it trims it)"
            else:
                outcome = f"reclaimed {result.reclaimed}"
            event_type, message = NORMAL, f"reclaim space: {outcome}"
        return self._record(_Record(item.claim_key, item.claim, now, outcome, event_type, message))

    def _record(self, run: _Record) -> bool:
        """Write the run's record on its claim; False (kept for the next pass) when the patch fails."""
        claim = run.claim
        try:
            self.ctx.writer.annotate_claim(objects.namespace(claim), objects.name(claim), {
                reclaim.LAST_RUN_ANNOTATION: reclaim.format_time(run.when), reclaim.RESULT_ANNOTATION: run.outcome})
        except Exception as error:  # noqa: BLE001 - one claim's failed patch must not end the pass
            self._unrecorded[objects.uid(claim)] = run
            log.warning("reclaim-space run not recorded on its claim; written again on the next pass",
                        extra=fields(claim=run.claim_key, error=getattr(error, "message", str(error))))
            return False
        self._unrecorded.pop(objects.uid(claim), None)
        self.ctx.events.event(claim, run.event_type,
                              "ReclaimSpace" if run.event_type == NORMAL else "ReclaimSpaceFailed", run.message)
        return True

    def _credentials(self, item: due.Due) -> Credentials:
        """The PV's controller-expand Secret (already resolved on the PV), else the class's
        provisioner Secret resolved for this claim: ceph-csi's controller calls use either."""
        csi = objects.spec(item.pv).get("csi") or {}
        ref = csi.get("controllerExpandSecretRef") or {}
        if ref.get("name") and ref.get("namespace"):
            return Credentials.from_secrets(self.ctx.api.read_secret(str(ref["namespace"]), str(ref["name"])))
        parameters = {str(k): str(v) for k, v in (item.storage_class.get("parameters") or {}).items()}
        found = secrets.secret_ref(secrets.PROVISIONER, parameters, objects.name(item.pv), item.claim)
        if found is None:
            raise FailedPrecondition(
                f"neither the PersistentVolume {objects.name(item.pv)} (controllerExpandSecretRef) nor its "
                "StorageClass (provisioner secret) names a Secret to sparsify the volume with")
        return Credentials.from_secrets(self.ctx.api.read_secret(found.namespace, found.name))


@dataclass(frozen=True)
class _Record:
    """One run's record, as it is written on the claim."""

    claim_key: str
    claim: Mapping[str, Any]
    when: datetime
    outcome: str
    event_type: str
    message: str


def _nothing(name: str) -> Mapping[str, Any] | None:
    return None


def _getter(informer: Informer) -> Callable[[str], Mapping[str, Any] | None]:
    def get(name: str) -> Mapping[str, Any] | None:
        return informer.get(name) if name else None
    return get
