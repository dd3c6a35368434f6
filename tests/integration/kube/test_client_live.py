"""The throttled client against the real apiserver: QPS/burst and timeouts."""
from __future__ import annotations

import time

import kubernetes.client as k8s
import pytest
import urllib3

from cephcsi.kube import apierrors
from cephcsi.kube.client import ClientSettings, new_api_client
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.timeout(60)]


def test_qps_and_burst_limit_real_requests(control_plane: ControlPlane) -> None:
    api = k8s.CoreV1Api(new_api_client(ClientSettings(qps=20, burst=5), configuration=control_plane.configuration()))
    start = time.monotonic()
    for _ in range(25):
        api.list_namespace(limit=1)
    elapsed = time.monotonic() - start
    assert elapsed >= (25 - 5) / 20 * 0.9


def test_default_limits_do_not_throttle_a_burst_of_100(control_plane: ControlPlane) -> None:
    api = k8s.CoreV1Api(new_api_client(configuration=control_plane.configuration()))
    start = time.monotonic()
    for _ in range(100):
        api.list_namespace(limit=1)
    # The burst of 100 covers it: no limiter wait, only request time (vs ~18s at 5/10).
    assert time.monotonic() - start < 10


def test_requests_time_out_when_the_apiserver_hangs(control_plane: ControlPlane, apiserver_proxy: TcpProxy) -> None:
    api = k8s.CoreV1Api(new_api_client(ClientSettings(timeout=1.0, connect_timeout=1.0),
                                       configuration=control_plane.configuration(host=apiserver_proxy.url)))
    api.list_namespace(limit=1)
    apiserver_proxy.blackhole()
    start = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError) as caught:
        api.list_namespace(limit=1)
    assert time.monotonic() - start < 5
    assert apierrors.is_transient(caught.value)
