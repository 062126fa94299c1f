"""The rate-limiting queue: ``add_rate_limited`` delays come from the limiter, exactly.

Ported from client-go ``util/workqueue/rate_limiting_queue_test.go``. client-go reads each
waiting entry's ``readyAt - now`` off the delaying queue's channel; here a subclass records the
delay handed to ``add_after``, and the fake clock shows the item landing at that deadline and
not before. Not covered: the limiters' own sequences (``test_limiters.py``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

import pytest

from tally.workqueue import clock as clocks
from tally.workqueue import limiters, rate_limiting

pytestmark = pytest.mark.unit

T = TypeVar("T", bound=Hashable)
MS = 0.001


class RecordingQueue(rate_limiting.RateLimitingQueue[T]):
    """Records every ``add_after`` delay, like client-go's test reading ``waitingForAddCh``."""

    def __init__(self, rate_limiter: limiters.RateLimiter[T], clock: clocks.Clock) -> None:
        super().__init__(rate_limiter, clock=clock)
        self.delays: list[tuple[T, float]] = []

    def add_after(self, item: T, delay: float) -> None:
        self.delays.append((item, delay))
        super().add_after(item, delay)


# client-go: TestRateLimitingQueue
def test_rate_limiting_queue() -> None:
    clock = clocks.FakeClock()
    q = RecordingQueue[str](limiters.ItemExponentialFailureRateLimiter(1 * MS, 1.0), clock)

    q.add_rate_limited("one")
    assert ("one", 1 * MS) == q.delays[-1]
    q.add_rate_limited("one")
    assert ("one", 2 * MS) == q.delays[-1]
    assert 2 == q.num_requeues("one")

    q.add_rate_limited("two")
    assert ("two", 1 * MS) == q.delays[-1]
    q.add_rate_limited("two")
    assert ("two", 2 * MS) == q.delays[-1]

    q.forget("one")
    assert 0 == q.num_requeues("one")
    q.add_rate_limited("one")
    assert ("one", 1 * MS) == q.delays[-1]


# client-go: TestRateLimitingQueue, read off the clock: the item lands at its deadline.
@pytest.mark.parametrize(
    ("failures", "expected_delay"),
    [
        pytest.param(0, 5 * MS, id="first-retry-5ms"),
        pytest.param(1, 10 * MS, id="second-retry-10ms"),
        pytest.param(4, 80 * MS, id="fifth-retry-80ms"),
    ],
)
async def test_item_lands_after_the_limiter_delay(failures: int, expected_delay: float) -> None:
    clock = clocks.FakeClock()
    q = rate_limiting.RateLimitingQueue[str](
        limiters.default_controller_rate_limiter(clock=clock), clock=clock
    )
    for _ in range(failures):
        q.add_rate_limited("one")
        clock.step(1000)
        q.done(await q.get())

    q.add_rate_limited("one")
    clock.step(expected_delay / 2)
    assert 0 == len(q), "landed before its back-off"
    clock.step(expected_delay / 2)
    assert 1 == len(q), "did not land at its back-off"
    assert failures + 1 == q.num_requeues("one")


# client-go: TestNewNamedRateLimitingWithCustomQueue (default limiter, then get the item).
async def test_default_limiter_then_get() -> None:
    clock = clocks.FakeClock()
    q = rate_limiting.RateLimitingQueue[str](
        limiters.default_controller_rate_limiter(clock=clock), name="cluster", clock=clock
    )
    q.add_rate_limited("one")
    clock.step(5 * MS)
    assert "one" == await q.get()
    q.done("one")
    q.shut_down()


# client-go AddRateLimited after shutdown: the limiter still counts, nothing is queued.
def test_add_rate_limited_after_shutdown_is_ignored() -> None:
    clock = clocks.FakeClock()
    q = rate_limiting.RateLimitingQueue[str](
        limiters.ItemExponentialFailureRateLimiter(1 * MS, 1.0), clock=clock
    )
    q.shut_down()
    q.add_rate_limited("one")
    clock.step(1)
    assert 0 == len(q)
    assert not clock.has_waiters()
