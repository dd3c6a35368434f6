"""The controller loops: Lease naming and namespace resolution, the composition root's checks,
and ControllerLoops running the ready-made parts it is given."""
from __future__ import annotations

import pathlib
import threading
from dataclasses import dataclass, field

import pytest
from kubernetes import client as k8s

from cephcsi.cli.sidecar_wiring import build_controller_loops
from cephcsi.csi.identity import IdentityOptions, IdentityServicer
from cephcsi.csi.services import Services
from cephcsi.errors import ConfigError
from cephcsi.kube.events import EventRecorder, EventSettings
from cephcsi.kube.factory import InformerFactory
from cephcsi.observability.health import HealthRegistry
from cephcsi.settings import Settings
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.leadership import ControllerClients, ControllerLoops, Loops, lease_name, lease_namespace

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("driver,lease", [("rbd.csi.ceph.com", "rbd-csi-ceph-com"), ("a/b.c", "a-b-c"), ("x.", "x-X")])
def test_lease_name_is_sanitised_like_csi_lib_utils(driver: str, lease: str) -> None:
    assert lease_name(driver) == lease


def test_lease_namespace_order(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "namespace"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert lease_namespace("flag", str(sa)) == "flag"
    assert lease_namespace("", str(sa)) == "from-env"
    sa.write_text("from-pod\n")
    assert lease_namespace("", str(sa)) == "from-pod"
    monkeypatch.delenv("POD_NAMESPACE")
    with pytest.raises(ConfigError, match="--leader-election-namespace"):
        lease_namespace("", str(tmp_path / "missing"))


def test_the_loops_need_the_controller_service() -> None:
    identity = IdentityServicer(IdentityOptions(driver_name="rbd.csi.ceph.com", controller=False, topology=False,
                                                online_expansion=False))
    services = Services(identity, None, None, [])
    with pytest.raises(ConfigError, match="need the Controller service"):
        build_controller_loops(Settings(mode="node"), services, HealthRegistry(), lambda code, why: None,
                               {"provisioner"})


@dataclass
class FakeLoop:
    started: threading.Event = field(default_factory=threading.Event)
    stopped: list[float] = field(default_factory=list)
    closed: bool = False

    def start(self, stop: threading.Event) -> None:
        self.started.set()

    def stop(self, timeout: float) -> bool:
        self.stopped.append(timeout)
        return True

    def close(self) -> None:
        self.closed = True


class RecordingApiClient(k8s.ApiClient):
    closed = False

    def close(self) -> None:
        self.closed = True


def test_loops_without_leader_election_run_the_parts_they_are_given() -> None:
    api_client = RecordingApiClient()
    clients = ControllerClients(api_client, InformerFactory(api_client), EventRecorder(None, EventSettings(component="test")),
                                CsiCalls(max_workers=1, timeout=1.0))
    provisioner, snapshotter = FakeLoop(), FakeLoop()
    health = HealthRegistry()
    loops = ControllerLoops(clients, Loops(provisioner=provisioner, snapshotter=snapshotter), health,
                            lambda code, why: None, leadership=None, shutdown_grace=2.0)
    loops.start()
    # No informers to sync: the term starts its loops at once, in the background thread.
    assert provisioner.started.wait(10.0) and snapshotter.started.wait(10.0)
    assert health.run("readiness")["informers"] is None
    loops.stop()
    assert provisioner.stopped == [2.0] and snapshotter.stopped == [2.0]
    assert snapshotter.closed and not provisioner.closed
    assert api_client.closed
