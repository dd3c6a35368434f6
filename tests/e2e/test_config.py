"""A ConfigMap edit is picked up without a restart (docs/quickstart.md step 2: "later edits need
no restart"). A StorageClass naming a clusterID that config.json lacks fails to provision; after
the user adds that cluster to ceph-csi-config (re-applying the install, as they would), a new
claim of that class is provisioned by the same controller processes and staged by the same node
plugin process, none of them restarted."""
from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.e2e.env import IMAGE, E2EEnv, quickstart_config, storage_class
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, NODE_LABELS, wait_for
from tests.e2e.test_volumes import IDLE, delete_claim

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]
ALIAS = "e2e-added-cluster"
ALIAS_CLASS = "csi-rbd-added"


def containers(e2e: E2EEnv) -> dict[str, tuple[str, int]]:
    """pod uid → (container id, restart count) of every driver pod."""
    found = {}
    for labels in (CONTROLLER_LABELS, NODE_LABELS):
        for pod in e2e.kube.pods(DEPLOY_NAMESPACE, labels):
            [status] = pod["status"]["containerStatuses"]
            found[pod["metadata"]["uid"]] = (status.get("containerID", ""), status["restartCount"])
    return found


def failed_events(e2e: E2EEnv, namespace: str, claim: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(e2e.kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={claim}", _preload_content=False).data)["items"]
    return [e for e in items if e.get("reason") == "ProvisioningFailed"]


def test_config_map_edit_needs_no_restart(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    sc = storage_class(e2e.ceph, ALIAS_CLASS)
    sc["parameters"]["clusterID"] = ALIAS
    kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(sc))
    original = quickstart_config(e2e.ceph)
    before = containers(e2e)
    try:
        # Unknown clusterID: the provisioner reports it on the claim and keeps retrying.
        kube.create_pvc(namespace, "early", ALIAS_CLASS)
        events = wait_for("ProvisioningFailed on the claim", lambda: failed_events(e2e, namespace, "early"), timeout=60)
        assert ALIAS in events[0]["message"], events[0]["message"]

        entries = json.loads(original)
        entries.append({**entries[0], "clusterID": ALIAS})
        e2e.set_config(json.dumps(entries, indent=2))

        # The kubelet refreshes the mounted ConfigMap within its sync period and the driver
        # re-reads the file: the failing claim's next retry (backoff doubles from 1 s) and a
        # new claim both succeed; staging (node plugin) needs the new entry too.
        kube.create_pvc(namespace, "late", ALIAS_CLASS)
        late = kube.wait_bound(namespace, "late", timeout=150)
        early = kube.wait_bound(namespace, "early", timeout=150)
        assert late["spec"]["csi"]["volumeAttributes"]["clusterID"] == ALIAS
        kube.create_pod(namespace, "app", IMAGE, IDLE, "late")
        kube.wait_pod_ready(namespace, "app", timeout=150)
        kube.delete_pod(namespace, "app")
        delete_claim(e2e, namespace, "late", late)
        delete_claim(e2e, namespace, "early", early)

        assert containers(e2e) == before, "no driver container was restarted or replaced"
    finally:
        e2e.set_config(original)
        kube.kubectl("delete", "--ignore-not-found", "storageclass", ALIAS_CLASS)
