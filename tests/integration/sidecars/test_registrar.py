"""The registrar in a real `cephcsi --mode=node` process, with the test playing the kubelet's
plugin watcher over the registration socket."""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from cephcsi._generated import pluginregistration_pb2 as reg_pb2
from cephcsi._generated import pluginregistration_pb2_grpc as reg_grpc
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DriverProcess, str, int]]:
    kubelet = tempfile.mkdtemp(prefix="kl-", dir="/tmp")
    config = tmp_path_factory.mktemp("cfg") / "config.json"
    config.write_text(json.dumps([{"clusterID": "c1", "monitors": ["127.0.0.1:1"]}]))
    port = _free_port()
    process = DriverProcess(str(config), mode="node", args=[
        "--nodeid=node-1", f"--kubelet-dir={kubelet}", f"--state-dir={kubelet}/state",
        f"--http-endpoint=127.0.0.1:{port}",
        f"--kubelet-registration-path={kubelet}/plugins/rbd.csi.ceph.com/csi.sock",
    ])
    # The command() default says --sidecars=none; the registrar is what we test here.
    process.command = lambda: [a for a in DriverProcess.command(process) if a != "--sidecars=none"]  # type: ignore[method-assign]
    process.start()
    try:
        yield process, kubelet, port
    finally:
        process.stop()
        shutil.rmtree(kubelet, ignore_errors=True)
        shutil.rmtree(process.workdir, ignore_errors=True)


def _healthz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_kubelet_registration_flow(node_plugin: tuple[DriverProcess, str, int]) -> None:
    process, kubelet, port = node_plugin
    reg_socket = os.path.join(kubelet, "plugins_registry", "rbd.csi.ceph.com-reg.sock")
    deadline = time.monotonic() + 10
    while not os.path.exists(reg_socket):
        assert time.monotonic() < deadline, "registration socket never appeared"
        time.sleep(0.05)
    with grpc.insecure_channel(f"unix://{reg_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name) == ("CSIPlugin", "rbd.csi.ceph.com")
        assert info.endpoint == f"{kubelet}/plugins/rbd.csi.ceph.com/csi.sock"
        assert "1.0.0" in info.supported_versions
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
        assert _healthz(port)[0] == 200
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=False, error="version mismatch"), timeout=5)
        code, body = _healthz(port)
        assert code == 503 and "version mismatch" in json.dumps(body)
    assert process.stop() == 0
    assert not os.path.exists(reg_socket), "the registration socket must go with the plugin"
