"""Section 2b: the node section's comparison on a real kernel — krbd and rbd-nbd in a VM node
(tests/vm: a Debian VM under qemu, KVM where the CPU offers VT-x/AMD-V, TCG otherwise), the
node plugin running there as the tests run it, against the same steps done by hand in the guest:

  stage    rbd device map -t krbd|nbd (--id, -m, --keyfile) → mkfs.ext4 -m0
           -Enodiscard,lazy_itable_init=1,lazy_journal_init=1 (the driver's defaults) → mount
           (Block: bind the device onto a file under the staging dir, as the driver does)
  publish  mount --bind staging → target
  reverse  umount target; umount staging; rbd device unmap

The by-hand steps are timed inside the guest (one script per direction, so the control share's
round trip is not counted against them); the driver's calls are timed on the host over gRPC
through the guest's TCP relay (a few ms). Driver and by-hand cycles alternate, each on a fresh,
never-formatted image created outside the timings. Under TCG every figure is slowed by the
emulated CPU (and by whatever else the host runs), so only the ratios mean anything there.

It boots its own VM and starts its own Ceph cluster on the VM bridge (the bench's cluster is
not reachable from a guest), so it costs a boot (25-140 s under TCG) besides its cycles.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

from bench import report
from bench.environment import Environment
from bench.model import SectionResult, Table
from bench.sections.base import Section
from bench.sections.node_ops import MKFS_EXT4, MODES, STEPS, Timings, _capability
from bench.stats import Spread, percentile, ratio_spread

log = logging.getLogger("bench")

NAME = "node-vm"
TITLE = "2b. Node on a real kernel (VM): krbd and rbd-nbd, driver vs by hand"
MAPPERS = (("krbd", "krbd"), ("rbd-nbd", "nbd"))
"""(the driver's mounter name, `rbd device --device-type`)."""
EXCLUSIVE = "rbd-nbd exclusive"
"""The row of a single-node writer's rbd-nbd map on an image with exclusive-lock: the driver reads the
image's features (`rbd info`) and maps with `exclusive` (cephcsi.node.mappers.exclusive); by hand,
`rbd device map -o exclusive`. Block volumes only: the map is what differs from the rbd-nbd rows."""
EXCLUSIVE_FEATURES = "layering,exclusive-lock"
RPC_TIMEOUT_S = 300.0
GUEST_TIMEOUT_S = 300.0


def accelerator_label(accel: str) -> str:
    """How the report names the accelerator; TCG figures are ratios only."""
    if accel == "kvm":
        return "KVM"
    return "TCG (emulated CPU: compare ratios only, not the times)"


def manual_up_script(device_type: str, image_spec: str, mode: str, staging: str, target: str,
                     user: str, mon_host: str, key_file: str, options: str = "") -> str:
    """The by-hand stage and publish, timed inside the guest; prints `DEVICE STAGE_NS PUBLISH_NS`."""
    q = shlex.quote
    mkfs = shlex.join(MKFS_EXT4)
    if mode == "block":
        stage = f"touch {q(staging)}/block && mount --bind \"$dev\" {q(staging)}/block"
        publish = f"touch {q(target)} && mount --bind {q(staging)}/block {q(target)}"
    else:
        stage = f"{mkfs} \"$dev\" && mkdir -p {q(staging)}/fs && mount -t {mode} \"$dev\" {q(staging)}/fs"
        publish = f"mkdir -p {q(target)} && mount --bind {q(staging)}/fs {q(target)}"
    return (
        "set -e; s=$(date +%s%N); "
        f"dev=$(rbd device map --device-type {device_type} --id {q(user)} -m {q(mon_host)} --keyfile {q(key_file)} "
        f"{'-o ' + q(options) + ' ' if options else ''}{q(image_spec)}); {stage}; m=$(date +%s%N); {publish}; e=$(date +%s%N); "
        "echo \"$dev $((m - s)) $((e - m))\""
    )


def manual_down_script(device_type: str, device: str, mode: str, staging: str, target: str) -> str:
    """The by-hand unpublish and unstage, timed inside the guest; prints `UNPUBLISH_NS UNSTAGE_NS`."""
    q = shlex.quote
    mounted = f"{q(staging)}/block" if mode == "block" else f"{q(staging)}/fs"
    return (
        f"set -e; s=$(date +%s%N); umount {q(target)}; m=$(date +%s%N); umount {mounted}; "
        f"rbd device unmap --device-type {device_type} {q(device)}; e=$(date +%s%N); "
        "echo \"$((m - s)) $((e - m))\""
    )


def _last_line(stdout: str) -> list[str]:
    lines = stdout.strip().splitlines()
    return lines[-1].split() if lines else []


def parse_up(stdout: str) -> tuple[str, float, float]:
    """`DEVICE STAGE_NS PUBLISH_NS` (the last line) → (device, stage s, publish s)."""
    fields = _last_line(stdout)
    if len(fields) != 3 or not fields[0].startswith("/dev/"):
        raise ValueError(f"unexpected by-hand stage output: {stdout.strip()[-300:]!r}")
    return fields[0], int(fields[1]) / 1e9, int(fields[2]) / 1e9


def parse_down(stdout: str) -> tuple[float, float]:
    """`UNPUBLISH_NS UNSTAGE_NS` (the last line) → seconds."""
    fields = _last_line(stdout)
    if len(fields) != 2:
        raise ValueError(f"unexpected by-hand unstage output: {stdout.strip()[-300:]!r}")
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


def ratios(results: dict[tuple[str, str], dict[str, Timings]]) -> dict[tuple[str, str, str], Spread | None]:
    """Per (mapper, mode, step): the spread of driver/by-hand over the interleaved cycles."""
    out: dict[tuple[str, str, str], Spread | None] = {}
    for (mapper, mode), paths in results.items():
        for step, pick in STEPS:
            out[(mapper, mode, step)] = ratio_spread(list(pick(paths["driver"])), list(pick(paths["manual"])))
    return out


@dataclass
class _Vm:
    """The VM node, its cluster and plugin (tests/vm's harness), torn down by `close`."""

    workdir: str
    cluster: Any = None
    node: Any = None
    plugin: Any = None
    key_host_path: str = ""

    def close(self) -> None:
        from tests.ceph.fixtures import stop_cluster
        from tests.vm import network
        if self.key_host_path and os.path.exists(self.key_host_path):
            os.unlink(self.key_host_path)
        if self.plugin is not None and self.node is not None and self.node.running():
            self.plugin.stop()
        if self.node is not None:
            self.node.stop()
        stop_cluster(os.path.join(self.workdir, "c"))
        network.remove_bridge()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _start(vm: _Vm) -> str:
    """Cluster on the bridge, VM, plugin; '' or why the VM could not be had."""
    from tests.ceph.fixtures import start_cluster
    from tests.vm import network
    from tests.vm.conftest import MAX_CONCURRENT_SESSIONS, REPO, built_image, missing_requirement
    from tests.vm.machine import IndexInUse, VmNode
    from tests.vm.plugin import GuestPlugin

    reason = missing_requirement()
    if reason:
        return f"VM node: {reason}"
    image = built_image()
    if image is None:
        return "VM node: the VM image is not built (scripts/setup.sh, or tests/vm/build_image.sh)"
    network.ensure_bridge()
    with mock.patch.dict(os.environ, {"CEPH_ADDR": network.HOST_ADDRESS}):
        vm.cluster = start_cluster(os.path.join(vm.workdir, "c"))
    for index in range(MAX_CONCURRENT_SESSIONS):
        node = VmNode(image, index, os.path.join(vm.workdir, "vm"), REPO)
        os.makedirs(node.workdir, exist_ok=True)
        try:
            node.start()
        except IndexInUse:
            continue
        vm.node = node
        break
    if vm.node is None:
        return "VM node: every VM node index is in use by test sessions on this machine"
    log.info("node-vm: VM node %d (%s) ready after %.0fs", vm.node.index, vm.node.accel, vm.node.boot_seconds)
    vm.plugin = GuestPlugin(vm.node, vm.cluster)
    vm.plugin.start()
    vm.key_host_path = vm.node.host_path("bench.key")
    with open(os.open(vm.key_host_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="ascii") as f:
        f.write(vm.cluster.key)
    return ""


class _Cycles:
    def __init__(self, vm: _Vm, size_bytes: int) -> None:
        from tests.vm.conftest import PODS_ROOT, STAGING_ROOT
        self.vm, self.size_mib = vm, max(1, size_bytes >> 20)
        self.staging_root, self.pods_root = STAGING_ROOT, PODS_ROOT

    def _image(self, features: str = "") -> str:
        name = f"bench-vm-{uuid.uuid4().hex[:10]}"
        extra = ["--image-feature", features] if features else []
        self.vm.cluster.admin("rbd", "create", "--size", f"{self.size_mib}M", *extra, f"{self.vm.cluster.pool}/{name}")
        return name

    def _remove(self, image: str) -> None:
        try:
            self.vm.cluster.admin("rbd", "rm", "--no-progress", f"{self.vm.cluster.pool}/{image}", timeout=120)
        except subprocess.CalledProcessError as error:
            log.warning("node-vm: could not remove %s: %s", image, error.stderr)

    def _paths(self, mode: str) -> tuple[str, str]:
        pv = f"pv-{uuid.uuid4().hex[:12]}"
        staging = f"{self.staging_root}/{pv}/globalmount"
        target = f"{self.pods_root}/pod-uid/volumes/kubernetes.io~csi/{pv}/mount"
        # The kubelet's part, untimed: the staging dir and the target's parent.
        self.vm.node.check(f"mkdir -p {shlex.quote(staging)} {shlex.quote(os.path.dirname(target))}", timeout=60)
        return staging, target

    def driver(self, mapper: str, mode: str, t: Timings, features: str = "") -> None:
        from cephcsi._generated import csi_pb2
        from cephcsi.volumes.volume_id import VolumeId
        cluster, stub = self.vm.cluster, self.vm.plugin.node
        image = self._image(features)
        try:
            volume_id = VolumeId(cluster.cluster_id, 1, VolumeId.new_uuid()).encode()
            context = {"clusterID": cluster.cluster_id, "pool": cluster.pool, "imageName": image, "mounter": mapper}
            staging, target = self._paths(mode)
            cap = _capability(mode)
            timed_cycle(stub, t, csi_pb2.NodeStageVolumeRequest(
                volume_id=volume_id, staging_target_path=staging, volume_capability=cap,
                secrets=cluster.secrets, volume_context=context), target)
        finally:
            self._remove(image)

    def manual(self, device_type: str, mode: str, t: Timings, features: str = "", options: str = "") -> None:
        from tests.vm.machine import SHARE_IN_GUEST
        cluster, node = self.vm.cluster, self.vm.node
        image = self._image(features)
        try:
            staging, target = self._paths(mode)
            key = f"{SHARE_IN_GUEST}/files/bench.key"
            up = node.check(manual_up_script(device_type, f"{cluster.pool}/{image}", mode, staging, target,
                                             cluster.user, cluster.mon_host, key, options), timeout=GUEST_TIMEOUT_S)
            device, stage_s, publish_s = parse_up(up)
            down = node.check(manual_down_script(device_type, device, mode, staging, target), timeout=GUEST_TIMEOUT_S)
            unpublish_s, unstage_s = parse_down(down)
            t.stage.append(stage_s)
            t.publish.append(publish_s)
            t.unpublish.append(unpublish_s)
            t.unstage.append(unstage_s)
        finally:
            self._remove(image)


def _p50(samples: list[float]) -> float | None:
    return percentile(samples, 50) if samples else None


def _table(accel: str, iterations: int, results: dict[tuple[str, str], dict[str, Timings]],
           spreads: dict[tuple[str, str, str], Spread | None]) -> Table:
    table = Table(title=f"[{accelerator_label(accel)}] latency in ms, {iterations} interleaved cycles per row "
                        "(driver, by hand, driver, ...), a fresh image per cycle; × = driver/by hand per cycle, "
                        "median (min–max)",
                  columns=["mapper", "volume", "steps", "driver p50", "driver max", "manual p50", "manual max",
                           "× per cycle"])
    for (mapper, mode), paths in results.items():
        for step, pick in STEPS:
            ds, ms_ = list(pick(paths["driver"])), list(pick(paths["manual"]))
            table.add(mapper, mode if mode == "block" else "ext4 (Filesystem)", step, report.ms(_p50(ds)),
                      report.ms(max(ds, default=None)), report.ms(_p50(ms_)), report.ms(max(ms_, default=None)),
                      report.times_spread(spreads[(mapper, mode, step)]))
    return table


def run(env: Environment) -> SectionResult:
    vm = _Vm(tempfile.mkdtemp(prefix="bv-", dir="/tmp"))
    try:
        reason = _start(vm)
        if reason:
            return SectionResult(name=NAME, title=TITLE, status="skipped", reason=reason)
        cycles = _Cycles(vm, env.options.size_bytes)
        iterations = env.options.node_iterations
        results: dict[tuple[str, str], dict[str, Timings]] = {
            (mapper, mode): {"driver": Timings(), "manual": Timings()} for mapper, _ in MAPPERS for mode in MODES}
        results[(EXCLUSIVE, "block")] = {"driver": Timings(), "manual": Timings()}
        for i in range(iterations):
            for mapper, device_type in MAPPERS:
                for mode in MODES:
                    log.info("node-vm: cycle %d/%d, %s %s", i + 1, iterations, mapper, mode)
                    cycles.driver(mapper, mode, results[(mapper, mode)]["driver"])
                    cycles.manual(device_type, mode, results[(mapper, mode)]["manual"])
            log.info("node-vm: cycle %d/%d, %s block", i + 1, iterations, EXCLUSIVE)
            exclusive = results[(EXCLUSIVE, "block")]
            cycles.driver("rbd-nbd", "block", exclusive["driver"], features=EXCLUSIVE_FEATURES)
            cycles.manual("nbd", "block", exclusive["manual"], features=EXCLUSIVE_FEATURES, options="exclusive")
        spreads = ratios(results)
        accel = vm.node.accel
        data: dict[str, Any] = {
            "accelerator": accel, "iterations": iterations, "boot_seconds": round(vm.node.boot_seconds, 1),
            "cycles": {f"{mapper}/{mode}": {path: t.to_json() for path, t in paths.items()}
                       for (mapper, mode), paths in results.items()},
            "ratios": {f"{mapper}/{mode}/{step.strip()}": (s.to_json() if s else None)
                       for (mapper, mode, step), s in spreads.items()},
        }
        return SectionResult(
            name=NAME, title=TITLE, tables=[_table(accel, iterations, results, spreads)], data=data,
            notes=[f"accelerator: {accelerator_label(accel)}; one pass (--background-load does not apply here)",
                   f"{EXCLUSIVE}: an image with {EXCLUSIVE_FEATURES}, mapped with 'exclusive' (by hand: -o exclusive; "
                   "the driver first reads the image's features); every driver rbd-nbd read-write stage reads them",
                   "by hand = rbd device map + mkfs.ext4 (the driver's default options) + mount, timed in the guest; "
                   "the driver additionally probes the device (direct read, blkid -p) before mkfs, fsyncs its stage "
                   "records, and waits for udev"])
    finally:
        vm.close()


SECTION = Section(NAME, TITLE, run)


def timed_cycle(stub: Any, t: Timings, stage: Any, target: str, while_published: Callable[[], None] = lambda: None
                ) -> None:
    """NodeStage (the request given), NodePublish onto `target` with its volume, capability and
    context, `while_published` (untimed here), then the reverse; each call's time into `t`."""
    from cephcsi._generated import csi_pb2
    started = time.perf_counter()
    stub.NodeStageVolume(stage, timeout=RPC_TIMEOUT_S)
    t.stage.append(time.perf_counter() - started)
    started = time.perf_counter()
    stub.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
        volume_id=stage.volume_id, staging_target_path=stage.staging_target_path, target_path=target,
        volume_capability=stage.volume_capability, volume_context=stage.volume_context), timeout=RPC_TIMEOUT_S)
    t.publish.append(time.perf_counter() - started)
    while_published()
    started = time.perf_counter()
    stub.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
        volume_id=stage.volume_id, target_path=target), timeout=RPC_TIMEOUT_S)
    t.unpublish.append(time.perf_counter() - started)
    started = time.perf_counter()
    stub.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
        volume_id=stage.volume_id, staging_target_path=stage.staging_target_path), timeout=RPC_TIMEOUT_S)
    t.unstage.append(time.perf_counter() - started)
