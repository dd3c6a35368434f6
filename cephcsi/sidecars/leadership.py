"""Controller-mode loops: shared informers on every replica; provisioner, attacher and the other
leader-only loops on the Lease holder. Built from ready-made parts by cephcsi.cli.sidecar_wiring.
Losing the Lease stops every loop (handlers, queues, workers, in-process calls) before the fence
deadline and campaigns again. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kubernetes import client as k8s

from cephcsi.errors import ConfigError
from cephcsi.kube.events import EventRecorder
from cephcsi.kube.factory import InformerFactory
from cephcsi.kube.leaderelection import LeaderCallbacks, LeaderElectionConfig, LeaderElector
from cephcsi.kube.leaselock import KubeLeaseLock
from cephcsi.observability.health import HealthRegistry
from cephcsi.observability.logging import fields
from cephcsi.sidecars.calls import CsiCalls

log = logging.getLogger(__name__)

_SLOW_SYNC = 60.0
"""Seconds of loading after which the wait is worth a warning: 20,000 claims load in ~10 s."""

RequestExit = Callable[[int, str], None]
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def lease_name(driver_name: str) -> str:
    """csi-lib-utils' sanitizeName: anything but [a-zA-Z0-9-] becomes "-", no trailing "-"."""
    name = re.sub(r"[^a-zA-Z0-9-]", "-", driver_name)
    return name + "X" if name.endswith("-") else name


def lease_namespace(configured: str, sa_file: str = SERVICE_ACCOUNT_NAMESPACE) -> str:
    if configured:
        return configured
    try:
        with open(sa_file, encoding="utf-8") as handle:
            namespace = handle.read().strip()
            if namespace:
                return namespace
    except OSError:
        pass
    namespace = os.environ.get("POD_NAMESPACE", "").strip()
    if namespace:
        return namespace
    raise ConfigError(
        "leader election needs a namespace for its Lease: set --leader-election-namespace "
        "(or POD_NAMESPACE), or run in a pod, or pass --leader-election=false"
    )


class LeaderLoop(Protocol):
    """What a leader-only loop offers (ProvisionerLoop, AttacherLoop, ResizerLoop): workers
    started for one term, stopped (joined) at its end."""

    def start(self, stop: threading.Event) -> None: ...

    def stop(self, timeout: float) -> bool: ...


class ClosingLoop(LeaderLoop, Protocol):
    """A loop with an informer of its own (SnapshotterLoop), stopped once at process shutdown."""

    def close(self) -> None: ...


@dataclass
class ControllerClients:
    """The Kubernetes side the loops share. ControllerLoops owns them once handed over: it
    starts the informers and stops and closes everything in `stop`."""

    api_client: k8s.ApiClient
    factory: InformerFactory
    events: EventRecorder
    calls: CsiCalls


@dataclass
class Loops:
    """The loops chosen with --sidecars; None for one that does not run."""

    provisioner: LeaderLoop | None = None
    attacher: LeaderLoop | None = None
    resizer: LeaderLoop | None = None
    snapshotter: ClosingLoop | None = None
    groupsnapshotter: ClosingLoop | None = None
    """VolumeGroupSnapshotContents (cephcsi.sidecars.groupsnapshotter), with the snapshotter."""
    capacity: LeaderLoop | None = None
    """The provisioner's capacity tracking (--enable-capacity)."""
    reclaimspace: LeaderLoop | None = None
    """The reclaim-space schedule (cephcsi.sidecars.reclaimspace), with the provisioner."""

    def present(self) -> list[LeaderLoop]:
        """The loops present, in start order (stop order is the same: they are independent)."""
        chosen: list[LeaderLoop | None] = [self.provisioner, self.attacher, self.resizer, self.snapshotter,
                                           self.groupsnapshotter,
                                           self.capacity, self.reclaimspace]
        return [loop for loop in chosen if loop is not None]


@dataclass
class Leadership:
    """Leader election's parts: which Lease and how fast, and the lock on it. `client` is the
    lock's own API client (unthrottled), closed by ControllerLoops.stop."""

    config: LeaderElectionConfig
    lock: KubeLeaseLock
    client: k8s.ApiClient


@dataclass
class _Term:
    """The loops of one leadership term (or of the whole run without leader election)."""

    stop: threading.Event = field(default_factory=threading.Event)
    started: bool = False


class ControllerLoops:
    """Runs the loops it is given: on every term of leadership, or unconditionally when
    `leadership` is None (--leader-election=false)."""

    def __init__(self, clients: ControllerClients, loops: Loops, health: HealthRegistry,
                 request_exit: RequestExit, *, leadership: Leadership | None, shutdown_grace: float) -> None:
        self.clients = clients
        self.factory = clients.factory
        self.calls = clients.calls
        self.loops = loops
        self.health = health
        self.request_exit = request_exit
        self.leadership = leadership
        self.shutdown_grace = shutdown_grace
        self.elector: LeaderElector | None = None
        self._term_lock = threading.Lock()
        self._term: _Term | None = None
        self._unconditional: threading.Thread | None = None
        self._stopped = threading.Event()

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.factory.start()
        self.health.add_readiness("informers", self._informers_synced)
        if self.leadership is None:
            self._unconditional = threading.Thread(target=self._run_unconditionally, name="controller-loops",
                                                   daemon=True)
            self._unconditional.start()
            return
        config = self.leadership.config
        self.elector = LeaderElector(self.leadership.lock, config, LeaderCallbacks(
            on_started_leading=self._on_started_leading,
            on_stopped_leading=self._on_stopped_leading,
            on_new_leader=lambda identity: log.info("leader observed", extra=fields(leader=identity)),
        ))
        self.health.add_liveness("leader-election", self.elector.check_health)
        self.elector.start()
        log.info("leader election started", extra=fields(lease=f"{config.namespace}/{config.lease_name}",
                                                         identity=config.identity))

    def stop(self) -> None:
        """Stop the loops (releasing the Lease), then the informers and API clients."""
        self._stopped.set()
        if self.elector is not None and self.leadership is not None:
            self.elector.stop(timeout=self.leadership.config.lease_duration + self.shutdown_grace)
        else:
            self._stop_term(self.shutdown_grace)
            if self._unconditional is not None:
                self._unconditional.join(self.shutdown_grace)
        self.clients.events.stop(timeout=2.0)
        for closing in (self.loops.snapshotter, self.loops.groupsnapshotter):
            if closing is not None:
                closing.close()
        self.factory.stop(timeout=5.0)
        self.calls.shutdown()
        self.clients.api_client.close()
        if self.leadership is not None:
            self.leadership.client.close()

    # ---- leadership terms ----------------------------------------------------------------------

    def _on_started_leading(self, stop: threading.Event) -> None:
        log.info("leading: starting the controller loops once the caches are synced")
        self._start_term(stop)

    def _on_stopped_leading(self) -> None:
        # Must return only when every leader-only activity has stopped (the elector fences on it).
        self._stop_term(timeout=None)

    def _run_unconditionally(self) -> None:
        try:
            self._start_term(self._stopped)
        except Exception as error:  # noqa: BLE001 - without an elector nobody else would notice
            log.exception("controller loops failed to start")
            self.request_exit(1, f"controller loops failed to start: {error}")

    def _start_term(self, stop: threading.Event) -> None:
        term = _Term(stop=stop)
        with self._term_lock:
            self._term = term
        started, warned = time.monotonic(), False
        while not self.factory.wait_for_sync(1.0):
            if stop.is_set():
                return
            waited = time.monotonic() - started
            if not warned and waited > _SLOW_SYNC:
                log.warning("informer caches still loading; the loops start once they are complete",
                            extra=fields(waited_seconds=round(waited), informers=self.factory.unsynced()))
                warned = True
        log.info("informer caches synced", extra=fields(seconds=round(time.monotonic() - started, 2)))
        with self._term_lock:
            if stop.is_set() or self._term is not term:
                return
            for loop in self.loops.present():
                loop.start(stop)
            term.started = True

    def _stop_term(self, timeout: float | None) -> None:
        with self._term_lock:
            term, self._term = self._term, None
        if term is None:
            return
        term.stop.set()  # CSI waits and queues notice at once
        if term.started:
            for loop in self.loops.present():
                loop.stop(timeout=timeout if timeout is not None else 3600.0)
        # A call that timed out for its caller may still be running: it must end before another
        # leader can act on the same volume names.
        drained = self.calls.drain(timeout if timeout is not None else 3600.0)
        log.info("controller loops stopped", extra=fields(calls_drained=drained))

    def _informers_synced(self) -> str | None:
        waiting = [i.name for i in self.factory.informers() if not i.has_synced()]
        return f"informers not synced yet: {', '.join(waiting)}" if waiting else None
