"""The full resync spread over its period: every key once per period, evenly, on a fake clock.

Expected values are hand-calculated from the rule in the module docstring: a round starts one
period after ``start`` and then every period; ``ceil(count * elapsed / period)`` keys are due
``elapsed`` seconds into it.
"""

from __future__ import annotations

import logging

import pytest

from tally.workqueue import clock as clocks
from tally.workqueue import resync

pytestmark = pytest.mark.unit

LOGGER = logging.getLogger("test.resync")


@pytest.mark.parametrize(
    ("count", "elapsed", "period", "expected"),
    [
        pytest.param(0, 0.0, 300.0, 0, id="nothing-to-hand-out"),
        pytest.param(10_000, 0.0, 300.0, 1, id="the-first-key-at-once"),
        pytest.param(10_000, 1.0, 300.0, 34, id="a-second-in"),  # ceil(33.3)
        pytest.param(10_000, 150.0, 300.0, 5_000, id="half-way"),
        pytest.param(10_000, 299.5, 300.0, 9_984, id="just-before-the-end"),  # ceil(9983.3)
        pytest.param(10_000, 300.0, 300.0, 10_000, id="all-by-the-end"),
        pytest.param(3, 400.0, 300.0, 3, id="late"),
        pytest.param(3, 1.0, 300.0, 1, id="few-keys"),
    ],
)
def test_due(count: int, elapsed: float, period: float, expected: int) -> None:
    assert expected == resync.due(count, elapsed, period)


def _resync(
    keys: list[str], period: float = 300.0
) -> tuple[resync.SpreadResync[str], clocks.FakeClock, list[str]]:
    clock = clocks.FakeClock()
    enqueued: list[str] = []
    spread = resync.SpreadResync(
        lambda: list(keys), enqueued.append, period, name="resync", logger=LOGGER, clock=clock
    )
    return spread, clock, enqueued


async def test_the_first_round_comes_one_period_after_start() -> None:
    spread, clock, enqueued = _resync([f"q{i}" for i in range(10_000)])
    spread.start()
    clock.step(299.9)
    assert [] == enqueued, "the start-up has just synced every key"
    clock.step(0.1)
    assert ["q0"] == enqueued


async def test_a_round_hands_out_every_key_once_evenly_over_the_period() -> None:
    keys = [f"q{i}" for i in range(10_000)]
    spread, clock, enqueued = _resync(keys)
    spread.start()
    clock.step(300.0)
    per_second: list[int] = []
    for _ in range(300):
        before = len(enqueued)
        clock.step(1.0)
        per_second.append(len(enqueued) - before)
    # Every key once, in the order of keys(); and round 2 begins at 600 s with the first.
    assert [*keys, "q0"] == enqueued
    # 10 000 over 300 one-second ticks: 33 or 34 a tick, never a burst.
    assert {33, 34} >= set(per_second[:-1]), per_second
    assert 2 == spread.rounds


async def test_rounds_start_a_period_apart_and_pick_up_new_keys() -> None:
    keys = ["a", "b", "c"]
    spread, clock, enqueued = _resync(keys, period=30.0)
    assert 1.0 == spread.tick
    spread.start()
    # Round 1 at 30 s: key i is due once more than i * 10 s of it have gone, at the next tick.
    clock.step(30.0)
    assert ["a"] == enqueued
    clock.step(10.0)
    assert ["a"] == enqueued
    clock.step(1.0)
    assert ["a", "b"] == enqueued
    keys.append("d")  # arrives mid-round: the next round has it
    clock.step(10.0)
    assert ["a", "b", "c"] == enqueued
    assert 1 == spread.rounds
    # Round 2 at 60 s, a period after round 1 began: four keys, one per 7.5 s.
    clock.step(9.0)
    assert ["a", "b", "c", "a"] == enqueued
    clock.step(8.0)
    assert ["a", "b", "c", "a", "b"] == enqueued
    clock.step(15.0)
    assert ["a", "b", "c", "a", "b", "c", "d"] == enqueued
    assert 2 == spread.rounds


async def test_a_short_period_ticks_at_a_tenth_of_it() -> None:
    spread, clock, enqueued = _resync([f"q{i}" for i in range(100)], period=5.0)
    assert 0.5 == spread.tick
    spread.start()
    clock.step(5.0)
    assert 1 == len(enqueued)
    clock.step(0.5)
    assert 10 == len(enqueued)  # ceil(100 * 0.5 / 5)


async def test_stop_cancels_the_rest() -> None:
    spread, clock, enqueued = _resync([f"q{i}" for i in range(100)], period=10.0)
    spread.start()
    clock.step(10.0)
    clock.step(5.0)
    assert 50 == len(enqueued)
    await spread.stop()
    assert not spread.running
    clock.step(100.0)
    assert 50 == len(enqueued)
    assert not clock.has_waiters()


async def test_a_failing_round_is_logged_and_the_next_comes_as_planned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = clocks.FakeClock()
    calls: list[int] = []
    enqueued: list[str] = []

    def keys() -> list[str]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("cache gone")
        return ["a"]

    spread = resync.SpreadResync(
        keys, enqueued.append, 10.0, name="resync", logger=LOGGER, clock=clock
    )
    spread.start()
    with caplog.at_level(logging.ERROR, logger=LOGGER.name):
        clock.step(10.0)
    assert ["resync: round 1 failed after 0 keys; the next round starts as planned"] == [
        r.getMessage() for r in caplog.records
    ]
    assert [] == enqueued
    clock.step(9.5)
    assert [] == enqueued
    clock.step(0.5)
    assert ["a"] == enqueued


async def test_a_late_round_starts_at_once_without_a_second_catching_up() -> None:
    spread, clock, enqueued = _resync(["a"], period=10.0)
    spread.start()
    clock.step(10.0)
    assert ["a"] == enqueued
    clock.set_time(45.0)  # the loop stalled past two more round starts: one round, now
    assert ["a", "a"] == enqueued
    clock.step(9.5)
    assert ["a", "a"] == enqueued
    clock.step(0.5)  # and the next a period after it
    assert ["a", "a", "a"] == enqueued


def test_absurd_periods_are_refused() -> None:
    with pytest.raises(ValueError, match="period must be positive"):
        resync.SpreadResync(list, print, 0.0, name="r", logger=LOGGER)


async def test_start_twice_is_an_error() -> None:
    spread, _, _ = _resync(["a"])
    spread.start()
    with pytest.raises(RuntimeError, match="already started"):
        spread.start()
    await spread.stop()
