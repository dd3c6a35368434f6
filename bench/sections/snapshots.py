"""Snapshots, restores and clones through a real `cephcsi --mode=controller` over gRPC, beside
the raw librbd operations they are made of, on the same cluster in the same run, for an empty
and a fully written 1 GiB source.

Baselines (what the driver's call does in Ceph, with no journal, locks or checks around it):
  CreateSnapshot ↔ snap create on the source + clone + snap remove + snap create on the clone
                   (the cut and the restore point of a snapshot image, docs/snapshots.md);
  restore        ↔ one clone from a snapshot;
  clone          ↔ snap create on the source + clone + snap remove.
Single librbd steps (snap create, clone) are reported too. Each figure is the median of
`ITERATIONS` sequential calls; nothing is copied, so written and empty should cost the same.
"""
from __future__ import annotations

import logging
import os
import statistics
import time
import uuid
from collections.abc import Callable

import rbd

from bench.environment import Environment
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from cephcsi._generated import csi_pb2

log = logging.getLogger("bench")

NAME = "snapshots"
TITLE = "7. CreateSnapshot, restore and clone: driver over gRPC vs the raw librbd steps"
ITERATIONS = 7
SOURCE_BYTES = 1 << 30
CHUNK = 4 << 20
RPC_TIMEOUT_S = 120.0
Mode = csi_pb2.VolumeCapability.AccessMode


def _ms(call: Callable[[], object]) -> tuple[float, object]:
    started = time.monotonic()
    result = call()
    return (time.monotonic() - started) * 1000, result


def _fill(raw: RawRbd, name: str) -> None:
    data = os.urandom(CHUNK)
    with rbd.Image(raw.io, name) as image:
        for offset in range(0, SOURCE_BYTES, CHUNK):
            image.write(data, offset)


class Driver:
    def __init__(self, env: Environment) -> None:
        cluster = env.start_cluster()
        self.stub = env.controller().controller
        self.parameters, self.secrets = cluster.parameters, cluster.secrets
        self.snapshots: list[str] = []
        self.volumes: list[str] = []

    def create(self, source: csi_pb2.VolumeContentSource | None = None) -> str:
        request = csi_pb2.CreateVolumeRequest(
            name=f"bench-snap-{uuid.uuid4()}", capacity_range=csi_pb2.CapacityRange(required_bytes=SOURCE_BYTES),
            volume_capabilities=[csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                                          access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))],
            parameters=self.parameters, secrets=self.secrets)
        if source is not None:
            request.volume_content_source.CopyFrom(source)
        volume_id = str(self.stub.CreateVolume(request, timeout=RPC_TIMEOUT_S).volume.volume_id)
        self.volumes.append(volume_id)
        return volume_id

    def snapshot(self, volume_id: str) -> str:
        request = csi_pb2.CreateSnapshotRequest(name=f"bench-snap-{uuid.uuid4()}", source_volume_id=volume_id,
                                                secrets=self.secrets)
        snapshot_id = str(self.stub.CreateSnapshot(request, timeout=RPC_TIMEOUT_S).snapshot.snapshot_id)
        self.snapshots.append(snapshot_id)
        return snapshot_id

    def cleanup(self) -> None:
        for volume_id in self.volumes:
            self.stub.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=self.secrets),
                                   timeout=RPC_TIMEOUT_S)
        for snapshot_id in self.snapshots:
            self.stub.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=self.secrets),
                                     timeout=RPC_TIMEOUT_S)


def _driver_round(driver: Driver, source: str) -> dict[str, float]:
    snap_ms, snapshot_id = _ms(lambda: driver.snapshot(source))
    restore_ms, _ = _ms(lambda: driver.create(csi_pb2.VolumeContentSource(
        snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=str(snapshot_id)))))
    clone_ms, _ = _ms(lambda: driver.create(csi_pb2.VolumeContentSource(
        volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=source))))
    return {"CreateSnapshot": snap_ms, "restore": restore_ms, "clone": clone_ms}


def _raw_round(raw: RawRbd, source: str, made: list[str]) -> dict[str, float]:
    """The same three operations from their librbd steps (names kept for the clean-up)."""
    tag = uuid.uuid4().hex[:8]
    snap_image, restored, cloned = f"bench-rs-{tag}", f"bench-rr-{tag}", f"bench-rc-{tag}"
    with rbd.Image(raw.io, source) as image:
        snap_ms, _ = _ms(lambda: image.create_snap(f"t-{tag}"))
        clone_ms, _ = _ms(lambda: raw.rbd.clone(raw.io, source, f"t-{tag}", raw.io, snap_image, features=rbd.RBD_FEATURE_LAYERING))
        remove_ms, _ = _ms(lambda: image.remove_snap(f"t-{tag}"))
    with rbd.Image(raw.io, snap_image) as image:
        point_ms, _ = _ms(lambda: image.create_snap(snap_image))
    restore_ms, _ = _ms(lambda: raw.rbd.clone(raw.io, snap_image, snap_image, raw.io, restored, features=rbd.RBD_FEATURE_LAYERING))
    with rbd.Image(raw.io, source) as image:
        started = time.monotonic()
        image.create_snap(f"c-{tag}")
        raw.rbd.clone(raw.io, source, f"c-{tag}", raw.io, cloned, features=rbd.RBD_FEATURE_LAYERING)
        image.remove_snap(f"c-{tag}")
        volume_clone_ms = (time.monotonic() - started) * 1000
    made.extend([restored, cloned, snap_image])
    return {"CreateSnapshot": snap_ms + clone_ms + remove_ms + point_ms, "restore": restore_ms,
            "clone": volume_clone_ms, "snap create": snap_ms, "clone step": clone_ms}


def _raw_cleanup(raw: RawRbd, made: list[str], source: str) -> None:
    for name in made:  # children before parents (restored/cloned, then the snapshot image)
        with rbd.Image(raw.io, name) as image:
            for snap in list(image.list_snaps()):
                if snap.get("namespace", 0) == 0:
                    image.remove_snap(snap["name"])
        raw.rbd.remove(raw.io, name)
    raw.rbd.remove(raw.io, source)


def _measure(env: Environment, driver: Driver, raw: RawRbd, written: bool) -> dict[str, dict[str, float]]:
    source = driver.create()
    raw_source = raw.create(raw.new_name())
    if written:
        _fill(raw, f"csi-vol-{source[-36:]}")
        _fill(raw, raw_source)
    made: list[str] = []
    rounds_driver, rounds_raw = [], []
    for _ in range(ITERATIONS):
        rounds_driver.append(_driver_round(driver, source))
        rounds_raw.append(_raw_round(raw, raw_source, made))
    _raw_cleanup(raw, made, raw_source)
    return {"driver": _medians(rounds_driver), "raw": _medians(rounds_raw)}


def _medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def run(env: Environment) -> SectionResult:
    result = SectionResult(name=NAME, title=TITLE)
    cluster = env.start_cluster()
    driver = Driver(env)
    raw = RawRbd(cluster, SOURCE_BYTES)
    raw.client.conf_set("rbd_default_clone_format", "2")
    figures: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for written in (False, True):
            label = "written 1 GiB" if written else "empty 1 GiB"
            log.info("snapshots: %s source, %d iterations", label, ITERATIONS)
            figures[label] = _measure(env, driver, raw, written)
        driver.cleanup()
    finally:
        raw.close()
    table = Table(["operation", "source", "cephcsi p50 ms", "raw librbd steps p50 ms", "ratio"],
                  title="median of sequential calls")
    for label, numbers in figures.items():
        for op in ("CreateSnapshot", "restore", "clone"):
            ours, floor = numbers["driver"][op], numbers["raw"][op]
            table.add(op, label, f"{ours:.1f}", f"{floor:.1f}", f"{ours / floor:.2f}×" if floor else "-")
    result.tables.append(table)
    result.notes.append("raw single steps, p50 ms: " + "; ".join(
        f"{label}: snap create {n['raw']['snap create']:.1f}, clone {n['raw']['clone step']:.1f}" for label, n in figures.items()))
    result.data.update({"iterations": ITERATIONS, "source_bytes": SOURCE_BYTES, "figures": figures})
    return result


SECTION = Section(name=NAME, title=TITLE, run=run)
