"""Controller-mode loops: shared informers on every replica, provisioner and attacher on the leader.

Start-up (`start_controller_loops`): one API client for the controllers (--kube-api-qps/burst)
and a separate unthrottled one for the Lease (a saturated limiter must never delay a renewal);
shared informers for PVCs, PVs, StorageClasses and VolumeAttachments (+ Nodes and CSINodes when
the plugin reports topology) are started at once on every replica, so a standby's caches are
warm and a failover costs a Lease hand-over, not a relist. /readyz gets "informers synced";
/healthz gets the leader elector's health.

Leadership (cephcsi.kube.leaderelection, Lease `<driver name sanitised>` in
--leader-election-namespace, else the pod's namespace): on acquiring the Lease the loops wait
for the caches, then start their workers. On losing it we stop the loops and campaign again
rather than exit (the choice leaderelection.py documents: this process also serves CSI calls and
holds warm caches). Stopping a loop means: handlers removed, queues shut down, workers joined,
and every in-process CSI call still running drained (cephcsi.sidecars.calls), all before the
fence deadline; if that cannot be done in time the elector exits the process, which is the
only way to guarantee no leader-only work continues. Graceful stop releases the Lease so a
standby takes over at its next poll. --leader-election=false runs the loops unconditionally.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kubernetes import client as k8s

from cephcsi._generated import csi_pb2
from cephcsi.errors import ConfigError
from cephcsi.kube.client import ClientSettings, ThrottledApiClient, new_api_client
from cephcsi.kube.errors import KubeError
from cephcsi.kube.events import EventRecorder, EventSettings
from cephcsi.kube.factory import InformerFactory
from cephcsi.kube.informer import Informer
from cephcsi.kube.leaderelection import LeaderCallbacks, LeaderElectionConfig, LeaderElector
from cephcsi.kube.leaselock import KubeLeaseLock
from cephcsi.kube.ratelimit import ItemBackoffSettings
from cephcsi.observability.health import HealthRegistry
from cephcsi.observability.logging import fields
from cephcsi.settings import Settings
from cephcsi.sidecars import kubeerrors
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.attacher import strategy as attach_strategy
from cephcsi.sidecars.attacher.controller import AttacherLoop
from cephcsi.sidecars.attacher.legacy import LegacyTakeover
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.provisioner.context import ProvisionerContext, provisioner_identity
from cephcsi.sidecars.provisioner.controller import ProvisionerLoop
from cephcsi.sidecars.provisioner.pvspec import PVOptions
from cephcsi.sidecars.provisioner.request import RequestOptions
from cephcsi.sidecars.resizer.api import ResizerApi
from cephcsi.sidecars.resizer.controller import ResizerLoop
from cephcsi.sidecars.resizer.worker import ResizerContext
from cephcsi.sidecars.snapshotter.api import SnapshotApi
from cephcsi.sidecars.snapshotter.content import SnapshotterContext
from cephcsi.sidecars.snapshotter.controller import SnapshotterLoop

if TYPE_CHECKING:
    from cephcsi.csi.services import Services

log = logging.getLogger(__name__)

RequestExit = Callable[[int, str], None]
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_RPC = csi_pb2.ControllerServiceCapability.RPC
_SERVICE = csi_pb2.PluginCapability.Service
# Worker threads of the attacher: its work is one small patch per attachment, so the
# provisioner-sized --worker-threads (100) would only add idle threads (external-attacher: 10).
ATTACHER_WORKERS = 10
# Resizer workers: external-resizer's default (--workers 10); resizes are rare and short.
RESIZER_WORKERS = 10
# Snapshotter workers: csi-snapshotter's default (--worker-threads 10).
SNAPSHOTTER_WORKERS = 10


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


@dataclass
class _Term:
    """The loops of one leadership term (or of the whole run without leader election)."""

    stop: threading.Event = field(default_factory=threading.Event)
    started: bool = False


class ControllerLoops:
    def __init__(self, settings: Settings, services: Services, health: HealthRegistry,
                 request_exit: RequestExit, loops: set[str]) -> None:
        if services.controller is None:
            raise ConfigError("the provisioner and attacher need the Controller service (--mode=controller or all)")
        self.settings = settings
        self.sidecar = settings.sidecars
        self.services = services
        self.health = health
        self.request_exit = request_exit
        self.loops = loops
        kubeconfig = self.sidecar.kubeconfig or None
        self.api_client = _api_client(ClientSettings(
            kubeconfig=kubeconfig, qps=self.sidecar.kube_api_qps, burst=self.sidecar.kube_api_burst, timeout=15.0))
        self.lease_client: k8s.ApiClient | None = None
        self.factory = InformerFactory(self.api_client)
        self.events = EventRecorder(self.api_client, EventSettings(component=settings.driver_name))
        self.calls = CsiCalls(max_workers=self.sidecar.worker_threads, timeout=self.sidecar.timeout)
        self.api = KubeApi(self.api_client)
        backoff = ItemBackoffSettings(self.sidecar.retry_interval_start,
                                      max(self.sidecar.retry_interval_start, self.sidecar.retry_interval_max))
        self.provisioner = self._provisioner(backoff) if "provisioner" in loops else None
        self.attacher = self._attacher(backoff) if "attacher" in loops else None
        self.resizer = self._resizer(backoff) if "resizer" in loops else None
        self.snapshotter = self._snapshotter(backoff) if "snapshotter" in loops else None
        self.elector: LeaderElector | None = None
        self._term_lock = threading.Lock()
        self._term: _Term | None = None
        self._unconditional: threading.Thread | None = None
        self._stopped = threading.Event()

    # ---- construction -----------------------------------------------------------------------------

    def _provisioner(self, backoff: ItemBackoffSettings) -> ProvisionerLoop:
        controller = self.services.controller
        assert controller is not None
        caps = controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest(), None).capabilities
        multi_writer = any(c.rpc.type == _RPC.SINGLE_NODE_MULTI_WRITER for c in caps)
        plugin_caps = self.services.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), None)
        use_topology = any(c.service.type == _SERVICE.VOLUME_ACCESSIBILITY_CONSTRAINTS for c in plugin_caps.capabilities)
        driver = self.settings.driver_name
        ctx = ProvisionerContext(
            driver_name=driver,
            claims=self.factory.persistent_volume_claims(),
            volumes=self.factory.persistent_volumes(),
            classes=self.factory.storage_classes(),
            attachments=self.factory.volume_attachments(),
            api=self.api,
            events=self.events,
            controller=controller,
            calls=self.calls,
            request_options=RequestOptions(driver, self.sidecar.default_fstype, self.sidecar.extra_create_metadata,
                                           multi_writer),
            pv_options=PVOptions(driver, provisioner_identity(driver), use_topology),
            nodes=self.factory.nodes() if use_topology else None,
            csinodes=self.factory.csi_nodes() if use_topology else None,
            snapshots=SnapshotApi(self.api_client),
        )
        return ProvisionerLoop(ctx, workers=self.sidecar.worker_threads, backoff=backoff)

    def _attacher(self, backoff: ItemBackoffSettings) -> AttacherLoop:
        controller = self.services.controller
        assert controller is not None
        caps = controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest(), None).capabilities
        chosen = attach_strategy.choose(caps, self.api)
        attachments = self.factory.volume_attachments()
        # Finalizers left by ceph-csi >= 3.15's csi-attacher are taken over (attacher/legacy.py).
        takeover = LegacyTakeover(self.api, self.settings.driver_name, attachments)
        return AttacherLoop(self.settings.driver_name, attachments, chosen,
                            workers=min(self.sidecar.worker_threads, ATTACHER_WORKERS), backoff=backoff,
                            volumes=self.factory.persistent_volumes(), takeover=takeover)

    def _resizer(self, backoff: ItemBackoffSettings) -> ResizerLoop:
        controller = self.services.controller
        assert controller is not None
        caps = controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest(), None).capabilities
        ctx = ResizerContext(
            driver_name=self.settings.driver_name,
            claims=self.factory.persistent_volume_claims(),
            volumes=self.factory.persistent_volumes(),
            api=self.api,
            writer=ResizerApi(self.api_client),
            events=self.events,
            controller=controller,
            calls=self.calls,
            multi_writer=any(c.rpc.type == _RPC.SINGLE_NODE_MULTI_WRITER for c in caps),
        )
        return ResizerLoop(ctx, workers=min(self.sidecar.worker_threads, RESIZER_WORKERS), backoff=backoff)

    def _snapshotter(self, backoff: ItemBackoffSettings) -> SnapshotterLoop:
        controller = self.services.controller
        assert controller is not None
        snapshots = SnapshotApi(self.api_client)
        ctx = SnapshotterContext(
            driver_name=self.settings.driver_name,
            contents=Informer(snapshots.list_contents, name="volumesnapshotcontents"),
            snapshots=snapshots,
            api=self.api,
            events=self.events,
            controller=controller,
            calls=self.calls,
            extra_create_metadata=self.sidecar.extra_create_metadata,
        )
        return SnapshotterLoop(ctx, workers=min(self.sidecar.worker_threads, SNAPSHOTTER_WORKERS), backoff=backoff)

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.factory.start()
        self.health.add_readiness("informers", self._informers_synced)
        if not self.sidecar.leader_election:
            self._unconditional = threading.Thread(target=self._run_unconditionally, name="controller-loops",
                                                   daemon=True)
            self._unconditional.start()
            return
        config = LeaderElectionConfig(
            lease_name=lease_name(self.settings.driver_name),
            namespace=lease_namespace(self.sidecar.leader_election_namespace),
            lease_duration=self.sidecar.lease_duration,
            renew_deadline=self.sidecar.renew_deadline,
            retry_period=self.sidecar.retry_period,
        )
        self.lease_client = _api_client(ClientSettings(kubeconfig=self.sidecar.kubeconfig or None, qps=0))
        lock = KubeLeaseLock(self.lease_client, config.namespace, config.lease_name)
        self.elector = LeaderElector(lock, config, LeaderCallbacks(
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
        if self.elector is not None:
            self.elector.stop(timeout=self.sidecar.lease_duration + self.settings.shutdown_grace)
        else:
            self._stop_term(self.settings.shutdown_grace)
            if self._unconditional is not None:
                self._unconditional.join(self.settings.shutdown_grace)
        self.events.stop(timeout=2.0)
        if self.snapshotter is not None:
            self.snapshotter.close()
        self.factory.stop(timeout=5.0)
        self.calls.shutdown()
        for client in (self.api_client, self.lease_client):
            if client is not None:
                client.close()

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
        while not self.factory.wait_for_sync(1.0):
            if stop.is_set():
                return
        with self._term_lock:
            if stop.is_set() or self._term is not term:
                return
            for loop in (self.provisioner, self.attacher, self.resizer, self.snapshotter):
                if loop is not None:
                    loop.start(stop)
            term.started = True

    def _stop_term(self, timeout: float | None) -> None:
        with self._term_lock:
            term, self._term = self._term, None
        if term is None:
            return
        term.stop.set()  # CSI waits and queues notice at once
        if term.started:
            for loop in (self.provisioner, self.attacher, self.resizer, self.snapshotter):
                if loop is not None:
                    loop.stop(timeout=timeout if timeout is not None else 3600.0)
        # A call that timed out for its caller may still be running: it must end before another
        # leader can act on the same volume names.
        drained = self.calls.drain(timeout if timeout is not None else 3600.0)
        log.info("controller loops stopped", extra=fields(calls_drained=drained))

    def _informers_synced(self) -> str | None:
        waiting = [i.name for i in self.factory.informers() if not i.has_synced()]
        return f"informers not synced yet: {', '.join(waiting)}" if waiting else None


def _api_client(settings: ClientSettings) -> ThrottledApiClient:
    """new_api_client, its failure (no usable kubeconfig) as a cephcsi ConfigError."""
    try:
        return new_api_client(settings)
    except KubeError as error:
        raise kubeerrors.from_kube(error) from error


def start_controller_loops(settings: Settings, services: Services, health: HealthRegistry,
                           request_exit: RequestExit, loops: set[str]) -> ControllerLoops:
    """Build and start the controller-mode loops; returns the object whose stop() ends them."""
    controller_loops = ControllerLoops(settings, services, health, request_exit, loops)
    controller_loops.start()
    return controller_loops
