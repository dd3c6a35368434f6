"""The embedded registrar, exercised by the real kubelet's plugin watcher: the node plugin's
registration socket is found, GetInfo is called, and the kubelet publishes the driver in the
CSINode object and the Node's nodeid annotation (what node-driver-registrar does)."""
from __future__ import annotations

import json

import pytest

from tests.e2e.env import E2EEnv
from tests.e2e.kube import DRIVER
from tests.e2e.nodehost import KUBELET_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120, func_only=True)]


def test_kubelet_registered_the_driver(e2e: E2EEnv) -> None:
    node = e2e.node.name
    csinode = e2e.kube.csinode(node)
    assert csinode is not None, "the kubelet creates the CSINode once a plugin registers"
    drivers = {d["name"]: d for d in csinode["spec"].get("drivers") or []}
    assert DRIVER in drivers, drivers
    # --nodeid=$(NODE_NAME) in the DaemonSet: the driver reports the node's own name.
    assert drivers[DRIVER]["nodeID"] == node

    annotations = e2e.kube.core.read_node(node).metadata.annotations or {}
    assert json.loads(annotations["csi.volume.kubernetes.io/nodeid"]).get(DRIVER) == node

    # The socket the kubelet's plugin watcher found, and the driver socket it was told about.
    assert (KUBELET_ROOT / "plugins_registry" / f"{DRIVER}-reg.sock").is_socket()
    assert (KUBELET_ROOT / "plugins" / DRIVER / "csi.sock").is_socket()
