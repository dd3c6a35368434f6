"""Leader election against the real apiserver, as the controller's ServiceAccount (deploy/ RBAC:
leases get/create/update in ceph-csi-rbd only).

Most tests use short timings (lease 4s, renew deadline 3s, retry 0.5s) to stay fast; the
apiserver-outage test uses the defaults scaled by 0.4 (6s / 4s / 0.8s) so the proportions the
product ships with are exercised too.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import kubernetes.client as k8s
import pytest

from cephcsi.kube.client import new_api_client
from cephcsi.kube.leaderelection import LeaderCallbacks, LeaderElectionConfig, LeaderElector
from cephcsi.kube.leaselock import KubeLeaseLock
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.proxy import TcpProxy
from tests.integration.kube.conftest import (
    CONTROLLER_NAMESPACE,
    CONTROLLER_SERVICE_ACCOUNT,
    ROOT,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.kube]

NS = CONTROLLER_NAMESPACE
SHORT = {"lease_duration": 4.0, "renew_deadline": 3.0, "retry_period": 0.5}
DEFAULTS_X04 = {"lease_duration": 6.0, "renew_deadline": 4.0, "retry_period": 0.8}


@dataclass
class Candidate:
    """One elector with its own client (optionally through its own proxy) and a record of
    when its leader-only loop ran."""

    identity: str
    elector: LeaderElector
    proxy: TcpProxy | None
    led: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    started_at: list[float] = field(default_factory=list)
    stopped_at: list[float] = field(default_factory=list)
    fencing_failed: threading.Event = field(default_factory=threading.Event)


class Election:
    """Builds candidates for one lease and watches the invariants while they run."""

    def __init__(self, plane: ControlPlane, token: str, timings: dict[str, float]) -> None:
        self.plane = plane
        self.token = token
        self.timings = timings
        self.lease = f"lease-{uuid.uuid4().hex[:8]}"
        self.candidates: list[Candidate] = []
        self.violations: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    def add(self, *, proxied: bool = False) -> Candidate:
        identity = f"cand-{len(self.candidates)}-{uuid.uuid4().hex[:4]}"
        proxy = TcpProxy(self.plane.apiserver_port).start() if proxied else None
        client = new_api_client(configuration=self.plane.configuration(self.token, proxy.url if proxy else None))
        config = LeaderElectionConfig(self.lease, NS, identity=identity, request_timeout=2.0,
                                      lease_duration=self.timings["lease_duration"],
                                      renew_deadline=self.timings["renew_deadline"],
                                      retry_period=self.timings["retry_period"])
        holder: list[Candidate] = []

        def started(stop: threading.Event) -> None:
            holder[0].started_at.append(time.monotonic())
            holder[0].stopped.clear()
            holder[0].led.set()
            stop.wait()

        def stopped() -> None:
            holder[0].stopped_at.append(time.monotonic())
            holder[0].led.clear()
            holder[0].stopped.set()

        callbacks = LeaderCallbacks(started, stopped, on_fencing_failure=lambda: holder[0].fencing_failed.set())
        cand = Candidate(identity, LeaderElector(KubeLeaseLock(client, NS, self.lease), config, callbacks), proxy)
        holder.append(cand)
        self.candidates.append(cand)
        cand.elector.start()
        return cand

    def leaders(self) -> list[Candidate]:
        return [c for c in self.candidates if c.elector.is_leader]

    def holder(self, api: k8s.CoordinationV1Api) -> str:
        try:
            return api.read_namespaced_lease(self.lease, NS).spec.holder_identity or ""
        except k8s.ApiException:
            return ""

    def start_monitor(self) -> None:
        self._monitor = threading.Thread(target=self._watch_invariants, name="election-monitor", daemon=True)
        self._monitor.start()

    def _watch_invariants(self) -> None:
        with self.plane.api_client() as admin:
            api = k8s.CoordinationV1Api(admin)
            while not self._stop.is_set():
                before = {c.identity for c in self.leaders()}
                if len(before) > 1:
                    self.violations.append(f"two local leaders: {sorted(before)}")
                try:
                    holder = api.read_namespaced_lease(self.lease, NS, _request_timeout=2).spec.holder_identity
                except Exception:  # noqa: BLE001 - lease not created yet / apiserver down
                    holder = None
                after = {c.identity for c in self.leaders()}
                # Whoever was leader both before and after the read must be the holder read.
                for identity in before & after:
                    if holder is not None and holder != identity:
                        self.violations.append(f"{identity} is leader but the lease says {holder!r}")
                self.samples += 1
                time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(5)
        for cand in self.candidates:
            if cand.proxy is not None:
                cand.proxy.restore()
        for cand in self.candidates:
            cand.elector.stop(10)
        for cand in self.candidates:
            if cand.proxy is not None:
                cand.proxy.stop()

    def leadership_overlaps(self) -> list[str]:
        """Pairs of candidates whose leader-only loops ran at the same time."""
        spans = []
        for cand in self.candidates:
            ends = cand.stopped_at + [float("inf")] * (len(cand.started_at) - len(cand.stopped_at))
            spans += [(start, end, cand.identity) for start, end in zip(cand.started_at, ends)]
        spans.sort()
        return [f"{a[2]} until {a[1]:.3f} overlaps {b[2]} from {b[0]:.3f}"
                for a, b in zip(spans, spans[1:]) if b[0] < a[1]]


@pytest.fixture
def controller_token(controller_rbac: ControlPlane) -> str:
    return controller_rbac.service_account_token(NS, CONTROLLER_SERVICE_ACCOUNT)


@pytest.fixture
def election(controller_rbac: ControlPlane, controller_token: str) -> Iterator[Election]:
    el = Election(controller_rbac, controller_token, SHORT)
    try:
        yield el
    finally:
        el.close()


def only_leader(election: Election, timeout: float) -> Candidate:
    assert wait_until(lambda: len(election.leaders()) == 1 and election.leaders()[0].led.is_set(), timeout)
    return election.leaders()[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("count", [2, 3])
def test_racing_electors_never_lead_together(election: Election, count: int) -> None:
    timings = election.timings
    for _ in range(count):
        election.add(proxied=True)
    election.start_monitor()
    leader = only_leader(election, 5)

    # 1. Graceful stop: handover within the retry period (well under 2s).
    stop_at = time.monotonic()
    leader.elector.stop(5)
    successor = only_leader(election, 2)
    assert successor is not leader
    assert successor.started_at[-1] - stop_at < 2.0
    replacement = election.add(proxied=True)
    assert not replacement.elector.is_leader

    # 2. Partition the leader silently (requests hang): it must stop its loops by its renew
    #    deadline, before anyone else can take over.
    for partition in ("blackhole", "cut"):
        leader = only_leader(election, 5)
        assert leader.proxy is not None
        cut_at = time.monotonic()
        getattr(leader.proxy, partition)()
        assert leader.stopped.wait(timings["renew_deadline"] + 1), partition
        assert leader.stopped_at[-1] - cut_at <= timings["renew_deadline"] + 0.5
        assert wait_until(lambda: not leader.elector.is_leader, 1)
        successor = only_leader(election, timings["lease_duration"] + 2 * timings["retry_period"] + 1)
        assert successor is not leader
        assert successor.started_at[-1] > leader.stopped_at[-1]
        # Healing the partition: the old leader campaigns again as a standby.
        leader.proxy.restore()
        time.sleep(2 * timings["retry_period"] + 0.2)
        assert not leader.elector.is_leader and leader.elector.leader_identity == successor.identity
        assert not leader.fencing_failed.is_set()

    assert election.samples > 100
    assert election.violations == []
    assert election.leadership_overlaps() == []


@pytest.mark.timeout(60)
def test_graceful_stop_hands_over_in_under_two_seconds(election: Election) -> None:
    first = election.add()
    assert first.led.wait(5)
    second = election.add()
    time.sleep(1)  # second is a standby polling the lease
    with election.plane.api_client() as admin:
        api = k8s.CoordinationV1Api(admin)
        transitions = api.read_namespaced_lease(election.lease, NS).spec.lease_transitions
        start = time.monotonic()
        assert first.elector.stop(5)
        assert second.led.wait(2)
        assert second.started_at[-1] - start < 2.0
        lease = api.read_namespaced_lease(election.lease, NS).spec
    assert lease.holder_identity == second.identity
    assert lease.lease_transitions == transitions + 1
    assert lease.lease_duration_seconds == 4
    assert first.stopped_at[-1] <= second.started_at[-1]


@pytest.mark.timeout(60)
def test_killed_leader_is_replaced_after_the_lease_expires(
        controller_rbac: ControlPlane, controller_token: str, tmp_path: Path) -> None:
    """The standby's clock starts when it sees the dead leader's last write, which it sees at
    its next poll (retry_period with up to 20% jitter); it then acts exactly at expiry. So
    the takeover comes between lease_duration - retry_period and lease_duration +
    1.2 * retry_period after the kill (plus API latency)."""
    election = Election(controller_rbac, controller_token, SHORT)
    kubeconfig = controller_rbac.write_kubeconfig(tmp_path / "sa.kubeconfig", controller_token)
    t = election.timings
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.kube.elector_child", str(kubeconfig), NS, election.lease,
         "child", str(t["lease_duration"]), str(t["renew_deadline"]), str(t["retry_period"])],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert lines.get(timeout=20).startswith("LEADING child")
        standby = election.add()
        time.sleep(1.5)
        assert not standby.elector.is_leader and standby.elector.leader_identity == "child"
        killed_at = time.monotonic()
        child.send_signal(signal.SIGKILL)
        assert standby.led.wait(t["lease_duration"] + 2 * t["retry_period"] + 1)
        took = standby.started_at[-1] - killed_at
        assert t["lease_duration"] - t["retry_period"] - 0.05 <= took
        assert took <= t["lease_duration"] + 1.2 * t["retry_period"] + 0.5
    finally:
        child.kill()
        child.wait(5)
        election.close()


@pytest.mark.timeout(120)
def test_apiserver_outage_stops_the_loops_by_the_renew_deadline(
        control_plane_guard: ControlPlane, controller_rbac: ControlPlane, controller_token: str) -> None:
    election = Election(controller_rbac, controller_token, DEFAULTS_X04)
    t = election.timings
    try:
        leader = election.add()
        assert leader.led.wait(5)
        time.sleep(2 * t["retry_period"])  # a few renewals happened
        killed_at = time.monotonic()
        control_plane_guard.stop_apiserver(graceful=False)
        assert leader.stopped.wait(t["renew_deadline"] + 2)
        took = leader.stopped_at[-1] - killed_at
        # At most one retry period of renewal lead time is lost before the kill, never more.
        assert t["renew_deadline"] - t["retry_period"] - 0.1 <= took <= t["renew_deadline"] + 0.5
        assert wait_until(lambda: not leader.elector.is_leader, 1)
        assert leader.elector.healthy()
        # The elector re-enters the election and leads again once the apiserver is back.
        leader.led.clear()
        control_plane_guard.start_apiserver()
        assert leader.led.wait(10)
        assert leader.elector.is_leader
        assert len(leader.started_at) == 2 and not leader.fencing_failed.is_set()
    finally:
        election.close()
