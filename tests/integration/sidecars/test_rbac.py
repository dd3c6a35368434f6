"""The controller loops with exactly the RBAC of deploy/: the ServiceAccount, ClusterRoles, Roles
and bindings are rendered from deploy/ (tests/unit/deploy/manifests.py), created for real, and
the controller runs with a TokenRequest token of that ServiceAccount. The whole flow (claim →
Bound → attached → detached → deleted) must work, and nothing may be refused (HTTP 403).

The objects are moved into a fresh namespace, as kustomize's `namespace:` would: the rules are
unchanged, and the test does not depend on the state other tests leave `ceph-csi-rbd` in."""
from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.deploy.conftest import Applier
from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import images_with, new_prefix, wait_for
from tests.unit.deploy import manifests as m

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")


def moved(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    if obj["kind"] not in m.CLUSTER_SCOPED:
        obj["metadata"]["namespace"] = namespace
    for subject in obj.get("subjects") or []:
        if subject.get("kind") == "ServiceAccount":
            subject["namespace"] = namespace
    return obj


@pytest.fixture
def deploy_rbac(env: Env) -> Iterator[str]:
    """deploy/'s controller identity and grants, installed in a fresh namespace; yields it."""
    namespace = f"rbac-{uuid.uuid4().hex[:6]}"
    env.kube.ensure_namespace(namespace)
    applier = Applier(env.kube.client)
    objects = [moved(o, namespace) for o in m.render() if o["kind"] in RBAC_KINDS]
    assert any(o["kind"] == "ServiceAccount" and o["metadata"]["name"] == m.CONTROLLER_SA for o in objects)
    for obj in objects:
        applier.apply(obj, dry_run=False)
    try:
        yield namespace
    finally:
        for obj in reversed(objects):
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                applier.delete(obj)


def test_loops_need_nothing_beyond_deploy_rbac(env: Env, start_controllers: StartControllers, deploy_rbac: str,
                                               kube_namespace: str, tmp_path: Path) -> None:
    namespace = deploy_rbac
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    # The provisioner Secret lives where deploy/ lets the controller read Secrets: its own namespace.
    kube.create_ceph_secret(namespace, "csi-rbd-secret", ceph)
    kubeconfig = env.plane.service_account_kubeconfig(namespace, m.CONTROLLER_SA, tmp_path / "controller.kubeconfig")
    (controller,) = start_controllers(kubeconfig=kubeconfig, lease_namespace=namespace)
    wait_for("leadership with the ServiceAccount's token", controller.is_leader, timeout=30)

    storage_class = kube.create_storage_class(ceph, (namespace, "csi-rbd-secret"), prefix=prefix)
    uid = kube.create_pvc(kube_namespace, "data", storage_class)["metadata"]["uid"]
    wait_for("Bound", lambda: ((kube.pvc(kube_namespace, "data") or {}).get("status") or {}).get("phase") == "Bound")
    assert any(r == "ProvisioningSucceeded" for _t, r, _m in kube.events(kube_namespace, "data")), \
        "events must be writable in the claim's namespace"
    node = f"node-{uuid.uuid4().hex[:6]}"
    kube.create_node(node)
    kube.create_pod(kube_namespace, "app", node, "data")
    wait_for("attached", lambda: [va for va in kube.attachments()
                                  if va["spec"]["source"].get("persistentVolumeName") == f"pvc-{uid}"
                                  and (va.get("status") or {}).get("attached")])
    kube.delete_pod(kube_namespace, "app")
    wait_for("detached", lambda: not [va for va in kube.attachments()
                                      if va["spec"]["source"].get("persistentVolumeName") == f"pvc-{uid}"])
    kube.delete_pvc(kube_namespace, "data")
    wait_for("the PV to be deleted", lambda: kube.pv(f"pvc-{uid}") is None)
    wait_for("the image to be deleted", lambda: not images_with(ceph, prefix))

    log = controller.log()
    refused = [line for line in log.splitlines() if re.search(r"\(403\)|HTTP 403|http_403|forbidden", line, re.I)]
    assert not refused, "\n".join(refused[:20])
    assert controller.stop() == 0
    assert kube.lease_holder(namespace) == "", "the Lease is released on graceful stop (update allowed)"
