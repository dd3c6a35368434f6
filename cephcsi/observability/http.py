"""The HTTP endpoint: /healthz, /readyz and /metrics (Prometheus text format).

A stdlib ThreadingHTTPServer is enough for three read-only paths scraped every few seconds;
prometheus_client renders the metrics.
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from cephcsi.errors import ConfigError
from cephcsi.observability.health import HealthRegistry
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


def parse_address(endpoint: str) -> tuple[str, int]:
    """`:8080`, `0.0.0.0:8080` or `127.0.0.1:9000` → (host, port)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--http-endpoint {endpoint!r} must look like :8080 or 127.0.0.1:8080")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class HealthServer:
    def __init__(self, endpoint: str, health: HealthRegistry) -> None:
        self.health = health
        registry = health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    results = registry.run("liveness" if path == "/healthz" else "readiness")
                    failed = {name: why for name, why in results.items() if why}
                    body = json.dumps({"ok": not failed, "checks": {n: w or "ok" for n, w in results.items()}})
                    self._send(503 if failed else 200, body.encode(), "application/json")
                else:
                    self._send(404, b'{"error": "not found"}', "application/json")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - probes are too chatty to log
                pass

        host, port = parse_address(endpoint)
        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as error:
            raise ConfigError(f"cannot listen on --http-endpoint {endpoint}: {error.strerror}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("http endpoint serving", extra=fields(port=self.port, paths=["/healthz", "/readyz", "/metrics"]))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
