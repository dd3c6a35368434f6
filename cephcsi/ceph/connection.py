"""Cached, shared librados connections, one per (cluster, monitors, user, key).

The bindings release the GIL in every blocking call, so one connection serves all threads as
well as one per thread would, without a monitor session per call (ceph-csi keeps a similar
pool). Every connection has op timeouts set, so no call can hang forever: with the cluster
down, calls fail in bounded time and a later call on the same connection succeeds once the
cluster is back. A connection that reports it was shut down or blocklisted is dropped, and the
next call reconnects. Keys live only in librados' in-memory config.
"""
from __future__ import annotations

import errno
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import rados

from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.errors import CONNECTION_LOST, ceph_call, error_number
from cephcsi.config.clusters import ClusterConfig
from cephcsi.errors import CephCSIError, NotFound, PermissionDenied, Unavailable
from cephcsi.observability.logging import fields
from cephcsi.settings import CephSettings

log = logging.getLogger(__name__)


def _seconds(value: float) -> str:
    return str(max(1, math.ceil(value)))


@dataclass(eq=False)
class Connection:
    cluster: ClusterConfig
    credentials: Credentials
    settings: CephSettings
    handle: rados.Rados | None = None
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    broken: bool = False
    connect_lock: threading.Lock = field(default_factory=threading.Lock)

    def connect(self) -> rados.Rados:
        # Per-connection lock: two threads needing the same cluster connect once; other
        # clusters are never blocked behind a slow monitor.
        with self.connect_lock:
            if self.handle is not None:
                return self.handle
            conf = {
                "mon_host": self.cluster.mon_host,
                "key": self.credentials.key,
                # Pacific takes whole seconds here and rejects "30.0".
                "rados_osd_op_timeout": _seconds(self.settings.osd_op_timeout),
                "rados_mon_op_timeout": _seconds(self.settings.mon_op_timeout),
                "client_mount_timeout": _seconds(self.settings.mount_timeout),
                "log_to_stderr": "false",
                "err_to_stderr": "false",
                "log_file": "",
            }
            handle = rados.Rados(rados_id=self.credentials.user_id, conf=conf)
            started = time.monotonic()
            try:
                handle.connect(timeout=int(max(1, self.settings.mount_timeout)))
            except rados.Error as error:
                handle.shutdown()
                raise self._connect_error(error) from error
            log.info(
                "connected to Ceph",
                extra=fields(cluster=self.cluster.cluster_id, user=self.credentials.user_id,
                             ms=round((time.monotonic() - started) * 1000, 1)),
            )
            self.handle = handle
            return handle

    def _connect_error(self, error: rados.Error) -> CephCSIError:
        number = error_number(error)
        where = f"Ceph cluster {self.cluster.cluster_id!r} (monitors {self.cluster.mon_host})"
        if number in (errno.EPERM, errno.EACCES, errno.EINVAL):
            return PermissionDenied(
                f"cephx authentication as {self.credentials.user_id!r} failed on {where}: check the secret's userID/userKey"
            )
        return Unavailable(
            f"cannot connect to {where} as {self.credentials.user_id!r} within "
            f"{self.settings.mount_timeout:g}s: {error.__class__.__name__}; check that the monitors are reachable"
        )

    def close(self) -> None:
        if self.handle is not None:
            try:
                self.handle.shutdown()
            finally:
                self.handle = None


class Session:
    """What a caller gets for one operation: the cluster handle and ioctx factory."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.cluster = connection.cluster
        self.user_id = connection.credentials.user_id

    @property
    def rados(self) -> rados.Rados:
        return self._connection.connect()

    @contextmanager
    def ioctx(self, pool: str, namespace: str | None = None) -> Iterator[rados.Ioctx]:
        """An I/O context on `pool` (and the cluster's rados namespace unless given)."""
        with ceph_call("open pool", f"pool {pool!r}"):
            try:
                io = self.rados.open_ioctx(pool)
            except rados.ObjectNotFound:
                raise NotFound(f"pool {pool!r} does not exist in cluster {self.cluster.cluster_id!r}") from None
        try:
            io.set_namespace(self.cluster.rados_namespace if namespace is None else namespace)
            yield io
        finally:
            io.close()

    def pool_name(self, pool_id: int) -> str | None:
        """The pool's name, or None if no pool has this id any more."""
        with ceph_call("look up pool", f"pool id {pool_id}"):
            try:
                return str(self.rados.pool_reverse_lookup(pool_id))
            except rados.ObjectNotFound:
                return None

    def mgr_command(self, command: str) -> tuple[int, str]:
        with ceph_call("mgr command"):
            ret, out, status = self.rados.mgr_command(command, b"", timeout=int(self._connection.settings.mon_op_timeout))
        return ret, status or (out.decode() if isinstance(out, bytes) else str(out))


class ConnectionCache:
    """Hands out `Session`s on shared connections; drops broken ones and closes idle ones."""

    def __init__(self, settings: CephSettings) -> None:
        self.settings = settings
        self._connections: dict[tuple[str, str, str], Connection] = {}
        self._lock = threading.Lock()

    @contextmanager
    def session(self, cluster: ClusterConfig, credentials: Credentials) -> Iterator[Session]:
        key = (cluster.cluster_id, cluster.mon_host, credentials.fingerprint)
        with self._lock:
            connection = self._connections.get(key)
            if connection is None or connection.broken:
                connection = Connection(cluster, credentials, self.settings)
                self._connections[key] = connection
            connection.users += 1
        try:
            yield Session(connection)
        except CephCSIError as error:
            cause = error.__cause__
            if cause is not None and error_number(cause) in CONNECTION_LOST:
                self._mark_broken(key, connection)
            raise
        finally:
            with self._lock:
                connection.users -= 1
                connection.last_used = time.monotonic()
                retire = connection.broken and connection.users == 0
            if retire:
                connection.close()
            self._close_idle()

    def _mark_broken(self, key: tuple[str, str, str], connection: Connection) -> None:
        log.warning("dropping a broken Ceph connection", extra=fields(cluster=connection.cluster.cluster_id))
        with self._lock:
            connection.broken = True
            if self._connections.get(key) is connection:
                del self._connections[key]

    def _close_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [
                (key, c) for key, c in self._connections.items()
                if c.users == 0 and now - c.last_used > self.settings.connection_idle_seconds
            ]
            for key, _ in idle:
                del self._connections[key]
        for _, connection in idle:
            connection.close()

    def close_all(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
        for connection in connections:
            connection.close()
