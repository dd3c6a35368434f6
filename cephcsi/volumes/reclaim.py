"""Reclaiming space: when a volume's space is due to be given back (csi-addons' schedule annotation,
cron in UTC, the last run recorded on the claim), and the controller's half of doing it
(sparsify of the volume's image). Design: docs/design/controller.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter

from cephcsi.ceph import image_metadata, sparsify
from cephcsi.ceph.credentials import Credentials
from cephcsi.encryption import volume_keys
from cephcsi.errors import InvalidArgument
from cephcsi.observability.logging import fields
from cephcsi.volumes.journal import Record
from cephcsi.volumes.manager import VolumeManager

log = logging.getLogger(__name__)

SCHEDULE_ANNOTATION = "reclaimspace.csiaddons.openshift.io/schedule"
LAST_RUN_ANNOTATION = "reclaimspace.cephcsi.ceph.io/last-run"
"""RFC 3339 UTC time of the last controller run on the claim (as a ReclaimSpaceCronJob's
status.lastScheduleTime would say)."""
RESULT_ANNOTATION = "reclaimspace.cephcsi.ceph.io/last-result"
"""What that run did: `reclaimed <bytes>`, `skipped: in use`, `skipped: encrypted`, or the error."""

SPARSIFIED_BYTES = Counter(
    "cephcsi_sparsify_reclaimed_bytes_total",
    "Bytes the controller's sparsify returned to the pool (rbd du's USED before minus after).",
)
SPARSIFY_RUNS = Counter("cephcsi_sparsify_runs_total", "Controller sparsify runs, by outcome.", ["outcome"])

_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_NAMES = ("minute", "hour", "day of month", "month", "day of week")
_HORIZON_DAYS = 366 * 5
"""A schedule that names no time within this many days (e.g. 30 February) is refused."""


@dataclass(frozen=True)
class Schedule:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 = Sunday … 6 = Saturday (7 folded onto 0)."""
    days_restricted: bool
    weekdays_restricted: bool

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def next_after(self, moment: datetime) -> datetime:
        """The first time strictly after `moment` (to the minute) the schedule names."""
        start = (moment.astimezone(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
        day = start.replace(hour=0, minute=0)
        for _ in range(_HORIZON_DAYS):
            if self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        candidate = day.replace(hour=hour, minute=minute)
                        if candidate >= start:
                            return candidate
            day += timedelta(days=1)
        raise InvalidArgument(f"reclaim-space schedule {self.text!r} names no time in the next five years")


def parse_schedule(text: str) -> Schedule:
    """A Schedule from the annotation's value (InvalidArgument with what is wrong)."""
    spec = _MACROS.get(text.strip().lower(), text.strip())
    parts = spec.split()
    if len(parts) != 5:
        raise InvalidArgument(
            f"reclaim-space schedule {text!r} is neither @hourly/@daily/@weekly/@monthly/@yearly nor a cron expression "
            "of five fields (minute hour day-of-month month day-of-week)")
    values = [_field(part, low, high, name, text) for part, (low, high), name in zip(parts, _RANGES, _NAMES)]
    weekdays = frozenset(day % 7 for day in values[4])
    schedule = Schedule(text, values[0], values[1], values[2], values[3], weekdays,
                        days_restricted=parts[2] != "*", weekdays_restricted=parts[4] != "*")
    schedule.next_after(datetime(2000, 1, 1, tzinfo=UTC))  # refuses a schedule that never fires
    return schedule


def _field(part: str, low: int, high: int, name: str, text: str) -> frozenset[int]:
    found: set[int] = set()
    for item in part.split(","):
        body, _, step_text = item.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if body == "*":
                first, last = low, high
            elif "-" in body:
                first_text, last_text = body.split("-", 1)
                first, last = int(first_text), int(last_text)
            else:
                first = int(body)
                last = high if step_text else first
        except ValueError:
            raise InvalidArgument(f"reclaim-space schedule {text!r}: {item!r} is not a valid {name} field") from None
        if step < 1 or not low <= first <= last <= high:
            raise InvalidArgument(
                f"reclaim-space schedule {text!r}: {item!r} is outside {low}-{high} for the {name}")
        found.update(range(first, last + 1, step))
    return frozenset(found)


def schedule_of(claim_annotations: dict[str, str], class_annotations: dict[str, str]) -> str:
    """The schedule that applies: the claim's own, else its StorageClass's ('' for none)."""
    return (claim_annotations.get(SCHEDULE_ANNOTATION) or class_annotations.get(SCHEDULE_ANNOTATION) or "").strip()


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time as Kubernetes writes it; None for an empty or unreadable one."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def next_run(schedule: Schedule, last_run: datetime | None, created: datetime) -> datetime:
    """When the next run is due: the schedule's first time after the last run, or after the
    claim's creation before any run."""
    return schedule.next_after(last_run or created)


def is_due(schedule: Schedule, last_run: datetime | None, created: datetime, now: datetime) -> bool:
    return next_run(schedule, last_run, created) <= now


# ---- the controller's half -----------------------------------------------------------------------

def encrypted(record: Record, metadata: dict[str, str]) -> bool:
    """Whether the volume is encrypted: its journal record names a KMS, or its image carries an
    encryption state (ceph-csi's volumes, and ours, have both; either is enough)."""
    values = {key: record.get(key) for key in (volume_keys.RECORD_KMS_KEY, volume_keys.RECORD_TYPE_KEY)}
    return volume_keys.spec_of_record(values) is not None or bool(volume_keys.state_of(metadata))


def sparsify_volume(volumes: VolumeManager, volume_id: str, credentials: Credentials) -> sparsify.Sparsified:
    """Sparsify the image of volume `volume_id` unless it is in use (ceph-csi's
    ControllerReclaimSpace) or encrypted. Holds the volume's in-process lock, so this
    controller's own delete, expand or snapshot of the volume does not run meanwhile (busy →
    ABORTED, retried).

    An encrypted volume is never sparsified: what it stores is ciphertext, which is not zeros
    even where the filesystem inside wrote zeros or freed blocks, so the sparsify would read the
    whole image to find nothing (the node does not trim it either: its dm-crypt mapping passes no
    discards)."""
    with volumes.held(volume_id, credentials) as (io, record):
        if encrypted(record, image_metadata.read(io, record.image_name)):
            done = sparsify.Sparsified(record.image_name, in_use=False, encrypted=True)
        else:
            done = sparsify.sparsify(io, record.image_name)
    outcome = "skipped-encrypted" if done.encrypted else "skipped-in-use" if done.in_use else "sparsified"
    SPARSIFY_RUNS.labels(outcome).inc()
    SPARSIFIED_BYTES.inc(done.reclaimed)
    if done.encrypted:
        log.info("volume encrypted, sparsify skipped (its ciphertext holds no zeros)",
                 extra=fields(volume_id=volume_id))
    elif done.in_use:
        log.info("volume in use, sparsify skipped (its node trims it)", extra=fields(volume_id=volume_id))
    else:
        log.info("volume sparsified", extra=fields(volume_id=volume_id, image=done.image, reclaimed=done.reclaimed))
    return done
