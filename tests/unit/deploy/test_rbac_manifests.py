"""RBAC shipped in deploy/: every binding resolves, grants are exactly the reviewed set (static
evaluation of the rendered roles), and the KMS reader role is bound only as documented."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.unit.deploy import manifests as m

pytestmark = pytest.mark.unit

RENDERED = m.render()


def test_every_binding_resolves_and_every_service_account_exists() -> None:
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in RENDERED if o["kind"] == "ServiceAccount"}
    for obj in RENDERED:
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj["subjects"]:
                assert subject["kind"] == "ServiceAccount"
                assert (subject["namespace"], subject["name"]) in accounts, m.key(obj)
        spec = m.pod_spec(obj)
        if spec is not None:
            assert (obj["metadata"]["namespace"], spec["serviceAccountName"]) in accounts
    m.grants(RENDERED, m.NAMESPACE, m.CONTROLLER_SA)  # raises on a roleRef to a missing role


def test_no_wildcards_and_no_resource_names_in_rules() -> None:
    for obj in RENDERED:
        for rule in obj.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (m.key(obj), rule)
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule, (m.key(obj), rule)


@pytest.mark.parametrize(("account", "expected"), [(m.CONTROLLER_SA, m.CONTROLLER_GRANTS), (m.NODE_SA, m.NODE_GRANTS)],
                         ids=["controller", "node"])
def test_grants_are_exactly_the_reviewed_set(account: str, expected: dict[Any, Any]) -> None:
    assert m.grants(RENDERED, m.NAMESPACE, account) == expected


@pytest.mark.parametrize(("account", "must", "must_not"), [
    (m.CONTROLLER_SA, m.CONTROLLER_MUST, m.CONTROLLER_MUST_NOT),
    (m.NODE_SA, m.NODE_MUST, m.NODE_MUST_NOT),
], ids=["controller", "node"])
def test_static_rbac_evaluation(account: str, must: list[m.Access], must_not: list[m.Access]) -> None:
    granted = m.grants(RENDERED, m.NAMESPACE, account)
    missing = [str(a) for a in must if not m.statically_allowed(granted, a)]
    excess = [str(a) for a in must_not if m.statically_allowed(granted, a)]
    assert not missing, f"{account} lacks {missing}"
    assert not excess, f"{account} may {excess}"


def test_leases_are_namespaced_and_secrets_are_not_cluster_wide() -> None:
    cluster_bound = m.grants(RENDERED, m.NAMESPACE, m.CONTROLLER_SA)[("ClusterRoleBinding", "")]
    assert ("coordination.k8s.io", "leases") not in cluster_bound
    assert ("", "secrets") not in cluster_bound


# ---- helpers shared with test_dockerfile -------------------------------------------------------

def kms_reader_binding(namespace: str) -> dict[str, Any]:
    """What node-rbac.yaml's `kubectl create rolebinding` command makes."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": m.KMS_READER, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": m.KMS_READER},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": m.NAMESPACE}
                         for sa in (m.NODE_SA, m.CONTROLLER_SA)]}


def test_kms_reader_role_is_get_only_and_unbound_by_default() -> None:
    # Encryption KMS types read Secrets/ConfigMaps in tenant namespaces (ceph-csi grants its node
    # and provisioner that cluster-wide). Here the rule exists, but no binding in deploy/ uses it:
    # the exact grants above stay as they were until an admin binds it per namespace.
    role = m.find(RENDERED, "ClusterRole", m.KMS_READER)
    rules = [(tuple(r["apiGroups"]), tuple(sorted(r["resources"])), tuple(r["verbs"])) for r in role["rules"]]
    assert rules == [(("",), ("configmaps", "secrets"), ("get",))]
    refs = [o for o in RENDERED if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and o["roleRef"]["name"] == m.KMS_READER]
    assert refs == []


@pytest.mark.parametrize("account", [m.NODE_SA, m.CONTROLLER_SA])
def test_kms_reader_bound_as_documented_grants_reads_in_that_namespace_only(account: str) -> None:
    text = (m.DEPLOY / "node-rbac.yaml").read_text()
    command = " ".join(line.lstrip("# ").rstrip("\\ ") for line in text.splitlines() if "rolebinding cephcsi-kms-reader" in line
                       or "--serviceaccount=" in line)
    assert f"--clusterrole={m.KMS_READER}" in command
    assert f"--serviceaccount={m.NAMESPACE}:{account}" in command
    granted = m.grants([*RENDERED, kms_reader_binding(m.TENANT_NAMESPACE)], m.NAMESPACE, account)
    for resource in ("secrets", "configmaps"):
        assert m.statically_allowed(granted, m.Access("get", "", resource, m.TENANT_NAMESPACE))
        for verb in ("list", "watch", "create", "update"):
            assert not m.statically_allowed(granted, m.Access(verb, "", resource, m.TENANT_NAMESPACE))
        assert not m.statically_allowed(granted, m.Access("get", "", resource, m.OTHER_NAMESPACE))
    if account == m.NODE_SA:
        assert not m.statically_allowed(granted, m.Access("get", "", "secrets", m.NAMESPACE))
