"""Capacity tracking on the real control plane and Ceph: a real `cephcsi --mode=controller
--enable-capacity` publishes a CSIStorageCapacity object for a WaitForFirstConsumer class of
this driver (its pool's room, read with the credentials of the Secret the class names), none for
an Immediate class or another driver's class, refreshes it on the poll interval when the pool's
quota changes, and deletes it with the class."""
from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.utils.quantity import parse_quantity

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import DRIVER, new_prefix, wait_for
from tests.integration.sidecars.test_rbac import deploy_rbac  # noqa: F401 - a fixture
from tests.unit.deploy import manifests as m

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]
MiB = 1 << 20


@pytest.fixture
def spare_pool(env: Env) -> Iterator[str]:
    """A pool of the test's own whose quota makes its room exact (and touches no other test)."""
    name = f"capk-{uuid.uuid4().hex[:6]}"
    env.ceph.admin("ceph", "osd", "pool", "create", name, "8", "8", "replicated")
    env.ceph.admin("ceph", "osd", "pool", "set-quota", name, "max_bytes", str(48 * MiB))
    try:
        yield name
    finally:
        env.ceph.admin("ceph", "osd", "pool", "rm", name, name, "--yes-i-really-really-mean-it")


@pytest.fixture
def registered_node(env: Env) -> Iterator[str]:
    """A Node whose CSINode lists this driver without topology keys (as the registrar leaves it)."""
    name = f"capnode-{uuid.uuid4().hex[:6]}"
    env.kube.create_node(name)
    env.kube.storage.create_csi_node({"metadata": {"name": name}, "spec": {"drivers": [
        {"name": DRIVER, "nodeID": name, "topologyKeys": None}]}})
    try:
        yield name
    finally:
        env.kube.storage.delete_csi_node(name)
        env.kube.core.delete_node(name)


def capacities(env: Env, storage_class: str, namespace: str | None = None) -> list[dict[str, Any]]:
    items = env.kube.storage.list_namespaced_csi_storage_capacity(namespace or env.lease_namespace).to_dict()["items"]
    return [c for c in items if c["storage_class_name"] == storage_class]


def figure(env: Env, storage_class: str, namespace: str | None = None) -> int | None:
    """The capacity of the class's object for the segment of `registered_node` (no keys). Other
    tests' CSINodes may list the driver with topology keys: their segments get objects of their own."""
    found = [c for c in capacities(env, storage_class, namespace) if not (c["node_topology"] or {}).get("match_labels")]
    return int(parse_quantity(found[0]["capacity"])) if len(found) == 1 else None


def test_objects_follow_the_classes_and_the_pools_room(env: Env, start_controllers: StartControllers,
                                                       spare_pool: str, registered_node: str) -> None:
    pool = {"clusterID": env.ceph.cluster_id, "pool": spare_pool}
    tracked = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix(), parameters=pool,
                                            volumeBindingMode="WaitForFirstConsumer")
    immediate = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix(), parameters=pool)
    foreign = f"sc-{uuid.uuid4().hex[:8]}"
    env.kube.storage.create_storage_class({"metadata": {"name": foreign}, "provisioner": "other.csi.example.com",
                                           "volumeBindingMode": "WaitForFirstConsumer"})
    try:
        start_controllers(args=["--enable-capacity", "--capacity-poll-interval=2s", "--capacity-ownerref-level=-1"])

        wait_for("the class's object with the quota's room", lambda: figure(env, tracked) == 48 * MiB, timeout=30)
        (capacity,) = [c for c in capacities(env, tracked) if not (c["node_topology"] or {}).get("match_labels")]
        assert capacity["metadata"]["labels"] == {"csi.storage.k8s.io/drivername": DRIVER,
                                                  "csi.storage.k8s.io/managed-by": "external-provisioner"}
        assert capacity["metadata"]["generate_name"] == "csisc-"
        assert capacities(env, immediate) == [] and capacities(env, foreign) == []

        env.ceph.admin("ceph", "osd", "pool", "set-quota", spare_pool, "max_bytes", str(24 * MiB))
        wait_for("the poll to bring the smaller room", lambda: figure(env, tracked) == 24 * MiB, timeout=20)
        assert capacity["metadata"]["name"] in [c["metadata"]["name"] for c in capacities(env, tracked)]  # in place

        env.kube.storage.delete_storage_class(tracked)
        wait_for("the object to go with its class", lambda: capacities(env, tracked) == [], timeout=20)
    finally:
        try:
            env.kube.storage.delete_storage_class(foreign)
        except kubernetes.client.ApiException:
            pass


def test_objects_are_owned_by_the_controllers_deployment_with_deploys_rbac(
        env: Env, start_controllers: StartControllers, spare_pool: str, registered_node: str, deploy_rbac: str,
        tmp_path: Path) -> None:
    """deploy/'s flags and RBAC (test_rbac's fixture: its Roles and bindings, created for real, and
    the ServiceAccount's token): --capacity-ownerref-level=2 from the Pod POD_NAME names finds Pod →
    ReplicaSet → Deployment (the chain written by hand here: this control plane runs no workload
    controllers), the class's Secret is read in the controller's namespace, nothing is refused."""
    namespace, suffix = deploy_rbac, uuid.uuid4().hex[:6]
    apps = kubernetes.client.AppsV1Api(env.kube.client)
    labels = {"app": f"cap-{suffix}"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "cephcsi"}]}}
    deployment = apps.create_namespaced_deployment(namespace, {"metadata": {"name": f"ctl-{suffix}"}, "spec": {
        "selector": {"matchLabels": labels}, "template": template}})
    replica_set = apps.create_namespaced_replica_set(namespace, {"metadata": {"name": f"ctl-{suffix}-1", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment.metadata.name,
         "uid": deployment.metadata.uid, "controller": True}]}, "spec": {"selector": {"matchLabels": labels},
                                                                          "template": template}})
    env.kube.core.create_namespaced_pod(namespace, {"metadata": {"name": f"ctl-{suffix}-1-a", "labels": labels,
                                                                 "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replica_set.metadata.name,
         "uid": replica_set.metadata.uid, "controller": True}]}, "spec": template["spec"]})
    env.kube.create_ceph_secret(namespace, "csi-rbd-secret", env.ceph)
    tracked = env.kube.create_storage_class(env.ceph, (namespace, "csi-rbd-secret"), prefix=new_prefix(),
                                            volumeBindingMode="WaitForFirstConsumer",
                                            parameters={"clusterID": env.ceph.cluster_id, "pool": spare_pool})
    kubeconfig = env.plane.service_account_kubeconfig(namespace, m.CONTROLLER_SA, tmp_path / "controller.kubeconfig")
    (controller,) = start_controllers(args=["--enable-capacity", "--capacity-ownerref-level=2"],
                                      environ={"POD_NAME": f"ctl-{suffix}-1-a"}, kubeconfig=kubeconfig,
                                      lease_namespace=namespace)

    wait_for("the class's object", lambda: figure(env, tracked, namespace) == 48 * MiB, timeout=30)
    for capacity in capacities(env, tracked, namespace):
        (owner,) = capacity["metadata"]["owner_references"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == \
            ("Deployment", deployment.metadata.name, deployment.metadata.uid, True)
    refused = [line for line in controller.log().splitlines() if re.search(r"\(403\)|HTTP 403|forbidden", line, re.I)]
    assert not refused, "\n".join(refused[:20])
