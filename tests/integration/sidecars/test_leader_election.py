"""Leader election of the controller loops: only the Lease holder provisions, a lost Lease stops
the loops (and the replica campaigns again), a graceful stop hands over at once, and
--leader-election=false runs the loops unconditionally."""
from __future__ import annotations

import datetime
import time

import kubernetes.client
import pytest

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import LEASE, ControllerProcess, images_with, new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]


def phase(env: Env, namespace: str, name: str) -> str:
    return str(((env.kube.pvc(namespace, name) or {}).get("status") or {}).get("phase") or "")


def test_graceful_stop_hands_the_lease_over_at_once(env: Env, start_controllers: StartControllers,
                                                    kube_namespace: str) -> None:
    replicas = start_controllers(2)
    leader = wait_for("a leader", lambda: next((r for r in replicas if r.is_leader()), None))
    assert isinstance(leader, ControllerProcess)
    standby = next(r for r in replicas if r is not leader)
    assert not standby.is_leader()
    # A standby gets ready (warm caches) without the Lease, once its informers have synced.
    wait_for("the standby ready", lambda: standby.http("/readyz")[0] == 200)
    assert not standby.is_leader()
    began = time.monotonic()
    assert leader.stop() == 0
    wait_for("the standby to lead", standby.is_leader, timeout=10, interval=0.1)
    # Released on stop: the standby takes over at its next poll, not after the 4 s lease duration.
    assert time.monotonic() - began < 3.5
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    env.kube.create_pvc(kube_namespace, "data", storage_class)
    wait_for("Bound by the new leader", lambda: phase(env, kube_namespace, "data") == "Bound")
    env.kube.delete_pvc(kube_namespace, "data")
    wait_for("the image to be deleted", lambda: not images_with(env.ceph, prefix))


def test_lost_lease_stops_the_loops_until_it_is_won_back(env: Env, start_controllers: StartControllers,
                                                         kube_namespace: str) -> None:
    (controller,) = start_controllers()
    wait_for("leadership", controller.is_leader)
    coordination = kubernetes.client.CoordinationV1Api(env.kube.client)
    lease = coordination.read_namespaced_lease(LEASE, env.lease_namespace)
    now = datetime.datetime.now(datetime.timezone.utc)
    lease.spec.holder_identity = "an-intruder"
    lease.spec.renew_time = now
    lease.spec.acquire_time = now
    lease.spec.lease_duration_seconds = 6
    coordination.replace_namespaced_lease(LEASE, env.lease_namespace, lease)
    wait_for("the loops to stop", lambda: not controller.is_leader(), timeout=10, interval=0.1)

    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    env.kube.create_pvc(kube_namespace, "data", storage_class)
    time.sleep(2)
    assert phase(env, kube_namespace, "data") == "Pending", "a replica without the Lease must not provision"
    assert not images_with(env.ceph, prefix)
    # The intruder never renews: once its lease runs out, our replica (still campaigning) wins.
    wait_for("leadership regained", controller.is_leader, timeout=20)
    wait_for("Bound", lambda: phase(env, kube_namespace, "data") == "Bound")
    assert controller.process is not None and controller.process.poll() is None, "losing the Lease is not fatal"
    env.kube.delete_pvc(kube_namespace, "data")
    wait_for("the image to be deleted", lambda: not images_with(env.ceph, prefix))


def test_without_leader_election_the_loops_just_run(env: Env, start_controllers: StartControllers,
                                                    kube_namespace: str) -> None:
    namespace = f"{env.lease_namespace}-none"
    env.kube.ensure_namespace(namespace)
    (controller,) = start_controllers(args=["--leader-election=false"], lease_namespace=namespace)
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    env.kube.create_pvc(kube_namespace, "data", storage_class)
    wait_for("Bound", lambda: phase(env, kube_namespace, "data") == "Bound")
    assert env.kube.lease_holder(namespace) == "", "no Lease without leader election"
    assert "leader-election" not in controller.http("/healthz")[1]
    env.kube.delete_pvc(kube_namespace, "data")
    wait_for("the image to be deleted", lambda: not images_with(env.ceph, prefix))
