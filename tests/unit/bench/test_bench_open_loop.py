"""bench/_open_loop.py: Poisson send times, and latency measured from each request's scheduled
send time (no coordinated omission), in virtual time."""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _open_loop import open_loop, poisson_offsets, split  # noqa: E402 (bench/ put on sys.path)

pytestmark = pytest.mark.unit


class VirtualTime:
    """A clock that moves only when the loop sleeps (by exactly the delay, plus ``lag`` once
    ``lag_after`` sleeps have passed: a sending loop that fell behind) or when a test moves it."""

    def __init__(self, lag: float = 0.0, lag_after: int = -1) -> None:
        self.now = 1000.0
        self.sleeps = 0
        self.lag = lag
        self.lag_after = lag_after

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        # As a real sleep: the tasks that are ready run first, then the time passes.
        await asyncio.sleep(0)
        self.now += delay + (self.lag if self.sleeps == self.lag_after else 0.0)
        self.sleeps += 1


def test_poisson_offsets_increase_with_mean_gap_one_over_rate() -> None:
    offsets = poisson_offsets(100.0, 20_000, random.Random(7))

    assert 20_000 == len(offsets)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert all(gap > 0 for gap in gaps)
    assert 0.01 == pytest.approx(statistics.fmean(gaps), rel=0.03)
    # Exponential gaps: the standard deviation equals the mean (a fixed-rate schedule has none).
    assert 0.01 == pytest.approx(statistics.pstdev(gaps), rel=0.05)
    assert offsets == poisson_offsets(100.0, 20_000, random.Random(7))


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_poisson_offsets_refuse_a_rate_that_is_not_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        poisson_offsets(rate, 10, random.Random(1))


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [
        pytest.param(1000, 4, [250, 250, 250, 250], id="even"),
        pytest.param(10, 4, [3, 3, 2, 2], id="remainder first"),
        pytest.param(2, 3, [1, 1, 0], id="fewer than parts"),
    ],
)
def test_split(total: int, parts: int, expected: list[int]) -> None:
    assert expected == split(total, parts)


async def test_a_stall_counts_for_every_request_scheduled_during_it() -> None:
    # The server answers nothing until the last request arrives at 0.3 s, then everything at
    # 1.0 s. A closed loop of one client would have sent request 1 only at 1.0 s and measured
    # it as fast; here each latency runs from its scheduled time to the answer at 1.0 s.
    time = VirtualTime()
    start = time.now
    stall_over = asyncio.Event()
    sent: list[int] = []

    async def send(index: int) -> bool:
        sent.append(index)
        if index == 3:
            time.now = start + 1.0
            stall_over.set()
        await stall_over.wait()
        return index != 2  # request 2 is refused: no latency for it

    result = await open_loop([0.0, 0.1, 0.2, 0.3], send, clock=time.clock, sleep=time.sleep)

    assert [0, 1, 2, 3] == sent
    assert [0.7, 0.9, 1.0] == pytest.approx(sorted(result.latencies))
    assert 1 == result.refused
    assert [0.0, 0.0, 0.0, 0.0] == pytest.approx(result.send_lags)
    assert 1.0 == pytest.approx(result.wall_s)


async def test_a_sending_loop_that_falls_behind_is_measured_from_the_schedule() -> None:
    # The loop oversleeps by 0.5 s before request 1 (its second sleep): request 1 is sent 0.5 s
    # late and request 2, due meanwhile, 0.4 s late; request 3 is on time again. Each is
    # answered at once, so its latency is its lag.
    time = VirtualTime(lag=0.5, lag_after=1)

    async def send(index: int) -> bool:
        return True

    result = await open_loop([0.1, 0.2, 0.3, 0.9], send, clock=time.clock, sleep=time.sleep)

    assert [0.0, 0.5, 0.4, 0.0] == pytest.approx(result.send_lags)
    assert [0.0, 0.5, 0.4, 0.0] == pytest.approx(result.latencies)
