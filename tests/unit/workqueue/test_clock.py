"""The clock's two readings: monotonic seconds (``now``) and wall nanoseconds (``time_ns``).

The timers (``call_at``, ``step``) are exercised by ``test_delaying.py`` and the queue tests;
here only that both readings exist on both clocks and that the fake's move together.
"""

from __future__ import annotations

import time

import pytest

from tally.workqueue import clock as clocks

pytestmark = pytest.mark.unit


def test_fake_wall_clock_moves_with_its_monotonic_one() -> None:
    clock = clocks.FakeClock(start=1_700_000_000.0)
    assert 1_700_000_000_000_000_000 == clock.time_ns()
    clock.step(2.5)
    assert 1_700_000_002.5 == clock.now()
    assert 1_700_000_002_500_000_000 == clock.time_ns()


def test_real_clock_reads_the_system_clocks() -> None:
    clock = clocks.RealClock()
    before_ns, before = time.time_ns(), time.monotonic()
    wall, monotonic = clock.time_ns(), clock.now()
    assert before_ns <= wall <= time.time_ns()
    assert before <= monotonic <= time.monotonic()
