"""The node half of the composition root: NodeConfig → the node service and its parts.

Imported only where the Node service is served (pyudev and the mappers load with it). Tests
build a NodeService from parts, or through `build_node_service` with a fake runner.
"""
from __future__ import annotations

import os

from cephcsi.cli.kms_secrets import LazyKubeReader
from cephcsi.encryption.volume_keys import VolumeKeys
from cephcsi.node import devices, exec as node_exec, mounts
from cephcsi.node.client_address import AddressReporter
from cephcsi.node.crush_location import CrushLocator
from cephcsi.node.expander import NodeExpander
from cephcsi.node.io_max import KrbdQos
from cephcsi.node.luks_keys import KmsKeys
from cephcsi.node.mappers.base import FUSE, KRBD, NBD, Mapper
from cephcsi.node.mappers.fuse import FuseMapper
from cephcsi.node.mappers.fuse_capacity import LoopCapacityFollower
from cephcsi.node.mappers.krbd import KrbdMapper
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.mappers.nbd_attachments import AttachmentStore
from cephcsi.node.mappers.select import MapperChoice, NodeProbe, runner_modprobe
from cephcsi.node.nbd_healer import NbdHealer
from cephcsi.node.reclaim_claims import KubeTrimRequests
from cephcsi.node.reclaim_loop import NodeTrimPass
from cephcsi.node.publisher import Publisher
from cephcsi.node.service import NodeConfig, NodeParts, NodeService
from cephcsi.node.stale_stages import StaleStageSweep
from cephcsi.node.stager import Stager
from cephcsi.node.topology import KubeNodeLabels, NodeLabels


def build_node_service(config: NodeConfig, runner: node_exec.Runner = node_exec.run,
                       labels: NodeLabels | None = None, probe: NodeProbe | None = None) -> NodeService:
    labels = labels or KubeNodeLabels(config.kubeconfig)
    mounter = mounts.Mounter(runner, config.command_timeout)
    fuse = FuseMapper(
        runner, config.command_timeout, config.state_dir, config.connect_timeout,
        devices.wait_for_device, config.device_timeout, mounter,
    )
    mappers: dict[str, Mapper] = {
        KRBD: KrbdMapper(runner, config.command_timeout, devices.wait_for_device, config.device_timeout,
                         devices.udev_running),
        FUSE: fuse,
    }
    nbd = NbdMapper(runner, config.command_timeout, devices.wait_for_device, config.device_timeout,
                    log_dir=os.path.join(config.state_dir, "log"), attachments=AttachmentStore(config.runtime_dir))
    mappers[NBD] = nbd
    choice = MapperChoice(config.mounter, probe or NodeProbe(modprobe=runner_modprobe(runner)))
    expander = NodeExpander(mappers, runner, config.command_timeout, min(config.device_timeout, 10.0))
    crush = CrushLocator(labels, config.node_id, fallback_labels=config.read_affinity_labels)
    stager = Stager(mappers, choice, mounter, runner, config.command_timeout, config.kubelet_dir,
                    after_ready=expander.after_stage, before_mount=expander.before_mount,
                    crush_location=crush.location, keys=node_keys(config))
    service = NodeService(config, NodeParts(
        labels=labels,
        choice=choice,
        stager=stager,
        publisher=Publisher(mounter, config.kubelet_dir, krbd_qos=KrbdQos(runner, config.command_timeout)),
        expander=expander,
        # Started by the process (cli.main), not here: tests build services without threads.
        loop_follower=LoopCapacityFollower(fuse.root, runner, config.command_timeout),
        addresses=AddressReporter(config.node_id, runner, config.command_timeout),
    ))
    # Started by the process (cli.main) too; it takes the service's volume locks.
    service.nbd_healer = NbdHealer(nbd, service.volume_locks)
    has_api = bool(config.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"))
    if has_api and isinstance(labels, KubeNodeLabels):
        # Run by the process (cli.main) before the node service serves; without an API to read
        # the Node from (a plugin run outside a cluster) there is no sweep.
        node_labels = labels
        service.stale_sweep = StaleStageSweep(
            config.node_id, config.driver_name, config.kubelet_dir,
            lambda name: node_labels.node(name, "cannot read this node's attached volumes"), service.unstage)
    if config.reclaimspace_poll_interval > 0 and has_api:
        # Started by the process (cli.main) as well; it takes the service's volume locks. Without
        # an API to read the claims from (a plugin run outside a cluster) there is no pass.
        service.reclaimer = NodeTrimPass(
            config.kubelet_dir, config.driver_name, config.state_dir, service.volume_locks, runner,
            KubeTrimRequests(config.kubeconfig), config.reclaimspace_poll_interval)
    return service


def node_keys(config: NodeConfig) -> KmsKeys:
    """Where staging finds an encrypted volume's passphrase: the --kms-config KMS settings, and
    the Kubernetes API for KMS types that read a Secret or ConfigMap (the `metadata` type's
    secretName, vaulttokens), connected on the first such read only."""
    return KmsKeys(VolumeKeys(config.kms_config, secret_reader=LazyKubeReader(config.kubeconfig),
                              namespace=os.environ.get("POD_NAMESPACE", "")))
