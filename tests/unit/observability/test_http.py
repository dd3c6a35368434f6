import json
import urllib.error
import urllib.request

import pytest

from cephcsi.errors import ConfigError
from cephcsi.observability.health import HealthRegistry, SocketProbe
from cephcsi.observability.http import HealthServer, parse_address
from cephcsi.observability.metrics import CSI_OPERATIONS

pytestmark = pytest.mark.unit


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_health_readiness_and_metrics() -> None:
    health = HealthRegistry()
    state: dict[str, str | None] = {"leader": None}
    health.add_liveness("leader-election", lambda: state["leader"])
    health.add_readiness("caches", lambda: "informers not synced")
    server = HealthServer("127.0.0.1:0", health)
    server.start()
    try:
        code, body = _get(server.port, "/healthz")
        assert code == 200 and json.loads(body)["checks"] == {"leader-election": "ok"}
        state["leader"] = "lease not renewed for 20s"
        code, body = _get(server.port, "/healthz")
        assert code == 503 and "not renewed" in body
        code, body = _get(server.port, "/readyz")
        assert code == 503 and "not synced" in body
        CSI_OPERATIONS.labels("d", "/csi.v1.Controller/CreateVolume", "OK").observe(0.1)
        code, body = _get(server.port, "/metrics")
        assert code == 200 and 'csi_sidecar_operations_seconds_count{driver_name="d",grpc_status_code="OK"' in body
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.stop()


def test_a_crashing_check_is_a_failure_not_a_crash() -> None:
    health = HealthRegistry()
    health.add_liveness("broken", lambda: 1 / 0)  # type: ignore[arg-type,return-value]
    assert "check failed" in (health.run("liveness")["broken"] or "")


def test_socket_probe_reports_a_dead_socket(tmp_path: pytest.TempPathFactory) -> None:
    probe = SocketProbe(f"{tmp_path}/missing.sock", timeout=0.5)
    assert "Probe" in (probe() or "")
    probe.close()


@pytest.mark.parametrize("endpoint", ["8080", "host:port", ":99999"])
def test_bad_endpoints(endpoint: str) -> None:
    with pytest.raises(ConfigError):
        parse_address(endpoint)


def test_address_forms() -> None:
    assert parse_address(":8080") == ("0.0.0.0", 8080)
    assert parse_address("127.0.0.1:9") == ("127.0.0.1", 9)
