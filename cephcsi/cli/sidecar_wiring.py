"""The composition root's sidecar half: settings → the embedded sidecars, built in one place.

Imported by `cephcsi.cli.wiring.start_sidecars` only when --sidecars names some, so a process
without them never loads the Kubernetes client. Everything the controller-mode loops use (API
clients, informer factory, event recorder, CSI call pool, the loops and the Lease lock) is built
here from Settings and handed to `ControllerLoops` ready-made; nothing under cephcsi.sidecars
reads Settings to build its own collaborators.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client as k8s

from cephcsi._generated import csi_pb2
from cephcsi.cli.kms_secrets import KubeSecretReader
from cephcsi.csi.controller import ControllerServicer
from cephcsi.csi.group_controller import GroupControllerServicer
from cephcsi.csi.server import socket_path
from cephcsi.csi.services import Services
from cephcsi.errors import ConfigError
from cephcsi.kube.client import ClientSettings, ThrottledApiClient, new_api_client
from cephcsi.kube.errors import KubeError
from cephcsi.kube.events import EventRecorder, EventSettings
from cephcsi.kube.factory import InformerFactory
from cephcsi.kube.informer import Informer
from cephcsi.kube.leaderelection import LeaderElectionConfig
from cephcsi.kube.leaselock import KubeLeaseLock
from cephcsi.kube.ratelimit import ItemBackoffSettings
from cephcsi.observability.health import HealthRegistry
from cephcsi.settings import Settings
from cephcsi.volumes import reclaim
from cephcsi.volumes.group_snapshots import GroupSnapshotManager
from cephcsi.sidecars import kubeerrors
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.attacher import strategy as attach_strategy
from cephcsi.sidecars.attacher.api import AttacherApi
from cephcsi.sidecars.attacher.loop import AttacherLoop
from cephcsi.sidecars.attacher.fencing import KubeNodes, Unfencer
from cephcsi.sidecars.attacher.publishing import PublishingAttach, node_id_of
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.capacity import desired as capacity_desired
from cephcsi.sidecars.capacity.api import CapacityApi
from cephcsi.sidecars.capacity.loop import CapacityContext, CapacityLoop
from cephcsi.sidecars.capacity.secrets import KubeCapacitySecrets
from cephcsi.sidecars.leadership import (
    ControllerClients,
    ControllerLoops,
    Leadership,
    Loops,
    lease_name,
    lease_namespace,
)
from cephcsi.sidecars.groupsnapshotter.api import GroupSnapshotApi
from cephcsi.sidecars.groupsnapshotter.content import GroupSnapshotterContext
from cephcsi.sidecars.groupsnapshotter.loop import GroupSnapshotterLoop
from cephcsi.sidecars.provisioner.context import ProvisionerContext, provisioner_identity
from cephcsi.sidecars.provisioner.loop import ProvisionerLoop
from cephcsi.sidecars.provisioner.pvspec import PVOptions
from cephcsi.sidecars.provisioner.topology import TopologyPolicy
from cephcsi.sidecars.provisioner.request import RequestOptions
from cephcsi.sidecars.reclaimspace.api import ReclaimApi
from cephcsi.sidecars.reclaimspace.loop import ReclaimContext, ReclaimSpaceLoop
from cephcsi.sidecars.registrar import Registrar, RegistrarOptions
from cephcsi.sidecars.resizer.api import ResizerApi
from cephcsi.sidecars.resizer.loop import ResizerLoop
from cephcsi.sidecars.resizer.worker import ResizerContext
from cephcsi.sidecars.runner import SidecarRunner
from cephcsi.sidecars.snapshotter.api import SnapshotApi
from cephcsi.sidecars.snapshotter.content import SnapshotterContext
from cephcsi.sidecars.snapshotter.loop import SnapshotterLoop

RequestExit = Callable[[int, str], None]
CONTROLLER_LOOPS = frozenset({"provisioner", "attacher", "resizer", "snapshotter"})
_RPC = csi_pb2.ControllerServiceCapability.RPC
_SERVICE = csi_pb2.PluginCapability.Service
# Worker threads of the attacher: its work is one small patch per attachment, so the
# provisioner-sized --worker-threads (100) would only add idle threads (external-attacher: 10).
ATTACHER_WORKERS = 10
# Resizer workers: external-resizer's default (--workers 10); resizes are rare and short.
RESIZER_WORKERS = 10
# Snapshotter workers: csi-snapshotter's default (--worker-threads 10).
SNAPSHOTTER_WORKERS = 10


def start_sidecars(settings: Settings, services: Services, health: HealthRegistry,
                   request_exit: RequestExit) -> SidecarRunner:
    """Start the sidecars chosen with --sidecars; the runner stops them in reverse order."""
    runner = SidecarRunner()
    enabled = set(settings.sidecars.enabled)
    if "registrar" in enabled:
        registrar = Registrar(registrar_options(settings))
        registrar.start()
        health.add_liveness("registrar", registrar.health)
        runner.add(registrar)
    chosen = enabled & CONTROLLER_LOOPS
    if chosen:
        loops = build_controller_loops(settings, services, health, request_exit, chosen)
        loops.start()
        runner.add(loops)
    return runner


def registrar_options(settings: Settings) -> RegistrarOptions:
    kubelet_dir = settings.node.kubelet_dir or "/var/lib/kubelet"
    csi_endpoint = settings.sidecars.kubelet_registration_path or os.path.join(
        kubelet_dir, "plugins", settings.driver_name, "csi.sock"
    )
    return RegistrarOptions(
        driver_name=settings.driver_name,
        csi_endpoint=socket_path(csi_endpoint),
        registry_dir=os.path.join(kubelet_dir, "plugins_registry"),
    )


def build_controller_loops(settings: Settings, services: Services, health: HealthRegistry,
                           request_exit: RequestExit, chosen: set[str]) -> ControllerLoops:
    """The controller-mode loops in `chosen`, with every collaborator they share."""
    controller = services.controller
    if controller is None:
        raise ConfigError("the provisioner and attacher need the Controller service (--mode=controller or all)")
    sidecar = settings.sidecars
    api_client = _api_client(ClientSettings(kubeconfig=sidecar.kubeconfig or None, qps=sidecar.kube_api_qps,
                                            burst=sidecar.kube_api_burst, timeout=15.0))
    clients = ControllerClients(
        api_client=api_client,
        factory=InformerFactory(api_client),
        events=EventRecorder(api_client, EventSettings(component=settings.driver_name)),
        calls=CsiCalls(max_workers=sidecar.worker_threads, timeout=sidecar.timeout),
    )
    parts = _Parts(settings, services, controller, clients, KubeApi(api_client),
                   ItemBackoffSettings(sidecar.retry_interval_start,
                                       max(sidecar.retry_interval_start, sidecar.retry_interval_max)))
    # Encrypted volumes' KMS types that name a Secret (metadata's secretName) read it here.
    controller.volumes.encryption.keys.secret_reader = KubeSecretReader(parts.api)
    loops = Loops(
        provisioner=_provisioner(parts) if "provisioner" in chosen else None,
        attacher=_attacher(parts) if "attacher" in chosen else None,
        resizer=_resizer(parts) if "resizer" in chosen else None,
        snapshotter=_snapshotter(parts) if "snapshotter" in chosen else None,
        groupsnapshotter=_groupsnapshotter(parts) if "snapshotter" in chosen else None,
        capacity=_capacity(parts) if "provisioner" in chosen and sidecar.capacity.enabled else None,
        reclaimspace=_reclaimspace(parts) if "provisioner" in chosen and sidecar.reclaimspace_poll_interval > 0
        else None,
    )
    # GetCapacity reads the class's provisioner secret, for the capacity loop and gRPC callers alike.
    controller.capacity_secrets = KubeCapacitySecrets(parts.api)
    leadership = _leadership(settings) if sidecar.leader_election else None
    return ControllerLoops(clients, loops, health, request_exit, leadership=leadership,
                           shutdown_grace=settings.shutdown_grace)


def _leadership(settings: Settings) -> Leadership:
    """The Lease and its lock, on an API client of its own without a rate limit (qps=0)."""
    sidecar = settings.sidecars
    config = LeaderElectionConfig(
        lease_name=lease_name(settings.driver_name),
        namespace=lease_namespace(sidecar.leader_election_namespace),
        lease_duration=sidecar.lease_duration,
        renew_deadline=sidecar.renew_deadline,
        retry_period=sidecar.retry_period,
    )
    client = _api_client(ClientSettings(kubeconfig=sidecar.kubeconfig or None, qps=0))
    return Leadership(config, KubeLeaseLock(client, config.namespace, config.lease_name), client)


def _api_client(settings: ClientSettings) -> ThrottledApiClient:
    """new_api_client, its failure (no usable kubeconfig) as a cephcsi ConfigError."""
    try:
        return new_api_client(settings)
    except KubeError as error:
        raise kubeerrors.from_kube(error) from error


@dataclass(frozen=True)
class _Parts:
    """What the loop builders below share."""

    settings: Settings
    services: Services
    controller: ControllerServicer
    clients: ControllerClients
    api: KubeApi
    backoff: ItemBackoffSettings

    @property
    def api_client(self) -> k8s.ApiClient:
        return self.clients.api_client

    @property
    def factory(self) -> InformerFactory:
        return self.clients.factory

    def capabilities(self) -> list[csi_pb2.ControllerServiceCapability]:
        request = csi_pb2.ControllerGetCapabilitiesRequest()
        return list(self.controller.ControllerGetCapabilities(request, None).capabilities)

    def multi_writer(self) -> bool:
        return any(c.rpc.type == _RPC.SINGLE_NODE_MULTI_WRITER for c in self.capabilities())


def _provisioner(parts: _Parts) -> ProvisionerLoop:
    sidecar, factory, driver = parts.settings.sidecars, parts.factory, parts.settings.driver_name
    multi_writer = parts.multi_writer()
    plugin_caps = parts.services.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), None)
    use_topology = any(c.service.type == _SERVICE.VOLUME_ACCESSIBILITY_CONSTRAINTS for c in plugin_caps.capabilities)
    ctx = ProvisionerContext(
        driver_name=driver,
        claims=factory.persistent_volume_claims(),
        volumes=factory.persistent_volumes(),
        classes=factory.storage_classes(),
        attachments=factory.volume_attachments(),
        api=parts.api,
        events=parts.clients.events,
        controller=parts.controller,
        calls=parts.clients.calls,
        request_options=RequestOptions(driver, sidecar.default_fstype, sidecar.extra_create_metadata, multi_writer),
        pv_options=PVOptions(driver, provisioner_identity(driver), use_topology),
        nodes=factory.nodes() if use_topology else None,
        csinodes=factory.csi_nodes() if use_topology else None,
        snapshots=SnapshotApi(parts.api_client),
        topology_policy=TopologyPolicy(sidecar.strict_topology, sidecar.immediate_topology),
    )
    return ProvisionerLoop(ctx, workers=sidecar.worker_threads, backoff=parts.backoff)


def _attacher(parts: _Parts) -> AttacherLoop:
    driver = parts.settings.driver_name
    attachments = parts.factory.volume_attachments()
    volumes = parts.factory.persistent_volumes()
    workers = min(parts.settings.sidecars.worker_threads, ATTACHER_WORKERS)
    if not attach_strategy.publishes(parts.capabilities()):
        return AttacherLoop(driver, attachments, attach_strategy.TrivialAttach(parts.api), workers=workers,
                            backoff=parts.backoff, volumes=volumes)
    api = AttacherApi(parts.api_client)
    nodes, csinodes = parts.factory.nodes(), parts.factory.csi_nodes()
    publishing = PublishingAttach(api, driver, parts.controller, parts.clients.calls, volumes,
                                  csinodes=csinodes, nodes=nodes, multi_writer=parts.multi_writer())
    unfencer = None
    if parts.controller.publisher is not None:
        unfencer = Unfencer(api, driver, parts.controller.publisher, volumes, publishing.secrets_of_volume)
    # The controller learns node ids and out-of-service taints from the same caches.
    parts.controller.nodes = KubeNodes(api, driver, nodes, csinodes,
                                       on_fence=unfencer.note if unfencer is not None else None)
    return AttacherLoop(driver, attachments, publishing, workers=workers, backoff=parts.backoff, volumes=volumes,
                        nodes=nodes, unfencer=unfencer,
                        node_id_of=lambda name: node_id_of(name, driver, csinodes, nodes))


def _resizer(parts: _Parts) -> ResizerLoop:
    ctx = ResizerContext(
        driver_name=parts.settings.driver_name,
        claims=parts.factory.persistent_volume_claims(),
        volumes=parts.factory.persistent_volumes(),
        api=parts.api,
        writer=ResizerApi(parts.api_client),
        events=parts.clients.events,
        controller=parts.controller,
        calls=parts.clients.calls,
        multi_writer=parts.multi_writer(),
        # VolumeAttributesClass changes (ControllerModifyVolume): storage.k8s.io/v1, Kubernetes >= 1.34.
        modify=True,
    )
    return ResizerLoop(ctx, workers=min(parts.settings.sidecars.worker_threads, RESIZER_WORKERS),
                       backoff=parts.backoff)


def _capacity(parts: _Parts) -> CapacityLoop:
    """CSIStorageCapacity objects in the controller's namespace (its Lease's), owned as
    --capacity-ownerref-level says, counted from the Pod named by POD_NAME."""
    settings, driver = parts.settings.sidecars.capacity, parts.settings.driver_name
    namespace = lease_namespace(parts.settings.sidecars.leader_election_namespace)
    api = CapacityApi(parts.api_client, namespace)
    pod = os.environ.get("POD_NAME", "").strip()
    if settings.ownerref_level >= 0 and not pod:
        raise ConfigError(
            f"--capacity-ownerref-level={settings.ownerref_level} needs the controller's Pod name in POD_NAME "
            "(downward API: metadata.name) to find the owner of CSIStorageCapacity objects; or pass -1 for none")
    level = settings.ownerref_level
    ctx = CapacityContext(
        driver_name=driver,
        classes=parts.factory.storage_classes(),
        csinodes=parts.factory.csi_nodes(),
        nodes=parts.factory.nodes(),
        capacities=parts.factory.for_resource(k8s.StorageV1Api, "list_namespaced_csi_storage_capacity",
                                              namespace=namespace, label_selector=capacity_desired.label_selector(driver)),
        api=api,
        controller=parts.controller,
        calls=parts.clients.calls,
        find_owner=lambda: api.owner(pod, level) if level >= 0 else None,
        poll_interval=settings.poll_interval,
        immediate_binding=settings.immediate_binding,
    )
    return CapacityLoop(ctx, backoff=parts.backoff)


def _reclaimspace(parts: _Parts) -> ReclaimSpaceLoop:
    """The reclaim-space schedule: sparsify through the controller's VolumeManager, the run
    recorded on the claim (the node plugins follow that record)."""
    volumes = parts.controller.volumes
    ctx = ReclaimContext(
        driver_name=parts.settings.driver_name,
        claims=parts.factory.persistent_volume_claims(),
        volumes=parts.factory.persistent_volumes(),
        classes=parts.factory.storage_classes(),
        # csi-addons' namespace-level schedule (claim > namespace > class); the loop's own
        # informer, outside the factory, so a missing RBAC grant cannot hold back every loop;
        # its handlers still run on the factory's one handler thread.
        namespaces=Informer(k8s.CoreV1Api(parts.api_client).list_namespace, name="namespaces",
                            settings=parts.factory.settings, dispatch_loop=parts.factory.dispatch_loop),
        api=parts.api,
        writer=ReclaimApi(parts.api_client),
        events=parts.clients.events,
        calls=parts.clients.calls,
        sparsify=lambda volume_id, credentials: reclaim.sparsify_volume(volumes, volume_id, credentials),
        poll_interval=parts.settings.sidecars.reclaimspace_poll_interval,
    )
    return ReclaimSpaceLoop(ctx)


def _snapshotter(parts: _Parts) -> SnapshotterLoop:
    snapshots = SnapshotApi(parts.api_client)
    ctx = SnapshotterContext(
        driver_name=parts.settings.driver_name,
        contents=Informer(snapshots.list_contents, name="volumesnapshotcontents",
                          dispatch_loop=parts.factory.dispatch_loop),
        snapshots=snapshots,
        api=parts.api,
        events=parts.clients.events,
        controller=parts.controller,
        calls=parts.clients.calls,
        extra_create_metadata=parts.settings.sidecars.extra_create_metadata,
    )
    return SnapshotterLoop(ctx, workers=min(parts.settings.sidecars.worker_threads, SNAPSHOTTER_WORKERS),
                           backoff=parts.backoff)


def _groupsnapshotter(parts: _Parts) -> GroupSnapshotterLoop:
    """VolumeGroupSnapshotContents through a GroupController servicer of its own over the
    controller's snapshot manager: the same journals, leases and Ceph connections as the one
    served on the socket (its in-process name locks are its own, so a gRPC caller racing the
    loop on one name meets the journal lease, as another process would)."""
    snapshots = parts.controller.snapshots
    if snapshots is None:
        raise ConfigError("the group snapshotter needs the controller's snapshot manager")
    groups = GroupControllerServicer(GroupSnapshotManager(snapshots), parts.settings.driver_name,
                                     parts.settings.slow_call_seconds)
    api = GroupSnapshotApi(parts.api_client)
    ctx = GroupSnapshotterContext(
        driver_name=parts.settings.driver_name,
        contents=Informer(api.list_contents, name="volumegroupsnapshotcontents",
                          dispatch_loop=parts.factory.dispatch_loop),
        snapshots=api,
        api=parts.api,
        events=parts.clients.events,
        controller=parts.controller,
        calls=parts.clients.calls,
        extra_create_metadata=parts.settings.sidecars.extra_create_metadata,
        groups=groups,
    )
    return GroupSnapshotterLoop(ctx, workers=min(parts.settings.sidecars.worker_threads, SNAPSHOTTER_WORKERS),
                                backoff=parts.backoff)
