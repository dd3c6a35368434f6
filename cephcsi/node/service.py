"""The node service: serializes work per volume and per path over the stager, publisher and
expander it is given (built by cephcsi.cli.node_wiring).

Locking: every operation holds non-blocking KeyLocks — stage/unstage on the volume id and the
staging path, publish/unpublish on the volume id and the target path. A busy key fails at once
with ABORTED (the CO retries); different volumes proceed in parallel. No lock is held around
subprocess calls across volumes: the only process-wide lock is MapperChoice's one-time probe.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from cephcsi.encryption import kms_config
from cephcsi.errors import NotFound
from cephcsi.locks import KeyLocks
from cephcsi.node import mounts, stage_record, stats
from cephcsi.node.client_address import AddressReporter
from cephcsi.node.expander import NodeExpander, NodeExpandRequest
from cephcsi.node.mappers.fuse_capacity import LoopCapacityFollower
from cephcsi.node.mappers.select import MapperChoice
from cephcsi.node.nbd_healer import NbdHealer
from cephcsi.node.reclaim_loop import NodeTrimPass
from cephcsi.node.stale_stages import StaleStageSweep
from cephcsi.node.publisher import Publisher
from cephcsi.node.requests import PublishRequest, StageRequest
from cephcsi.node.stager import Stager
from cephcsi.node.topology import NodeLabels, segments

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    driver_name: str
    kubelet_dir: str
    state_dir: str
    mounter: str
    domain_labels: tuple[str, ...]
    max_volumes_per_node: int
    device_timeout: float
    command_timeout: float
    connect_timeout: float
    kubeconfig: str = ""
    read_affinity_labels: tuple[str, ...] = ()
    runtime_dir: str = "/run/cephcsi"
    """tmpfs state that must survive a plugin restart (the rbd-nbd re-attach records)."""
    kms_config: str = kms_config.DEFAULT_PATH
    """--kms-config: the KMS ConfigMap's config.json (encrypted volumes)."""
    reclaimspace_poll_interval: float = 0.0
    """--reclaimspace-poll-interval: how often the node trims the volumes whose claim has a new
    reclaim-space run recorded (cephcsi.node.reclaim_loop); 0 off."""


@dataclass
class NodeParts:
    """What a NodeService works with, built by the composition root (cephcsi.cli.node_wiring)."""

    labels: NodeLabels
    choice: MapperChoice
    stager: Stager
    publisher: Publisher
    expander: NodeExpander
    loop_follower: LoopCapacityFollower
    addresses: AddressReporter | None = None
    """Reports the node's Ceph client address for fencing (cephcsi.node.client_address)."""


class NodeService:
    def __init__(self, config: NodeConfig, parts: NodeParts) -> None:
        self.config = config
        self.labels = parts.labels
        self.choice = parts.choice
        self.stager = parts.stager
        self.publisher = parts.publisher
        self.expander = parts.expander
        self.loop_follower = parts.loop_follower
        self.addresses = parts.addresses
        self.volume_locks = KeyLocks("volume")
        self.path_locks = KeyLocks("path")
        self.backing_check = stats.BackingCheck()
        # Re-attaches rbd-nbd devices after a restart (cephcsi.node.nbd_healer); set by node_wiring.
        self.nbd_healer: NbdHealer | None = None
        # Trims volumes the leader recorded a reclaim-space run for (cephcsi.node.reclaim_loop); set by node_wiring.
        self.reclaimer: NodeTrimPass | None = None
        # Unstages, at start, what Kubernetes no longer attaches here (cephcsi.node.stale_stages); set by node_wiring.
        self.stale_sweep: StaleStageSweep | None = None

    @contextmanager
    def _locked(self, volume_id: str, path: str) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(self.volume_locks.hold(volume_id))
            stack.enter_context(self.path_locks.hold(path))
            yield

    def stage(self, request: StageRequest) -> None:
        with self._locked(request.volume_id, request.staging_path):
            if self.addresses is not None:
                self.addresses.report(request)  # before the map: a node lost right after it is known
            self.stager.stage(request)

    def unstage(self, volume_id: str, staging_path: str) -> None:
        with self._locked(volume_id, staging_path):
            self.stager.unstage(volume_id, staging_path)

    def expand(self, request: NodeExpandRequest) -> int:
        """NodeExpandVolume under the locks stage and unstage take (busy → ABORTED)."""
        with self.volume_locks.hold(request.volume_id):
            record = self.expander.locate(request)
            with self.path_locks.hold(record.staging_path):
                return self.expander.expand(record, request)

    def publish(self, request: PublishRequest) -> None:
        with self._locked(request.volume_id, request.target_path):
            self.publisher.publish(request)

    def unpublish(self, volume_id: str, target_path: str) -> None:
        with self._locked(volume_id, target_path):
            self.publisher.unpublish(volume_id, target_path)

    def volume_stats(self, volume_id: str, volume_path: str) -> stats.VolumeStats:
        state = mounts.path_state(volume_path)
        if state == "missing":
            raise NotFound(f"volume path {volume_path} does not exist on this node")
        table = mounts.read_mounts()
        entry = mounts.top_mount(volume_path, table)
        path = volume_path
        if entry is None:
            record = stage_record.load(volume_path) if state == "ok" and os.path.isdir(volume_path) else None
            if record is None or record.volume_id != volume_id:
                raise NotFound(f"{volume_path} is not a staged or published volume {volume_id} on this node")
            path = record.mount_path
            entry = mounts.top_mount(path, table)
            if entry is None:
                return stats.abnormal(
                    f"volume {volume_id} is staged at {volume_path} but {path} is not mounted; stage it again",
                    block=record.access_type == stage_record.ACCESS_BLOCK,
                )
        return stats.volume_stats(path, entry, self.backing_check)

    def topology(self) -> dict[str, str]:
        if not self.config.domain_labels:
            return {}
        labels = self.labels.labels(self.config.node_id)
        return segments(self.config.driver_name, self.config.domain_labels, labels, self.config.node_id)
