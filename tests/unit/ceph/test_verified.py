"""cephcsi.ceph.verified: which cluster and client releases open the hand-written paths, the
flag that overrides it, and how long one reading of the cluster is trusted. On a real cluster:
tests/integration/controller/test_hand_write_gate.py."""
from __future__ import annotations

import logging
from typing import Any, cast

import pytest
import rados

from cephcsi.ceph import verified
from cephcsi.ceph.verified import FACTS_TTL_SECONDS, RETRY_SECONDS, HandWriteGate, Mode, decide

pytestmark = pytest.mark.unit

PACIFIC_CLIENT = (1, 16)
HANDLE = cast(rados.Rados, object())


@pytest.mark.parametrize("release, client, allowed", [
    ("pacific", (1, 16), True),
    ("reef", (1, 18), True),
    ("tentacle", (1, 20), True),
    ("tentacle", (1, 16), True),  # an older verified client on a verified cluster (issue 32's runs)
    ("squid", (1, 16), False),
    ("quincy", (1, 16), False),
    ("umbrella", (1, 16), False),
    ("pacific", (1, 19), False),
    ("pacific", (2, 16), False),
    (None, (1, 16), False),
])
def test_auto_needs_both_sides_verified(release: str | None, client: tuple[int, int], allowed: bool) -> None:
    decision = decide(Mode.AUTO, release, client)
    assert decision.allowed is allowed
    if not allowed:
        assert decision.reason  # said in the log line


def test_the_reason_names_what_is_not_verified() -> None:
    assert "'squid'" in decide(Mode.AUTO, "squid", PACIFIC_CLIENT).reason
    assert "librbd 1.19" in decide(Mode.AUTO, "pacific", (1, 19)).reason
    assert "could not be read" in decide(Mode.AUTO, None, PACIFIC_CLIENT).reason


def test_the_flag_overrides_the_list() -> None:
    assert decide(Mode.ALWAYS, "squid", (1, 19)).allowed
    assert decide(Mode.ALWAYS, None, (1, 19)).allowed
    assert not decide(Mode.NEVER, "pacific", PACIFIC_CLIENT).allowed


def test_every_verified_row_is_distinct() -> None:
    assert len({row.name for row in verified.VERIFIED}) == len(verified.VERIFIED)
    assert all(row.checked for row in verified.VERIFIED)


class Reader:
    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, handle: rados.Rados, timeout: float) -> str | None:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cluster_is_read_once_and_again_after_the_ttl(caplog: pytest.LogCaptureFixture) -> None:
    clock, reader = Clock(), Reader("pacific", "squid")
    gate = HandWriteGate(Mode.AUTO, clock=clock, reader=reader, client=lambda: PACIFIC_CLIENT)
    with caplog.at_level(logging.INFO, logger=verified.__name__):
        assert all(gate.allowed(HANDLE, 5) for _ in range(5))
        assert reader.calls == 1
        assert len(caplog.records) == 1 and "on" in caplog.records[0].getMessage()
        clock.now += FACTS_TTL_SECONDS - 1
        assert gate.allowed(HANDLE, 5) and reader.calls == 1
        clock.now += 2  # the cluster was upgraded meanwhile
        assert not gate.allowed(HANDLE, 5) and reader.calls == 2
        assert not gate.allowed(HANDLE, 5) and reader.calls == 2
    assert len(caplog.records) == 2 and "'squid'" in cast(Any, caplog.records[1]).fields["reason"]


def test_a_failed_reading_is_retried_sooner() -> None:
    clock, reader = Clock(), Reader(None, "pacific")
    gate = HandWriteGate(Mode.AUTO, clock=clock, reader=reader, client=lambda: PACIFIC_CLIENT)
    assert not gate.allowed(HANDLE, 5)
    clock.now += RETRY_SECONDS + 0.1
    assert gate.allowed(HANDLE, 5) and reader.calls == 2


@pytest.mark.parametrize("mode", [Mode.ALWAYS, Mode.NEVER])
def test_a_forced_mode_reads_nothing(mode: Mode) -> None:
    reader = Reader("pacific")
    gate = HandWriteGate(mode, reader=reader, client=lambda: (9, 9))
    assert gate.allowed(HANDLE, 5) is (mode is Mode.ALWAYS)
    assert reader.calls == 0


class FakeHandle:
    def __init__(self, ret: int, out: bytes, error: Exception | None = None) -> None:
        self.answer = (ret, out, "")
        self.error = error
        self.commands: list[str] = []

    def mon_command(self, command: str, inbuf: bytes, timeout: int = 0) -> tuple[int, bytes, str]:
        self.commands.append(command)
        if self.error is not None:
            raise self.error
        return self.answer


@pytest.mark.parametrize("ret, out, expected", [
    (0, b'{"epoch": 7, "require_osd_release": "reef", "pools": []}', "reef"),
    (0, b'{"epoch": 7}', None),
    (0, b'not json', None),
    (0, b'[]', None),
    (-13, b'', None),
])
def test_reading_the_release(ret: int, out: bytes, expected: str | None) -> None:
    handle = FakeHandle(ret, out)
    assert verified.read_cluster_release(cast(rados.Rados, handle), 5) == expected
    assert '"osd dump"' in handle.commands[0]


def test_a_failing_monitor_reads_as_unknown() -> None:
    handle = FakeHandle(0, b"", rados.TimedOut("timed out"))
    assert verified.read_cluster_release(cast(rados.Rados, handle), 5) is None


def test_one_caller_reads_while_the_others_go_on() -> None:
    """Callers arriving during a reading do not queue behind it (or send their own): before the
    first decision they get librbd, later the previous decision."""
    clock = Clock()
    seen: list[bool] = []
    gate: HandWriteGate

    def reader(handle: rados.Rados, timeout: float) -> str | None:
        assert timeout <= verified.READ_TIMEOUT_SECONDS
        seen.append(gate.allowed(HANDLE, 5))  # another call arriving meanwhile
        return "pacific"

    gate = HandWriteGate(Mode.AUTO, clock=clock, reader=reader, client=lambda: PACIFIC_CLIENT)
    assert gate.allowed(HANDLE, 30) and seen == [False]
    clock.now += FACTS_TTL_SECONDS + 1
    assert gate.allowed(HANDLE, 30) and seen == [False, True]
