"""Section 5: the controller side at scale. On its own test control plane (etcd + kube-apiserver,
no kube-controller-manager: nothing else writes while it measures) the bench seeds N bound claims
of the driver (PVC + PV + attached VolumeAttachment each, in the shape the controller leaves them)
and 50 Nodes with their CSINodes, then starts, in interleaved rounds, the same way on the same objects:

- `cephcsi --mode=controller` with its embedded sidecars (production flags, leader election on);
  synced = the first 200 of its /readyz (503 until every informer the leader needs has synced),
  polled every 50 ms from the moment the process is launched;
- the Go stack: csi-provisioner + csi-attacher (bench/build_sidecars.sh) + `cephcsi --sidecars=none`,
  all three launched together, leader election on; synced = the last of client-go's
  "Caches populated" lines (klog -v=2, UTC) for the kinds each sidecar watches, in its log.

After sync each side stays idle for --scale-idle seconds, then VmRSS, threads and CPU are read
from /proc (the Go stack: the sum of its three processes). Writes = etcd revisions over the
start and idle window (Lease renewals included, on both sides). Everything is measured first on
the cluster with no claims, then with N: growth per 1,000 claims = (median at N − median empty) / N.
"""
from __future__ import annotations

import datetime
import logging
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import procstat, report, scale_model, scale_seed, scale_threads
from bench.kube import wait_until
from bench.environment import DRIVER_ARGS, Environment
from bench.model import SectionResult, Table
from bench.sections.base import Section
from bench.stats import ratio_spread

log = logging.getLogger("bench")

NAME = "scale"
TITLE = "5. Scale: controller idle on N claims (embedded sidecars vs Go csi-provisioner + csi-attacher)"
SECRET = ("scale-secrets", "csi-rbd-secret")
GO_KINDS = {"csi-provisioner": ("PersistentVolumeClaim", "PersistentVolume", "StorageClass", "VolumeAttachment"),
            "csi-attacher": ("VolumeAttachment", "PersistentVolume", "CSINode")}
"""The informers each Go sidecar starts (csi-provisioner watches VolumeAttachments too when the
driver advertises PUBLISH_UNPUBLISH_VOLUME, as ours does); it may log more kinds: all it logs count."""
GO_MARKERS = {"csi-provisioner": "Started provisioner controller", "csi-attacher": ""}
"""A line the sidecar writes once its own controller's caches synced (after the informers above)."""
SYNC_TIMEOUT_S = 900.0
DEPLOYMENT = Path(__file__).resolve().parents[2] / "deploy" / "controller-deployment.yaml"


@dataclass
class Start:
    """One start of one side: seconds to synced, CPU then, and the /proc figures after idling."""

    side: str
    claims: int
    synced_s: float | None = None
    cpu_at_sync_s: float | None = None
    rss_bytes: int | None = None
    hwm_bytes: int | None = None
    threads: int | None = None
    cpu_s: float | None = None
    writes: int | None = None
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _sum_samples(samples: dict[str, procstat.ProcessSample]) -> tuple[int, int, float]:
    return (sum(s.rss_bytes for s in samples.values()), sum(s.threads for s in samples.values()),
            sum(s.cpu_s for s in samples.values()))


class Bench:
    """The control plane, the seeded objects and the two sides' starts."""

    def __init__(self, env: Environment, go: dict[str, str]) -> None:
        from tests.controlplane.cluster import start_control_plane
        from tests.integration.sidecars.harness import Kube

        self.env = env
        self.go = go
        self.cluster = env.start_cluster()
        self.plane = start_control_plane()
        try:
            self.admin = self.plane.api_client()
            self.kube = Kube(self.admin)
            self.kube.create_ceph_secret(SECRET[0], SECRET[1], self.cluster)
            self.storage_class = self.kube.create_storage_class(self.cluster, SECRET, prefix="scale-")
            self.namespace = "scale-claims"
            self.kube.ensure_namespace(self.namespace)
            self.api = scale_seed.RawApi(self.plane.url, self.plane.token, str(self.plane.ca_file))
            params = self.cluster.parameters
            self.seed = scale_model.Seed(namespace=self.namespace, storage_class=self.storage_class, secret=SECRET,
                                         cluster_id=params["clusterID"], pool=params["pool"],
                                         attacher_finalizer=_attacher_finalizer())
            scale_seed.seed_nodes(self.api)
        except BaseException:
            self.plane.stop()
            raise

    def close(self) -> None:
        self.api.close()
        self.admin.close()
        self.plane.stop()

    def _lease_namespace(self) -> str:
        name = f"scale-le-{uuid.uuid4().hex[:6]}"
        self.kube.ensure_namespace(name)
        return name

    def _workdir(self, prefix: str) -> str:
        return tempfile.mkdtemp(prefix=prefix, dir=self.env.workdir)

    # ---- cephcsi with its embedded sidecars ------------------------------------------------------

    def cephcsi(self, claims: int, idle_s: float) -> Start:
        from bench.kube import log_problems
        from tests.integration.sidecars.harness import ControllerProcess

        out = Start("cephcsi", claims)
        process = ControllerProcess(self.env.config_file, mode="controller", args=[
            *DRIVER_ARGS, f"--kubeconfig={self.plane.kubeconfig}",
            f"--leader-election-namespace={self._lease_namespace()}"], workdir=self._workdir("sc-"))
        revision = self.plane.etcd_revision()
        try:
            popen = process.launch()
            out.synced_s = wait_until(lambda: popen.poll() is not None or process.http("/readyz")[0] == 200,
                                 SYNC_TIMEOUT_S, 0.05)
            if popen.poll() is not None:
                raise RuntimeError(f"cephcsi exited with {popen.returncode}: {process.log()[-600:]}")
            if out.synced_s is None:
                raise RuntimeError(f"/readyz not 200 within {SYNC_TIMEOUT_S:g} s: {process.http('/readyz')[1][:300]}")
            out.cpu_at_sync_s = procstat.sample(popen.pid).cpu_s
            time.sleep(idle_s)
            s = procstat.sample(popen.pid)
            out.rss_bytes, out.hwm_bytes, out.threads, out.cpu_s = s.rss_bytes, s.hwm_bytes, s.threads, s.cpu_s
            out.processes["cephcsi"] = s.to_json()
            out.processes["cephcsi"]["thread_names"] = scale_threads.describe(popen.pid)
            out.writes = self.plane.etcd_revision() - revision
            out.problems = log_problems(process)
        finally:
            process.stop()
        return out

    # ---- the Go stack ---------------------------------------------------------------------------------

    def go_stack(self, claims: int, idle_s: float) -> Start:
        import subprocess

        from tests.integration.driver import DriverProcess

        out = Start("go", claims)
        lease_namespace = self._lease_namespace()
        driver = DriverProcess(self.env.config_file, mode="controller", args=DRIVER_ARGS,
                               workdir=self._workdir("sg-"))
        logs: dict[str, Path] = {}
        popens: dict[str, subprocess.Popen[bytes]] = {}
        revision = self.plane.etcd_revision()
        launched = datetime.datetime.now(datetime.timezone.utc)
        try:
            popens["cephcsi --sidecars=none"] = driver.launch()
            for name, path in self.go.items():
                logs[name] = Path(driver.workdir) / f"{name}.log"
                with open(logs[name], "wb") as handle:
                    popens[name] = subprocess.Popen(
                        [path, f"--csi-address={driver.socket}", "--v=2", f"--kubeconfig={self.plane.kubeconfig}",
                         "--leader-election=true", f"--leader-election-namespace={lease_namespace}"],
                        stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

            def synced() -> bool:
                if any(p.poll() is not None for p in popens.values()):
                    return True
                return all(scale_model.ready_at(logs[name].read_text(errors="replace"), launched.year,
                                                GO_KINDS[name], GO_MARKERS[name]) is not None for name in self.go)

            if wait_until(synced, SYNC_TIMEOUT_S, 0.1) is None:
                raise RuntimeError("the Go sidecars did not sync in time")
            dead = {n: p.returncode for n, p in popens.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"exited: {dead}: " + " | ".join(
                    logs[n].read_text(errors="replace")[-300:] for n in dead if n in logs))
            out.cpu_at_sync_s = sum(procstat.sample(p.pid).cpu_s for p in popens.values())
            time.sleep(idle_s)
            samples = {n: procstat.sample(p.pid) for n, p in popens.items()}
            out.rss_bytes, out.threads, out.cpu_s = _sum_samples(samples)
            out.hwm_bytes = sum(x.hwm_bytes for x in samples.values())
            out.processes = {n: s.to_json() for n, s in samples.items()}
            out.writes = self.plane.etcd_revision() - revision
            last = None
            for name in self.go:
                text = logs[name].read_text(errors="replace")
                populated = scale_model.caches_populated(text, launched.year)
                at = scale_model.ready_at(text, launched.year, sorted(set(GO_KINDS[name]) | set(populated)),
                                          GO_MARKERS[name])
                out.processes[name]["populated"] = sorted(populated)
                last = at if last is None or (at is not None and at > last) else last
            out.synced_s = (last - launched).total_seconds() if last is not None else None
        finally:
            for name, popen in popens.items():
                if name in logs and popen.poll() is None:
                    popen.terminate()
            for name, popen in popens.items():
                if name in logs:
                    try:
                        popen.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        popen.kill()
                        popen.wait(timeout=10)
            driver.stop()
        return out

    # ---- rounds -----------------------------------------------------------------------------------------

    def rounds(self, claims: int, rounds: int, idle_s: float) -> list[tuple[Start, Start | None]]:
        """`rounds` starts of each side, alternating which goes first."""
        out = []
        for i in range(rounds):
            order = ("cephcsi", "go") if i % 2 == 0 else ("go", "cephcsi")
            got: dict[str, Start | None] = {"go": None}
            for side in order:
                if side == "go" and not self.go:
                    continue
                log.info("scale: %d claims, round %d, %s", claims, i + 1, side)
                try:
                    got[side] = self.cephcsi(claims, idle_s) if side == "cephcsi" else self.go_stack(claims, idle_s)
                except Exception as error:  # noqa: BLE001 - reported in the table, the other side still runs
                    log.error("scale: %s failed: %s", side, error)
                    got[side] = Start(side, claims, error=f"{type(error).__name__}: {str(error)[:300]}")
            ours = got["cephcsi"]
            assert ours is not None
            out.append((ours, got["go"]))
        return out


def _attacher_finalizer() -> str:
    """The finalizer the embedded attacher leaves on an attachment it published (so the seeded
    attachments look attached by it: a steady-state start must write nothing)."""
    from cephcsi.sidecars.attacher.publishing import finalizer_for

    return finalizer_for(scale_model.DRIVER)


# ---- tables -------------------------------------------------------------------------------------------

def _values(starts: Sequence[Start | None], attr: str, scale: float = 1.0) -> list[float | None]:
    out: list[float | None] = []
    for s in starts:
        value = getattr(s, attr) if s is not None and not s.error else None
        out.append(None if value is None else float(value) * scale)
    return out


def _cell(values: Sequence[float | None], digits: int) -> str:
    sp = scale_model.value_spread(values)
    if sp is None:
        return "—"
    if sp.n == 1 or sp.low == sp.high:
        return f"{sp.median:.{digits}f}"
    return f"{sp.median:.{digits}f} ({sp.low:.{digits}f}–{sp.high:.{digits}f})"


FIGURES = (("informers synced, s", "synced_s", 1.0, 2), ("VmRSS after idle, MiB", "rss_bytes", 1 / (1 << 20), 1),
           ("VmHWM (peak since start), MiB", "hwm_bytes", 1 / (1 << 20), 1),
           ("OS threads after idle", "threads", 1.0, 0), ("start-up CPU (until synced), s", "cpu_at_sync_s", 1.0, 2),
           ("CPU at the end of the idle window, s", "cpu_s", 1.0, 2), ("etcd writes (start + idle)", "writes", 1.0, 0))


GROWTH = ("synced_s", "rss_bytes", "threads", "cpu_at_sync_s")


def main_table(by_size: dict[int, list[tuple[Start, Start | None]]], idle_s: float) -> Table:
    table = Table(title=f"median (min–max) over the rounds; idle window {idle_s:g} s after sync; ratio per round",
                  columns=["figure", "claims", "cephcsi", "Go stack", "cephcsi / Go"])
    for label, attr, scale, digits in FIGURES:
        for claims, pairs in by_size.items():
            ours = _values([p[0] for p in pairs], attr, scale)
            go = _values([p[1] for p in pairs], attr, scale)
            table.add(label, f"{claims:,}", _cell(ours, digits), _cell(go, digits),
                      report.times_spread(ratio_spread(ours, go)))
    return table


def growth_table(by_size: dict[int, list[tuple[Start, Start | None]]], claims: int) -> tuple[Table, dict[str, Any]]:
    table = Table(title=f"growth per 1,000 claims (empty cluster → {claims:,}; range: worst and best pairing of rounds)",
                  columns=["figure", "side", "empty", "per 1,000 claims", "range", "at 20,000 (line)"])
    data: dict[str, Any] = {}
    for label, attr, scale, digits in (f for f in FIGURES if f[1] in GROWTH):
        for side, index in (("cephcsi", 0), ("Go stack", 1)):
            empty = [v for v in _values([p[index] for p in by_size.get(0, [])], attr, scale) if v is not None]
            loaded = [v for v in _values([p[index] for p in by_size.get(claims, [])], attr, scale) if v is not None]
            g = scale_model.growth_per_1000(empty, loaded, claims)
            data[f"{attr}/{side}"] = g.to_json() if g else None
            if g is None:
                table.add(label, side, "—", "—", "—", "—")
                continue
            d = digits + 1
            table.add(label, side, f"{g.base:.{digits}f}", f"{g.per_1000:.{d}f}", f"{g.low:.{d}f}–{g.high:.{d}f}",
                      f"{scale_model.predict(g, 20000):.{digits}f}")
    return table, data


def _shipped_limit() -> str:
    import re

    text = DEPLOYMENT.read_text() if DEPLOYMENT.exists() else ""
    m = re.search(r"limits:\s*\n\s*memory:\s*(\S+)", text)
    return m.group(1) if m else "?"


def run(env: Environment) -> SectionResult:
    from bench.sections.go_sidecars import _build

    opts = env.options
    claims, idle_s, rounds = opts.scale_claims, opts.scale_idle_s, opts.scale_rounds
    result = SectionResult(name=NAME, title=TITLE)
    built = {b.name: b for b in _build(env)}
    go = {name: built[name].path for name in GO_KINDS if name in built and built[name].path}
    missing = [f"{name}: {built[name].error if name in built else 'not listed'}" for name in GO_KINDS if name not in go]
    if missing:
        go = {}  # half a Go stack is no baseline
        result.notes.append("Go stack not measured: " + "; ".join(missing))
    versions = {name: built[name].version for name in GO_KINDS if name in built}
    bench = Bench(env, go)
    data: dict[str, Any] = {"claims": claims, "idle_s": idle_s, "rounds": rounds, "nodes": scale_model.NODES,
                            "go_versions": versions, "starts": {}}
    by_size: dict[int, list[tuple[Start, Start | None]]] = {}
    try:
        by_size[0] = bench.rounds(0, rounds, idle_s)
        log.info("scale: seeding %d claims", claims)
        seeded = scale_seed.seed_claims_parallel(bench.plane.url, bench.plane.token, str(bench.plane.ca_file),
                                                 bench.seed, claims)
        data["seeding"] = seeded.to_json()
        if seeded.errors:
            raise RuntimeError(f"{len(seeded.errors)} claims failed to seed: {seeded.errors[:3]}")
        by_size[claims] = bench.rounds(claims, rounds, idle_s)
    finally:
        bench.close()
    for size, pairs in by_size.items():
        data["starts"][str(size)] = [[a.to_json(), b.to_json() if b else None] for a, b in pairs]
    growth, data["growth"] = growth_table(by_size, claims)
    seed_table = Table(title="seeding (one PVC + PV + VolumeAttachment per claim, statuses by merge patch)",
                       columns=["claims", "objects", "API requests", "seconds", "objects/s"])
    s = data["seeding"]
    seed_table.add(f"{claims:,}", f"{3 * claims:,}", f"{s['requests']:,}", report.num(s["seconds"], 1),
                   report.rate(s["objects_per_s"]))
    result.tables = [main_table(by_size, idle_s), growth, seed_table]
    rss = data["growth"].get("rss_bytes/cephcsi")
    limit = _shipped_limit()
    if rss:
        result.notes.append(f"cephcsi's RSS line at 20,000 claims: {rss['base'] + rss['per_1000'] * 20:.0f} MiB "
                            f"(shipped limit in deploy/controller-deployment.yaml: {limit}).")
    failures = [f"{st.side} at {st.claims}: {st.error}" for pairs in by_size.values() for pair in pairs
                for st in pair if st is not None and st.error]
    problems = sum(len(p[0].problems) for pairs in by_size.values() for p in pairs)
    result.notes.append(f"Go stack: {' + '.join(f'{n} {v}' for n, v in versions.items())} + cephcsi --sidecars=none; "
                        f"synced from 'Caches populated' klog lines (-v=2). cephcsi: /readyz 200. "
                        f"cephcsi log lines at WARNING+ over all its starts: {problems}.")
    if failures:
        result.status, result.reason = "failed", "; ".join(failures)[:500]
    result.data = data
    return result


SECTION = Section(NAME, TITLE, run)
