"""Leader election on a coordination.k8s.io/v1 Lease (client-go's protocol), with fencing: leader-only
loops are stopped before another replica can take the lease, `is_leader` stays true until they
have stopped, and a loss re-enters the election (`on_fencing_failure` exits if the loops do not stop
in time). Timings must satisfy lease_duration > renew_deadline > retry_period; give the lock an
ApiClient of its own. Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import enum
import logging
import os
import random
import socket
import sys
import threading
import uuid
from dataclasses import dataclass, field
from typing import Callable

from cephcsi.kube.backoff import jittered
from cephcsi.kube.clock import SYSTEM_CLOCK, Clock
from cephcsi.kube.leaselock import LeaseConflict, LeaseLock, LeaseRecord, lease_seconds
from cephcsi.kube.metrics import LEADER_STATUS

log = logging.getLogger(__name__)

_POLL = 0.05  # supervisor granularity (seconds)


def default_identity() -> str:
    """hostname + "_" + a random UUID: unique even for two processes in one pod."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def exit_process() -> None:
    """Default on_fencing_failure: exit immediately (no cleanup may run leader-only code)."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(1)


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Which lease and how fast to move."""

    lease_name: str
    """Lease object name (e.g. the driver name with "/" replaced)."""
    namespace: str
    """Namespace of the lease."""
    identity: str = field(default_factory=default_identity)
    """This candidate's holderIdentity."""
    lease_duration: float = 15.0
    """How long standbys wait after the last observed change (stored rounded up to seconds)."""
    renew_deadline: float = 10.0
    """The leader gives up (and stops its loops) when renewals fail for this long."""
    retry_period: float = 2.0
    """Interval between renewals (leader) and acquisition attempts (standby)."""
    jitter: float = 0.2
    """Standby polls wait retry_period stretched by up to this fraction."""
    request_timeout: float = 5.0
    """Timeout of one lease API call (also capped by the time left to the renew deadline)."""
    fence_deadline: float | None = None
    """Seconds after the last successful renewal began by which loops must be stopped;
    None → 0.9 * lease_duration."""
    release_on_stop: bool = True
    """Release the lease on graceful stop so a standby takes over at once."""
    health_tolerance: float = 5.0
    """check_health fails when a leader has not renewed for lease_duration + this."""

    def __post_init__(self) -> None:
        if not (self.lease_duration > self.renew_deadline > self.retry_period > 0):
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        if self.fence_deadline is not None and not (self.renew_deadline < self.fence_deadline <= self.lease_duration):
            raise ValueError("need renew_deadline < fence_deadline <= lease_duration")

    @property
    def effective_fence_deadline(self) -> float:
        """fence_deadline or its default."""
        if self.fence_deadline is not None:
            return self.fence_deadline
        return max(self.renew_deadline + _POLL, 0.9 * self.lease_duration)


@dataclass(frozen=True)
class LeaderCallbacks:
    """What to do when leadership changes."""

    on_started_leading: Callable[[threading.Event], None]
    """Runs in its own thread when we become leader. Start leader-only loops; either block until
    the event is set or return after starting threads that watch the event."""
    on_stopped_leading: Callable[[], None]
    """Called when leadership ends (lost or stopping), after the event is set. Return only when
    every leader-only loop has stopped."""
    on_new_leader: Callable[[str], None] | None = None
    """Called with the holder identity whenever a different holder is observed (also us)."""
    on_fencing_failure: Callable[[], None] = exit_process
    """Called when loops did not stop by the fence deadline; default exits the process."""


class Outcome(enum.Enum):
    """Result of one acquire/renew attempt."""

    LEADING = "leading"
    """We hold the lease now."""
    HELD_BY_OTHER = "held_by_other"
    """A valid lease held by someone else."""
    FAILED = "failed"
    """Error or lost race; try again later."""


class LeaderElector:
    """Runs the election; the protocol and fencing are in docs/design/kubernetes-machinery.md."""

    def __init__(self, lock: LeaseLock, config: LeaderElectionConfig, callbacks: LeaderCallbacks, *,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None) -> None:
        self.lock = lock
        self.config = config
        self.callbacks = callbacks
        self._clock = clock
        self._rng = rng or random.Random()
        self._state = threading.Lock()
        self._gen = 0  # bumped when a leadership term ends; stale renewals are then ignored
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._leader = False
        self._last_renew = 0.0  # monotonic start of the last successful write
        self._taken = False
        self._failed = False
        self._loops_failed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gauge = LEADER_STATUS.labels(config.lease_name)
        self._gauge.set(0)

    # ---- state -----------------------------------------------------------------------------------

    @property
    def identity(self) -> str:
        """Our holderIdentity."""
        return self.config.identity

    @property
    def is_leader(self) -> bool:
        """True from acquiring the lease until leader-only loops are confirmed stopped."""
        with self._state:
            return self._leader

    @property
    def leader_identity(self) -> str:
        """The holder in the last record we saw ("" if none/unknown)."""
        with self._state:
            return self._observed.holder_identity if self._observed else ""

    def renew_deadline_at(self) -> float:
        """Monotonic time at which leadership is declared lost without a further renewal."""
        with self._state:
            return self._last_renew + self.config.renew_deadline

    def check_health(self) -> str | None:
        """None when healthy; otherwise why not (for /healthz/leader-election)."""
        now = self._clock.monotonic()
        with self._state:
            if self._failed:
                return "leader-only loops did not stop after leadership was lost"
            if self._leader:
                silent = now - self._last_renew
                if silent > self.config.lease_duration + self.config.health_tolerance:
                    return f"leader, but the lease was not renewed for {silent:.1f}s"
        return None

    def healthy(self) -> bool:
        """check_health() is None."""
        return self.check_health() is None

    # ---- one attempt ---------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> Outcome:
        """One attempt to acquire or renew, under the current leadership term."""
        with self._state:
            gen = self._gen
        return self._attempt(gen)

    def _attempt(self, gen: int) -> Outcome:
        me = self.config.identity
        start = self._clock.monotonic()
        timeout = self._request_timeout(start)
        with self._state:
            cached = self._observed if self._leader and gen == self._gen else None
        if cached is not None and cached.holder_identity == me:
            # Fast path: renew from the record we wrote last; a conflict means someone touched
            # the lease, so fall back to reading it.
            try:
                written = self.lock.update(self._renewed(cached), timeout)
            except LeaseConflict:
                pass
            except Exception as exc:  # noqa: BLE001 - any failure just fails this attempt
                self._log_failure("renew", exc)
                return Outcome.FAILED
            else:
                return self._won(written, start, gen)
        try:
            current = self.lock.get(self._request_timeout(start))
        except Exception as exc:  # noqa: BLE001
            self._log_failure("read", exc)
            return Outcome.FAILED
        if current is None:
            record = LeaseRecord(me, lease_seconds(self.config.lease_duration), self._clock.wall(),
                                 self._clock.wall(), 0)
            try:
                return self._won(self.lock.create(record, self._request_timeout(start)), start, gen)
            except LeaseConflict:
                return Outcome.FAILED
            except Exception as exc:  # noqa: BLE001
                self._log_failure("create", exc)
                return Outcome.FAILED
        self._observe(current, gen)
        if current.holder_identity and current.holder_identity != me and not self._expired(current):
            return Outcome.HELD_BY_OTHER
        try:
            written = self.lock.update(self._renewed(current), self._request_timeout(start))
        except LeaseConflict:
            return Outcome.FAILED
        except Exception as exc:  # noqa: BLE001
            self._log_failure("update", exc)
            return Outcome.FAILED
        return self._won(written, start, gen)

    def _renewed(self, current: LeaseRecord) -> LeaseRecord:
        me = self.config.identity
        now = self._clock.wall()
        same_holder = current.holder_identity == me
        return current.with_changes(
            holder_identity=me,
            lease_duration_seconds=lease_seconds(self.config.lease_duration),
            renew_time=now,
            acquire_time=current.acquire_time if same_holder and current.acquire_time else now,
            lease_transitions=current.lease_transitions + (0 if same_holder else 1),
        )

    def _expired(self, record: LeaseRecord) -> bool:
        with self._state:
            observed_at = self._observed_at
        return self._clock.monotonic() >= observed_at + record.lease_duration_seconds

    def _observe(self, record: LeaseRecord, gen: int) -> None:
        """Remember a record read from the API; restart the expiry clock if it changed."""
        notify = None
        with self._state:
            if gen != self._gen:
                return
            previous = self._observed
            if previous is None or previous.resource_version != record.resource_version:
                self._observed = record
                self._observed_at = self._clock.monotonic()
                if record.holder_identity and (previous is None or previous.holder_identity != record.holder_identity):
                    notify = record.holder_identity
            if self._leader and record.holder_identity != self.config.identity:
                self._taken = True
        if notify is not None:
            self._notify_new_leader(notify)

    def _won(self, written: LeaseRecord, start: float, gen: int) -> Outcome:
        with self._state:
            if gen != self._gen:
                # This term already ended: the write does not extend it, but it is the newest
                # record (release needs its resourceVersion).
                if self._observed is None or self._observed.holder_identity == written.holder_identity:
                    self._observed = written
                return Outcome.FAILED
            previous = self._observed
            self._observed = written
            self._observed_at = self._clock.monotonic()
            self._last_renew = start
            first = not self._leader
            self._leader = True
        if first:
            self._gauge.set(1)
            log.info("acquired lease", extra={"fields": {"lease": self.lock.describe(), "identity": self.identity,
                                              "transitions": written.lease_transitions}})
        if previous is None or previous.holder_identity != written.holder_identity:
            self._notify_new_leader(written.holder_identity)
        return Outcome.LEADING

    def _request_timeout(self, start: float) -> float:
        with self._state:
            leader = self._leader
            deadline = self._last_renew + self.config.renew_deadline
        if not leader:
            return self.config.request_timeout
        return max(0.05, min(self.config.request_timeout, deadline - start))

    def _notify_new_leader(self, identity: str) -> None:
        if self.callbacks.on_new_leader is None:
            return
        try:
            self.callbacks.on_new_leader(identity)
        except Exception:  # noqa: BLE001
            log.exception("on_new_leader failed", extra={"fields": {"lease": self.lock.describe()}})

    def _log_failure(self, step: str, exc: BaseException) -> None:
        log.warning("lease %s failed", step, extra={"fields": {"lease": self.lock.describe(), "error": repr(exc)}})

    def next_poll_delay(self) -> float:
        """How long a standby waits before its next attempt: retry_period with jitter, but no
        longer than until the observed lease expires (so takeover is not delayed by a poll)."""
        delay = jittered(self.config.retry_period, self.config.jitter, self._rng)
        with self._state:
            record, observed_at = self._observed, self._observed_at
        if record is not None and record.holder_identity and record.holder_identity != self.identity:
            until_expiry = observed_at + record.lease_duration_seconds - self._clock.monotonic()
            if until_expiry < delay:
                delay = max(0.0, until_expiry) + 0.01
        return delay

    # ---- the loop -------------------------------------------------------------------------------

    def start(self) -> None:
        """Run the election in a daemon thread until stop()."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self.run, args=(self._stop,),
                                        name=f"leader-election-{self.config.lease_name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread started by start() (loops stop, the lease is released); True if the
        thread ended within timeout."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def run(self, stop: threading.Event) -> None:
        """Campaign, lead, and campaign again after losing, until `stop` is set."""
        try:
            while not stop.is_set() and not self._failed:
                if not self._acquire(stop):
                    return
                self._lead(stop)
        finally:
            self._gauge.set(0)

    def _acquire(self, stop: threading.Event) -> bool:
        log.info("waiting for lease", extra={"fields": {"lease": self.lock.describe(), "identity": self.identity}})
        while not stop.is_set():
            if self.try_acquire_or_renew() is Outcome.LEADING:
                return True
            stop.wait(self.next_poll_delay())
        return False

    def _lead(self, stop: threading.Event) -> None:
        with self._state:
            gen = self._gen
            self._taken = False
        self._loops_failed.clear()
        lead_stop = threading.Event()
        loops = threading.Thread(target=self._run_loops, args=(lead_stop,),
                                 name=f"leader-loops-{self.config.lease_name}", daemon=True)
        loops.start()
        renew_stop = threading.Event()
        renewer = threading.Thread(target=self._run_renewals, args=(gen, renew_stop),
                                   name=f"leader-renew-{self.config.lease_name}", daemon=True)
        renewer.start()
        reason = self._supervise(stop)
        renew_stop.set()
        with self._state:
            self._gen += 1  # from here on, late renewals of this term are ignored
            fence_by = self._last_renew + self.config.effective_fence_deadline
        # A stop we were asked for (SIGTERM, shutdown) is routine; a lost lease or failed renewal is not.
        level = logging.INFO if reason == "stopped" else logging.WARNING
        log.log(level, "leadership ending", extra={"fields": {"lease": self.lock.describe(), "identity": self.identity,
                                                   "reason": reason}})
        if not self._fence(lead_stop, loops, fence_by):
            return
        renewer.join(self.config.request_timeout)
        if reason in ("stopped", "loops_failed") and self.config.release_on_stop:
            self._release()
        if reason == "loops_failed" and not stop.is_set():
            stop.wait(self.config.retry_period)  # let another replica have a go

    def _supervise(self, stop: threading.Event) -> str:
        while True:
            if stop.is_set():
                return "stopped"
            if self._loops_failed.is_set():
                return "loops_failed"
            with self._state:
                taken = self._taken
                remaining = self._last_renew + self.config.renew_deadline - self._clock.monotonic()
            if taken:
                return "taken"
            if remaining <= 0:
                return "renew_deadline"
            stop.wait(min(_POLL, remaining))

    def _run_renewals(self, gen: int, renew_stop: threading.Event) -> None:
        while not renew_stop.wait(self.config.retry_period):
            outcome = self._attempt(gen)
            if outcome is Outcome.HELD_BY_OTHER:
                with self._state:
                    if gen == self._gen:
                        self._taken = True
                return

    def _run_loops(self, lead_stop: threading.Event) -> None:
        try:
            self.callbacks.on_started_leading(lead_stop)
        except Exception:  # noqa: BLE001 - a crashed loop gives the lease up
            log.exception("on_started_leading failed; giving up the lease", extra={"fields": {"lease": self.lock.describe()}})
            self._loops_failed.set()

    def _fence(self, lead_stop: threading.Event, loops: threading.Thread, fence_by: float) -> bool:
        """Stop leader-only work before fence_by (monotonic); True if it stopped in time."""
        lead_stop.set()
        stopper = threading.Thread(target=self._call_stopped, name=f"leader-stopping-{self.config.lease_name}",
                                   daemon=True)
        stopper.start()
        for thread in (stopper, loops):
            thread.join(max(0.0, fence_by - self._clock.monotonic()))
        if stopper.is_alive() or loops.is_alive():
            with self._state:
                self._failed = True
            log.critical("leader-only loops did not stop before the lease could expire; fencing failed",
                         extra={"fields": {"lease": self.lock.describe(), "identity": self.identity}})
            self.callbacks.on_fencing_failure()
            return False
        with self._state:
            self._leader = False
        self._gauge.set(0)
        log.info("leader-only loops stopped", extra={"fields": {"lease": self.lock.describe(), "identity": self.identity}})
        return True

    def _call_stopped(self) -> None:
        try:
            self.callbacks.on_stopped_leading()
        except Exception:  # noqa: BLE001 - the loops' threads are still joined by the caller
            log.exception("on_stopped_leading failed", extra={"fields": {"lease": self.lock.describe()}})

    def _release(self) -> None:
        with self._state:
            record = self._observed
        written = None
        for _attempt in range(2):
            if record is None or record.holder_identity != self.identity:
                return
            now = self._clock.wall()
            released = record.with_changes(holder_identity="", lease_duration_seconds=1,
                                           renew_time=now, acquire_time=now)
            try:
                written = self.lock.update(released, self.config.request_timeout)
                break
            except LeaseConflict:
                # Our own last renewal may have landed after we stopped tracking it: re-read.
                try:
                    record = self.lock.get(self.config.request_timeout)
                except Exception as exc:  # noqa: BLE001
                    self._log_failure("read before release", exc)
                    return
            except Exception as exc:  # noqa: BLE001 - a failed release only delays the standby
                log.warning("lease release failed; standbys wait for expiry",
                            extra={"fields": {"lease": self.lock.describe(), "error": repr(exc)}})
                return
        if written is None:
            return
        with self._state:
            self._observed = written
            self._observed_at = self._clock.monotonic()
        log.info("released lease", extra={"fields": {"lease": self.lock.describe(), "identity": self.identity}})
