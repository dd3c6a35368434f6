"""Where the driver may write RBD image objects by hand: the Ceph releases (cluster and client) on
which what it writes was compared byte for byte with librbd's (`VERIFIED`, `HandWriteGate`,
`--rbd-hand-writes`). Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import rados
import rbd

from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

FACTS_TTL_SECONDS = 600.0
"""How long one reading of the cluster's release is trusted (an upgrade is noticed this late)."""
RETRY_SECONDS = 30.0
"""After a failed reading (librbd meanwhile), how long until the next attempt."""
READ_TIMEOUT_SECONDS = 10.0
"""At most this long for the reading (on the create or delete that happens to make it)."""


class Mode(enum.Enum):
    AUTO = "auto"
    """Hand-written paths only on verified releases (cluster and client)."""
    ALWAYS = "always"
    """Hand-written paths wherever their own checks allow, on any release (tests, benchmarks)."""
    NEVER = "never"
    """librbd writes every image object."""


@dataclass(frozen=True)
class Release:
    name: str
    """As `require_osd_release` names it."""
    librbd: tuple[int, int]
    """The client library's (major, minor) ABI version, as `rbd.RBD().version()` reports it
    (librbd's `rbd_version`: 1.16 in Debian's 16.2.15, 1.18 in 18.2.7, 1.20 in 20.2.4, read from
    the function's code in each package)."""
    checked: str
    """Which versions the comparison ran with, and where."""


VERIFIED: tuple[Release, ...] = (
    Release("pacific", (1, 16), "16.2.15 cluster and client: the test suite's default cluster"),
    Release("reef", (1, 18), "18.2.7 (Debian trixie) cluster and client: the test suite's Reef cluster"),
    Release("tentacle", (1, 20), "20.2.4 (Debian sid) cluster with the 16.2.15, 18.2.7 and 20.2.4 clients "
                                  "(issue 32) and the test suite's Tentacle cluster"),
)


def cluster_verified(release: str) -> bool:
    return any(row.name == release for row in VERIFIED)


def client_verified(librbd: tuple[int, int]) -> bool:
    return any(row.librbd == librbd for row in VERIFIED)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


def decide(mode: Mode, cluster_release: str | None, client_librbd: tuple[int, int]) -> Decision:
    """Pure: whether the hand-written paths may run, and why (for the log line)."""
    client = f"librbd {client_librbd[0]}.{client_librbd[1]}"
    if mode is Mode.NEVER:
        return Decision(False, "--rbd-hand-writes=never")
    if mode is Mode.ALWAYS:
        return Decision(True, f"--rbd-hand-writes=always (cluster {cluster_release or 'unknown'}, {client})")
    if cluster_release is None:
        return Decision(False, "the cluster's require_osd_release could not be read")
    if not cluster_verified(cluster_release):
        return Decision(False, f"cluster release {cluster_release!r} is not among the verified ones "
                               f"({', '.join(row.name for row in VERIFIED)})")
    if not client_verified(client_librbd):
        return Decision(False, f"client {client} is not among the verified ones "
                               f"({', '.join(f'{r.librbd[0]}.{r.librbd[1]}' for r in VERIFIED)})")
    return Decision(True, f"cluster {cluster_release} and client {client} are verified")


def client_librbd() -> tuple[int, int]:
    major, minor, _ = rbd.RBD().version()
    return int(major), int(minor)


def read_cluster_release(handle: rados.Rados, timeout: float) -> str | None:
    """The OSD map's `require_osd_release` (one monitor command), or None when it cannot be
    read: the gate then stays closed, and librbd does the work."""
    command = json.dumps({"prefix": "osd dump", "format": "json"})
    try:
        ret, out, _ = handle.mon_command(command, b"", timeout=int(max(1, timeout)))
    except rados.Error as error:
        log.warning("cannot read the cluster's release", extra=fields(error=error.__class__.__name__))
        return None
    if ret != 0:
        log.warning("cannot read the cluster's release", extra=fields(ret=ret))
        return None
    try:
        release = json.loads(out).get("require_osd_release")
    except (ValueError, AttributeError):
        return None
    return str(release) if isinstance(release, str) and release else None


class HandWriteGate:
    """Per connection: whether this cluster and client may take the hand-written paths."""

    def __init__(self, mode: Mode = Mode.AUTO, clock: Callable[[], float] = time.monotonic,
                 reader: Callable[[rados.Rados, float], str | None] = read_cluster_release,
                 client: Callable[[], tuple[int, int]] = client_librbd) -> None:
        self.mode = mode
        self._clock = clock
        self._reader = reader
        self._client = client
        self._decision: Decision | None = None
        self._expires = 0.0
        """When the cached decision is read again (monotonic)."""
        self._logged: str | None = None
        self._reading = False
        self._lock = threading.Lock()  # guards the cached decision; held for no Ceph call

    def allowed(self, handle: rados.Rados, timeout: float) -> bool:
        """The cached decision; read again when it expired. One caller reads at a time: the
        others meanwhile go on with the previous decision, or librbd before the first."""
        now = self._clock()
        with self._lock:
            decision = self._decision
            if decision is not None and (self.mode is not Mode.AUTO or now < self._expires):
                return decision.allowed
            if self._reading:
                return decision.allowed if decision is not None else False
            self._reading = True
        try:
            release = self._reader(handle, min(timeout, READ_TIMEOUT_SECONDS)) if self.mode is Mode.AUTO else None
            decision = decide(self.mode, release, self._client())
        finally:
            with self._lock:
                self._reading = False
        with self._lock:
            self._decision = decision
            self._expires = now + (FACTS_TTL_SECONDS if release is not None else RETRY_SECONDS)
            changed = self._logged != decision.reason
            self._logged = decision.reason
        if changed:
            log.info("hand-written RBD paths " + ("on" if decision.allowed else "off: librbd writes every image"),
                     extra=fields(reason=decision.reason))
        return decision.allowed
