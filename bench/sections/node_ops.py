"""Section 2: NodeStage+NodePublish and NodeUnpublish+NodeUnstage through a real
`cephcsi --mode=node` socket (rbd-fuse mapper: these machines have no krbd/nbd), beside the same
steps done by hand — the floor:

  stage    rbd-fuse (own minimal ceph.conf, --id) → losetup --find --show --direct-io=on
           → mkfs.ext4 -m0 -Enodiscard,lazy_itable_init=1,lazy_journal_init=1 (the driver's
           default options) → mount -o _netdev           (Block: no mkfs, no mount)
  publish  mount --bind staging → target                (Block: bind the loop device onto a file)
  reverse  umount target; umount staging; losetup -d; umount the rbd-fuse dir and wait until
           rbd-fuse has exited (it holds a watch on the image until then)

Every iteration uses a fresh, never-formatted volume/image on both paths (created and deleted
outside the timings), so both run mkfs. The driver also does what the manual floor leaves out:
a direct read of the device and `blkid -p` before mkfs (it never formats over data), stage
records written with fsync, path checks, a key file, and mount-table reads.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench import background, procstat, report
from bench.environment import Environment
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from bench.stats import Spread, percentile, ratio, ratio_spread
from cephcsi._generated import csi_pb2

log = logging.getLogger("bench")

NAME = "node"
TITLE = "2. Node: stage+publish / unpublish+unstage, driver (rbd-fuse) vs by hand"
MKFS_EXT4 = ["mkfs.ext4", "-q", "-m0", "-Enodiscard,lazy_itable_init=1,lazy_journal_init=1"]
RPC_TIMEOUT_S = 180.0
CMD_TIMEOUT_S = 120.0
Mode = csi_pb2.VolumeCapability.AccessMode
MODES = ("ext4", "block")


def unavailable_reason() -> str:
    """Why the node service cannot be benchmarked, or '' when its module imports."""
    try:
        if importlib.util.find_spec("cephcsi.csi.node") is None:
            return "node service not available (cephcsi/csi/node.py does not exist yet)"
        importlib.import_module("cephcsi.csi.node")
    except Exception as error:  # noqa: BLE001 - any import failure means: not usable
        return f"node service not available (cephcsi.csi.node does not import: {type(error).__name__}: {error})"
    return ""


def _capability(mode: str) -> csi_pb2.VolumeCapability:
    access = Mode(mode=Mode.SINGLE_NODE_WRITER)
    if mode == "block":
        return csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=access)
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(fs_type=mode), access_mode=access)


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return done.stdout


def _fuse_pids(mount_dir: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and os.path.basename(argv[0]) == b"rbd-fuse" and os.fsencode(mount_dir) in argv:
                pids.append(int(entry))
    return pids


def _wait(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


@dataclass
class Timings:
    stage: list[float] = field(default_factory=list)
    publish: list[float] = field(default_factory=list)
    unpublish: list[float] = field(default_factory=list)
    unstage: list[float] = field(default_factory=list)

    def up(self) -> list[float]:
        return [a + b for a, b in zip(self.stage, self.publish)]

    def down(self) -> list[float]:
        return [a + b for a, b in zip(self.unpublish, self.unstage)]

    def to_json(self) -> dict[str, list[float]]:
        return {"stage": self.stage, "publish": self.publish, "unpublish": self.unpublish, "unstage": self.unstage}


class ManualPath:
    """The by-hand floor, with a conf/key written once (outside the timings)."""

    def __init__(self, env: Environment, root: Path) -> None:
        cluster = env.start_cluster()
        self.pool, self.user = cluster.pool, cluster.user
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        keyring = root / "keyring"
        keyring.write_text(f"[client.{cluster.user}]\n\tkey = {cluster.key}\n")
        keyring.chmod(0o600)
        self.conf = root / "ceph.conf"
        self.conf.write_text(f"[global]\nmon host = {cluster.mon_host}\nkeyring = {keyring}\nadmin socket =\n"
                             f"log file = {root / 'rbd-fuse.log'}\n")

    def cycle(self, image: str, mode: str, t: Timings) -> None:
        work = self.root / image
        mnt, staging = work / "mnt", work / "staging"
        target = work / ("target" if mode != "block" else "target-dev")
        for d in (mnt, staging):
            d.mkdir(parents=True)
        backing = str(mnt / image)

        started = time.perf_counter()
        _run("rbd-fuse", "-c", str(self.conf), "--id", self.user, "-p", self.pool, "-r", image, str(mnt))
        _wait(lambda: os.path.exists(backing), f"rbd-fuse to expose {image}")
        device = _run("losetup", "--find", "--show", "--direct-io=on", backing).strip()
        if mode != "block":
            _run(*MKFS_EXT4, device)
            _run("mount", "-t", mode, "-o", "_netdev", device, str(staging))
        t.stage.append(time.perf_counter() - started)

        started = time.perf_counter()
        if mode == "block":
            target.touch()
            _run("mount", "--bind", device, str(target))
        else:
            target.mkdir()
            _run("mount", "--bind", str(staging), str(target))
        t.publish.append(time.perf_counter() - started)

        started = time.perf_counter()
        _run("umount", str(target))
        target.unlink() if mode == "block" else target.rmdir()
        t.unpublish.append(time.perf_counter() - started)

        started = time.perf_counter()
        if mode != "block":
            _run("umount", str(staging))
        _run("losetup", "-d", device)
        _run("umount", str(mnt))
        _wait(lambda: not _fuse_pids(str(mnt)), "rbd-fuse to exit")
        t.unstage.append(time.perf_counter() - started)
        for d in (mnt, staging, work):
            d.rmdir()


class DriverPath:
    def __init__(self, env: Environment) -> None:
        self.env = env
        self.node = env.node().node
        self.controller = env.controller().controller
        self.cluster = env.start_cluster()

    def create(self) -> csi_pb2.Volume:
        request = csi_pb2.CreateVolumeRequest(
            name=f"bench-node-{uuid.uuid4()}",
            capacity_range=csi_pb2.CapacityRange(required_bytes=self.env.options.size_bytes),
            volume_capabilities=[_capability("ext4")],
            parameters=self.cluster.parameters, secrets=self.cluster.secrets)
        response: csi_pb2.CreateVolumeResponse = self.controller.CreateVolume(request, timeout=RPC_TIMEOUT_S)
        return response.volume

    def delete(self, volume: csi_pb2.Volume) -> None:
        self.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id,
                                                                 secrets=self.cluster.secrets),
                                     timeout=RPC_TIMEOUT_S)

    def cycle(self, volume: csi_pb2.Volume, mode: str, t: Timings) -> None:
        # The kubelet's layout: it creates the staging dir and the target's parent.
        pv = f"pv-{uuid.uuid4().hex[:12]}"
        kubelet = self.env.kubelet_dir
        staging = kubelet / "plugins/kubernetes.io/csi/rbd.csi.ceph.com" / pv / "globalmount"
        if mode == "block":
            target = kubelet / "plugins/kubernetes.io/csi/volumeDevices/publish" / pv / "pod-uid"
        else:
            target = kubelet / "pods/pod-uid/volumes/kubernetes.io~csi" / pv / "mount"
        staging.mkdir(parents=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        cap = _capability(mode)

        started = time.perf_counter()
        self.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
            volume_id=volume.volume_id, volume_capability=cap, staging_target_path=str(staging),
            secrets=self.cluster.secrets, volume_context=volume.volume_context), timeout=RPC_TIMEOUT_S)
        t.stage.append(time.perf_counter() - started)

        started = time.perf_counter()
        self.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=volume.volume_id, volume_capability=cap, staging_target_path=str(staging),
            target_path=str(target), volume_context=volume.volume_context), timeout=RPC_TIMEOUT_S)
        t.publish.append(time.perf_counter() - started)

        started = time.perf_counter()
        self.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id=volume.volume_id, target_path=str(target)), timeout=RPC_TIMEOUT_S)
        t.unpublish.append(time.perf_counter() - started)

        started = time.perf_counter()
        self.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
            volume_id=volume.volume_id, staging_target_path=str(staging)), timeout=RPC_TIMEOUT_S)
        t.unstage.append(time.perf_counter() - started)


def _skipped(reason: str) -> SectionResult:
    return SectionResult(name=NAME, title=TITLE, status="skipped", reason=reason)


def _p(samples: list[float], q: float) -> float | None:
    return percentile(samples, q) if samples else None


def _cycles(env: Environment, driver: DriverPath, manual: ManualPath, raw: RawRbd,
            first_pass: bool) -> dict[str, dict[str, Timings]] | SectionResult:
    """node_iterations interleaved cycles per mode: driver, by hand, driver, by hand, ..."""
    results: dict[str, dict[str, Timings]] = {m: {"driver": Timings(), "manual": Timings()} for m in MODES}
    for i in range(env.options.node_iterations):
        for mode in MODES:
            volume = driver.create()
            try:
                driver.cycle(volume, mode, results[mode]["driver"])
            except grpc.RpcError as error:
                if first_pass and i == 0 and mode == MODES[0]:
                    return _skipped(f"node service not available ({error.code().name}: {(error.details() or '')[:300]})")
                raise
            finally:
                driver.delete(volume)
            image = raw.create(raw.new_name())
            try:
                manual.cycle(image, mode, results[mode]["manual"])
            finally:
                raw.remove(image)
    return results


STEPS = (("stage+publish", Timings.up), ("  stage", lambda t: t.stage), ("  publish", lambda t: t.publish),
         ("unpublish+unstage", Timings.down), ("  unpublish", lambda t: t.unpublish),
         ("  unstage", lambda t: t.unstage))

# issue 17's node targets: (label, mode, step, target)
TARGETS = (
    ("NodeUnpublish+NodeUnstage ≤ 1.3× by hand, ext4", "ext4", "unpublish+unstage", 1.3),
    ("NodeUnpublish+NodeUnstage ≤ 1.3× by hand, block", "block", "unpublish+unstage", 1.3),
    ("NodePublish ≤ 1.5× a bare bind mount, ext4", "ext4", "  publish", 1.5),
    ("NodePublish ≤ 1.5× a bare bind mount, block", "block", "  publish", 1.5),
)


def step_ratios(results: dict[str, dict[str, Timings]]) -> dict[tuple[str, str], Spread | None]:
    """Per (mode, step): the spread of driver/manual over the interleaved cycles (cycle i of
    the driver against cycle i by hand)."""
    out: dict[tuple[str, str], Spread | None] = {}
    for mode in MODES:
        d, m = results[mode]["driver"], results[mode]["manual"]
        for step, pick in STEPS:
            out[(mode, step)] = ratio_spread(list(pick(d)), list(pick(m)))
    return out


Pass = tuple[dict[str, str], dict[str, dict[str, Timings]]]


def _measure(env: Environment, driver: DriverPath, manual: ManualPath) -> list[Pass] | SectionResult:
    """Each load pass's cycles (driver and by hand interleaved); a SectionResult when a cycle fails."""
    raw = RawRbd(env.start_cluster(), env.options.size_bytes)
    node_process = env.node().process
    assert node_process is not None  # env.node() returns a started process
    node_pid = node_process.pid
    env.node_samples["at rest (serving, nothing staged)"] = procstat.sample(node_pid)
    passes: list[Pass] = []
    try:
        for _hogs, state in background.passes(env.options.background_loads):
            log.info("node [%s]: %d cycles per mode", state["load"], env.options.node_iterations)
            got = _cycles(env, driver, manual, raw, first_pass=not passes)
            if isinstance(got, SectionResult):
                return got
            passes.append((state, got))
        env.node_samples["after the stage/unstage cycles (idle)"] = procstat.sample(node_pid)
    finally:
        raw.close()
    return passes


def _pass_table(env: Environment, state: Mapping[str, str], results: dict[str, dict[str, Timings]],
                ratios: dict[tuple[str, str], Spread | None]) -> tuple[Table, dict[str, Any]]:
    """One load pass: per mode and step group, driver vs by hand; (table, JSON record)."""
    where = (f"{state['load']}; load average {state['loadavg_start']} → {state['loadavg_end']}, "
             f"all CPUs {state['cpu_busy']} busy")
    table = Table(title=f"[{where}] latency in ms, {env.options.node_iterations} interleaved cycles per row "
                        "(driver, by hand, driver, ...), a fresh volume per cycle; × = driver/manual per cycle, "
                        "median (min–max)",
                  columns=["volume", "steps", "driver p50", "driver max", "manual p50", "manual max", "p50 ×",
                           "× per cycle"])
    pass_data: dict[str, Any] = {"state": state}
    for mode in MODES:
        d, m = results[mode]["driver"], results[mode]["manual"]
        pass_data[mode] = {"driver": d.to_json(), "manual": m.to_json(),
                           "ratios": {step.strip(): (r.to_json() if r else None)
                                      for (md, step), r in ratios.items() if md == mode}}
        for steps, pick in STEPS:
            ds, ms_ = list(pick(d)), list(pick(m))
            dp, mp = _p(ds, 50), _p(ms_, 50)
            table.add(mode if mode == "block" else "ext4 (Filesystem)", steps, report.ms(dp),
                      report.ms(max(ds, default=None)), report.ms(mp), report.ms(max(ms_, default=None)),
                      report.times(ratio(dp, mp) if dp is not None and mp is not None else None),
                      report.times_spread(ratios[(mode, steps)]))
    return table, pass_data


def run(env: Environment) -> SectionResult:
    """Stage/publish cycles through the node plugin and by hand, per load pass; tabulate."""
    reason = unavailable_reason()
    if reason:
        return _skipped(reason)
    env.start_cluster()
    try:
        driver = DriverPath(env)
    except Exception as error:  # noqa: BLE001 - a node plugin that cannot start is "not available"
        return _skipped(f"node service not available (cephcsi --mode=node did not start: {str(error)[:300]})")
    passes = _measure(env, driver, ManualPath(env, env.workdir / "manual"))
    if isinstance(passes, SectionResult):
        return passes
    tables = []
    data: dict[str, Any] = {"iterations": env.options.node_iterations, "passes": []}
    all_ratios = []
    for state, results in passes:
        ratios = step_ratios(results)
        all_ratios.append(ratios)
        table, pass_data = _pass_table(env, state, results, ratios)
        tables.append(table)
        data["passes"].append(pass_data)
    targets = Table(title="issue-17 targets (median of the per-cycle ratios; min–max in parentheses)",
                    columns=["target", *[state["load"] for state, _ in passes]])
    for label, mode, step, target in TARGETS:
        targets.add(label, *[report.verdict(r[(mode, step)], target) for r in all_ratios])
    tables.append(targets)
    return SectionResult(
        name=NAME, title=TITLE, tables=tables, data=data,
        notes=["manual = rbd-fuse + losetup --direct-io=on + mkfs.ext4 (driver's default options) + mount; "
               "the driver additionally probes the device (direct read, blkid -p) before mkfs and fsyncs its stage records."],
    )


SECTION = Section(NAME, TITLE, run)
