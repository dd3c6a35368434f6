"""The snapshot CRDs of kubernetes-csi/external-snapshotter, VolumeSnapshot and VolumeGroupSnapshot
(fetched, with the upstream snapshot-controller, by snapshotter_build.sh) on the test apiserver,
installed by the first test that needs them and left for the rest of the session.

A bare apiserver does not serve snapshot.storage.k8s.io. The CRDs are never deleted again: a CRD
deleted and re-created under the same name on the shared control plane sometimes stayed in
Terminating for minutes on a loaded 2-core machine (the apiserver's CRD finalizer), which failed
whatever test happened to be cleaning up. The one test that needs a cluster without them
(tests/integration/audit) runs before any installer in collection order and skips otherwise.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import kubernetes.client
import yaml

from tests.controlplane.cluster import ControlPlane

BUILD = Path(__file__).resolve().parent / "snapshotter_build.sh"
GROUP = "snapshot.storage.k8s.io"
VERSION = "v1"
# The VolumeGroupSnapshot CRDs (GA in external-snapshotter v8.6) are installed with them.
GROUP_SNAPSHOT_GROUP = "groupsnapshot.storage.k8s.io"


def snapshotter_build() -> Path:
    """The folder holding bin/snapshot-controller and crd/*.yaml (cached; built on first use)."""
    out = subprocess.run([str(BUILD)], check=True, capture_output=True, text=True, timeout=3600)
    return Path(out.stdout.strip().splitlines()[-1])


def _until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def served_plurals(client: kubernetes.client.ApiClient, group: str = GROUP) -> set[str]:
    """The resources discovery lists under <group>/v1 (empty: not served)."""
    try:
        listing = client.call_api(f"/apis/{group}/{VERSION}", "GET", response_type="object",
                                  auth_settings=["BearerToken"], _return_http_data_only=True)
    except kubernetes.client.ApiException:
        return set()
    return {r["name"] for r in listing["resources"]}


def install(client: kubernetes.client.ApiClient, created: list[str], out: Path | None = None) -> None:
    """Creates the CRDs (those that exist already are left as they are) and waits until
    discovery serves them all. Appends the name of each it created to `created` as it goes, so
    the caller can remove them even when a later step fails."""
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    plurals: dict[str, set[str]] = {}
    for path in sorted(((out or snapshotter_build()) / "crd").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        assert body["spec"]["group"] in (GROUP, GROUP_SNAPSHOT_GROUP), path
        plurals.setdefault(body["spec"]["group"], set()).add(body["spec"]["names"]["plural"])
        try:
            extensions.create_custom_resource_definition(body)
            created.append(body["metadata"]["name"])
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
    _until("the snapshot CRDs in discovery",
           lambda: all(names <= served_plurals(client, group) for group, names in plurals.items()))


def ensure_installed(control_plane: ControlPlane) -> None:
    """The CRDs served from here to the end of the session (see the module docstring)."""
    with control_plane.api_client() as client:
        install(client, [])
