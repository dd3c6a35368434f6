"""The node's Ceph client address, reported where the controller finds it to fence the node.

Written once per process, pool and address into the pool's `NODE_ADDRESSES` omap (node id →
address), before the image is mapped; a failure to report is logged and never fails the stage.
Why there and not per volume: docs/design/node.md, "The node's part in fencing".
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading

from cephcsi.ceph.credentials import key_file
from cephcsi.errors import CephCSIError
from cephcsi.node import exec as node_exec
from cephcsi.node.requests import StageRequest
from cephcsi.observability.logging import fields
from cephcsi.ceph.publish_keys import NODE_ADDRESSES

log = logging.getLogger(__name__)


def monitor_endpoints(monitors: str) -> list[tuple[str, int]]:
    """(host, port) of each monitor in a `-m` string (`10.0.0.1:6789,[v2:10.0.0.2:3300/0,v1:...]`)."""
    found: list[tuple[str, int]] = []
    for raw in monitors.replace("[v", ",v").replace("]", "").split(","):
        text = raw.strip().removeprefix("v1:").removeprefix("v2:").split("/")[0]
        host, port = text, ""
        if text.startswith("["):  # [v6]:port
            host, _, port = text[1:].partition("]")
            port = port.removeprefix(":")
        elif text.count(":") == 1:
            host, _, port = text.partition(":")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            continue  # a hostname: the kernel's route to it is not known without resolving it
        found.append((host, int(port) if port.isdigit() else 6789))
    return found


def source_address(monitors: str) -> str | None:
    """The local IP the kernel would use toward the first reachable monitor, or None."""
    for host, port in monitor_endpoints(monitors):
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((host, port))
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return None


class AddressReporter:
    def __init__(self, node_id: str, runner: node_exec.Runner, timeout: float) -> None:
        self.node_id = node_id
        self.runner = runner
        self.timeout = timeout
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str, str, str]] = set()

    def report(self, request: StageRequest) -> None:
        address = source_address(request.monitors)
        if address is None:
            log.warning("no route to any monitor found: this node's Ceph client address is not reported",
                        extra=fields(volume=request.volume_id, monitors=request.monitors))
            return
        done = (request.cluster_id, request.image.pool, request.image.namespace, address)
        with self._lock:
            if done in self._reported:
                return
        argv = ["rados", "--id", request.credentials.user_id, "-m", request.monitors, "-p", request.image.pool]
        if request.image.namespace:
            argv += ["-N", request.image.namespace]
        try:
            with key_file(request.credentials) as keyfile:
                self.runner([*argv, f"--keyfile={keyfile}", "setomapval", NODE_ADDRESSES, self.node_id, address],
                            what=f"report this node's client address in pool {request.image.pool}",
                            timeout=self.timeout, secrets=[request.credentials.key])
        except CephCSIError as error:
            log.warning("could not report this node's Ceph client address; fencing this node will rely on the "
                        "image's watchers", extra=fields(volume=request.volume_id, error=str(error)))
            return
        with self._lock:
            self._reported.add(done)
        log.info("node client address reported", extra=fields(pool=request.image.pool, address=address))
