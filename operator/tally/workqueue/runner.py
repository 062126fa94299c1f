"""Workers over a rate-limiting queue: the sample-controller worker loop, started and stopped
as guarded asyncio tasks.

This module owns the loop every tally controller runs, in the shape of
``kubernetes/sample-controller``'s ``runWorker``/``processNextWorkItem``: get an item, sync it,
``forget`` it on success or re-add it rate-limited on error, and always call ``done``. It also
owns the lifecycle of the N worker tasks, because Kopf does not supervise tasks that handlers
start (``on.startup`` returns, and a task that dies afterwards would die silently):

* every worker task is started with :func:`tally.workqueue.tasks.start_watched`, which logs
  loudly (ERROR) when a worker, which should run until the pool is stopped, ends early, with or
  without an exception, or is cancelled by anyone but :meth:`WorkerPool.stop`;
* :meth:`WorkerPool.stop` shuts the queue down with drain (in-flight items finish), lets the
  workers hand out what is still queued and return, then cancels whatever is left, waits for it,
  and logs each task that will not stop.

Left out: waiting for caches to sync before starting (the caller's job, as in sample-controller's
``Run``), restarting dead workers (a dead worker is a bug to see in the logs, not to paper over),
and anything Kopf-specific.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from tally.workqueue import queue as plain_queue
from tally.workqueue import rate_limiting, tasks

T = TypeVar("T", bound=Hashable)

logger = logging.getLogger(__name__)

#: How long :meth:`WorkerPool.stop` waits, by default, for in-flight and queued items to finish
#: before it cancels the workers. A sync is a few API calls, normally well under a second; ten
#: seconds leaves room for a slow API server and still fits a pod's 30 s termination grace.
DEFAULT_STOP_TIMEOUT = 10.0
#: How long :meth:`WorkerPool.stop` waits for cancelled workers before it gives up on them.
DEFAULT_CANCEL_TIMEOUT = 5.0


class WorkerPool(Generic[T]):
    """N workers, each running the sample-controller loop over one rate-limiting queue."""

    def __init__(
        self,
        queue: rate_limiting.RateLimitingQueue[T],
        sync: Callable[[T], Awaitable[None]],
        *,
        workers: int = 5,
        name: str = "",
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        expected: tuple[type[Exception], ...] = (),
    ) -> None:
        """Prepare ``workers`` workers that call ``sync(item)`` for every item of ``queue``.

        ``sync`` raises to ask for a rate-limited retry; returning means the item is finished
        (errors no retry will fix should be logged and swallowed by ``sync`` itself).
        Exceptions of the ``expected`` types (e.g. a 409 on a status write, routine under
        concurrency) are retried the same way but logged in one line, without a traceback.
        """
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._queue = queue
        self._sync = sync
        self._workers = workers
        self.name = name or queue.name or "workqueue"
        self._log = log if log is not None else logger
        self._expected = expected
        #: The worker tasks, created by ``start``; they end only when the queue is shut down
        #: and empty, or when ``stop`` cancels them.
        self._tasks: list[asyncio.Task[None]] = []
        #: Set by ``stop``: from then on a worker that ends is expected, not an alarm.
        self._stopping = False

    @property
    def tasks(self) -> tuple[asyncio.Task[None], ...]:
        """The worker tasks (for tests and for callers that want to await them)."""
        return tuple(self._tasks)

    def start(self) -> None:
        """Start the worker tasks on the running loop. Call once, after caches have synced."""
        if self._tasks:
            raise RuntimeError(f"workers of {self.name!r} already started")
        for index in range(self._workers):
            task = tasks.start_watched(
                self._run_worker(),
                name=f"{self.name}-worker-{index}",
                logger=self._log,
                level=logging.ERROR,
                # A crash is logged even while stopping; an end or a cancellation only before.
                died="%(pool)s: worker %(task)s crashed; %(pool)s has one worker fewer",
                ended="%(pool)s: worker %(task)s exited although the pool was not stopped"
                " (queue shut down?)",
                cancelled="%(pool)s: worker %(task)s was cancelled unexpectedly",
                stopping=lambda: self._stopping,
                context={"pool": self.name},
            )
            self._tasks.append(task)

    async def process_next_work_item(self) -> bool:
        """Take one item, sync it, and settle it with the queue. ``False`` means: stop.

        Exposed so tests (and a single-worker caller) can step the loop one item at a time.
        """
        try:
            item = await self._queue.get()
        except plain_queue.ShutDown:
            return False
        # `done` is always called, whatever happens below: it is what lets this item be
        # processed again (the queue never hands an item out twice at once).
        try:
            await self._sync(item)
        except self._expected as error:
            self._log.info("%s: sync of %r: %s; requeuing rate-limited", self.name, item, error)
            self._queue.add_rate_limited(item)
        except Exception:
            # Re-add rate-limited: one broken item backs off on its own (5 ms doubling up to
            # 1000 s with the default limiter), and the overall bucket keeps a broken
            # controller from spinning.
            self._log.exception(
                "%s: sync of %r failed (%d earlier retries); requeuing rate-limited",
                self.name,
                item,
                self._queue.num_requeues(item),
            )
            self._queue.add_rate_limited(item)
        else:
            # Success: end back-off tracking, so the next failure starts again at the base
            # delay and the limiter does not keep this item forever.
            self._queue.forget(item)
        finally:
            self._queue.done(item)
        return True

    async def stop(
        self,
        *,
        grace_period: float = DEFAULT_STOP_TIMEOUT,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
    ) -> None:
        """Stop gracefully: shut the queue down with drain, let the workers return, and cancel
        those that have not within ``grace_period`` seconds; log any that still hang after
        ``cancel_timeout`` more seconds. If ``stop`` itself is cancelled (a second signal),
        it cancels every worker at once and re-raises.

        ``grace_period`` 0 stops at once: no sync is started any more, not even of an item
        already queued, and those in flight are cancelled (a leader that lost its lease)."""
        self._stopping = True
        if grace_period <= 0:
            self._queue.shut_down()
            pending = {task for task in self._tasks if not task.done()}
            if pending:
                await self._cancel(pending, cancel_timeout)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_period
        try:
            try:
                await asyncio.wait_for(self._queue.shut_down_with_drain(), grace_period)
            except TimeoutError:
                self._log.warning(
                    "%s: in-flight items not done after %g s; forcing shutdown",
                    self.name,
                    grace_period,
                )
                self._queue.shut_down()
            # Workers still hand out what was queued before the shutdown, then get ShutDown.
            pending = {task for task in self._tasks if not task.done()}
            if pending:
                _, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
            if pending:
                self._log.warning(
                    "%s: cancelling %d worker(s) still busy after %g s",
                    self.name,
                    len(pending),
                    grace_period,
                )
                await self._cancel(pending, cancel_timeout)
        except asyncio.CancelledError:
            self._queue.shut_down()
            for task in self._tasks:
                task.cancel()
            raise

    async def _cancel(self, tasks: set[asyncio.Task[None]], cancel_timeout: float) -> None:
        for task in tasks:
            task.cancel()
        _, hanging = await asyncio.wait(tasks, timeout=cancel_timeout)
        for task in hanging:
            self._log.error(
                "%s: worker %s did not stop %g s after cancellation; abandoning it",
                self.name,
                task.get_name(),
                cancel_timeout,
            )

    async def _run_worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # A sync that writes nothing never suspends, and ``get`` on a non-empty queue
            # returns at once: one worker would run a whole queue of such syncs (a resync of
            # every quota) in one turn of the loop, and the webhook's reviews, the watches and
            # the probes on the same loop would wait for all of it. So a worker whose item
            # never let the loop run gives it a turn. One that did suspend (a status write)
            # does not: each extra turn is a wait behind everything else ready, and while
            # Kopf replays a large listing that is a long one, for every sync.
            turned = loop.create_future()
            marker = loop.call_soon(_set_done, turned)
            if not await self.process_next_work_item():
                marker.cancel()
                return
            if not turned.done():
                marker.cancel()
                await asyncio.sleep(0)


def _set_done(future: asyncio.Future[None]) -> None:
    """The loop ran a turn since the future was made (see ``WorkerPool._run_worker``)."""
    if not future.done():
        future.set_result(None)
