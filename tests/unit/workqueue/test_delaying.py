"""The delaying queue: ``add_after`` on a fake clock.

Ported from client-go ``util/workqueue/delaying_queue_test.go``; each test names its upstream
test. client-go polls until its waiting goroutine has caught up; here the fake clock runs the
queue's timer synchronously inside ``step``, so every check is immediate and nothing sleeps.
Not covered here: the plain queue's promises (``test_queue.py``).
"""

from __future__ import annotations

import asyncio

import pytest

from tally.workqueue import clock as clocks
from tally.workqueue import delaying

pytestmark = pytest.mark.unit


def _queue() -> tuple[delaying.DelayingQueue[str], clocks.FakeClock]:
    clock = clocks.FakeClock(start=1000.0)
    return delaying.DelayingQueue(clock=clock), clock


# client-go: TestSimpleQueue
async def test_simple_queue() -> None:
    q, clock = _queue()
    q.add_after("foo", 0.050)
    assert 0 == len(q), "should not have added"

    clock.step(0.060)
    assert 1 == len(q), "should have added"
    item = await q.get()
    q.done(item)

    clock.step(10)  # step past the next heartbeat
    assert 0 == len(q), "should not have added"
    assert not clock.has_waiters()


# client-go: TestDeduping
@pytest.mark.parametrize(
    ("first_delay", "second_delay", "fires_after"),
    [
        pytest.param(0.050, 0.070, 0.060, id="earlier-first-wins"),
        pytest.param(0.050, 0.030, 0.040, id="earlier-second-overrides"),
    ],
)
async def test_deduping(first_delay: float, second_delay: float, fires_after: float) -> None:
    q, clock = _queue()
    q.add_after("foo", first_delay)
    q.add_after("foo", second_delay)
    assert 0 == len(q), "should not have added"

    clock.step(fires_after)  # step past the earlier deadline: we should receive now
    assert 1 == len(q), "should have added"
    item = await q.get()
    q.done(item)

    clock.step(0.020)  # step past the later deadline: it must not add a second time
    assert 0 == len(q), "should not have added"


# client-go: TestDeduping, last part: an item being processed can still be added after a
# delay; it waits, then is deferred until done like any add while processing.
async def test_add_after_while_processing() -> None:
    q, clock = _queue()
    q.add("foo")
    item = await q.get()
    q.add_after("foo", 0.005)
    clock.step(0.005)
    assert 0 == len(q), "deferred until done"
    q.done(item)
    assert 1 == len(q)


# client-go: TestAddTwoFireEarly
async def test_add_two_fire_early() -> None:
    q, clock = _queue()
    q.add_after("foo", 1)
    q.add_after("bar", 0.050)
    assert 0 == len(q), "should not have added"

    clock.step(0.060)
    assert 1 == len(q)
    assert "bar" == await q.get()

    q.add_after("baz", 2)

    clock.step(1)
    assert 1 == len(q)
    assert "foo" == await q.get()

    clock.step(2)
    assert 1 == len(q)
    assert "baz" == await q.get()


# client-go: TestCopyShifting
async def test_copy_shifting() -> None:
    q, clock = _queue()
    q.add_after("foo", 1)
    q.add_after("bar", 0.500)
    q.add_after("baz", 0.250)
    assert 0 == len(q), "should not have added"

    clock.step(2)
    assert 3 == len(q)
    assert ["baz", "bar", "foo"] == [await q.get() for _ in range(3)]


# client-go AddAfter: "immediately add things with no delay".
@pytest.mark.parametrize(
    "delay",
    [pytest.param(0.0, id="zero"), pytest.param(-1.0, id="negative")],
)
def test_no_delay_adds_at_once(delay: float) -> None:
    q, clock = _queue()
    q.add_after("foo", delay)
    assert 1 == len(q)
    assert not clock.has_waiters()


# client-go AddAfter/ShutDown: no adds after shutdown, and waiting items are dropped.
@pytest.mark.parametrize(
    "drain",
    [pytest.param(False, id="shut_down"), pytest.param(True, id="shut_down_with_drain")],
)
async def test_shutdown_drops_waiting_items(drain: bool) -> None:
    q, clock = _queue()
    q.add_after("foo", 1)
    if drain:
        await q.shut_down_with_drain()
    else:
        q.shut_down()
    q.add_after("bar", 1)
    assert not clock.has_waiters(), "the timer must be cancelled"
    clock.step(2)
    assert 0 == len(q)


# tally-only: the same queue with the real clock and the running loop's timers.
async def test_real_clock_fires_on_the_event_loop() -> None:
    q: delaying.DelayingQueue[str] = delaying.DelayingQueue()
    q.add_after("foo", 0.001)
    assert "foo" == await asyncio.wait_for(q.get(), timeout=1)
    q.done("foo")
    q.shut_down()
