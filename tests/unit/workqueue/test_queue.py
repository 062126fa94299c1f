"""The plain work queue: the four promises of client-go's ``doc.go``, and shutdown.

Ported from client-go ``util/workqueue/queue_test.go``; each test names its upstream test.
Goroutines become tasks, ``time.Sleep`` becomes ``asyncio.sleep(0)`` (a yield, not a wait), and
``Get``'s ``shutdown`` flag becomes the ``ShutDown`` exception. Not covered here: delays
(``test_delaying.py``), rate limiting (``test_rate_limiting.py``), metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from tally.workqueue import queue as wq

pytestmark = pytest.mark.unit

ShutDownFn = Callable[[wq.Queue[Any]], Awaitable[None]]


async def _shut_down(q: wq.Queue[Any]) -> None:
    q.shut_down()


async def _shut_down_with_drain(q: wq.Queue[Any]) -> None:
    await q.shut_down_with_drain()


# client-go runs TestBasic and TestAddWhileProcessing with both shutdown modes.
SHUTDOWN_MODES = [
    pytest.param(_shut_down, id="shut_down"),
    pytest.param(_shut_down_with_drain, id="shut_down_with_drain"),
]


async def _yield(times: int = 1) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


async def _get_or_none(q: wq.Queue[Any]) -> Any:
    try:
        return await q.get()
    except wq.ShutDown:
        return None


# client-go: TestBasic
@pytest.mark.parametrize("shut_down", SHUTDOWN_MODES)
async def test_many_producers_and_consumers(shut_down: ShutDownFn) -> None:
    q: wq.Queue[Any] = wq.Queue()
    seen_after_shutdown: list[Any] = []
    in_flight: set[Any] = set()
    overlaps: list[Any] = []

    async def producer(i: int) -> None:
        for _ in range(50):
            q.add(i)
            await _yield()

    async def consumer() -> None:
        while True:
            try:
                item = await q.get()
            except wq.ShutDown:
                return
            if item == "added after shutdown!":
                seen_after_shutdown.append(item)
            if item in in_flight:
                overlaps.append(item)
            in_flight.add(item)
            await _yield(3)
            in_flight.discard(item)
            q.done(item)

    producers = [asyncio.create_task(producer(i)) for i in range(50)]
    consumers = [asyncio.create_task(consumer()) for _ in range(10)]
    await asyncio.gather(*producers)
    await shut_down(q)
    q.add("added after shutdown!")
    await asyncio.gather(*consumers)

    assert [] == seen_after_shutdown
    assert [] == overlaps, "an item was processed by two consumers at once"
    assert 0 == len(q)


# client-go: TestAddWhileProcessing
@pytest.mark.parametrize("shut_down", SHUTDOWN_MODES)
async def test_add_while_processing(shut_down: ShutDownFn) -> None:
    q: wq.Queue[int] = wq.Queue()
    processed: dict[int, int] = {}

    async def consumer() -> None:
        # Every consumer re-adds every item it sees for the first time: the dirty-while-
        # processing case.
        counters: dict[int, int] = {}
        while True:
            try:
                item = await q.get()
            except wq.ShutDown:
                return
            counters[item] = counters.get(item, 0) + 1
            processed[item] = processed.get(item, 0) + 1
            if counters[item] < 2:
                q.add(item)
            await _yield()
            q.done(item)

    for i in range(50):
        q.add(i)
    consumers = [asyncio.create_task(consumer()) for _ in range(10)]
    await _yield(20)
    await shut_down(q)
    await asyncio.gather(*consumers)

    assert 0 == len(q)
    assert set(range(50)) == set(processed)


# client-go: TestLen
def test_len() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    assert 1 == len(q)
    q.add("bar")
    assert 2 == len(q)
    q.add("foo")  # should not increase the queue length
    assert 2 == len(q)


async def test_waiting_is_queued_and_not_yet_handed_out() -> None:
    q: wq.Queue[str] = wq.Queue()
    assert not q.waiting("foo")
    q.add("foo")
    assert q.waiting("foo")
    item = await q.get()
    assert not q.waiting("foo")  # a worker has it: what changes now may be missed
    q.add(item)
    assert not q.waiting("foo")  # again after done, but its worker still runs
    q.done(item)
    assert q.waiting("foo")
    q.done(await q.get())
    assert not q.waiting("foo")


# client-go: TestReinsert
async def test_reinsert() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    item = await q.get()  # start processing
    assert "foo" == item
    q.add(item)  # add it back while processing
    q.done(item)  # finish it up
    item = await q.get()  # it should be back on the queue
    assert "foo" == item
    q.done(item)
    assert 0 == len(q)


# doc.go "Stingy": repeated adds before processing collapse into one.
async def test_collapse() -> None:
    q: wq.Queue[str] = wq.Queue()
    for _ in range(3):
        q.add("foo")
    assert 1 == len(q)
    assert "foo" == await q.get()
    assert 0 == len(q)
    q.done("foo")
    assert 0 == len(q)


# doc.go "Stingy" + "re-adds while processing": adds during processing collapse into one
# deferred add, which lands only on done. (client-go TestReinsert, with more adds.)
async def test_collapse_while_processing() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    item = await q.get()
    for _ in range(3):
        q.add("foo")
    assert 0 == len(q), "an item being processed must not be queued again before done"
    q.done(item)
    assert 1 == len(q)
    assert "foo" == await q.get()
    q.done("foo")
    assert 0 == len(q)


# doc.go "Fair": items are handed out in the order in which they were first added.
@pytest.mark.parametrize(
    ("adds", "expected"),
    [
        pytest.param(["a", "b", "c"], ["a", "b", "c"], id="in-order"),
        pytest.param(["a", "b", "a", "c", "b"], ["a", "b", "c"], id="re-add-keeps-first-place"),
    ],
)
async def test_fair(adds: list[str], expected: list[str]) -> None:
    q: wq.Queue[str] = wq.Queue()
    for item in adds:
        q.add(item)
    assert expected == [await q.get() for _ in expected]


# doc.go "Fair": waiting consumers are served in the order in which they started waiting.
async def test_waiting_getters_are_woken_in_order() -> None:
    q: wq.Queue[str] = wq.Queue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await _yield()
    q.add("a")
    q.add("b")
    assert ("a", "b") == (await first, await second)


# client-go: TestQueueDrainageUsingShutDownWithDrain
async def test_shut_down_with_drain_waits_for_in_flight_items() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    q.add("bar")
    first = await q.get()
    second = await q.get()

    drain = asyncio.create_task(q.shut_down_with_drain())
    await _yield()
    with pytest.raises(wq.ShutDown):
        await q.get()
    assert not drain.done(), "the drain must wait for in-flight items"

    q.done(first)
    await _yield()
    assert not drain.done()
    q.done(second)
    await drain


# client-go: TestNoQueueDrainageUsingShutDown
async def test_shut_down_does_not_wait_for_in_flight_items() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    q.add("bar")
    await q.get()
    await q.get()
    q.shut_down()  # returns at once, without done
    assert q.shutting_down


# client-go: TestForceQueueShutdownUsingShutDown
async def test_shut_down_forces_a_pending_drain() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    q.add("bar")
    await q.get()
    await q.get()

    drain = asyncio.create_task(q.shut_down_with_drain())
    await _yield()
    with pytest.raises(wq.ShutDown):
        await q.get()
    assert not drain.done()

    q.shut_down()  # a second SIGTERM: stop waiting for the drain
    await drain


# client-go: TestQueueDrainageUsingShutDownWithDrainWithDirtyItem
async def test_shut_down_with_drain_hands_out_a_dirty_item() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    gotten = await q.get()
    q.add("foo")

    drain = asyncio.create_task(q.shut_down_with_drain())
    await _yield()
    with pytest.raises(wq.ShutDown):
        await q.get()

    q.done(gotten)  # finish "working": done puts the dirty item back on the queue
    again = await q.get()  # so get does not signal shutdown yet
    assert "foo" == again
    q.done(again)

    with pytest.raises(wq.ShutDown):  # now we are really done
        await q.get()
    await drain


# doc.go "Shutdown notifications": a blocked get is woken by the shutdown.
async def test_shut_down_wakes_blocked_getters() -> None:
    q: wq.Queue[str] = wq.Queue()
    getters = [asyncio.create_task(_get_or_none(q)) for _ in range(3)]
    await _yield()
    q.shut_down()
    assert [None, None, None] == await asyncio.gather(*getters)


# client-go Get: items queued before the shutdown are still handed out, then shutdown.
async def test_get_after_shut_down_hands_out_queued_items_first() -> None:
    q: wq.Queue[str] = wq.Queue()
    q.add("foo")
    q.shut_down()
    q.add("bar")  # ignored
    assert "foo" == await q.get()
    with pytest.raises(wq.ShutDown):
        await q.get()


# client-go ShutDownWithDrain returns at once when nothing is in flight.
async def test_shut_down_with_drain_on_idle_queue_returns_at_once() -> None:
    q: wq.Queue[str] = wq.Queue()
    await q.shut_down_with_drain()
    assert q.shutting_down


# tally-only: done without get would queue an item twice in client-go; here it is an error.
@pytest.mark.parametrize(
    "state",
    [
        pytest.param("never-added", id="never-added"),
        pytest.param("queued-not-gotten", id="queued-not-gotten"),
        pytest.param("already-done", id="already-done"),
    ],
)
async def test_done_for_an_item_not_in_processing_raises(state: str) -> None:
    q: wq.Queue[str] = wq.Queue()
    if state != "never-added":
        q.add("foo")
    if state == "already-done":
        q.done(await q.get())
    with pytest.raises(ValueError, match="not being processed"):
        q.done("foo")
    assert (1 if state == "queued-not-gotten" else 0) == len(q)


# tally-only: a getter cancelled after it was woken passes the wake-up to the next getter, so
# no item is left in the queue while a consumer waits.
async def test_cancelled_getter_passes_its_wake_up_on() -> None:
    q: wq.Queue[str] = wq.Queue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await _yield()
    q.add("foo")  # wakes `first`...
    first.cancel()  # ...which leaves before it runs
    assert "foo" == await asyncio.wait_for(second, 1)
    with pytest.raises(asyncio.CancelledError):
        await first


def _get_now(q: wq.Queue[int]) -> int:
    """Run ``get`` on a non-empty queue to completion without an event loop (it never waits)."""
    coro = q.get()
    try:
        coro.send(None)
    except StopIteration as stop:
        return int(stop.value)
    coro.close()
    raise AssertionError("get() waited on a non-empty queue")


# doc.go promises, checked against a reference model of queue.go's Add/Get/Done on random
# operation sequences; the invariants are the ones documented on queue.go's struct fields.
@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 4)),
            st.tuples(st.just("get"), st.just(0)),
            st.tuples(st.just("done"), st.integers(0, 4)),
        ),
        max_size=60,
    )
)
def test_matches_client_go_model(ops: list[tuple[str, int]]) -> None:
    q: wq.Queue[int] = wq.Queue()
    queue: list[int] = []
    dirty: set[int] = set()
    processing: set[int] = set()
    for op, item in ops:
        if op == "add":
            q.add(item)
            if item not in dirty:
                dirty.add(item)
                if item not in processing:
                    queue.append(item)
        elif op == "get" and queue:
            expected = queue.pop(0)
            assert expected == _get_now(q)
            processing.add(expected)
            dirty.discard(expected)
        elif op == "done" and item in processing:
            q.done(item)
            processing.discard(item)
            if item in dirty:
                queue.append(item)
        assert len(queue) == len(q)
        assert len(queue) == len(set(queue)), "an item is queued twice"
        assert all(i in dirty and i not in processing for i in queue)
