"""The token bucket (``golang.org/x/time/rate.Limiter``) on its own: reserve, allow, scales.

Its three users have their own tests, against upstream's numbers: ``test_limiters.py``
(``BucketRateLimiter``), ``podset/test_podset_rate_limit.py`` (the blocking ``wait``) and
``test_events.py`` (the spam filter). Here only what sets ``reserve`` and ``allow`` apart, and
the ``per_second`` scale, written as scripts on a fake clock.
"""

from __future__ import annotations

import pytest

from tally.workqueue import clock as clocks
from tally.workqueue import tokenbucket

pytestmark = pytest.mark.unit


def test_reserve_borrows_and_allow_refuses_without_taking() -> None:
    clock = clocks.FakeClock()
    bucket = tokenbucket.TokenBucket(2, 1, clock=clock)
    assert bucket.allow() is True  # starts full: burst 1
    assert bucket.allow() is False  # empty, and a refusal takes nothing ...
    clock.step(0.5)
    assert bucket.allow() is True  # ... so one token's time later there is one
    assert 0.5 == bucket.reserve()  # borrowed: it exists in 1/qps
    assert 1.0 == bucket.reserve()  # and the next one after that
    clock.step(1.0)
    assert bucket.allow() is False  # 1 s repays the two borrowed tokens, no more
    clock.step(0.5)
    assert bucket.allow() is True


def test_refill_stops_at_burst() -> None:
    clock = clocks.FakeClock()
    bucket = tokenbucket.TokenBucket(10, 3, clock=clock)
    assert [0.0, 0.0, 0.0] == [bucket.reserve() for _ in range(3)]
    clock.step(100)
    assert [True, True, True, False] == [bucket.allow() for _ in range(4)]


def test_burst_below_one_allows_nothing() -> None:
    bucket = tokenbucket.TokenBucket(1, 0, clock=clocks.FakeClock())
    assert bucket.allow() is False


def test_times_on_a_finer_scale() -> None:
    """``per_second=1e9``: times in nanoseconds, as the event spam filter passes them."""
    s = 1_000_000_000
    start = 1_700_000_000 * s
    bucket = tokenbucket.TokenBucket(1, 1, per_second=1e9)
    assert bucket.allow(start) is True
    assert bucket.allow(start + s - 1000) is False  # 1 µs short of a token
    assert bucket.allow(start + s) is True
    # 1 ns short: the float deficit comes out just under 1 ns, and Go's wait is whole
    # nanoseconds, truncated, so there is no wait (the same float64 steps as Go's).
    assert bucket.allow(start + 2 * s - 1) is True
