"""StorageClass secret references and external-provisioner's templates."""
from __future__ import annotations

import pytest

from cephcsi.errors import InvalidArgument
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.secrets import PROVISIONER, SecretRef, resolve_template, secret_ref
from tests.unit.sidecars.fixtures import claim

pytestmark = pytest.mark.unit

NAME = "csi.storage.k8s.io/provisioner-secret-name"
NAMESPACE = "csi.storage.k8s.io/provisioner-secret-namespace"


def ref(name: str, namespace: str, c: KubeObject | None = None) -> SecretRef | None:
    return secret_ref(PROVISIONER, {NAME: name, NAMESPACE: namespace}, "pvc-1", c or claim("data", "team-a"))


def test_plain_reference() -> None:
    assert ref("ceph", "ceph-csi") == SecretRef("ceph", "ceph-csi")


def test_templates_resolve_from_the_claim() -> None:
    c = claim("data", "team-a", annotations={"example.com/secret": "special"})
    assert ref("${pvc.name}-key", "${pvc.namespace}", c) == SecretRef("data-key", "team-a")
    assert ref("${pvc.annotations['example.com/secret']}", "sys", c) == SecretRef("special", "sys")
    assert ref("${pv.name}", "sys", c) == SecretRef("pvc-1", "sys")


def test_namespace_templates_cannot_use_the_claim_name() -> None:
    with pytest.raises(InvalidArgument, match=r"invalid tokens: \['pvc.name'\]"):
        ref("x", "${pvc.name}")


def test_unknown_tokens_are_listed() -> None:
    with pytest.raises(InvalidArgument, match=r"invalid tokens: \['a', 'b'\]"):
        resolve_template("${a}-${b}", {})
    assert resolve_template("$x-${y}", {"x": "1", "y": "2"}) == "1-2"


def test_both_keys_or_neither() -> None:
    assert secret_ref(PROVISIONER, {}, "pvc-1", claim()) is None
    with pytest.raises(InvalidArgument, match="must be given together"):
        secret_ref(PROVISIONER, {NAME: "x"}, "pvc-1", claim())


@pytest.mark.parametrize("name,namespace", [("Bad_Name", "ok"), ("ok", "not.a.label"), ("ok", "${pvc.namespace}x" * 10)])
def test_resolved_names_must_be_valid(name: str, namespace: str) -> None:
    with pytest.raises(InvalidArgument, match="not a valid"):
        ref(name, namespace)
