"""Cached, shared librados connections, one per (cluster, monitors, user, key), with op timeouts so
no call hangs for ever; connects are single-flight and a failure is remembered for a few seconds;
a shut-down or blocklisted connection is dropped and the next call reconnects. Keys live only in
librados' in-memory config. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import errno
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import rados
# Imported by name too: inside Session, `rados` is the property. Re-exported: cephcsi.volumes
# types the handles a Session opens with it and imports no rados itself.
from rados import Ioctx as Ioctx

from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph import cephx_keys, pool_defaults, pool_validation, verified
from cephcsi.ceph.errors import CONNECTION_LOST, ceph_call, error_number
from cephcsi.config.clusters import ClusterConfig
from cephcsi.errors import CephCSIError, Internal, NotFound, PermissionDenied, Unavailable
from cephcsi.observability.logging import fields
from cephcsi.settings import CephSettings

log = logging.getLogger(__name__)


def _seconds(value: float) -> str:
    return str(max(1, math.ceil(value)))


# librados ends a connect at client_mount_timeout (whole seconds, rounded up); its set-up
# before and after the monitor hunt takes milliseconds. Callers waiting for another thread's
# attempt give it this much extra before they give up on it.
CONNECT_GRACE = 1.0

Clock = Callable[[], float]


def open_rados(cluster: ClusterConfig, credentials: Credentials, settings: CephSettings) -> rados.Rados:
    """A connected librados handle with every op timeout set; raises rados.Error, or
    FailedPrecondition for a key this librados cannot read (checked before it sees the key:
    librados would print the key on stderr, see cephcsi.ceph.cephx_keys)."""
    cephx_keys.check_usable(credentials.key_info, cephx_keys.library_client())
    # Rados(conf=...) sets these one by one in this order: the log settings first and the key
    # last, so the key is never in the config before the log is told to be quiet. (Not enough
    # alone: Pacific still prints an undecodable key on stderr during connect's monitor
    # bootstrap, whatever these say; hence the check above.)
    conf = {
        "log_to_stderr": "false",
        "err_to_stderr": "false",
        "log_file": "",
        "mon_host": cluster.mon_host,
        # Pacific takes whole seconds here and rejects "30.0".
        "rados_osd_op_timeout": _seconds(settings.osd_op_timeout),
        "rados_mon_op_timeout": _seconds(settings.mon_op_timeout),
        "client_mount_timeout": _seconds(settings.mount_timeout),
        # Snapshots and clones (cephcsi.ceph.layering): clone v2 needs no protected snapshot, and
        # a deleted image that clones still read through waits in the trash until they are gone.
        "rbd_default_clone_format": "2",
        "rbd_move_parent_to_trash_on_remove": "true",
        # Read once per pool by cephcsi.ceph.pool_validation, not by every create.
        pool_validation.OPTION: "false",
        # In memory only: a `keyfile` would put it on disk, and librados prints either the same way.
        "key": credentials.key,
    }
    handle = rados.Rados(rados_id=credentials.user_id, conf=conf)
    try:
        handle.connect(timeout=int(max(1, settings.mount_timeout)))
    except rados.Error:
        handle.shutdown()
        raise
    return handle


def _instance_id(handle: rados.Rados) -> int | None:
    try:
        return int(handle.get_instance_id())
    except rados.Error:
        return None  # only for the log line


@dataclass(eq=False)
class _Attempt:
    """One connect in flight. Callers arriving meanwhile wait for its outcome instead of
    queueing their own attempts behind it (N callers must not wait N mount timeouts)."""

    started: float
    done: threading.Event = field(default_factory=threading.Event)
    error: CephCSIError | None = None


@dataclass(eq=False)
class _Failure:
    """A failed connect, answered again to every caller until `until` (monotonic)."""

    error: CephCSIError
    at: float
    until: float


def _fresh(error: CephCSIError, message: str) -> CephCSIError:
    """A new exception of the same class per caller: one instance raised in many threads at
    once would share (and garble) its traceback."""
    copy = type(error)(message)
    copy.__cause__ = error.__cause__
    return copy


@dataclass(eq=False)
class Connection:
    """One librados handle, connected on first use by a single thread at a time.

    A failed connect is remembered for `settings.failure_memory_seconds`: with the monitors
    down, every caller fails at once instead of each paying a full mount timeout, and the
    monitors see one attempt per interval instead of one per call. After that the next
    caller tries again, so a cluster that is back is used without a restart.
    """

    cluster: ClusterConfig
    credentials: Credentials
    settings: CephSettings
    opener: Callable[[ClusterConfig, Credentials, CephSettings], rados.Rados] = open_rados
    clock: Clock = time.monotonic
    handle: rados.Rados | None = None
    users: int = 0
    last_used: float = 0.0
    broken: bool = False
    kept: bool = False
    """A caller that keeps connections (the default) has used it: a one-off user does not close it."""
    # Guards handle/_attempt/_failure only and is never held while librados connects, so a
    # waiter can always give up in time; other clusters have their own Connection and lock.
    _state: threading.Lock = field(default_factory=threading.Lock)
    _attempt: _Attempt | None = None
    _failure: _Failure | None = None
    pools: pool_validation.PoolValidation = field(default_factory=pool_validation.PoolValidation)
    defaults: pool_defaults.PoolDefaults = field(default_factory=pool_defaults.PoolDefaults)
    gate: verified.HandWriteGate = field(default_factory=verified.HandWriteGate)

    def __post_init__(self) -> None:
        self.last_used = self.clock()

    @property
    def _where(self) -> str:
        return f"Ceph cluster {self.cluster.cluster_id!r} (monitors {self.cluster.mon_host})"

    @property
    def _wait_limit(self) -> float:
        return math.ceil(max(1.0, self.settings.mount_timeout)) + CONNECT_GRACE

    def connect(self) -> rados.Rados:
        """The handle, connecting first if needed; raises Unavailable/PermissionDenied within
        about one client_mount_timeout however many callers are waiting."""
        with self._state:
            if self.handle is not None:
                return self.handle
            remembered = self._remembered()
            if remembered is not None:
                raise remembered
            attempt, mine = self._attempt, False
            if attempt is None:
                attempt, mine = _Attempt(started=self.clock()), True
                self._attempt = attempt
        if mine:
            return self._run(attempt)
        return self._join(attempt)

    def remembers_failure(self) -> bool:
        """No handle, and a failed connect still remembered: dropping it would forget that."""
        with self._state:
            return self.handle is None and self._failure is not None and self.clock() < self._failure.until

    def _remembered(self) -> CephCSIError | None:
        failure = self._failure
        if failure is None:
            return None
        now = self.clock()
        if now >= failure.until:
            self._failure = None
            return None
        return _fresh(failure.error, (
            f"{failure.error.message} (last connect attempt failed {now - failure.at:.1f}s ago; "
            f"the next one is made in {failure.until - now:.1f}s)"
        ))

    def _run(self, attempt: _Attempt) -> rados.Rados:
        handle: rados.Rados | None = None
        try:
            handle = self.opener(self.cluster, self.credentials, self.settings)
        except rados.Error as error:
            attempt.error = self._connect_error(error)
            attempt.error.__cause__ = error
        except CephCSIError as error:  # the opener's own verdict (a key this client cannot read)
            attempt.error = error
        except Exception as error:  # noqa: BLE001 - becomes the outcome every waiter gets
            attempt.error = Internal(f"connecting to {self._where} failed unexpectedly: {error!r}; see the driver log")
            attempt.error.__cause__ = error
        finally:
            self._settle(attempt, handle)
        if attempt.error is not None:
            raise _fresh(attempt.error, attempt.error.message)
        assert handle is not None
        return handle

    def _settle(self, attempt: _Attempt, handle: rados.Rados | None) -> None:
        now = self.clock()
        with self._state:
            self._attempt = None
            if handle is not None:
                self.handle, self._failure = handle, None
            elif attempt.error is not None:
                self._failure = _Failure(attempt.error, now, now + self.settings.failure_memory_seconds)
        attempt.done.set()
        extra = fields(cluster=self.cluster.cluster_id, user=self.credentials.user_id,
                       ms=round((now - attempt.started) * 1000, 1))
        if handle is not None:
            # The client's global id is how Ceph names it in watcher lists and blocklists
            # ("client.<id>"): with it an operator can tell which driver process holds an image.
            log.info("connected to Ceph", extra={**extra, **fields(client_id=_instance_id(handle))})
        else:
            log.warning("cannot connect to Ceph", extra={**extra, **fields(
                error=str(attempt.error), retry_after=self.settings.failure_memory_seconds)})

    def _join(self, attempt: _Attempt) -> rados.Rados:
        remaining = attempt.started + self._wait_limit - self.clock()
        if not attempt.done.wait(max(0.0, remaining)):
            raise Unavailable(
                f"still connecting to {self._where} as {self.credentials.user_id!r} after "
                f"{self.clock() - attempt.started:.0f}s (started by another call); check that the monitors "
                "are reachable, then retry"
            )
        if attempt.error is not None:
            raise _fresh(attempt.error, attempt.error.message)
        with self._state:
            handle = self.handle
        if handle is None:  # closed between the connect and now (idle clean-up or shutdown)
            return self.connect()
        return handle

    def _connect_error(self, error: rados.Error) -> CephCSIError:
        number = error_number(error)
        # The key's cipher decides the advice: a Tentacle cluster refuses a valid legacy aes key
        # unless it allows that cipher, and "check the userKey" would send the operator to the
        # wrong place (cephx_keys.refusal_hint). Measured against Tentacle 20.2.4 with a Pacific
        # client: such a refusal, like a wrong key, reaches librados as a timeout, not EPERM.
        hint = cephx_keys.refusal_hint(self.credentials.key_info, cephx_keys.library_client())
        if number in (errno.EPERM, errno.EACCES, errno.EINVAL):
            return PermissionDenied(
                f"cephx authentication as {self.credentials.user_id!r} failed on {self._where}. {hint}"
            )
        return Unavailable(
            f"cannot connect to {self._where} as {self.credentials.user_id!r} within "
            f"{self.settings.mount_timeout:g}s: {error.__class__.__name__}. Either the monitors are unreachable "
            f"(check them), or they do not accept this cephx key, which also ends this way: {hint}"
        )

    def close(self) -> None:
        with self._state:
            handle, self.handle = self.handle, None
        if handle is not None:
            handle.shutdown()


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
    def ioctx(self, pool: str, namespace: str | None = None) -> Iterator[Ioctx]:
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

    @contextmanager
    def creating_in(self, io: Ioctx, data_pool: str | None) -> Iterator[None]:
        """Around a create or clone into `io`: see cephcsi.ceph.pool_validation."""
        with self._connection.pools.creating(self.rados, io, data_pool):
            yield

    def hand_writes(self) -> bool:
        """Whether the hand-written image paths (cephcsi.ceph.image_create, trash_move) may
        run on this cluster with this client: cephcsi.ceph.verified."""
        return self._connection.gate.allowed(self.rados, self._connection.settings.mon_op_timeout)

    def plain_order(self, io: Ioctx, data_pool: str | None) -> int | None:
        """The order of a new image in `io` when its layout is plain, its pool validated and
        hand writes verified here (what cephcsi.ceph.image_create can write), else None."""
        if data_pool or io.get_namespace() or not self.hand_writes():
            return None
        handle = self.rados
        if not self._connection.pools.validated(handle, io):
            return None
        return self._connection.defaults.plain_order(handle, io)

    def pool_name(self, pool_id: int) -> str | None:
        """The pool's name, or None if no pool has this id any more."""
        with ceph_call("look up pool", f"pool id {pool_id}"):
            try:
                # The binding answers None for an unknown id (str() of it made "None" a pool name).
                return self.rados.pool_reverse_lookup(pool_id)
            except rados.ObjectNotFound:
                return None

    def mgr_command(self, command: str) -> tuple[int, str]:
        with ceph_call("mgr command"):
            ret, out, status = self.rados.mgr_command(command, b"", timeout=int(self._connection.settings.mon_op_timeout))
        return ret, status or out.decode()


class ConnectionCache:
    """Hands out `Session`s on shared connections; drops broken ones and closes idle ones."""

    def __init__(self, settings: CephSettings,
                 opener: Callable[[ClusterConfig, Credentials, CephSettings], rados.Rados] = open_rados,
                 clock: Clock = time.monotonic, hand_writes: verified.Mode = verified.Mode.AUTO) -> None:
        self.settings = settings
        self._hand_writes = hand_writes
        self._opener = opener
        self._clock = clock
        self._connections: dict[tuple[str, str, str], Connection] = {}
        self._lock = threading.Lock()

    @contextmanager
    def session(self, cluster: ClusterConfig, credentials: Credentials, keep: bool = True) -> Iterator[Session]:
        """`keep=False` is for a rare one-off call (a read once per leader term): a connection it
        had to open is closed when its last user ends unless a keeping caller used it meanwhile,
        so an idle process does not keep a librados client (a dozen threads) for the one-off."""
        key = (cluster.cluster_id, cluster.mon_host, credentials.fingerprint)
        with self._lock:
            connection = self._connections.get(key)
            if connection is None or connection.broken:
                connection = Connection(cluster, credentials, self.settings, self._opener, self._clock,
                                        gate=verified.HandWriteGate(self._hand_writes))
                self._connections[key] = connection
            connection.users += 1
            connection.kept |= keep
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
                connection.last_used = self._clock()
                # A one-off's failed connect stays, holding no client, so that the next one-off
                # gets the remembered failure instead of a new attempt (idle clean-up drops it).
                retire = connection.users == 0 and (
                    connection.broken or not (connection.kept or connection.remembers_failure()))
                if retire and self._connections.get(key) is connection:
                    del self._connections[key]
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
        now = self._clock()
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
