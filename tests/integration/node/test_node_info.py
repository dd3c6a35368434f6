"""NodeGetInfo topology through a real plugin process and the real kubernetes client, against a
minimal HTTP stand-in for the API server (it serves the one Node object the plugin reads)."""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import expect_code

pytestmark = pytest.mark.integration

LABELS = {"topology.kubernetes.io/zone": "zone-a", "example.com/rack": "r7", "kubernetes.io/hostname": "test-node"}


class FakeApiServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.requests.append(self.path)
        if self.path.split("?")[0] == "/api/v1/nodes/test-node":
            body: dict[str, object] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node", "labels": LABELS}}
            code = 200
        else:
            body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
            code = 404
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _kubeconfig(path: str, server: str) -> str:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": server}}],
        "users": [{"name": "t", "user": {"token": "test-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }
    with open(path, "w") as handle:
        json.dump(doc, handle)
    return path


def _driver(tmp: str, *args: str) -> DriverProcess:
    config = os.path.join(tmp, "config.json")
    with open(config, "w") as handle:
        json.dump([{"clusterID": "c1", "monitors": ["127.0.0.1:1"]}], handle)
    workdir = os.path.join(tmp, "drv")
    os.makedirs(workdir, exist_ok=True)
    return DriverProcess(config, mode="node", args=["--nodeid=test-node", "--kubelet-dir=", f"--state-dir={tmp}/state", *args],
                         workdir=workdir)


@pytest.fixture
def short_tmp() -> Iterator[str]:
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="ni-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_topology_from_node_labels(api_server: FakeApiServer, short_tmp: str) -> None:
    kubeconfig = _kubeconfig(os.path.join(short_tmp, "kubeconfig"), f"http://127.0.0.1:{api_server.server_address[1]}")
    driver = _driver(short_tmp, "--domainlabels=topology.kubernetes.io/zone,example.com/rack", f"--kubeconfig={kubeconfig}")
    try:
        driver.start()
        info = driver.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=30)
        assert info.node_id == "test-node"
        assert dict(info.accessible_topology.segments) == {
            "topology.rbd.csi.ceph.com/zone": "zone-a",
            "topology.rbd.csi.ceph.com/rack": "r7",
        }
        assert any(p.startswith("/api/v1/nodes/test-node") for p in api_server.requests)
        caps = driver.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
        Service = csi_pb2.PluginCapability.Service
        assert [c.service.type for c in caps.capabilities] == [Service.VOLUME_ACCESSIBILITY_CONSTRAINTS]
        assert "test-token" not in driver.log()
    finally:
        driver.stop()


def test_missing_label_and_unreachable_api(api_server: FakeApiServer, short_tmp: str) -> None:
    kubeconfig = _kubeconfig(os.path.join(short_tmp, "kubeconfig"), f"http://127.0.0.1:{api_server.server_address[1]}")
    driver = _driver(short_tmp, "--domainlabels=topology.kubernetes.io/region", f"--kubeconfig={kubeconfig}")
    try:
        driver.start()
        message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, driver.node.NodeGetInfo, csi_pb2.NodeGetInfoRequest())
        assert "topology.kubernetes.io/region" in message
    finally:
        driver.stop()

    dead = _kubeconfig(os.path.join(short_tmp, "dead"), "http://127.0.0.1:9")  # nothing listens on port 9
    driver = _driver(short_tmp, "--domainlabels=topology.kubernetes.io/zone", f"--kubeconfig={dead}")
    try:
        driver.start()
        message = expect_code(grpc.StatusCode.UNAVAILABLE, driver.node.NodeGetInfo, csi_pb2.NodeGetInfoRequest(), timeout=60)
        assert "unreachable" in message
    finally:
        driver.stop()

    driver = _driver(short_tmp, "--domainlabels=topology.kubernetes.io/zone", f"--kubeconfig={short_tmp}/missing")
    try:
        driver.start()
        message = expect_code(grpc.StatusCode.UNAVAILABLE, driver.node.NodeGetInfo, csi_pb2.NodeGetInfoRequest())
        assert "no usable Kubernetes client config" in message
    finally:
        driver.stop()
