"""Section 8: CreateVolumeGroupSnapshot and DeleteVolumeGroupSnapshot of 2, 8 and 32 members
through a real `cephcsi --mode=controller` over gRPC, beside the raw librbd steps of the same
physical work, on the same cluster in the same run.

Baselines (bench/groupraw.py; same members: 64 MiB images with their first 4 MiB written):
  create, full   ↔ RBD group created, the N images added, one group snapshot, then for each member
                   its copy at the group instant (`Image.copy` from the group snapshot point) and a
                   snapshot on the copy, and the group removed: what the driver does on Ceph
                   releases without clone-from-group-snapshot (a member is an ordinary snapshot
                   image), without its journal, leases and checks;
  create, instant ↔ the group, its snapshot and its removal only: no copies. The driver's ratio
                   to it shows what the per-member copy costs (the instant itself is the same);
  delete         ↔ for each member copy: its snapshot removed, trash_move and the mgr purge
                   handed over (the removal a DeleteSnapshot does).

Rounds interleaved (the side that goes first alternating), a ratio per round of the round's
medians, reported as the median over rounds with min–max; p50/p99 pooled over the rounds.
"""
from __future__ import annotations

import logging
import os
import uuid
import rbd

from bench import report
from bench.environment import Environment
from bench.groupraw import RawGroups
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from bench.sections.snapshots import row_figures
from bench.snapraw import timed
from cephcsi._generated import csi_pb2, csi_pb2_grpc

log = logging.getLogger("bench")

NAME = "group-snapshots"
TITLE = "8. Group snapshots: CreateVolumeGroupSnapshot / Delete over gRPC vs the raw RBD group steps"
MEMBER_COUNTS = (2, 8, 32)
QUICK_MEMBER_COUNTS = (2, 8)
MEMBER_BYTES = 64 << 20
WRITTEN_BYTES = 4 << 20
RPC_TIMEOUT_S = 600.0
CALLS_PER_ROUND = 2
"""Calls of each kind per side, member count and round (1 with --quick)."""
CALLS = (("create", "full"), ("create", "instant"), ("delete", "delete"))
BASELINES = {"full": "group + snapshot + N copies + N snapshots, group removed",
             "instant": "group + snapshot, group removed (no copies)",
             "delete": "N × (snapshot removed + trash_move + mgr purge)"}
Mode = csi_pb2.VolumeCapability.AccessMode
Rounds = list[dict[str, dict[str, list[float]]]]
"""Per round: side ('driver' / 'raw') → '<kind>|<members>' → latencies in seconds."""


def key(kind: str, members: int) -> str:
    return f"{kind}|{members}"


class Driver:
    """The driver's side: member volumes made once, group snapshots taken and deleted per call."""

    def __init__(self, env: Environment) -> None:
        cluster = env.start_cluster()
        process = env.controller()
        self.controller = process.controller
        self.groups = csi_pb2_grpc.GroupControllerStub(process.channel)
        self.parameters, self.secrets = cluster.parameters, cluster.secrets
        self.volumes: list[str] = []

    def create_volume(self) -> str:
        request = csi_pb2.CreateVolumeRequest(
            name=f"bench-group-{uuid.uuid4()}", capacity_range=csi_pb2.CapacityRange(required_bytes=MEMBER_BYTES),
            volume_capabilities=[csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                                          access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))],
            parameters=self.parameters, secrets=self.secrets)
        volume_id = str(self.controller.CreateVolume(request, timeout=RPC_TIMEOUT_S).volume.volume_id)
        self.volumes.append(volume_id)
        return volume_id

    def group_snapshot(self, volume_ids: list[str]) -> csi_pb2.VolumeGroupSnapshot:
        request = csi_pb2.CreateVolumeGroupSnapshotRequest(name=f"groupsnapshot-{uuid.uuid4()}",
                                                           source_volume_ids=volume_ids, secrets=self.secrets)
        response: csi_pb2.CreateVolumeGroupSnapshotResponse = self.groups.CreateVolumeGroupSnapshot(
            request, timeout=RPC_TIMEOUT_S)
        return response.group_snapshot

    def delete_group_snapshot(self, group: csi_pb2.VolumeGroupSnapshot) -> None:
        self.groups.DeleteVolumeGroupSnapshot(csi_pb2.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id=group.group_snapshot_id, snapshot_ids=[s.snapshot_id for s in group.snapshots],
            secrets=self.secrets), timeout=RPC_TIMEOUT_S)

    def delete_volumes(self) -> None:
        for volume_id in self.volumes:
            self.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=self.secrets),
                                         timeout=RPC_TIMEOUT_S)
        self.volumes = []


def fill(raw: RawRbd, image_name: str, data: bytes) -> None:
    with rbd.Image(raw.io, image_name) as image:
        image.write(data, 0)


def volume_image(volume_id: str) -> str:
    return f"csi-vol-{volume_id[-36:]}"


# ---- one round -------------------------------------------------------------------------------------


def driver_side(driver: Driver, members: list[str], counts: tuple[int, ...], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for count in counts:
        for _ in range(n):
            taken: list[csi_pb2.VolumeGroupSnapshot] = []
            seconds = timed(lambda: taken.append(driver.group_snapshot(members[:count])))
            for baseline in ("full", "instant"):  # one driver figure, two floors
                out.setdefault(key(baseline, count), []).append(seconds)
            out.setdefault(key("delete", count), []).append(timed(lambda: driver.delete_group_snapshot(taken[-1])))
    return out


def raw_side(groups: RawGroups, members: list[str], counts: tuple[int, ...], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for count in counts:
        for _ in range(n):
            copies: list[list[str]] = []
            out.setdefault(key("full", count), []).append(
                timed(lambda: copies.append(groups.group_snapshot(members[:count], copy=True))))
            out.setdefault(key("delete", count), []).append(timed(lambda: groups.delete_copies(copies[-1])))
            out.setdefault(key("instant", count), []).append(
                timed(lambda: groups.group_snapshot(members[:count], copy=False)))
    return out


def one_round(env: Environment, driver: Driver, groups: RawGroups, driver_members: list[str],
              raw_members: list[str], counts: tuple[int, ...], n: int, r: int) -> dict[str, dict[str, list[float]]]:
    one: dict[str, dict[str, list[float]]] = {}
    for side in (("driver", "raw") if r % 2 == 0 else ("raw", "driver")):
        if side == "driver":
            one["driver"] = driver_side(driver, driver_members, counts, n)
        else:
            one["raw"] = raw_side(groups, raw_members, counts, n)
        groups.raw.wait_trash_empty(env.options.drain_timeout_s)
    return one


# ---- table ------------------------------------------------------------------------------------------


def driver_table(rounds: Rounds, counts: tuple[int, ...], n: int) -> Table:
    table = Table(title=f"latency in ms (client side), {len(rounds)} interleaved rounds × {n} calls per side, member "
                        "count and row; p50/p99 pooled over the rounds; × = driver/raw per round (median of the "
                        "round's calls), median over rounds (min–max)",
                  columns=["members", "driver call", "driver p50", "driver p99", "raw librbd steps", "raw p50",
                           "raw p99", "p50 ×"])
    for count in counts:
        for call, baseline in CALLS:
            f = row_figures(rounds, key(baseline, count))
            if f:
                table.add(str(count), f"{'Create' if call == 'create' else 'Delete'}VolumeGroupSnapshot",
                          report.ms(f["p50"]), report.ms(f["p99"]), BASELINES[baseline], report.ms(f["base_p50"]),
                          report.ms(f["base_p99"]), report.times_spread(f["ratio"]))
    return table


# ---- the section ------------------------------------------------------------------------------------


def run(env: Environment) -> SectionResult:
    result = SectionResult(name=NAME, title=TITLE)
    cluster = env.start_cluster()
    counts = QUICK_MEMBER_COUNTS if env.options.quick else MEMBER_COUNTS
    n = 1 if env.options.quick else CALLS_PER_ROUND
    rounds_count = max(1, env.options.rounds)
    driver = Driver(env)
    raw = RawRbd(cluster, MEMBER_BYTES)
    groups = RawGroups(raw)
    rounds: Rounds = []
    raw_members: list[str] = []
    try:
        log.info("group snapshots: making and filling %d members per side", max(counts))
        data = os.urandom(WRITTEN_BYTES)
        driver_members = [driver.create_volume() for _ in range(max(counts))]
        raw_members.extend(raw.create(raw.new_name()) for _ in range(max(counts)))
        for volume_id, raw_name in zip(driver_members, raw_members):
            fill(raw, volume_image(volume_id), data)
            fill(raw, raw_name, data)
        # Untimed warm-up of both paths (connections, first-call costs).
        one_round(env, driver, groups, driver_members, raw_members, counts[:1], 1, 0)
        for r in range(rounds_count):
            log.info("group snapshots: round %d of %d", r + 1, rounds_count)
            rounds.append(one_round(env, driver, groups, driver_members, raw_members, counts, n, r))
    finally:
        driver.delete_volumes()
        groups.remove_members(raw_members)
        raw.wait_trash_empty(env.options.drain_timeout_s)
        raw.close()
    result.tables.append(driver_table(rounds, counts, n))
    result.notes.extend([
        f"Members: {MEMBER_BYTES >> 20} MiB images with their first {WRITTEN_BYTES >> 20} MiB written (the same data on "
        "both sides). The driver copies each member at the group instant because Pacific and Reef cannot clone "
        "from a group snapshot; 'instant' is the floor without those copies.",
        "The driver's figure is one CreateVolumeGroupSnapshot (journal, leases, group, snapshot, copies, group "
        "removed); each raw call is timed after the same untimed monitor settle pause as section 7.",
    ])
    result.data.update({
        "member_counts": list(counts), "calls_per_round": n, "rounds": rounds,
        "member_bytes": MEMBER_BYTES, "written_bytes": WRITTEN_BYTES,
        "rows": {key(b, c): {k: (v.to_json() if hasattr(v, "to_json") else v)
                             for k, v in (row_figures(rounds, key(b, c)) or {}).items()}
                 for c in counts for _, b in CALLS},
    })
    return result


SECTION = Section(name=NAME, title=TITLE, run=run)

