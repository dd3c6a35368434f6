"""The composition root: settings → the objects a process serves, built in one place.

Servicers, managers and sidecar loops take their collaborators as arguments and never read
Settings themselves, so tests build them from parts and the composition root is the only code
that knows how a running driver is assembled. Its sidecar half (Kubernetes clients, informers,
the controller-mode loops, the registrar) is `cephcsi.cli.sidecar_wiring`, imported by
`start_sidecars` only when sidecars run.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from cephcsi._generated import csi_pb2_grpc
from cephcsi.ceph import verified
from cephcsi.ceph.connection import ConnectionCache
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.cli.kms_secrets import LazyKubeReader
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.csi.controller import ControllerServicer
from cephcsi.csi.group_controller import GroupControllerServicer
from cephcsi.csi.identity import IdentityOptions, IdentityServicer
from cephcsi.csi.server import CSIServer
from cephcsi.csi.services import Services
from cephcsi.encryption.volume_keys import VolumeKeys
from cephcsi.observability.health import HealthRegistry
from cephcsi.settings import Settings
from cephcsi.volumes.clones import Cloner
from cephcsi.volumes.flatten import FlattenPolicy
from cephcsi.volumes.group_snapshots import GroupSnapshotManager
from cephcsi.volumes.manager import VolumeManager
from cephcsi.volumes.publish import LocalNodes, Publisher
from cephcsi.volumes.snapshots import SnapshotManager

if TYPE_CHECKING:
    from cephcsi.csi.node import NodeServicer
    from cephcsi.sidecars.runner import SidecarRunner

Register = Callable[[grpc.Server], None]
RequestExit = Callable[[int, str], None]


def build_controller(settings: Settings, clusters: ClusterRegistry, keeper: LeaseKeeper) -> ControllerServicer:
    """`keeper`: the process's journal lease keeper; its owner drains it at exit."""
    snap = settings.snapshots
    policy = FlattenPolicy(snap.soft_max_clone_depth, snap.hard_max_clone_depth,
                           snap.min_snapshots_on_image, snap.max_snapshots_on_image)
    manager = VolumeManager(
        clusters,
        ConnectionCache(settings.ceph, hand_writes=verified.Mode(settings.ceph.rbd_hand_writes)),
        settings.instance_id,
        journal_lock_seconds=settings.ceph.journal_lock_seconds,
        inline_purge_seconds=settings.ceph.inline_purge_seconds,
        cloner=Cloner(policy, settings.instance_id, settings.ceph.journal_lock_seconds, keeper),
        keeper=keeper,
        # The sidecar wiring swaps in a reader over its own API client; without embedded
        # sidecars a KMS that reads a Secret or ConfigMap connects on its first read.
        keys=VolumeKeys(settings.kms_config, secret_reader=LazyKubeReader(settings.sidecars.kubeconfig),
                        namespace=os.environ.get("POD_NAMESPACE", "")),
    )
    publisher = Publisher(clusters, manager.connections, manager.read_record, mon_timeout=settings.ceph.mon_op_timeout)
    # Without Kubernetes the controller knows only its own node (--mode=all); the sidecar wiring
    # replaces this with the Nodes and CSINodes the attacher watches.
    own = frozenset({settings.node.node_id}) if settings.serves_node and settings.node.node_id else frozenset()
    return ControllerServicer(manager, settings.driver_name, settings.slow_call_seconds,
                              snapshots=SnapshotManager(manager, policy), publisher=publisher, nodes=LocalNodes(own))


def build_group_controller(settings: Settings, controller: ControllerServicer) -> GroupControllerServicer:
    """Group snapshots, over the controller's snapshot manager (same journals, leases, locks)."""
    assert controller.snapshots is not None  # build_controller always wires snapshots
    return GroupControllerServicer(GroupSnapshotManager(controller.snapshots), settings.driver_name,
                                   settings.slow_call_seconds)


def build_node(settings: Settings, clusters: ClusterRegistry) -> NodeServicer:
    # The node stack (pyudev, mappers) is imported only where it is served.
    from cephcsi.cli.node_wiring import build_node_service
    from cephcsi.csi.node import NodeServicer
    from cephcsi.node.service import NodeConfig

    node = settings.node
    config = NodeConfig(
        node_id=node.node_id,
        driver_name=settings.driver_name,
        kubelet_dir=node.kubelet_dir,
        state_dir=node.state_dir,
        runtime_dir=node.runtime_dir,
        mounter=node.mounter,
        domain_labels=node.domain_labels,
        read_affinity_labels=node.read_affinity_labels,
        max_volumes_per_node=node.max_volumes_per_node,
        device_timeout=node.device_timeout,
        command_timeout=node.command_timeout,
        connect_timeout=settings.ceph.mount_timeout,
        kubeconfig=settings.sidecars.kubeconfig,
        kms_config=settings.kms_config,
        reclaimspace_poll_interval=settings.sidecars.reclaimspace_poll_interval,
    )
    return NodeServicer(build_node_service(config), clusters, settings)


def advertises_topology(settings: Settings) -> bool:
    """VOLUME_ACCESSIBILITY_CONSTRAINTS: a node plugin with --domainlabels (its NodeGetInfo has
    segments), or a controller opted in with --feature-gates=Topology=true (its provisioner then
    sends accessibility requirements, which topologyConstrainedPools need)."""
    return ((settings.serves_node and bool(settings.node.domain_labels))
            or (settings.serves_controller and settings.sidecars.topology))


def build_services(settings: Settings, clusters: ClusterRegistry, keeper: LeaseKeeper) -> Services:
    """The servicers of this process's mode and the servers (sockets) that serve them; `keeper`
    holds the controller's journal leases (the caller drains it at exit)."""
    identity = IdentityServicer(
        IdentityOptions(
            driver_name=settings.driver_name,
            controller=settings.serves_controller,
            topology=advertises_topology(settings),
            online_expansion=settings.serves_controller,
            group_controller=settings.serves_controller,
        )
    )
    main: list[Register] = [lambda s: csi_pb2_grpc.add_IdentityServicer_to_server(identity, s)]
    controller_side: list[Register] = []
    controller: ControllerServicer | None = None
    node: NodeServicer | None = None
    if settings.serves_controller:
        controller = build_controller(settings, clusters, keeper)
        register: Register = lambda s: csi_pb2_grpc.add_ControllerServicer_to_server(controller, s)  # noqa: E731
        (controller_side if settings.controller_endpoint else main).append(register)
        group = build_group_controller(settings, controller)
        register_group: Register = lambda s: csi_pb2_grpc.add_GroupControllerServicer_to_server(group, s)  # noqa: E731
        (controller_side if settings.controller_endpoint else main).append(register_group)
    if settings.serves_node:
        node = build_node(settings, clusters)
        main.append(lambda s: csi_pb2_grpc.add_NodeServicer_to_server(node, s))
    servers = [CSIServer(settings.endpoint, settings.grpc_workers, main)]
    if controller_side:
        controller_side.insert(0, lambda s: csi_pb2_grpc.add_IdentityServicer_to_server(identity, s))
        servers.append(CSIServer(settings.controller_endpoint, settings.grpc_workers, controller_side))
    return Services(identity, controller, node, servers)


def start_sidecars(settings: Settings, services: Services, health: HealthRegistry,
                   request_exit: RequestExit) -> SidecarRunner:
    """Build and start the sidecars chosen with --sidecars; the runner's stop() ends them."""
    # The Kubernetes client and the loops are imported only where sidecars run.
    from cephcsi.cli import sidecar_wiring

    return sidecar_wiring.start_sidecars(settings, services, health, request_exit)
