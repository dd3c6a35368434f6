"""Section 2d: block encryption (LUKS2, `encrypted: "true"`, the `metadata` KMS) on the VM node of
section 2b — the driver's NodeStage+NodePublish, a sequential write through the published volume
and NodeUnpublish+NodeUnstage, against the same steps by hand in the guest:

  stage    rbd device map -t krbd|nbd → cryptsetup -q luksFormat (the driver's options:
           cephcsi.node.luks.FORMAT_OPTIONS, cryptsetup's default cipher, key and sector size)
           --key-file=<0600 file> → cryptsetup luksOpen --disable-keyring → mkfs.ext4 (the
           driver's defaults) → mount
  publish  mount --bind staging → target
  write    dd if=/dev/zero of=<target>/bench.data bs=1M count=64 oflag=direct conv=fsync
  reverse  umount target; umount staging; cryptsetup luksClose; rbd device unmap

Each round runs a driver cycle and a by-hand cycle per mapper (which goes first alternating), each
on a fresh, never-formatted image. The driver's volume is set up as CreateVolume leaves one with
the metadata KMS: state `encryptionPrepared` and a per-volume passphrase wrapped with the class
secret in the image metadata. The write is timed in the guest on both sides. The headers both
sides wrote are compared (cipher, key size, sector size, PBKDF). TCG: only ratios mean anything.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shlex
import tempfile
from dataclasses import dataclass, field
from typing import Any

from bench import report
from bench.environment import Environment
from bench.model import SectionResult, Table
from bench.sections.base import Section
from bench.sections.node_ops import MKFS_EXT4, STEPS, Timings, _capability
from bench.sections.node_vm import (
    GUEST_TIMEOUT_S,
    MAPPERS,
    _Cycles,
    _start,
    _Vm,
    accelerator_label,
    parse_down,
    parse_up,
    timed_cycle,
)
from bench.stats import Spread, percentile, ratio_spread, spread

log = logging.getLogger("bench")

NAME = "node-vm-crypt"
TITLE = "2d. Encrypted node on a real kernel (VM): LUKS2 stage, write and unstage, driver vs by hand"
WRITE_MIB = 64
KMS_ID = "bench-meta"
KMS_CONFIG_DIR = "/etc/ceph-csi-encryption-kms-config"
WRITE_FILE = "bench.data"
HEADER_FIELDS = ("cipher", "key bits", "sector", "pbkdf")


@dataclass
class CryptTimings(Timings):
    """Node step latencies plus the sequential write's seconds, per cycle."""

    write: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, list[float]]:
        return {**super().to_json(), "write": self.write}


def _format_options() -> str:
    from cephcsi.node.luks import FORMAT_OPTIONS
    return shlex.join(FORMAT_OPTIONS)


def manual_up_script(device_type: str, image_spec: str, staging: str, target: str, user: str, mon_host: str,
                     ceph_key_file: str, luks_key_file: str, name: str) -> str:
    """The by-hand encrypted stage and publish, timed in the guest; prints `DEVICE STAGE_NS PUBLISH_NS`.

    luksFormat runs only when `blkid -p` positively finds no signature (exit 2); that probe is
    not timed (the by-hand floor leaves it out, as section 2b's does)."""
    q = shlex.quote
    mkfs = shlex.join(MKFS_EXT4)
    fs = f"{q(staging)}/fs"
    return (
        "set -e; s=$(date +%s%N); "
        f"dev=$(rbd device map --device-type {device_type} --id {q(user)} -m {q(mon_host)} "
        f"--keyfile {q(ceph_key_file)} {q(image_spec)}); g=$(date +%s%N); "
        "rc=0; blkid -p \"$dev\" >/dev/null 2>&1 || rc=$?; "
        "if [ $rc -ne 2 ]; then echo \"$dev holds a signature (blkid -p: $rc): not formatting\" >&2; exit 3; fi; "
        "h=$(date +%s%N); "
        f"cryptsetup -q luksFormat {_format_options()} --key-file={q(luks_key_file)} \"$dev\"; "
        f"cryptsetup luksOpen \"$dev\" {q(name)} --disable-keyring --key-file={q(luks_key_file)}; "
        f"{mkfs} /dev/mapper/{q(name)}; mkdir -p {fs}; mount -t ext4 /dev/mapper/{q(name)} {fs}; "
        f"m=$(date +%s%N); mkdir -p {q(target)} && mount --bind {fs} {q(target)}; e=$(date +%s%N); "
        "echo \"$dev $((g - s + m - h)) $((e - m))\""
    )


def write_script(target: str, mib: int = WRITE_MIB) -> str:
    """The sequential write through the published path, timed in the guest; prints `WRITE_NS`."""
    path = shlex.quote(f"{target}/{WRITE_FILE}")
    return (f"set -e; s=$(date +%s%N); dd if=/dev/zero of={path} bs=1M count={mib} oflag=direct conv=fsync "
            "status=none; e=$(date +%s%N); echo \"$((e - s))\"")


def manual_down_script(device_type: str, device: str, staging: str, target: str, name: str) -> str:
    """The by-hand unpublish and unstage, timed in the guest; prints `UNPUBLISH_NS UNSTAGE_NS`."""
    q = shlex.quote
    return (
        f"set -e; s=$(date +%s%N); umount {q(target)}; m=$(date +%s%N); umount {q(staging)}/fs; "
        f"cryptsetup luksClose {q(name)}; rbd device unmap --device-type {device_type} {q(device)}; "
        "e=$(date +%s%N); echo \"$((m - s)) $((e - m))\""
    )


def parse_write(stdout: str) -> float:
    """`WRITE_NS` (the last line) → seconds."""
    lines = stdout.strip().splitlines()
    fields_ = lines[-1].split() if lines else []
    if len(fields_) != 1 or not fields_[0].isdigit() or int(fields_[0]) <= 0:
        raise ValueError(f"unexpected write output: {stdout.strip()[-300:]!r}")
    return int(fields_[0]) / 1e9


def parse_header(dump: str) -> dict[str, str]:
    """`cryptsetup luksDump` (LUKS2) → the data segment's cipher and sector size, the first
    keyslot's key size and PBKDF: what decides the data path's cost and the open's."""
    found: dict[str, str] = {}
    section = ""
    for line in dump.splitlines():
        if line and not line[0].isspace():
            section = line.split(":")[0].strip()
            continue
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if section == "Data segments" and key == "cipher":
            found.setdefault("cipher", value)
        elif section == "Data segments" and key == "sector":
            found.setdefault("sector", value.split()[0])
        elif section == "Keyslots" and key == "Key":
            found.setdefault("key bits", value.split()[0])
        elif section == "Keyslots" and key == "PBKDF":
            found.setdefault("pbkdf", value)
    return found


def throughputs(t: CryptTimings, mib: int = WRITE_MIB) -> list[float]:
    """MiB/s per cycle."""
    return [mib / s for s in t.write if s > 0]


def ratios(results: dict[str, dict[str, CryptTimings]]) -> dict[tuple[str, str], Spread | None]:
    """Per (mapper, step): driver/by hand per round; for "write MiB/s" the driver's throughput over
    the by-hand one (below 1: the driver's volume writes slower)."""
    out: dict[tuple[str, str], Spread | None] = {}
    for mapper, paths in results.items():
        d, m = paths["driver"], paths["manual"]
        for step, pick in STEPS:
            out[(mapper, step)] = ratio_spread(list(pick(d)), list(pick(m)))
        out[(mapper, "write MiB/s")] = ratio_spread(throughputs(d), throughputs(m))
    return out


class _CryptCycles(_Cycles):
    def __init__(self, vm: _Vm, size_bytes: int, luks_key_guest: str) -> None:
        super().__init__(vm, size_bytes)
        self.luks_key_guest = luks_key_guest
        # The StorageClass secret the metadata KMS wraps each volume's passphrase with: fresh per run.
        self.class_secret = secrets.token_urlsafe(24)
        self.headers: dict[str, list[dict[str, str]]] = {"driver": [], "manual": []}

    def _dump(self, path: str, device: str) -> None:
        dump = self.vm.node.check(f"cryptsetup luksDump {shlex.quote(device)}", timeout=GUEST_TIMEOUT_S)
        self.headers[path].append(parse_header(dump))

    def _write(self, target: str) -> float:
        return parse_write(self.vm.node.check(write_script(target), timeout=GUEST_TIMEOUT_S))

    def driver(self, mapper: str, mode: str, t: Timings, features: str = "") -> None:
        """One encrypted cycle through the plugin (ext4); `t` is a CryptTimings."""
        from cephcsi._generated import csi_pb2
        from cephcsi.encryption.kms.secrets import PASSPHRASE_KEY, wrap
        from cephcsi.encryption.volume_keys import DEK_KEY, PREPARED, STATE_KEY, new_passphrase
        from cephcsi.volumes.volume_id import VolumeId
        from tests.vm.guestio import stage_record
        assert isinstance(t, CryptTimings)
        cluster, stub = self.vm.cluster, self.vm.plugin.node
        image = self._image(features)
        try:
            volume_id = VolumeId(cluster.cluster_id, 1, VolumeId.new_uuid()).encode()
            spec = f"{cluster.pool}/{image}"
            # What CreateVolume leaves on an encrypted volume of the metadata KMS (untimed).
            cluster.admin("rbd", "image-meta", "set", spec, STATE_KEY, PREPARED)
            cluster.admin("rbd", "image-meta", "set", spec, DEK_KEY, wrap(self.class_secret, volume_id, new_passphrase()))
            context = {"clusterID": cluster.cluster_id, "pool": cluster.pool, "imageName": image, "mounter": mapper,
                       "encrypted": "true", "encryptionType": "block", "encryptionKMSID": KMS_ID}
            request_secrets = {**cluster.secrets, PASSPHRASE_KEY: self.class_secret}
            staging, target = self._paths(mode)
            cap = _capability(mode)
            def write_while_published() -> None:
                self._dump("driver", str(stage_record(self.vm.node, staging)["device"]))
                t.write.append(self._write(target))

            timed_cycle(stub, t, csi_pb2.NodeStageVolumeRequest(
                volume_id=volume_id, staging_target_path=staging, volume_capability=cap,
                secrets=request_secrets, volume_context=context), target, write_while_published)
        finally:
            self._remove(image)

    def manual(self, device_type: str, mode: str, t: Timings, features: str = "", options: str = "") -> None:
        """The same cycle by hand in the guest (ext4); `t` is a CryptTimings."""
        from tests.vm.machine import SHARE_IN_GUEST
        assert isinstance(t, CryptTimings)
        cluster, node = self.vm.cluster, self.vm.node
        image = self._image(features)
        name = f"luks-bench-{image}"
        try:
            staging, target = self._paths(mode)
            up = node.check(manual_up_script(device_type, f"{cluster.pool}/{image}", staging, target, cluster.user,
                                             cluster.mon_host, f"{SHARE_IN_GUEST}/files/bench.key",
                                             self.luks_key_guest, name), timeout=GUEST_TIMEOUT_S)
            device, stage_s, publish_s = parse_up(up)
            self._dump("manual", device)
            write_s = self._write(target)
            unpublish_s, unstage_s = parse_down(node.check(
                manual_down_script(device_type, device, staging, target, name), timeout=GUEST_TIMEOUT_S))
            t.stage.append(stage_s)
            t.publish.append(publish_s)
            t.write.append(write_s)
            t.unpublish.append(unpublish_s)
            t.unstage.append(unstage_s)
        finally:
            self._remove(image)


def header_note(headers: dict[str, list[dict[str, str]]]) -> str:
    """One line: the LUKS2 parameters each side wrote, or where they differ."""
    def seen(path: str) -> dict[str, set[str]]:
        return {k: {h.get(k, "?") for h in headers[path]} for k in HEADER_FIELDS}
    d, m = seen("driver"), seen("manual")
    text = ", ".join(f"{k} {'/'.join(sorted(d[k]))}" for k in HEADER_FIELDS)
    if d == m:
        return f"LUKS2 headers, both sides alike: {text}"
    other = ", ".join(f"{k} {'/'.join(sorted(m[k]))}" for k in HEADER_FIELDS)
    return f"LUKS2 headers DIFFER: driver {text}; by hand {other}"


def _ms(samples: list[float]) -> tuple[str, str]:
    return (report.ms(percentile(samples, 50) if samples else None), report.ms(max(samples, default=None)))


def tables(accel: str, rounds: int, results: dict[str, dict[str, CryptTimings]],
           spreads: dict[tuple[str, str], Spread | None]) -> list[Table]:
    latency = Table(title=f"[{accelerator_label(accel)}] LUKS2 + ext4, latency in ms, {rounds} interleaved rounds "
                          "(a driver and a by-hand cycle per mapper, which goes first alternating), a fresh image per "
                          "cycle; × = driver/by hand per round, median (min–max)",
                    columns=["mapper", "steps", "driver p50", "driver max", "manual p50", "manual max", "× per round"])
    write = Table(title=f"[{accelerator_label(accel)}] sequential write of {WRITE_MIB} MiB into the published path "
                        "(dd oflag=direct conv=fsync, timed in the guest), MiB/s median (min–max); "
                        "× = driver/by hand per round (below 1: the driver's volume writes slower)",
                  columns=["mapper", "driver MiB/s", "manual MiB/s", "× per round"])
    for mapper, paths in results.items():
        for step, pick in STEPS:
            ds, ms_ = list(pick(paths["driver"])), list(pick(paths["manual"]))
            latency.add(mapper, step, *_ms(ds), *_ms(ms_), report.times_spread(spreads[(mapper, step)]))
        cells = []
        for path in ("driver", "manual"):
            values = throughputs(paths[path])
            s = spread(values) if values else None
            cells.append("—" if s is None else f"{s.median:.1f} ({s.low:.1f}–{s.high:.1f})")
        write.add(mapper, *cells, report.times_spread(spreads[(mapper, "write MiB/s")]))
    return [latency, write]


def _set_up_guest(vm: _Vm) -> tuple[str, str]:
    """The metadata KMS's config in the guest and the by-hand LUKS key (a 0600 file in the control
    share); (host path, guest path) of that key."""
    from cephcsi.encryption.volume_keys import new_passphrase
    config = json.dumps({KMS_ID: {"encryptionKMSType": "metadata"}})
    vm.node.check(f"mkdir -p {KMS_CONFIG_DIR} && echo {shlex.quote(config)} >{KMS_CONFIG_DIR}/config.json", timeout=60)
    host = vm.node.host_path("bench-luks.key")
    with open(os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="ascii") as f:
        f.write(new_passphrase())  # the same kind of key the metadata KMS gives the driver's volumes
    return host, vm.node.guest_path("bench-luks.key")


def run(env: Environment) -> SectionResult:
    vm = _Vm(tempfile.mkdtemp(prefix="bvc-", dir="/tmp"))
    luks_key = ""
    try:
        reason = _start(vm)
        if reason:
            return SectionResult(name=NAME, title=TITLE, status="skipped", reason=reason)
        luks_key, luks_key_guest = _set_up_guest(vm)
        cycles = _CryptCycles(vm, env.options.size_bytes, luks_key_guest)
        rounds = env.options.node_iterations
        results = {mapper: {"driver": CryptTimings(), "manual": CryptTimings()} for mapper, _ in MAPPERS}
        for i in range(rounds):
            for mapper, device_type in MAPPERS:
                log.info("node-vm-crypt: round %d/%d, %s", i + 1, rounds, mapper)
                for path in ("driver", "manual") if i % 2 == 0 else ("manual", "driver"):
                    if path == "driver":
                        cycles.driver(mapper, "ext4", results[mapper]["driver"])
                    else:
                        cycles.manual(device_type, "ext4", results[mapper]["manual"])
        spreads = ratios(results)
        accel = vm.node.accel
        data: dict[str, Any] = {
            "accelerator": accel, "rounds": rounds, "write_mib": WRITE_MIB, "boot_seconds": round(vm.node.boot_seconds, 1),
            "cycles": {mapper: {path: t.to_json() for path, t in paths.items()} for mapper, paths in results.items()},
            "ratios": {f"{mapper}/{step.strip()}": (s.to_json() if s else None) for (mapper, step), s in spreads.items()},
            "headers": cycles.headers,
        }
        return SectionResult(
            name=NAME, title=TITLE, tables=tables(accel, rounds, results, spreads), data=data,
            notes=[f"accelerator: {accelerator_label(accel)}; one pass (--background-load does not apply here)",
                   header_note(cycles.headers),
                   "by hand = rbd device map + cryptsetup luksFormat (the driver's options) + luksOpen + mkfs.ext4 "
                   "(the driver's defaults) + mount, timed in the guest, the key from a 0600 file; the driver "
                   "additionally reads the image metadata and unwraps the volume's passphrase (scrypt), takes and "
                   "releases the format lock, records the state 'encrypted', probes the device before luksFormat "
                   "and mkfs, fsyncs its stage records, waits for udev"])
    finally:
        if luks_key and os.path.exists(luks_key):
            os.unlink(luks_key)
        vm.close()


SECTION = Section(NAME, TITLE, run)
