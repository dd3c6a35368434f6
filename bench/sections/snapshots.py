"""Section 7: CreateSnapshot, restore, clone and ControllerExpandVolume through a real
`cephcsi --mode=controller` over gRPC, beside the raw librbd steps they are made of, on the same
cluster in the same run; and the four ways a CSI snapshot could map onto RBD, measured raw.

Baselines (bench/snapraw.py; each includes the image opens it needs, as the driver's call does):
  CreateSnapshot ↔ open the source, temporary snapshot, clone v2, snapshot removed, open the
                   clone, restore point: the Ceph steps of the mapping both drivers use, without
                   the journal, leases or checks (the fair floor: less would be another mapping,
                   which the mapping table prices separately);
  restore        ↔ one clone v2 of the restore point (the least any layered restore does); the
                   row "restore, owner keys" is the embedded provisioner's request under deploy/'s
                   --extra-create-metadata (the claim's keys, written to the new image), same floor;
  clone          ↔ open the source, temporary snapshot, clone v2, snapshot removed (a clone
                   needs a snapshot to clone from; removing it keeps the source's snapshot list
                   at one per live clone);
  expansion      ↔ open the image read-write + `Image.resize` to 2 GiB (growing a header is all
                   an expansion does in Ceph).

Figures that hold (the method of section 1): every pass runs `--rounds` interleaved rounds, each
a driver side and a raw side (the side that goes first alternating), for an empty and a fully
written 1 GiB source; ratios are per round (median of the round's driver calls / median of its
raw calls), reported as the median over rounds with min–max; p50/p99 are pooled over the rounds.
`--background-load 0,1` repeats the passes beside a CPU-busy process. RADOS operations per call
are counted by the OSD (untimed, `osdops.py`), for each driver call and its floor.
"""
from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import rbd

from bench import background, osdops, report
from bench.environment import Environment
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from bench.snapraw import OPTION_LABELS, OPTIONS, TWO_GIB, RawSnapshots, delete_source, is_clone_v1, timed
from bench.stats import Spread, percentile, ratio_spread
from cephcsi._generated import csi_pb2
from cephcsi.volumes.metadata import PV_NAME_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY

log = logging.getLogger("bench")

NAME = "snapshots"
TITLE = "7. Snapshots, restores, clones and expansion: driver over gRPC vs the raw librbd steps"
SOURCE_BYTES = 1 << 30
CHUNK = 4 << 20
RPC_TIMEOUT_S = 120.0
CALLS_PER_ROUND = 4
"""Calls of each kind per side and round (1 with --quick): 5 rounds give 20 samples a row."""
OP_COUNT_CALLS = 3
LABELS = ("empty 1 GiB", "written 1 GiB")
OWNED_RESTORE = "restore, owner keys"
"""A restore as the embedded provisioner requests it under deploy/'s --extra-create-metadata: with
the claim's owner keys, which the driver writes to the new image; its floor is the same clone."""
CALLS = (("CreateSnapshot", "snapshot image (a)"), ("restore", "clone v2 of the restore point"),
         (OWNED_RESTORE, "clone v2 of the restore point"), ("clone", "snap + clone v2 + snap remove"))
EXPAND = ("ControllerExpandVolume 1→2 GiB", "open + Image.resize")
Mode = csi_pb2.VolumeCapability.AccessMode
Rounds = list[dict[str, dict[str, list[float]]]]
"""Per round: side ('driver' / 'raw') → call → latencies in seconds."""


class Driver:
    def __init__(self, env: Environment) -> None:
        cluster = env.start_cluster()
        self.stub = env.controller().controller
        self.parameters, self.secrets = cluster.parameters, cluster.secrets
        self.snapshots: list[str] = []
        self.volumes: list[str] = []

    def create(self, source: csi_pb2.VolumeContentSource | None = None, keep: bool = False,
               owner_keys: bool = False) -> str:
        name = f"bench-snap-{uuid.uuid4()}"
        parameters = dict(self.parameters)
        if owner_keys:
            parameters.update({PVC_NAME_KEY: name, PVC_NAMESPACE_KEY: "bench", PV_NAME_KEY: name})
        request = csi_pb2.CreateVolumeRequest(
            name=name, capacity_range=csi_pb2.CapacityRange(required_bytes=SOURCE_BYTES),
            volume_capabilities=[csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                                          access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))],
            parameters=parameters, secrets=self.secrets)
        if source is not None:
            request.volume_content_source.CopyFrom(source)
        volume_id = str(self.stub.CreateVolume(request, timeout=RPC_TIMEOUT_S).volume.volume_id)
        if not keep:
            self.volumes.append(volume_id)
        return volume_id

    def snapshot(self, volume_id: str) -> str:
        request = csi_pb2.CreateSnapshotRequest(name=f"bench-snap-{uuid.uuid4()}", source_volume_id=volume_id,
                                                secrets=self.secrets)
        snapshot_id = str(self.stub.CreateSnapshot(request, timeout=RPC_TIMEOUT_S).snapshot.snapshot_id)
        self.snapshots.append(snapshot_id)
        return snapshot_id

    def restore(self, snapshot_id: str, owner_keys: bool = False) -> str:
        return self.create(csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snapshot_id)), owner_keys=owner_keys)

    def clone(self, volume_id: str) -> str:
        return self.create(csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=volume_id)))

    def expand(self, volume_id: str) -> None:
        self.stub.ControllerExpandVolume(csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=TWO_GIB), secrets=self.secrets),
            timeout=RPC_TIMEOUT_S)

    def delete_volume(self, volume_id: str) -> None:
        self.stub.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=self.secrets),
                               timeout=RPC_TIMEOUT_S)

    def cleanup(self) -> None:
        """Restored and cloned volumes first, then the snapshots they read through."""
        for volume_id in self.volumes:
            self.delete_volume(volume_id)
        for snapshot_id in self.snapshots:
            self.stub.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=self.secrets),
                                     timeout=RPC_TIMEOUT_S)
        self.volumes, self.snapshots = [], []


def _fill(raw: RawRbd, name: str) -> None:
    data = os.urandom(CHUNK)
    with rbd.Image(raw.io, name) as image:
        for offset in range(0, SOURCE_BYTES, CHUNK):
            image.write(data, offset)


def _image(volume_id: str) -> str:
    return f"csi-vol-{volume_id[-36:]}"


class Sources:
    """The sources of one label: a driver volume and a raw image with the same content."""

    def __init__(self, driver: Driver, raw: RawRbd, written: bool) -> None:
        self.volume_id = driver.create(keep=True)
        self.raw_name = raw.create(raw.new_name())
        if written:
            _fill(raw, _image(self.volume_id))
            _fill(raw, self.raw_name)


# ---- one round -------------------------------------------------------------------------------------


def _driver_side(driver: Driver, sources: dict[str, Sources], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for label, src in sources.items():
        for _ in range(n):
            ids: list[str] = []
            out.setdefault(f"CreateSnapshot|{label}", []).append(timed(lambda: ids.append(driver.snapshot(src.volume_id))))
            out.setdefault(f"restore|{label}", []).append(timed(lambda: driver.restore(ids[-1])))
            out.setdefault(f"{OWNED_RESTORE}|{label}", []).append(timed(lambda: driver.restore(ids[-1], owner_keys=True)))
            out.setdefault(f"clone|{label}", []).append(timed(lambda: driver.clone(src.volume_id)))
    for _ in range(n):
        volume_id = driver.create()
        out.setdefault("expand", []).append(timed(lambda: driver.expand(volume_id)))
    return out


def _raw_side(snaps: RawSnapshots, sources: dict[str, Sources], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    raw = snaps.raw
    for label, src in sources.items():
        for _ in range(n):
            made: list[str] = []
            out.setdefault(f"CreateSnapshot|{label}", []).append(timed(lambda: made.append(snaps.snapshot_image(src.raw_name))))
            out.setdefault(f"restore|{label}", []).append(timed(lambda: snaps.restore(made[-1])))
            out.setdefault(f"clone|{label}", []).append(timed(lambda: snaps.clone_volume(src.raw_name)))
    for _ in range(n):
        name = raw.create(raw.new_name())
        snaps.made.children.append(name)
        out.setdefault("expand", []).append(timed(lambda: snaps.resize(name)))
    for label in sources:
        out[f"{OWNED_RESTORE}|{label}"] = out[f"restore|{label}"]  # the same floor: one clone
    return out


def _mapping_side(snaps: RawSnapshots, sources: dict[str, Sources], n: int, r: int,
                  copies: bool) -> dict[str, list[float]]:
    """Options a–c (and d once per pass: `copies`), in an order that rotates with the round."""
    out: dict[str, list[float]] = {}
    order = OPTIONS[r % 3:3] + OPTIONS[:r % 3] + (("d",) if copies else ())
    for option in order:
        for label, src in sources.items():
            for _ in range(1 if option == "d" else n):
                made: list[str] = []
                out.setdefault(f"{option}|snapshot|{label}", []).append(
                    timed(lambda: made.append(snaps.snapshot_as(option, src.raw_name))))
                out.setdefault(f"{option}|restore|{label}", []).append(
                    timed(lambda: snaps.restore_as(option, src.raw_name, made[-1])))
            snaps.cleanup()  # one option's snapshots never slow the next option down
    return out


def _round(env: Environment, driver: Driver, snaps: RawSnapshots, sources: dict[str, Sources], n: int,
           r: int, copies: bool) -> dict[str, dict[str, list[float]]]:
    one: dict[str, dict[str, list[float]]] = {}
    for side in (("driver", "raw") if r % 2 == 0 else ("raw", "driver")):
        if side == "driver":
            one["driver"] = _driver_side(driver, sources, n)
            driver.cleanup()
        else:
            one["raw"] = _raw_side(snaps, sources, n)
            snaps.cleanup()
        snaps.raw.wait_trash_empty(env.options.drain_timeout_s)
    one["mapping"] = _mapping_side(snaps, sources, n, r, copies)
    return one


# ---- figures (pure) ---------------------------------------------------------------------------------


def row_figures(rounds: Rounds, key: str, side: str = "driver", base: str = "raw") -> dict[str, Any] | None:
    """Pooled p50/p99 of `key` on both sides (seconds) and the per-round ratio side/base of the
    rounds' medians; None when a side never measured it."""
    ours = [r.get(side, {}).get(key, []) for r in rounds]
    floor = [r.get(base, {}).get(key, []) for r in rounds]
    flat_ours, flat_floor = [x for xs in ours for x in xs], [x for xs in floor for x in xs]
    if not flat_ours or not flat_floor:
        return None
    return {
        "n": len(flat_ours),
        "p50": percentile(flat_ours, 50), "p99": percentile(flat_ours, 99),
        "base_p50": percentile(flat_floor, 50), "base_p99": percentile(flat_floor, 99),
        "ratio": ratio_spread([percentile(x, 50) if x else None for x in ours],
                              [percentile(x, 50) if x else None for x in floor]),
    }


def mapping_figures(rounds: Rounds, option: str, label: str) -> dict[str, Any] | None:
    """One option's snapshot and restore p50 (pooled) and each one's per-round ratio to option a's."""
    if not rounds:
        return None
    out: dict[str, Any] = {}
    for call in ("snapshot", "restore"):
        samples = [r.get("mapping", {}).get(f"{option}|{call}|{label}", []) for r in rounds]
        base = [r.get("mapping", {}).get(f"a|{call}|{label}", []) for r in rounds]
        flat = [x for xs in samples for x in xs]
        out[call] = {"n": len(flat), "p50": percentile(flat, 50) if flat else None,
                     "vs_a": ratio_spread([percentile(x, 50) if x else None for x in samples],
                                          [percentile(x, 50) if x else None for x in base])}
    return out


def _spread_json(s: Spread | None) -> dict[str, float | int] | None:
    return s.to_json() if s else None


# ---- RADOS operations -----------------------------------------------------------------------------


def _count(cluster: Any, call: Callable[[], object], k: int) -> dict[str, float]:
    before = osdops.read(cluster)
    for _ in range(k):
        call()
    return osdops.read(cluster).minus(before).per(k)


def count_ops(env: Environment, driver: Driver, snaps: RawSnapshots, sources: dict[str, Sources]) -> dict[str, Any]:
    """RADOS ops per call (OSD counters, untimed, one call at a time, `OP_COUNT_CALLS` each)."""
    cluster, k, counts = env.start_cluster(), OP_COUNT_CALLS, {}
    for label, src in sources.items():
        made: list[str] = []
        ids: list[str] = []
        counts[f"driver|CreateSnapshot|{label}"] = _count(cluster, lambda: ids.append(driver.snapshot(src.volume_id)), k)
        counts[f"driver|restore|{label}"] = _count(cluster, lambda: driver.restore(ids[-1]), k)
        counts[f"driver|{OWNED_RESTORE}|{label}"] = _count(cluster, lambda: driver.restore(ids[-1], owner_keys=True), k)
        counts[f"driver|clone|{label}"] = _count(cluster, lambda: driver.clone(src.volume_id), k)
        counts[f"raw|CreateSnapshot|{label}"] = _count(cluster, lambda: made.append(snaps.snapshot_image(src.raw_name)), k)
        counts[f"raw|restore|{label}"] = _count(cluster, lambda: snaps.restore(made[-1]), k)
        counts[f"raw|{OWNED_RESTORE}|{label}"] = counts[f"raw|restore|{label}"]
        counts[f"raw|clone|{label}"] = _count(cluster, lambda: snaps.clone_volume(src.raw_name), k)
        for option in ("b", "c"):
            taken: list[str] = []
            counts[f"{option}|snapshot|{label}"] = _count(cluster, lambda: taken.append(snaps.snapshot_as(option, src.raw_name)), k)
            counts[f"{option}|restore|{label}"] = _count(cluster, lambda: snaps.restore_as(option, src.raw_name, taken[-1]), k)
            snaps.cleanup()
        driver.cleanup()
        snaps.cleanup()
        snaps.raw.wait_trash_empty(env.options.drain_timeout_s)
    volumes = [driver.create() for _ in range(k)]
    counts["driver|expand"] = _count(cluster, lambda: driver.expand(volumes.pop()), k)
    names = [snaps.raw.create(snaps.raw.new_name()) for _ in range(k)]
    snaps.made.children.extend(names)
    counts["raw|expand"] = _count(cluster, lambda: snaps.resize(names.pop()), k)
    driver.cleanup()
    snaps.cleanup()
    snaps.raw.wait_trash_empty(env.options.drain_timeout_s)
    return counts | {"calls": k}


def _ops(counts: dict[str, Any], key: str) -> str:
    figure = counts.get(key) or {}
    return report.num(figure.get("op"), 0) if figure else "—"


# ---- tables -----------------------------------------------------------------------------------------


def _where(state: dict[str, str]) -> str:
    return (f"{state['load']}; load average {state['loadavg_start']} → {state['loadavg_end']}, "
            f"all CPUs {state['cpu_busy']} busy")


def driver_table(rounds: Rounds, state: dict[str, str], counts: dict[str, Any], n: int) -> Table:
    table = Table(title=f"[{_where(state)}] latency in ms (client side), {len(rounds)} interleaved rounds × {n} calls "
                        "per side and row, p50/p99 pooled over the rounds; × = driver/raw per round (median of the "
                        "round's calls), median over rounds (min–max); RADOS ops per call counted by the OSD",
                  columns=["operation", "source", "driver p50", "driver p99", "raw librbd steps", "raw p50", "raw p99",
                           "p50 ×", "driver ops", "raw ops"])
    for label in LABELS:
        for call, base in CALLS:
            f = row_figures(rounds, f"{call}|{label}")
            if f:
                table.add(call, label, report.ms(f["p50"]), report.ms(f["p99"]), base, report.ms(f["base_p50"]),
                          report.ms(f["base_p99"]), report.times_spread(f["ratio"]),
                          _ops(counts, f"driver|{call}|{label}"), _ops(counts, f"raw|{call}|{label}"))
    f = row_figures(rounds, "expand")
    if f:
        table.add(EXPAND[0], "empty 1 GiB", report.ms(f["p50"]), report.ms(f["p99"]), EXPAND[1],
                  report.ms(f["base_p50"]), report.ms(f["base_p99"]), report.times_spread(f["ratio"]),
                  _ops(counts, "driver|expand"), _ops(counts, "raw|expand"))
    return table


def mapping_table(rounds: Rounds, state: dict[str, str], counts: dict[str, Any],
                  outcomes: dict[str, dict[str, Any]]) -> Table:
    table = Table(title=f"[{_where(state)}] RBD mapping options, raw librbd (no driver): snapshot and restore "
                        "latency in ms (p50 pooled over the rounds; × = per-round ratio to option (a), median "
                        "(min–max); (d) one call per pass), RADOS ops per call, and what each leaves",
                  columns=["option", "source", "snapshot p50", "snapshot × (a)", "restore p50", "restore × (a)",
                           "snapshot ops", "restore ops", "images per snapshot", "snapshots on the source"])
    for option in OPTIONS:
        for label in LABELS:
            f = mapping_figures(rounds, option, label)
            if not f or not f["snapshot"]["n"]:
                continue
            o = outcomes.get(option) or {}
            snap_ops = _ops(counts, f"raw|CreateSnapshot|{label}" if option == "a" else f"{option}|snapshot|{label}")
            restore_ops = _ops(counts, f"raw|restore|{label}" if option == "a" else f"{option}|restore|{label}")
            table.add(OPTION_LABELS[option], label, report.ms(f["snapshot"]["p50"]),
                      "1" if option == "a" else report.times_spread(f["snapshot"]["vs_a"]),
                      report.ms(f["restore"]["p50"]), "1" if option == "a" else report.times_spread(f["restore"]["vs_a"]),
                      snap_ops if option != "d" else "—", restore_ops if option != "d" else "—",
                      o.get("images_per_snapshot", "—"), o.get("source_snaps_per_snapshot", "—"))
    return table


def outcome_table(outcomes: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="deleting the source volume of a snapshot that has a restored volume (raw librbd, empty "
                        "1 GiB source, RBD.remove with rbd_move_parent_to_trash_on_remove=true as the driver sets it)",
                  columns=["option", "RBD.remove(source)", "a new restore from the snapshot after it",
                           "left after the snapshot and restores are removed"])
    for option in OPTIONS:
        o = outcomes.get(option)
        if o:
            table.add(OPTION_LABELS[option], o["remove_result"], o["restore_after"], o["left_after_cleanup"])
    return table


# ---- the section ------------------------------------------------------------------------------------


def run(env: Environment) -> SectionResult:
    result = SectionResult(name=NAME, title=TITLE)
    cluster = env.start_cluster()
    driver = Driver(env)
    raw = RawRbd(cluster, SOURCE_BYTES)
    raw.client.conf_set("rbd_default_clone_format", "2")
    v1 = RawRbd(cluster, SOURCE_BYTES)
    v1.client.conf_set("rbd_default_clone_format", "1")
    snaps = RawSnapshots(raw, v1)
    n = 1 if env.options.quick else CALLS_PER_ROUND
    rounds_per_pass = max(1, env.options.rounds)
    passes: list[tuple[dict[str, str], Rounds]] = []
    counts: dict[str, Any] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    try:
        log.info("snapshots: making and filling the sources")
        sources = {label: Sources(driver, raw, written) for label, written in zip(LABELS, (False, True))}
        if not is_clone_v1(v1, sources[LABELS[0]].raw_name):
            result.notes.append("WARNING: the clone-format-1 connection made a format-2 clone; option (c) is not v1")
        # Untimed warm-up: connections, caches, first-call costs, on both paths.
        _round(env, driver, snaps, {LABELS[0]: sources[LABELS[0]]}, 1, 0, copies=False)
        try:
            counts = count_ops(env, driver, snaps, sources)
        except Exception as error:  # noqa: BLE001 - a figure missing, not a failed section
            result.notes.append(f"RADOS op counts not measured: {type(error).__name__}: {str(error)[:200]}")
        for option in OPTIONS:
            outcomes[option] = asdict(delete_source(snaps, option))
        for _, state in background.passes(env.options.background_loads):
            rounds: Rounds = []
            for r in range(rounds_per_pass):
                log.info("snapshots [%s]: round %d of %d", state["load"], r + 1, rounds_per_pass)
                # Full copies once per pass (the last round): seconds each for a written source.
                rounds.append(_round(env, driver, snaps, sources, n, r, copies=r == rounds_per_pass - 1))
            passes.append((state, rounds))
        for src in sources.values():
            driver.delete_volume(src.volume_id)
            raw.remove(src.raw_name)
        raw.wait_trash_empty(env.options.drain_timeout_s)
    finally:
        v1.close()
        raw.close()

    for state, rounds in passes:
        result.tables.append(driver_table(rounds, state, counts, n))
    for state, rounds in passes:
        result.tables.append(mapping_table(rounds, state, counts, outcomes))
    result.tables.append(outcome_table(outcomes))
    result.notes.extend([
        "Fair floors: CreateSnapshot ↔ the same RBD steps of the same mapping (temporary snapshot, clone v2, "
        "snapshot removed, restore point on the clone) with their image opens; restore ↔ one clone v2; clone ↔ "
        "temporary snapshot + clone v2 + snapshot removed; expansion ↔ open + Image.resize. Nothing is copied: "
        "written and empty sources cost the same except for option (d).",
        "RADOS ops are counted by the OSD (successful ops only: a failed read, e.g. probing a name that does not "
        "exist yet, is not counted but still costs a round trip). What each call does and why: bench/README.md "
        "('What each call costs'); the mapping and its reasoning: docs/snapshots.md ('Mapping').",
    ])
    result.data.update({
        "calls_per_round": n, "rounds": rounds_per_pass, "source_bytes": SOURCE_BYTES,
        "rados_ops_per_call": counts, "delete_outcomes": outcomes,
        "passes": [{"state": state, "rounds": rounds,
                    "rows": {key: {k: (_spread_json(v) if isinstance(v, Spread) or v is None else v)
                                   for k, v in (row_figures(rounds, key) or {}).items()}
                             for key in [f"{c}|{lbl}" for c, _ in CALLS for lbl in LABELS] + ["expand"]}}
                   for state, rounds in passes],
    })
    return result


SECTION = Section(name=NAME, title=TITLE, run=run)
