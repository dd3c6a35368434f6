"""overlays/topology/: what docs/topology.md applies to turn zone pools on. It must be deploy/ with
exactly the three flags the doc names added to the two driver containers, and cephcsi must accept
them as the image's ENTRYPOINT would parse them."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.deploy import manifests as m
from tests.unit.deploy.test_manifests import settings_of
from tests.unit.deploy.test_migration_overlay import kustomize

pytestmark = pytest.mark.unit

OVERLAY = m.REPO / "overlays" / "topology"
ADDED = {
    ("DaemonSet", "cephcsi-node"): ["--domainlabels=topology.kubernetes.io/zone"],
    ("Deployment", "cephcsi-controller"): ["--feature-gates=Topology=true", "--strict-topology"],
}


def test_overlay_is_deploy_plus_the_topology_flags(capsys: pytest.CaptureFixture[str]) -> None:
    rendered = {m.key(o): o for o in kustomize(OVERLAY)}
    base = {m.key(o): o for o in m.render()}
    assert set(rendered) == set(base)
    for (kind, name), flags in ADDED.items():
        key = m.key(m.find(m.render(), kind, name))
        patched = rendered.pop(key)
        expected: dict[str, Any] = copy.deepcopy(base.pop(key))
        [container] = [c for c in expected["spec"]["template"]["spec"]["containers"] if c["name"] == "cephcsi"]
        container["args"] = [*container["args"], *flags]
        assert patched == expected, f"{kind} {name}: more changed than the topology flags"
        [cephcsi] = [c for c in patched["spec"]["template"]["spec"]["containers"] if c["name"] == "cephcsi"]
        settings = settings_of(cephcsi, capsys)
        if kind == "DaemonSet":
            assert settings.node.domain_labels == ("topology.kubernetes.io/zone",)
        else:
            assert settings.sidecars.topology and settings.sidecars.strict_topology
    assert rendered == base, "the overlay changed something besides the two driver containers"
