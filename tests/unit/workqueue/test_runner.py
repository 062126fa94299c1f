"""The worker pool: the sample-controller loop, guarded tasks, graceful stop.

Modelled on ``kubernetes/sample-controller`` ``controller.go`` (``processNextWorkItem``): get,
sync, forget on success, add rate-limited on error, always done. Retries run on a fake clock;
the only real waits are the few-millisecond grace periods of the stop tests. Not covered: the
queue itself (``test_queue.py`` and friends).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from tally.workqueue import clock as clocks
from tally.workqueue import limiters, rate_limiting, runner

pytestmark = pytest.mark.unit

MS = 0.001


class Boom(BaseException):
    """Escapes ``except Exception``, as a bug in the loop itself would."""


def _queue(clock: clocks.FakeClock) -> rate_limiting.RateLimitingQueue[str]:
    return rate_limiting.RateLimitingQueue(
        limiters.default_controller_rate_limiter(clock=clock), name="test", clock=clock
    )


async def _yield(times: int = 5) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


# sample-controller processNextWorkItem: success forgets the item and calls done.
async def test_success_forgets_and_finishes() -> None:
    clock = clocks.FakeClock()
    q = _queue(clock)
    synced: list[str] = []

    async def sync(key: str) -> None:
        synced.append(key)

    pool = runner.WorkerPool(q, sync, workers=1)
    q.add_rate_limited("ns/a")  # a failure on record, to see forget clear it
    clock.step(5 * MS)
    assert 1 == q.num_requeues("ns/a")

    assert await pool.process_next_work_item()
    assert ["ns/a"] == synced
    assert 0 == q.num_requeues("ns/a")
    q.add("ns/a")
    assert 1 == len(q), "done was not called: the item could not be queued again"


# sample-controller processNextWorkItem: an error is reported and the item re-added
# rate-limited (5 ms, then 10 ms with the default limiter); done is still called.
async def test_error_requeues_rate_limited_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    clock = clocks.FakeClock()
    q = _queue(clock)
    attempts: list[str] = []

    async def sync(key: str) -> None:
        attempts.append(key)
        if len(attempts) < 3:
            raise RuntimeError("conflict")

    pool = runner.WorkerPool(q, sync, workers=1)
    q.add("ns/a")
    with caplog.at_level(logging.ERROR, logger=runner.__name__):
        assert await pool.process_next_work_item()
    assert 1 == q.num_requeues("ns/a")
    assert 0 == len(q), "requeued without back-off"
    assert ["RuntimeError: conflict"] == [
        str(record.exc_info[1].__class__.__name__) + ": " + str(record.exc_info[1])
        for record in caplog.records
        if record.exc_info and record.exc_info[1]
    ]

    clock.step(5 * MS)
    assert await pool.process_next_work_item()
    assert 2 == q.num_requeues("ns/a")
    clock.step(5 * MS)
    assert 0 == len(q), "second retry must wait 10 ms"
    clock.step(5 * MS)
    assert await pool.process_next_work_item()
    assert ["ns/a"] * 3 == attempts
    assert 0 == q.num_requeues("ns/a"), "success must forget the failures"


# sample-controller runWorker: the loop ends when the queue is shut down.
async def test_process_next_work_item_stops_on_shutdown() -> None:
    q = _queue(clocks.FakeClock())

    async def sync(key: str) -> None:
        raise AssertionError("nothing to sync")

    q.shut_down()
    assert not await runner.WorkerPool(q, sync).process_next_work_item()


# sample-controller Run: N workers process in parallel, never one key twice at once; stop
# drains the in-flight items and the workers end without alarms.
async def test_workers_run_in_parallel_and_stop_with_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = _queue(clocks.FakeClock())
    release = asyncio.Event()
    started: list[str] = []
    finished: list[str] = []

    async def sync(key: str) -> None:
        started.append(key)
        await release.wait()
        finished.append(key)

    pool = runner.WorkerPool(q, sync, workers=3, name="primary")
    pool.start()
    for key in ("a", "b", "c", "d", "a"):
        q.add(key)
    await _yield()
    assert ["a", "b", "c"] == started, "three workers, three keys in flight"

    with caplog.at_level(logging.WARNING, logger=runner.__name__):
        stop = asyncio.create_task(pool.stop(grace_period=1))
        await _yield()
        assert not stop.done(), "stop must wait for in-flight items"
        release.set()
        await asyncio.wait_for(stop, 1)

    assert ["a", "b", "c", "d"] == sorted(finished), "queued items are still handed out"
    assert all(task.done() and not task.cancelled() for task in pool.tasks)
    assert [] == caplog.records


# A queue of syncs that never suspend (a resync of quotas whose usage has not changed) must not
# hold the event loop for the whole queue: other coroutines (the webhook's reviews) get turns.
async def test_a_worker_lets_the_loop_run_between_syncs_that_never_suspend() -> None:
    q = _queue(clocks.FakeClock())
    order: list[str] = []

    async def sync(key: str) -> None:
        order.append(key)

    async def review() -> None:
        order.append("review")

    for index in range(100):
        q.add(f"quota-{index}")
    pool = runner.WorkerPool(q, sync, workers=1)
    pool.start()
    other = asyncio.create_task(review())
    await asyncio.wait_for(other, 1)
    await _yield(200)
    assert 101 == len(order)
    assert order.index("review") <= 2, f"the review waited for {order.index('review')} syncs"
    await pool.stop(grace_period=1)


# A sync that suspended (a status write) has already let the loop run: no extra turn for it,
# which under a busy loop would be one more wait behind everything else ready, per sync.
async def test_a_sync_that_suspended_gets_no_extra_turn() -> None:
    q = _queue(clocks.FakeClock())
    synced: list[str] = []
    turns = 0
    counting = True

    all_synced = asyncio.Event()

    async def sync(key: str) -> None:
        await asyncio.sleep(0)  # one turn of the loop, as a write's wait for its answer
        synced.append(key)
        if len(synced) == 100:
            all_synced.set()

    async def count_turns() -> None:
        nonlocal turns
        while counting:
            turns += 1
            await asyncio.sleep(0)

    for index in range(100):
        q.add(f"quota-{index}")
    counter = asyncio.create_task(count_turns())
    pool = runner.WorkerPool(q, sync, workers=1)
    pool.start()
    await asyncio.wait_for(all_synced.wait(), 5)
    counting = False
    await counter
    # One turn per sync, not two (one more for the get of each wait is not taken either).
    assert turns <= 110, turns
    await pool.stop(grace_period=1)


# Kopf aiotasks.stop: workers that outlive the grace period are cancelled, with a warning.
async def test_stop_cancels_workers_that_hang(caplog: pytest.LogCaptureFixture) -> None:
    q = _queue(clocks.FakeClock())

    async def sync(key: str) -> None:
        await asyncio.Event().wait()  # never returns

    pool = runner.WorkerPool(q, sync, workers=2)
    pool.start()
    q.add("a")
    await _yield()
    with caplog.at_level(logging.WARNING, logger=runner.__name__):
        await pool.stop(grace_period=5 * MS, cancel_timeout=1)
    # The idle worker returns on shutdown; the one stuck in sync is cancelled.
    assert [False, True] == sorted(task.cancelled() for task in pool.tasks)
    messages = [record.getMessage() for record in caplog.records]
    assert any("forcing shutdown" in message for message in messages), messages
    assert any("cancelling 1 worker(s)" in message for message in messages), messages
    assert not any(record.levelno >= logging.ERROR for record in caplog.records)


# tally (a leader that lost its lease): stop at once, no sync of what is queued, in-flight
# syncs cancelled, and no warning about a drain that was not asked for.
async def test_stop_without_grace_starts_nothing_more(caplog: pytest.LogCaptureFixture) -> None:
    q = _queue(clocks.FakeClock())
    started: list[str] = []

    async def sync(key: str) -> None:
        started.append(key)
        await asyncio.Event().wait()  # never returns

    pool = runner.WorkerPool(q, sync, workers=1)
    pool.start()
    q.add("a")
    q.add("b")
    await _yield()
    with caplog.at_level(logging.WARNING, logger=runner.__name__):
        await pool.stop(grace_period=0, cancel_timeout=1)
    assert ["a"] == started
    assert [True] == [task.cancelled() for task in pool.tasks]
    assert [] == caplog.records
    await _yield()
    assert ["a"] == started, "b was queued, but must not be synced after the stop"


# Kopf aiotasks.stop: a task that ignores cancellation is logged, not waited for forever.
async def test_stop_logs_workers_that_ignore_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = _queue(clocks.FakeClock())
    let_go = asyncio.Event()

    async def sync(key: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await let_go.wait()  # swallow the cancellation until the test lets go

    pool = runner.WorkerPool(q, sync, workers=1)
    pool.start()
    q.add("a")
    await _yield()
    with caplog.at_level(logging.ERROR, logger=runner.__name__):
        await pool.stop(grace_period=2 * MS, cancel_timeout=2 * MS)
    assert any("did not stop" in record.getMessage() for record in caplog.records)

    let_go.set()  # clean up: the worker finishes its item and sees the shutdown
    await asyncio.wait_for(asyncio.gather(*pool.tasks), 1)


# Kopf create_guarded_task: an eternal task that ends is logged loudly, crash or not.
@pytest.mark.parametrize(
    ("how", "expected_message"),
    [
        pytest.param("crash", "crashed", id="crash"),
        pytest.param("queue-shut-down", "exited although the pool was not stopped", id="exit"),
    ],
)
async def test_worker_that_ends_unexpectedly_is_logged(
    how: str, expected_message: str, caplog: pytest.LogCaptureFixture
) -> None:
    q = _queue(clocks.FakeClock())

    async def sync(key: str) -> None:
        raise Boom

    pool = runner.WorkerPool(q, sync, workers=1)
    with caplog.at_level(logging.ERROR, logger=runner.__name__):
        pool.start()
        if how == "crash":
            q.add("a")
        else:
            q.shut_down()
        await asyncio.wait(pool.tasks, timeout=1)
        await _yield()
    assert any(expected_message in record.getMessage() for record in caplog.records), [
        record.getMessage() for record in caplog.records
    ]
    if how == "crash":
        q.add("a")
        assert 1 == len(q), "done must be called even when the worker dies"
    await pool.stop(grace_period=MS, cancel_timeout=MS)


@pytest.mark.parametrize(
    "workers",
    [pytest.param(0, id="zero"), pytest.param(-1, id="negative")],
)
def test_workers_must_be_positive(workers: int) -> None:
    async def sync(key: str) -> None:
        pass

    with pytest.raises(ValueError, match="at least 1"):
        runner.WorkerPool(_queue(clocks.FakeClock()), sync, workers=workers)


async def test_start_twice_is_an_error() -> None:
    q = _queue(clocks.FakeClock())

    async def sync(key: str) -> None:
        pass

    pool = runner.WorkerPool(q, sync, workers=1)
    pool.start()
    with pytest.raises(RuntimeError, match="already started"):
        pool.start()
    await pool.stop(grace_period=0.1)


class ExpectedError(Exception):
    pass


async def test_expected_errors_are_retried_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Like client-go's HandleError for a conflict: retried rate-limited, logged in one line.
    queue: rate_limiting.RateLimitingQueue[str] = rate_limiting.RateLimitingQueue(
        limiters.ItemExponentialFailureRateLimiter(0.001, 1.0)
    )

    async def sync(item: str) -> None:
        raise ExpectedError("409: the object has been modified")

    pool = runner.WorkerPool(queue, sync, workers=1, name="t", expected=(ExpectedError,))
    queue.add("a")
    with caplog.at_level(logging.INFO):
        assert await pool.process_next_work_item()
    assert 1 == queue.num_requeues("a")
    records = [r for r in caplog.records if "409" in r.getMessage()]
    assert [logging.INFO] == [r.levelno for r in records]
    assert records[0].exc_info is None
    queue.shut_down()
