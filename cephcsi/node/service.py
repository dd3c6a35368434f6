"""The node service: wires mappers, stager and publisher from settings, and serializes work
per volume and per path.

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

from cephcsi.errors import NotFound
from cephcsi.locks import KeyLocks
from cephcsi.node import devices, exec as node_exec, mounts, stage_record, stats
from cephcsi.node.crush_location import CrushLocator
from cephcsi.node.expander import NodeExpander, NodeExpandRequest
from cephcsi.node.mappers.base import FUSE, KRBD, NBD, Mapper
from cephcsi.node.mappers.fuse import FuseMapper
from cephcsi.node.mappers.fuse_capacity import LoopCapacityFollower
from cephcsi.node.mappers.krbd import KrbdMapper
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.mappers.select import MapperChoice, NodeProbe, runner_modprobe
from cephcsi.node.publisher import Publisher
from cephcsi.node.requests import PublishRequest, StageRequest
from cephcsi.node.stager import Stager
from cephcsi.node.topology import KubeNodeLabels, NodeLabels, segments

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


class NodeService:
    def __init__(
        self,
        config: NodeConfig,
        runner: node_exec.Runner = node_exec.run,
        labels: NodeLabels | None = None,
        probe: NodeProbe | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.labels = labels or KubeNodeLabels(config.kubeconfig)
        mounter = mounts.Mounter(runner, config.command_timeout)
        fuse = FuseMapper(
            runner, config.command_timeout, config.state_dir, config.connect_timeout,
            devices.wait_for_device, config.device_timeout, mounter,
        )
        self.mappers: dict[str, Mapper] = {
            KRBD: KrbdMapper(runner, config.command_timeout, devices.wait_for_device, config.device_timeout, devices.udev_running),
            NBD: NbdMapper(
                runner, config.command_timeout, devices.wait_for_device, config.device_timeout,
                log_dir=os.path.join(config.state_dir, "log"),
            ),
            FUSE: fuse,
        }
        self.choice = MapperChoice(config.mounter, probe or NodeProbe(modprobe=runner_modprobe(runner)))
        self.expander = NodeExpander(self.mappers, runner, config.command_timeout, min(config.device_timeout, 10.0))
        self.crush = CrushLocator(self.labels, config.node_id, fallback_labels=config.read_affinity_labels)
        self.stager = Stager(self.mappers, self.choice, mounter, runner, config.command_timeout, config.kubelet_dir,
                             after_ready=self.expander.after_stage,
                             before_mount=self.expander.before_mount,
                             crush_location=self.crush.location)
        self.publisher = Publisher(mounter, config.kubelet_dir)
        self.volume_locks = KeyLocks("volume")
        self.path_locks = KeyLocks("path")
        self.backing_check = stats.BackingCheck()
        self.loop_follower = LoopCapacityFollower(fuse.root, runner, config.command_timeout)
        """Started by the process (cli.main), not here: tests build services without threads."""

    @contextmanager
    def _locked(self, volume_id: str, path: str) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(self.volume_locks.hold(volume_id))
            stack.enter_context(self.path_locks.hold(path))
            yield

    def stage(self, request: StageRequest) -> None:
        with self._locked(request.volume_id, request.staging_path):
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
