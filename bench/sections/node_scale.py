"""Section 2c (issue 38, deliverable 5): one `cephcsi --mode=node` process (rbd-fuse mapper) with N
volumes staged and published at once.

In order, on a node plugin of its own (the shared one of section 2 stays untouched, because this
one is SIGKILLed):
  1. the plugin started with nothing staged: seconds from launch until Probe and
     NodeGetCapabilities answer; its /proc figures;
  2. the floor by hand with nothing staged (section 2's ManualPath: rbd-fuse, losetup, mkfs.ext4,
     mount, bind mount, and back), BASELINE_CYCLES cycles;
  3. N volumes created through the shared controller (untimed), then NodeStage + NodePublish
     (ext4) of each in turn, each call timed, a file written into each (untimed), /proc read
     after each volume;
  4. the floor by hand again, now beside the N staged volumes (what the host itself pays for N
     mounts, loop devices and rbd-fuse daemons, apart from the plugin);
  5. NodeGetVolumeStats of all N, sequentially and at concurrency 8;
  6. SIGKILL, relaunch: seconds until it serves; then every staging and target mount, loop device
     and rbd-fuse daemon (same pid: rbd-fuse daemonizes, so on a host it outlives the plugin) is
     checked, each file read back, and the stats read once more;
  7. NodeUnpublish + NodeUnstage of each in turn (timed), DeleteVolume of each, and a check that
     nothing is left mounted, attached or running under the section's directory.
Teardown runs whatever happened: every volume still staged is unpublished and unstaged through
the plugin (relaunched if it is down), whatever is still mounted or attached under the section's
directory is released by hand (filesystems, then loop devices, then the rbd-fuse mounts — never a
file removed under an rbd-fuse mount: that file is the image), then the volumes are deleted.
"""
from __future__ import annotations

import functools
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench import machine, procstat, report
from bench.environment import DRIVER_ARGS, Environment, mounts_under
from bench.load import Batch, run_batch
from bench.model import SectionResult, Status, Table
from bench.options import Options
from bench.raw import RawRbd
from bench.sections import node_ops
from bench.sections.base import Section
from bench.stats import Spread, percentile, ratio, spread
from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.node.mappers.loops import attached_loops
from bench.sections.node_scale_figures import (
    BASELINE_CYCLES, STATS_CONCURRENCY, Figures, count, loops_under, rbd_fuse_daemons, volume_count, _fds, _read)
from bench.sections.node_scale_report import _data, _goals, _latency_table, _process_table, _restart_table, _stats_table
from tests.integration.driver import DriverProcess

log = logging.getLogger("bench")

NAME = "node-scale"
TITLE = "2c. Node at scale: one node plugin with N staged and published volumes (rbd-fuse)"

SERVE_TIMEOUT_S = 120.0
RPC_TIMEOUT_S = 180.0
MARKER = "bench-node-scale.txt"


# ---- the plugin and the volumes --------------------------------------------------------------------


@dataclass
class Placed:
    """One volume of the section and where the plugin put it."""

    index: int
    volume: csi_pb2.Volume
    staging: Path
    target: Path
    staged: bool = False
    published: bool = False

    @property
    def marker(self) -> Path:
        return self.target / MARKER

    def marker_text(self) -> str:
        return f"volume {self.index} {self.volume.volume_id}\n"


def _ext4() -> csi_pb2.VolumeCapability:
    mode = csi_pb2.VolumeCapability.AccessMode
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"),
                                    access_mode=mode(mode=mode.SINGLE_NODE_WRITER))


class ScaleNode:
    """A node plugin of the section's own under `root` (kubelet dir, state dir, its process dir)."""

    def __init__(self, env: Environment, root: Path) -> None:
        self.env = env
        self.root = root
        self.kubelet = root / "kubelet"
        self.state = root / "state"
        for d in (self.kubelet, self.state, root / "proc"):
            d.mkdir(parents=True, exist_ok=True)
        args = (*DRIVER_ARGS, "--nodeid=bench-node-scale", "--mounter=fuse", f"--kubelet-dir={self.kubelet}",
                f"--state-dir={self.state}")
        self.process = DriverProcess(env.config_file, mode="node", args=args, workdir=str(root / "proc"))
        self.cluster = env.start_cluster()

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def alive(self) -> bool:
        return self.process.process is not None and self.process.process.poll() is None

    @property
    def node(self) -> csi_pb2_grpc.NodeStub:
        return self.process.node

    def launch_until_serving(self) -> float:
        """Launch the plugin; seconds from the launch until Probe and NodeGetCapabilities answer.
        A fresh channel per attempt: a channel that failed to connect backs off for up to seconds,
        which would be measured as the plugin's start."""
        started = time.perf_counter()
        popen = self.process.launch()
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while time.monotonic() < deadline:
            if popen.poll() is not None:
                raise RuntimeError(f"the node plugin exited with {popen.returncode} while starting:\n"
                                   f"{self.process.log()[-2000:]}")
            if os.path.exists(self.process.socket):
                with grpc.insecure_channel(self.process.endpoint) as channel:
                    try:
                        probe = csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=1)
                        if not probe.HasField("ready") or probe.ready.value:
                            csi_pb2_grpc.NodeStub(channel).NodeGetCapabilities(
                                csi_pb2.NodeGetCapabilitiesRequest(), timeout=1)
                            return time.perf_counter() - started
                    except grpc.RpcError:
                        pass
            time.sleep(0.02)
        raise TimeoutError(f"the node plugin did not serve within {SERVE_TIMEOUT_S:.0f} s")

    def place(self, index: int, volume: csi_pb2.Volume) -> Placed:
        # The kubelet's layout (as section 2): it creates the staging dir and the target's parent.
        pv = f"pv-scale-{index:04d}-{uuid.uuid4().hex[:6]}"
        staging = self.kubelet / "plugins/kubernetes.io/csi/rbd.csi.ceph.com" / pv / "globalmount"
        target = self.kubelet / f"pods/pod-{index:04d}/volumes/kubernetes.io~csi" / pv / "mount"
        staging.mkdir(parents=True)
        target.parent.mkdir(parents=True)
        return Placed(index=index, volume=volume, staging=staging, target=target)

    def stage(self, p: Placed) -> float:
        started = time.perf_counter()
        self.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
            volume_id=p.volume.volume_id, volume_capability=_ext4(), staging_target_path=str(p.staging),
            secrets=self.cluster.secrets, volume_context=p.volume.volume_context), timeout=RPC_TIMEOUT_S)
        p.staged = True
        return time.perf_counter() - started

    def publish(self, p: Placed) -> float:
        started = time.perf_counter()
        self.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=p.volume.volume_id, volume_capability=_ext4(), staging_target_path=str(p.staging),
            target_path=str(p.target), volume_context=p.volume.volume_context), timeout=RPC_TIMEOUT_S)
        p.published = True
        return time.perf_counter() - started

    def unpublish(self, p: Placed) -> float:
        started = time.perf_counter()
        self.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id=p.volume.volume_id, target_path=str(p.target)), timeout=RPC_TIMEOUT_S)
        p.published = False
        return time.perf_counter() - started

    def unstage(self, p: Placed) -> float:
        started = time.perf_counter()
        self.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
            volume_id=p.volume.volume_id, staging_target_path=str(p.staging)), timeout=RPC_TIMEOUT_S)
        p.staged = False
        return time.perf_counter() - started

    def stats(self, p: Placed) -> bool:
        """NodeGetVolumeStats of one volume; True when it reads healthy (no abnormal condition)."""
        answer: csi_pb2.NodeGetVolumeStatsResponse = self.node.NodeGetVolumeStats(
            csi_pb2.NodeGetVolumeStatsRequest(volume_id=p.volume.volume_id, volume_path=str(p.target),
                                              staging_target_path=str(p.staging)), timeout=RPC_TIMEOUT_S)
        return not (answer.HasField("volume_condition") and answer.volume_condition.abnormal)




def _manual_cycles(env: Environment, manual: node_ops.ManualPath, raw: RawRbd, into: node_ops.Timings) -> None:
    for _ in range(BASELINE_CYCLES):
        image = raw.create(raw.new_name())
        try:
            manual.cycle(image, "ext4", into)
        finally:
            raw.remove(image)


def _stats_batches(node: ScaleNode, placed: list[Placed], figures: Figures, label: str,
                   levels: Sequence[int]) -> None:
    for c in levels:
        figures.stats[f"{label}, c={c}"] = run_batch(node.stats, placed, c)


def _check_after_restart(node: ScaleNode, placed: list[Placed], before: dict[int, str],
                         figures: Figures) -> None:
    mounted = mounts_under(node.root)

    def has_mount(path: Path) -> bool:  # the plugin may mount below the staging path it was given
        return any(m == str(path) or m.startswith(f"{path}/") for m in mounted)

    figures.checks["staging and target still mounted"] = count(
        [has_mount(p.staging) and has_mount(p.target) for p in placed])
    read_back = []
    for p in placed:
        try:
            read_back.append(p.marker.read_text() == p.marker_text())
        except OSError:
            read_back.append(False)
    figures.checks["file written before the kill reads back"] = count(read_back)
    after = rbd_fuse_daemons(str(node.state))
    figures.checks["rbd-fuse daemon survived (same pid)"] = count([pid in after for pid in before])
    figures.checks["loop device still attached"] = f"{len(loops_under(str(node.state)))}/{len(placed)}"


def _measure(env: Environment, node: ScaleNode, placed: list[Placed], figures: Figures) -> None:
    cluster = env.start_cluster()
    controller = env.controller().controller
    figures.first_start_s = node.launch_until_serving()
    figures.readings.append(_read("started, nothing staged", node.pid))
    raw = RawRbd(cluster, env.options.size_bytes)
    try:
        manual = node_ops.ManualPath(env, node.root / "manual")
        _manual_cycles(env, manual, raw, figures.manual_empty)

        log.info("node-scale: creating %d volumes", figures.volumes)
        for i in range(figures.volumes):
            answer: csi_pb2.CreateVolumeResponse = controller.CreateVolume(csi_pb2.CreateVolumeRequest(
                name=f"bench-node-scale-{uuid.uuid4()}",
                capacity_range=csi_pb2.CapacityRange(required_bytes=env.options.size_bytes),
                volume_capabilities=[_ext4()], parameters=cluster.parameters, secrets=cluster.secrets),
                timeout=RPC_TIMEOUT_S)
            placed.append(node.place(i, answer.volume))

        log.info("node-scale: staging and publishing %d volumes in turn", figures.volumes)
        cpu_before = previous_cpu = procstat.cpu_seconds(node.pid)
        for p in placed:
            stage_s, publish_s = node.stage(p), node.publish(p)
            figures.stage.append(stage_s)
            figures.publish.append(publish_s)
            with open(p.marker, "w", encoding="utf-8") as handle:
                handle.write(p.marker_text())
                handle.flush()
                os.fsync(handle.fileno())
            s = procstat.sample(node.pid)
            figures.stage_cpu.append(s.cpu_s - previous_cpu)
            previous_cpu = s.cpu_s
            figures.series.append({"stage_s": stage_s, "publish_s": publish_s, "rss_bytes": s.rss_bytes,
                                   "threads": s.threads, "fds": _fds(node.pid), "cpu_s": s.cpu_s})
        figures.checks["plugin CPU per stage+publish, ms"] = report.ms(
            (procstat.cpu_seconds(node.pid) - cpu_before) / max(1, len(placed)))
        figures.readings.append(_read(f"{len(placed)} staged and published", node.pid))
        daemons = rbd_fuse_daemons(str(node.state))
        samples = [procstat.sample(pid) for pid in daemons]
        figures.fuse_rss_bytes = sum(s.rss_bytes for s in samples)
        figures.fuse_threads = sum(s.threads for s in samples)

        _manual_cycles(env, manual, raw, figures.manual_full)
        _stats_batches(node, placed, figures, "all staged", (1, STATS_CONCURRENCY))

        log.info("node-scale: SIGKILL and restart with %d volumes staged", len(placed))
        before = rbd_fuse_daemons(str(node.state))
        node.process.kill()
        figures.restart_s = node.launch_until_serving()
        figures.readings.append(_read(f"restarted after SIGKILL, {len(placed)} staged", node.pid))
        _check_after_restart(node, placed, before, figures)
        _stats_batches(node, placed, figures, "after the restart", (1,))

        log.info("node-scale: unpublishing and unstaging %d volumes in turn", len(placed))
        for p in placed:
            figures.unpublish.append(node.unpublish(p))
            figures.unstage.append(node.unstage(p))
        figures.readings.append(_read("all unstaged again", node.pid))
    finally:
        raw.close()


# ---- teardown ---------------------------------------------------------------------------------------


def _umount(point: str) -> None:
    if subprocess.run(["umount", point], capture_output=True, timeout=60, check=False).returncode != 0:
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=60, check=False)


def release_by_hand(root: Path) -> None:
    """What neither the plugin nor section 2's ManualPath released: filesystems first, then the
    loop devices, then the rbd-fuse mounts (which makes each rbd-fuse close its image and exit).
    Nothing is ever deleted here: under an rbd-fuse mount a file IS the image."""
    for _ in range(5):
        fuse_mounts = set(rbd_fuse_daemons(str(root)).values())
        for point in mounts_under(root):
            if point not in fuse_mounts:
                log.warning("node-scale: unmounting leftover %s", point)
                _umount(point)
        for device in loops_under(str(root)):
            log.warning("node-scale: detaching leftover %s", device)
            subprocess.run(["losetup", "-d", device], capture_output=True, timeout=60, check=False)
        for point in mounts_under(root):
            _umount(point)
        if not mounts_under(root) and not loops_under(str(root)):
            return
        time.sleep(0.2)


def leftovers(root: Path) -> dict[str, list[str]]:
    found = {"mounts": mounts_under(root), "loop devices": loops_under(str(root)),
             "rbd-fuse daemons": [str(pid) for pid in rbd_fuse_daemons(str(root))]}
    return {kind: items for kind, items in found.items() if items}


def _quietly(what: str, call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - teardown goes on; what is left is released by hand
        log.warning("node-scale teardown: %s failed: %s", what, str(error)[:300])


def _teardown(env: Environment, node: ScaleNode, placed: list[Placed], figures: Figures) -> None:
    if any(p.staged or p.published for p in placed):
        if not node.alive():
            _quietly("relaunching the plugin", node.launch_until_serving)
        for p in placed:
            if p.published:
                _quietly(f"NodeUnpublishVolume {p.index}", functools.partial(node.unpublish, p))
            if p.staged:
                _quietly(f"NodeUnstageVolume {p.index}", functools.partial(node.unstage, p))
    _quietly("stopping the plugin", node.process.stop)
    release_by_hand(node.root)
    # rbd-fuse exits after its unmount closes the image; give the daemons a moment before looking.
    deadline = time.monotonic() + 10
    while rbd_fuse_daemons(str(node.root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    figures.leftovers = leftovers(node.root)
    if placed:
        controller = env.controller().controller
        secrets = env.start_cluster().secrets
        for p in placed:
            request = csi_pb2.DeleteVolumeRequest(volume_id=p.volume.volume_id, secrets=secrets)
            _quietly(f"DeleteVolume {p.index}",
                     functools.partial(controller.DeleteVolume, request, timeout=RPC_TIMEOUT_S))


# ---- tables ------------------------------------------------------------------------------------------




def run(env: Environment) -> SectionResult:
    reason = node_ops.unavailable_reason()
    if reason:
        return SectionResult(name=NAME, title=TITLE, status="skipped", reason=reason)
    figures = Figures(volumes=volume_count(env.options))
    env.start_cluster()
    node = ScaleNode(env, env.workdir / "node-scale")
    placed: list[Placed] = []
    load_start, jiffies = machine.loadavg(), machine.cpu_now()
    try:
        _measure(env, node, placed, figures)
    finally:
        _teardown(env, node, placed, figures)
    busy = machine.busy_fraction(jiffies, machine.cpu_now())
    where = (f"load average {load_start} → {machine.loadavg()}, all CPUs "
             f"{'—' if busy is None else f'{busy * 100:.0f}%'} busy")
    latency, latency_data = _latency_table(figures)
    latency.title = f"[{where}] {latency.title}"
    data = _data(figures, latency_data)
    data["machine"] = where
    status: Status = "failed" if figures.leftovers else "ok"
    return SectionResult(
        name=NAME, title=TITLE, status=status,
        reason=f"left behind: {figures.leftovers}" if figures.leftovers else "",
        tables=[latency, _process_table(figures), _stats_table(figures), _restart_table(figures), _goals(figures)],
        data=data,
        notes=[f"one node plugin of its own (rbd-fuse mapper, ext4, {env.options.size_bytes >> 20} MiB thin "
               "volumes), SIGKILLed and relaunched in the middle; every volume is created through the shared "
               "controller (untimed) and deleted at the end",
               "rbd-fuse daemonizes, so on a host its daemons (the mappings) outlive the plugin; in a container "
               "they die with it (see cephcsi/node/mappers/fuse.py)"],
    )


SECTION = Section(NAME, TITLE, run)
