"""The reclaim-space schedule: csi-addons' annotation values, cron fields, and when a run is due."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cephcsi.errors import InvalidArgument
from cephcsi.volumes import reclaim

pytestmark = pytest.mark.unit


def at(text: str) -> datetime:
    parsed = reclaim.parse_time(text)
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(("text", "after", "expected"), [
    ("@hourly", "2026-11-27T19:20:05Z", "2026-11-27T20:00:00Z"),
    ("@daily", "2026-11-27T19:20:00Z", "2026-11-28T00:00:00Z"),
    ("@weekly", "2026-11-27T19:20:00Z", "2026-11-29T00:00:00Z"),  # the 27th is a Friday
    ("@monthly", "2026-11-27T19:20:00Z", "2026-12-01T00:00:00Z"),
    ("@yearly", "2026-11-27T19:20:00Z", "2027-01-01T00:00:00Z"),
    ("@DAILY", "2026-11-28T00:00:00Z", "2026-11-29T00:00:00Z"),  # strictly after
    ("*/15 * * * *", "2026-11-27T19:20:00Z", "2026-11-27T19:30:00Z"),
    ("30 2 * * 1-5", "2026-11-27T19:20:00Z", "2026-11-30T02:30:00Z"),  # Friday evening → Monday
    ("0 0 * * 7", "2026-11-27T19:20:00Z", "2026-11-29T00:00:00Z"),  # 7 is Sunday too
    ("0 0 1,15 * *", "2026-11-02T00:00:00Z", "2026-11-15T00:00:00Z"),
    ("0 0 13 * 5", "2026-11-01T00:00:00Z", "2026-11-06T00:00:00Z"),  # either day field (a Friday)
    ("0 12 29 2 *", "2026-03-01T00:00:00Z", "2028-02-29T12:00:00Z"),
])
def test_the_next_time_a_schedule_names(text: str, after: str, expected: str) -> None:
    assert reclaim.parse_schedule(text).next_after(at(after)) == at(expected)


@pytest.mark.parametrize("text", [
    "", "daily", "@fortnightly", "* * * *", "60 * * * *", "* 24 * * *", "0 0 0 * *", "0 0 * 13 *",
    "0 0 * * 8", "*/0 * * * *", "a * * * *", "5-1 * * * *", "0 0 30 2 *",
])
def test_a_bad_schedule_is_refused_with_what_is_wrong(text: str) -> None:
    with pytest.raises(InvalidArgument, match="reclaim-space schedule"):
        reclaim.parse_schedule(text)


def test_the_claims_schedule_wins_over_its_classes() -> None:
    key = reclaim.SCHEDULE_ANNOTATION
    assert reclaim.schedule_of({key: "@daily"}, {key: "@weekly"}) == "@daily"
    assert reclaim.schedule_of({}, {key: " @weekly "}) == "@weekly"
    assert reclaim.schedule_of({"other": "x"}, {}) == ""


def test_due_after_creation_then_after_each_recorded_run() -> None:
    daily = reclaim.parse_schedule("@daily")
    created = at("2026-11-27T10:00:00Z")
    assert not reclaim.is_due(daily, None, created, at("2026-11-27T23:59:00Z"))
    assert reclaim.is_due(daily, None, created, at("2026-11-28T00:00:00Z"))
    last = at("2026-11-28T00:00:03Z")
    assert not reclaim.is_due(daily, last, created, at("2026-11-28T12:00:00Z"))
    assert reclaim.is_due(daily, last, created, at("2026-11-29T00:00:00Z"))
    # a leader that was down for days runs once, not once per missed day
    assert reclaim.next_run(daily, at("2026-12-05T00:00:01Z"), created) == at("2026-12-06T00:00:00Z")


def test_times_round_trip_as_kubernetes_writes_them() -> None:
    moment = at("2026-11-27T19:20:05Z")
    assert reclaim.format_time(moment) == "2026-11-27T19:20:05Z"
    assert reclaim.parse_time("") is None and reclaim.parse_time("yesterday") is None
    assert at("2026-11-27T20:20:05+01:00") == moment and moment.tzinfo == UTC
