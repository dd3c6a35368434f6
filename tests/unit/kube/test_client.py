"""The throttled ApiClient: every request passes the token bucket and gets a timeout."""
from __future__ import annotations

import time
from typing import Any

import pytest
import urllib3
from kubernetes import client as k8s

from cephcsi.kube.client import ClientSettings, load_configuration, new_api_client
from cephcsi.kube.errors import ClientConfigError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


class RecordingRest:
    """Stands in for the urllib3-based RESTClientObject."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, float]] = []

    def __getattr__(self, method: str) -> Any:
        def call(url: str, **kwargs: Any) -> Any:
            self.calls.append((method, kwargs.get("_request_timeout"), time.monotonic()))
            return type("Resp", (), {"status": 200, "data": "{}", "getheaders": lambda self: {}})()
        return call


def client(qps: float, burst: int) -> tuple[k8s.ApiClient, RecordingRest]:
    cfg = k8s.Configuration()
    cfg.host = "https://127.0.0.1:1"
    api = new_api_client(ClientSettings(qps=qps, burst=burst, timeout=7, connect_timeout=3), configuration=cfg)
    rest = RecordingRest()
    api.rest_client = rest
    return api, rest


def test_requests_are_throttled_after_the_burst() -> None:
    api, rest = client(qps=50, burst=5)
    start = time.monotonic()
    for _ in range(15):
        api.request("GET", "https://127.0.0.1:1/api")
    elapsed = time.monotonic() - start
    assert len(rest.calls) == 15
    assert elapsed >= (15 - 5) / 50 * 0.9


def test_default_and_numeric_timeouts_become_connect_read_pairs() -> None:
    api, rest = client(qps=0, burst=0)
    api.request("GET", "u")
    api.request("GET", "u", _request_timeout=2.5)
    api.request("GET", "u", _request_timeout=(1, 60))
    api.request("GET", "u", _request_timeout=urllib3.Timeout(connect=2, read=4))
    assert [c[1] for c in rest.calls] == [(3.0, 7.0), (2.5, 2.5), (1.0, 60.0), (2.0, 4.0)]


def test_typed_api_calls_go_through_the_limiter() -> None:
    api, rest = client(qps=0, burst=0)
    k8s.CoreV1Api(api).list_namespace(_preload_content=False)
    assert rest.calls and rest.calls[0][0] == "GET"


def test_configuration_is_copied_not_mutated() -> None:
    cfg = k8s.Configuration()
    cfg.host = "https://example:6443"
    api = new_api_client(ClientSettings(pool_size=7), configuration=cfg)
    assert api.configuration is not cfg
    assert api.configuration.connection_pool_maxsize == 7
    assert cfg.connection_pool_maxsize != 7 or cfg.connection_pool_maxsize is None


def test_missing_kubeconfig_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(ClientConfigError):
        load_configuration(ClientSettings(kubeconfig=str(tmp_path / "missing")))
