"""The demo of scripts/demo.sh, step for step (tests/e2e/demo.py), on the e2e node: its
transcript names every step and command, the pod's file is read back from the restored claim, and
the filesystem grew under the running pod. The VM node's run of the same steps is in
tests/e2e/test_vm_node.py."""
from __future__ import annotations

import io

import pytest

from tests.e2e.demo import GIB, Demo, DemoResult
from tests.e2e.env import E2EEnv
from tests.e2e.snapshot_addon import start_snapshot_addon

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900, func_only=True)]


def test_the_demo_writes_grows_snapshots_and_restores(e2e: E2EEnv, namespace: str,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    addon = start_snapshot_addon(e2e, tmp_path_factory.mktemp("demo") / "snapshot-controller.log")
    out = io.StringIO()
    try:
        result = Demo(e2e, out, namespace=namespace, snapshot_class=addon.class_name).run()
    finally:
        print(out.getvalue())
        e2e.kube.kubectl("-n", namespace, "delete", "volumesnapshots", "--all", "--wait=false")
        addon.stop()
    check_demo(result, out.getvalue(), namespace)


def check_demo(result: DemoResult, transcript: str, namespace: str) -> None:
    """What the demo must show on any node (also the VM node's check, tests/e2e/test_vm_node.py)."""
    assert len(result.steps) == 6 and transcript.count("\n== ") == 6, transcript
    for command in ("kubectl apply -f deploy/examples/pvc-pod.yaml", f"kubectl -n {namespace} patch pvc",
                    "| kubectl apply -f -", "--for=jsonpath={.status.readyToUse}=true"):
        assert command in transcript, command
    assert result.mounter in ("krbd", "rbd-nbd", "fuse"), transcript
    assert result.device.startswith("/dev/") and f"/data is on {result.device}" in transcript, transcript
    assert result.written and result.restored == result.written, transcript
    assert result.size_before < GIB + GIB // 8 < 2 * GIB - GIB // 8 < result.size_after, transcript
