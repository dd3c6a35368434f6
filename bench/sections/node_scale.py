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
from tests.integration.driver import DriverProcess

log = logging.getLogger("bench")

NAME = "node-scale"
TITLE = "2c. Node at scale: one node plugin with N staged and published volumes (rbd-fuse)"
DEFAULT_VOLUMES = 100
QUICK_VOLUMES = 10
ENDS = 10
"""How many volumes at each end of the sequence are compared (first ENDS against last ENDS)."""
BASELINE_CYCLES = 3
STATS_CONCURRENCY = 8
KUBELET_STATS_PERIOD_S = 60.0
"""The kubelet's --volume-stats-agg-period default: it asks every volume's stats once per period."""
RESTART_GOAL_S = 10.0
SERVE_TIMEOUT_S = 120.0
RPC_TIMEOUT_S = 180.0
MARKER = "bench-node-scale.txt"


# ---- pure helpers (unit-tested) ------------------------------------------------------------------


def volume_count(options: Options) -> int:
    """--node-volumes, else 10 with --quick and 100 otherwise."""
    chosen = options.extra.get("node_volumes")
    if chosen is not None:
        return int(chosen)
    return QUICK_VOLUMES if options.quick else DEFAULT_VOLUMES


@dataclass(frozen=True)
class Ends:
    """The first k and the last k samples of a sequence, and how the two compare."""

    k: int
    first: Spread
    last: Spread

    @property
    def ratio(self) -> float | None:
        """Median of the last k over the median of the first k."""
        return ratio(self.last.median, self.first.median)

    @property
    def as_fast(self) -> bool:
        """The last k's median is no slower than the first k's upper quartile: 'as fast ± spread'.
        Not their maximum: on a shared box one stalled call among the first would pass anything."""
        return self.last.median <= self.first.q3

    def verdict(self) -> str:
        word = "within the first's upper quartile" if self.as_fast else "above the first's upper quartile"
        return f"{report.times(self.ratio)}, {word}"

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "first": self.first.to_json(), "last": self.last.to_json(), "ratio": self.ratio,
                "as_fast": self.as_fast}


def ends(samples: Sequence[float], k: int = ENDS) -> Ends | None:
    """First k against last k (k shrinks to half the samples so the two never overlap); None for
    fewer than two samples."""
    k = min(k, len(samples) // 2)
    if k < 1:
        return None
    return Ends(k=k, first=spread(samples[:k]), last=spread(samples[-k:]))


def per_volume(before: float, after: float, volumes: int) -> float | None:
    """Growth per volume between two readings (None without volumes)."""
    return (after - before) / volumes if volumes > 0 else None


def rbd_fuse_daemons(root: str, proc: str = "/proc") -> dict[int, str]:
    """Live rbd-fuse processes whose argv names a path under root: pid → that path (the last such
    argument, the mount point; the -c ceph.conf beside it is under root too)."""
    prefix = os.fsencode(os.path.realpath(root).rstrip("/") + "/")
    found: dict[int, str] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as handle:
                argv = [a for a in handle.read().split(b"\0") if a]
        except OSError:
            continue  # gone meanwhile
        if not argv or os.path.basename(argv[0]) != b"rbd-fuse":
            continue
        under = [a for a in argv[1:] if a.startswith(prefix)]
        if under:
            found[int(entry)] = os.fsdecode(under[-1])
    return found


def loops_under(root: str, sys_block: str | None = None) -> list[str]:
    """Attached loop devices whose backing file is under root."""
    prefix = os.path.realpath(root).rstrip("/") + "/"
    return [device for device, backing in attached_loops(sys_block) if backing.startswith(prefix)]


def count(flags: Sequence[bool]) -> str:
    return f"{sum(flags)}/{len(flags)}"


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


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


@dataclass
class Reading:
    """The plugin's /proc figures at one moment."""

    label: str
    sample: procstat.ProcessSample
    fds: int | None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, **self.sample.to_json(), "fds": self.fds}


def _read(label: str, pid: int) -> Reading:
    return Reading(label, procstat.sample(pid), _fds(pid))


@dataclass
class Figures:
    """Everything the section measured, filled in as it goes (a failure keeps what was reached)."""

    volumes: int
    first_start_s: float | None = None
    restart_s: float | None = None
    readings: list[Reading] = field(default_factory=list)
    series: list[dict[str, float | int | None]] = field(default_factory=list)
    """Per volume, in stage order: its stage/publish latency and the plugin's RSS/threads after it."""
    stage: list[float] = field(default_factory=list)
    publish: list[float] = field(default_factory=list)
    unpublish: list[float] = field(default_factory=list)
    unstage: list[float] = field(default_factory=list)
    stage_cpu: list[float] = field(default_factory=list)
    """The plugin's CPU seconds over each volume's stage+publish (/proc ticks: 10 ms steps)."""
    manual_empty: node_ops.Timings = field(default_factory=node_ops.Timings)
    manual_full: node_ops.Timings = field(default_factory=node_ops.Timings)
    stats: dict[str, Batch[bool]] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    fuse_rss_bytes: int | None = None
    fuse_threads: int | None = None
    leftovers: dict[str, list[str]] = field(default_factory=dict)


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


def _median(samples: Sequence[float]) -> float | None:
    return percentile(samples, 50) if samples else None


def _cell(s: Spread | None) -> str:
    return "—" if s is None else f"{s.median * 1000:.1f} ({s.low * 1000:.1f}–{s.high * 1000:.1f})"


def _sum(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x + y for x, y in zip(a, b)]


def _latency_table(f: Figures) -> tuple[Table, dict[str, Any]]:
    e = ends(f.stage)
    k = e.k if e else 0
    table = Table(title=f"latency in ms over the {f.volumes} volumes in turn: the first {k} against the last {k} "
                        "(median (min–max)); by hand = section 2's steps (rbd-fuse, losetup, mkfs.ext4, mount; "
                        f"bind mount), {BASELINE_CYCLES} cycles with nothing staged and {BASELINE_CYCLES} beside the "
                        f"{f.volumes} staged volumes, median",
                  columns=["steps", f"first {k}", f"last {k}", "last / first", "by hand, 0 staged",
                           f"by hand, {f.volumes} staged", "first ÷ by hand (0)", f"last ÷ by hand ({f.volumes})"])
    rows: list[tuple[str, list[float], list[float], list[float]]] = [
        ("stage+publish", _sum(f.stage, f.publish), f.manual_empty.up(), f.manual_full.up()),
        ("  stage", f.stage, f.manual_empty.stage, f.manual_full.stage),
        ("  publish", f.publish, f.manual_empty.publish, f.manual_full.publish),
        ("unpublish+unstage", _sum(f.unpublish, f.unstage), f.manual_empty.down(), f.manual_full.down()),
        ("  unpublish", f.unpublish, f.manual_empty.unpublish, f.manual_full.unpublish),
        ("  unstage", f.unstage, f.manual_empty.unstage, f.manual_full.unstage),
    ]
    data: dict[str, Any] = {}
    cpu = ends(f.stage_cpu)
    data["plugin cpu per stage+publish"] = cpu.to_json() if cpu else None
    for label, samples, empty, full in rows:
        got = ends(samples)
        m0, mn = _median(empty), _median(full)
        data[label.strip()] = got.to_json() if got else None
        table.add(label, _cell(got.first if got else None), _cell(got.last if got else None),
                  got.verdict() if got else "—", report.ms(m0), report.ms(mn),
                  report.times(ratio(got.first.median, m0) if got and m0 else None),
                  report.times(ratio(got.last.median, mn) if got and mn else None))
        if label == "  publish":
            table.add("  the plugin's CPU in stage+publish", _cell(cpu.first if cpu else None),
                      _cell(cpu.last if cpu else None), cpu.verdict() if cpu else "—", "—", "—", "—", "—")
    return table, data


def _process_table(f: Figures) -> Table:
    table = Table(title="the node plugin process (/proc/<pid>/status, /proc/<pid>/fd)",
                  columns=["when", "VmRSS MiB", "VmHWM MiB", "threads", "open fds"])
    for r in f.readings:
        table.add(r.label, report.mib(r.sample.rss_bytes), report.mib(r.sample.hwm_bytes), r.sample.threads,
                  "—" if r.fds is None else r.fds)
    if len(f.readings) >= 2:
        empty, full = f.readings[0], f.readings[1]
        rss = per_volume(empty.sample.rss_bytes, full.sample.rss_bytes, f.volumes)
        threads = per_volume(empty.sample.threads, full.sample.threads, f.volumes)
        fds = per_volume(empty.fds, full.fds, f.volumes) if empty.fds is not None and full.fds is not None else None
        table.add("per staged volume (staged − started) / N", "—" if rss is None else f"{rss / 1024:.1f} KiB", "—",
                  report.num(threads, 2), report.num(fds, 2))
    if f.fuse_rss_bytes is not None:
        table.add(f"the {f.volumes} rbd-fuse daemons together (the mapping, not the plugin)",
                  report.mib(f.fuse_rss_bytes), "—", f.fuse_threads, "—")
    return table


def _stats_table(f: Figures) -> Table:
    table = Table(title=f"NodeGetVolumeStats of all {f.volumes} volumes against the kubelet's "
                        f"{KUBELET_STATS_PERIOD_S:.0f} s period (--volume-stats-agg-period)",
                  columns=["batch", "total s", "p50 ms", "p99 ms", "healthy", "errors", "share of the period"])
    for label, batch in f.stats.items():
        healthy = sum(1 for r in batch.results if r)
        table.add(label, f"{batch.wall_s:.2f}", report.ms(_median(batch.latencies)),
                  report.ms(percentile(batch.latencies, 99) if batch.latencies else None),
                  f"{healthy}/{f.volumes}", len(batch.errors), f"{batch.wall_s / KUBELET_STATS_PERIOD_S * 100:.1f}%")
    return table


def _restart_table(f: Figures) -> Table:
    table = Table(title="start and SIGKILL + restart: launch → Probe and NodeGetCapabilities answered",
                  columns=["figure", "value"])
    table.add("start with nothing staged, s", report.num(f.first_start_s, 2))
    table.add(f"restart after SIGKILL with {f.volumes} staged, s", report.num(f.restart_s, 2))
    for label, value in f.checks.items():
        table.add(label, value)
    return table


def _goals(f: Figures) -> Table:
    table = Table(title="issue 38, deliverable 5 (node at scale)", columns=["goal", "measured", "verdict"])
    up = ends(_sum(f.stage, f.publish))
    table.add(f"stage+publish of the last {up.k if up else 0} as fast as the first (± spread)",
              up.verdict() if up else "—", "met" if up and up.as_fast else "NOT met")
    floor0, floorn = _median(f.manual_empty.up()), _median(f.manual_full.up())
    if up and floor0 and floorn:
        first_x, last_x = up.first.median / floor0, up.last.median / floorn
        table.add(f"the same against the floor measured beside it (by hand with 0, then {f.volumes} staged)",
                  f"{report.times(first_x)} → {report.times(last_x)} the floor "
                  f"(the floor itself {report.times(floorn / floor0)})",
                  "informational: how much of the slowdown is the host's")
    intact = [v for k, v in f.checks.items() if k != "plugin CPU per stage+publish, ms"]
    all_intact = bool(intact) and all(v.split("/")[0] == v.split("/")[1] for v in intact)
    restart_ok = f.restart_s is not None and f.restart_s <= RESTART_GOAL_S
    table.add(f"restart to serving ≤ {RESTART_GOAL_S:.0f} s, every mount intact",
              f"{report.num(f.restart_s, 2)} s; " + ", ".join(f"{k}: {v}" for k, v in f.checks.items()
                                                             if k != "plugin CPU per stage+publish, ms"),
              "met" if restart_ok and all_intact else "NOT met")
    seq = f.stats.get("all staged, c=1")
    table.add(f"NodeGetVolumeStats of all {f.volumes} within the kubelet's {KUBELET_STATS_PERIOD_S:.0f} s",
              "—" if seq is None else f"{seq.wall_s:.2f} s sequential",
              "met" if seq and not seq.errors and seq.wall_s <= KUBELET_STATS_PERIOD_S else "NOT met")
    full = f.readings[1].sample.rss_bytes if len(f.readings) >= 2 else None
    table.add("RSS reported", f"{report.mib(full)} MiB with {f.volumes} staged", "reported" if full else "—")
    table.add("nothing left mounted, attached or running afterwards",
              "; ".join(f"{k}: {len(v)}" for k, v in f.leftovers.items()) or "nothing left",
              "met" if not f.leftovers else "NOT met")
    return table


def _data(f: Figures, latency: dict[str, Any]) -> dict[str, Any]:
    return {
        "volumes": f.volumes, "first_start_s": f.first_start_s, "restart_s": f.restart_s,
        "readings": [r.to_json() for r in f.readings], "series": f.series, "ends": latency,
        "latencies": {"stage": f.stage, "publish": f.publish, "unpublish": f.unpublish, "unstage": f.unstage},
        "manual_empty": f.manual_empty.to_json(), "manual_full": f.manual_full.to_json(),
        "stats": {k: {"wall_s": b.wall_s, "latencies": b.latencies, "healthy": sum(1 for r in b.results if r),
                      "errors": b.errors} for k, b in f.stats.items()},
        "checks": f.checks, "fuse_rss_bytes": f.fuse_rss_bytes, "fuse_threads": f.fuse_threads,
        "leftovers": f.leftovers,
    }


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
