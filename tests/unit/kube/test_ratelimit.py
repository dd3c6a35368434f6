"""Token bucket and reconnect backoff, driven by a fake clock."""
from __future__ import annotations

import random
import threading
import time

import pytest

from cephcsi.kube.backoff import Backoff, BackoffSettings, jittered
from cephcsi.kube.clock import FakeClock
from cephcsi.kube.ratelimit import TokenBucket

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def test_bucket_allows_burst_then_spaces_requests_at_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, 3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    # Each further reservation waits one more 1/rate slot.
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    clock.advance(0.2)
    assert bucket.reserve() == pytest.approx(0.1)


def test_bucket_refills_up_to_burst_only() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1.0, 2, clock=clock)
    assert bucket.try_take() and bucket.try_take()
    assert not bucket.try_take()
    clock.advance(100)
    assert bucket.try_take() and bucket.try_take()
    assert not bucket.try_take()


def test_unlimited_bucket_never_waits() -> None:
    bucket = TokenBucket(0, 0)
    assert all(bucket.reserve() == 0.0 for _ in range(1000))
    assert bucket.try_take()


def test_bucket_rejects_zero_burst_with_rate() -> None:
    with pytest.raises(ValueError):
        TokenBucket(5, 0)


def test_take_blocks_for_the_reserved_delay_and_honours_stop() -> None:
    bucket = TokenBucket(20.0, 1)
    bucket.take()
    start = time.monotonic()
    waited = bucket.take()
    assert waited == pytest.approx(0.05, abs=0.01)
    assert time.monotonic() - start >= 0.04
    slow = TokenBucket(0.01, 1)  # the next token is 100 s away
    slow.take()
    stop = threading.Event()
    stop.set()
    start = time.monotonic()
    assert slow.take(stop) > 50  # reserved, but the stop event cuts the sleep short
    assert time.monotonic() - start < 30


def test_backoff_grows_caps_and_jitters_within_bounds() -> None:
    clock = FakeClock()
    backoff = Backoff(BackoffSettings(initial=1, maximum=8, factor=2, jitter=0.2, reset_after=60),
                      clock=clock, rng=random.Random(1))
    delays = []
    for _ in range(7):
        delays.append(backoff.next_delay())
        clock.advance(1)
    bases = [1, 2, 4, 8, 8, 8, 8]
    for delay, base in zip(delays, bases):
        assert base <= delay < base * 1.2


def test_backoff_resets_after_a_quiet_period() -> None:
    clock = FakeClock()
    backoff = Backoff(BackoffSettings(initial=1, maximum=30, jitter=0, reset_after=60), clock=clock)
    assert [backoff.next_delay() for _ in range(4)] == [1, 2, 4, 8]
    clock.advance(61)
    assert backoff.next_delay() == 1
    backoff.reset()
    assert backoff.next_delay() == 1


def test_jittered_without_jitter_is_identity() -> None:
    assert jittered(2.0, 0) == 2.0
    values = [jittered(2.0, 0.5, random.Random(i)) for i in range(50)]
    assert all(2.0 <= v < 3.0 for v in values)
    assert len(set(values)) > 1
