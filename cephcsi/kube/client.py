"""Build a kubernetes ApiClient whose every request passes one QPS/burst token bucket, with default
(connect, read) timeouts and no hidden urllib3 retries. Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

import cephcsi
from cephcsi.kube.errors import ClientConfigError
from cephcsi.kube.metrics import CLIENT_REQUESTS, CLIENT_THROTTLE
from cephcsi.kube.ratelimit import TokenBucket

log = logging.getLogger(__name__)

RequestTimeout = float | tuple[float, float] | urllib3.Timeout | None


@dataclass(frozen=True)
class ClientSettings:
    """How to reach the API server and how hard to use it."""

    kubeconfig: str | None = None
    """Path of a kubeconfig; None → the in-cluster service-account configuration."""
    context: str | None = None
    """kubeconfig context; None → its current-context."""
    qps: float = 50.0
    """Sustained requests per second (0 disables the limiter)."""
    burst: int = 100
    """Requests that may be sent at once after an idle period."""
    connect_timeout: float = 10.0
    """Seconds to open the TCP/TLS connection."""
    timeout: float = 30.0
    """Read timeout (seconds) for requests that do not pass their own."""
    pool_size: int = 32
    """Pooled connections kept to the API server (watches hold one each)."""
    user_agent: str = f"cephcsi/{cephcsi.__version__}"
    """User-Agent header, visible in apiserver audit logs."""


class ThrottledApiClient(k8s.ApiClient):
    """An ApiClient whose every request waits for the token bucket and has a timeout."""

    def __init__(self, configuration: k8s.Configuration, *, limiter: TokenBucket,
                 connect_timeout: float, read_timeout: float) -> None:
        super().__init__(configuration)
        self.limiter = limiter
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    def request(self, method: str, url: str, query_params: Any = None, headers: Any = None,
                post_params: Any = None, body: Any = None, _preload_content: bool = True,
                _request_timeout: RequestTimeout = None) -> Any:
        waited = self.limiter.take()
        CLIENT_THROTTLE.labels(method).observe(waited)
        if waited > 1.0:
            log.debug("client rate limiter delayed a request", extra={"fields": {"method": method, "waited": waited}})
        timeout = self._normalize_timeout(_request_timeout)
        try:
            response = super().request(
                method, url, query_params=query_params, headers=headers, post_params=post_params,
                body=body, _preload_content=_preload_content, _request_timeout=timeout,
            )
        except ApiException as exc:
            CLIENT_REQUESTS.labels(method, str(exc.status or "<error>")).inc()
            raise
        except Exception:
            CLIENT_REQUESTS.labels(method, "<error>").inc()
            raise
        CLIENT_REQUESTS.labels(method, str(getattr(response, "status", ""))).inc()
        return response

    def _normalize_timeout(self, timeout: RequestTimeout) -> tuple[float, float]:
        if timeout is None:
            return (self.connect_timeout, self.read_timeout)
        if isinstance(timeout, tuple):
            return (float(timeout[0]), float(timeout[1]))
        if isinstance(timeout, urllib3.Timeout):
            connect = timeout.connect_timeout
            read = timeout.read_timeout
            return (
                float(connect) if isinstance(connect, (int, float)) else self.connect_timeout,
                float(read) if isinstance(read, (int, float)) else self.read_timeout,
            )
        return (min(self.connect_timeout, float(timeout)), float(timeout))


def load_configuration(settings: ClientSettings) -> k8s.Configuration:
    """A client Configuration from the kubeconfig or the in-cluster service account."""
    cfg = k8s.Configuration()
    try:
        if settings.kubeconfig:
            k8s_config.load_kube_config(
                config_file=settings.kubeconfig, context=settings.context, client_configuration=cfg
            )
        else:
            # Keeps re-reading the projected token file, so rotated tokens are picked up.
            k8s_config.load_incluster_config(client_configuration=cfg)
    except (k8s_config.ConfigException, OSError, ValueError) as exc:
        where = settings.kubeconfig or "the in-cluster service account"
        raise ClientConfigError(f"cannot load the Kubernetes client configuration from {where}: {exc}") from exc
    return cfg


def _tune(cfg: k8s.Configuration, settings: ClientSettings) -> None:
    cfg.connection_pool_maxsize = settings.pool_size
    cfg.retries = urllib3.Retry(total=1, connect=1, read=0, status=0, other=0, redirect=0)


def new_api_client(settings: ClientSettings = ClientSettings(), *,
                   configuration: k8s.Configuration | None = None) -> ThrottledApiClient:
    """A ThrottledApiClient; `configuration` overrides loading from settings (tests use it)."""
    if configuration is not None:
        cfg = copy.deepcopy(configuration)
    else:
        cfg = load_configuration(settings)
    _tune(cfg, settings)
    client = ThrottledApiClient(
        cfg, limiter=TokenBucket(settings.qps, settings.burst),
        connect_timeout=settings.connect_timeout, read_timeout=settings.timeout,
    )
    client.user_agent = settings.user_agent
    return client
