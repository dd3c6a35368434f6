"""overlays/migration/: what docs/migrate-from-ceph-csi.md applies while ceph-csi still runs. It
must be deploy/ with the node DaemonSet restricted to nodes labelled cephcsi.migrated=true, so
applying it never starts cephcsi's node plugin beside ceph-csi's (same registration socket and
port); and the guide must apply it, not deploy/, until every node is migrated."""
from __future__ import annotations

import copy
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.unit.deploy import manifests as m

pytestmark = pytest.mark.unit

OVERLAY = m.REPO / "overlays" / "migration"
GUIDE = m.REPO / "docs" / "migrate-from-ceph-csi.md"
SELECTOR = {"kubernetes.io/os": "linux", "cephcsi.migrated": "true"}


def kustomize(directory: Any) -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl binary to render the overlay with")
    proc = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                          check=False)
    if proc.returncode != 0 and "unknown command" in proc.stderr:
        pytest.skip("this kubectl has no kustomize")
    assert proc.returncode == 0, proc.stderr
    return [obj for obj in yaml.safe_load_all(proc.stdout) if obj]


def test_overlay_renders_and_only_the_node_daemonset_gets_the_selector() -> None:
    rendered = {m.key(o): o for o in kustomize(OVERLAY)}
    base = {m.key(o): o for o in m.render()}
    assert set(rendered) == set(base)
    daemonset_key = m.key(m.find(m.render(), "DaemonSet"))
    daemonset = rendered.pop(daemonset_key)
    assert daemonset["metadata"]["name"] == "cephcsi-node"
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == SELECTOR
    # Nothing else of the DaemonSet changes: it is the same plugin, just held back.
    expected = copy.deepcopy(base.pop(daemonset_key))
    expected["spec"]["template"]["spec"]["nodeSelector"] = SELECTOR
    assert daemonset == expected
    assert rendered == base


def test_overlay_fails_loudly_if_the_base_selector_changes(tmp_path: Any) -> None:
    """The patch's `test` op pins deploy/'s nodeSelector: a changed base breaks the render
    instead of silently producing a DaemonSet that runs everywhere or nowhere."""
    base = tmp_path / "deploy"
    shutil.copytree(m.DEPLOY, base)
    daemonset = base / "node-daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("kubernetes.io/os: linux", "kubernetes.io/os: windows"))
    overlay = tmp_path / "overlays" / "migration"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text((OVERLAY / "kustomization.yaml").read_text())
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl binary to render the overlay with")
    proc = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode != 0 and "test" in proc.stderr.lower(), proc.stderr


def _steps(text: str) -> dict[int, str]:
    """The numbered steps of "The switch, in order", by number."""
    section = text.split("## The switch, in order", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^(\d)\. ", section, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_guide_installs_through_the_overlay_and_deploy_only_at_the_end() -> None:
    steps = _steps(GUIDE.read_text())
    assert sorted(steps) == [1, 2, 3, 4, 5]
    assert "kubectl apply -k overlays/migration/" in steps[2]
    for number in (1, 2, 3, 4):
        assert "apply -k deploy" not in steps[number], f"step {number} would start cephcsi-node everywhere"
        assert "kubectl kustomize deploy" not in steps[number]
    assert "kubectl apply -k deploy/" in steps[5]
    # ceph-csi's plugin leaves a node (any value of the label) before cephcsi's may start there (only "true").
    four = steps[4]
    assert '"operator":"DoesNotExist"' in four and '"type":"OnDelete"' in four
    pending, wait, true = (four.index(s) for s in ("cephcsi.migrated=pending", "wait --for=delete pod -l app=csi-rbdplugin",
                                                   "cephcsi.migrated=true --overwrite"))
    assert pending < wait < true
