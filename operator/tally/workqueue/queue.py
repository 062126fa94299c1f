"""The plain work queue: client-go's ``util/workqueue`` ``Type``, on one asyncio event loop.

This module owns the queue's core algorithm, the ``dirty``/``processing`` bookkeeping behind
``add``/``get``/``done``, and shutdown. It exists because controllers must never handle the
same key in two workers at once, and must collapse a burst of events about one key into one
sync; ``asyncio.Queue`` does neither.

How it differs from client-go, and why:

* It runs on one event loop, so there is no mutex and no condition variable. Every method
  except ``get`` and ``shut_down_with_drain`` is synchronous, and the synchronous methods
  never ``await``, so each is atomic with respect to other coroutines. ``add``, ``done`` and
  ``shut_down`` may be called from plain callbacks (event handlers, timers). Calling any method
  from another thread is not supported.
* ``get`` raises :class:`ShutDown` instead of returning a ``shutdown`` flag, so its return
  type is just the item (Python 3.13's ``asyncio.Queue`` does the same with
  ``QueueShutDown``).
* ``done`` for an item that is not being processed raises ``ValueError``: client-go silently
  accepts it and can then queue the item twice, breaking the "stingy" promise.

Left out: pluggable FIFO storage (``TypedQueueConfig.Queue``), ``Find``, and the priority
queue; see ``delaying.py`` and ``rate_limiting.py`` for the layers built on top.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

from tally.workqueue import clock as clocks
from tally.workqueue import metrics as queue_metrics

T = TypeVar("T", bound=Hashable)


class ShutDown(Exception):
    """Raised by :meth:`Queue.get` once the queue is shut down and has nothing left to hand
    out: the worker that gets it should return."""


class Queue(Generic[T]):
    """A work queue of hashable items (usually ``namespace/name`` keys).

    It makes the four promises of client-go's ``doc.go``, and nothing else:

    1. **Fair**: items are processed in the order in which they are added.
    2. **Stingy**: a single item is never processed by two workers at once, and if an item is
       added several times before it is processed, it is processed only once.
    3. **Many producers and consumers**: any number of coroutines may add and get, and an item
       may be re-added while it is being processed; it is then queued again when ``done`` is
       called for it, and not before.
    4. **Shutdown notifications**: after :meth:`shut_down`, adds are ignored and ``get`` raises
       :class:`ShutDown` as soon as the queue is empty.

    ``len(queue)`` is for information only (metrics, logs): never decide whether to call
    ``add`` or ``get`` from it.
    """

    def __init__(
        self,
        *,
        name: str = "",
        clock: clocks.Clock | None = None,
        metrics_provider: queue_metrics.MetricsProvider | None = None,
        unfinished_work_update_period: float = (
            queue_metrics.DEFAULT_UNFINISHED_WORK_UPDATE_PERIOD
        ),
    ) -> None:
        """Build a queue. ``name`` labels its metrics; an unnamed queue, or one without a
        ``metrics_provider``, records none. ``clock`` is for tests (the metrics read it)."""
        self.name = name
        self._clock: clocks.Clock = clock if clock is not None else clocks.RealClock()
        self._metrics: queue_metrics.QueueMetrics[T] = queue_metrics.new_queue_metrics(
            name, metrics_provider, self._clock
        )
        self._unfinished_work_update_period = unfinished_work_update_period
        self._unfinished_work_timer: clocks.TimerHandle | None = None

        #: The order in which items will be worked on. Every item in ``_queue`` is in
        #: ``_dirty`` and not in ``_processing``; each item is in it at most once.
        self._queue: collections.deque[T] = collections.deque()
        #: Every item that needs processing: the queued ones, plus in-flight ones that were
        #: added again while being processed. An add of an item already here collapses.
        self._dirty: set[T] = set()
        #: Items that a worker got and has not called ``done`` for. An item may be in both
        #: ``_processing`` and ``_dirty``; it then stays out of ``_queue`` until ``done``, which
        #: is where it is queued again. This is what keeps one item out of two workers.
        self._processing: set[T] = set()

        #: Coroutines blocked in ``get``, woken one per queued item, in arrival order.
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        #: Coroutines blocked in ``shut_down_with_drain``, woken when ``_processing`` empties
        #: or when ``shut_down`` forces the shutdown.
        self._drainers: list[asyncio.Future[None]] = []
        #: Once set, adds are ignored and ``get`` raises ``ShutDown`` on an empty queue.
        self._shutting_down = False
        #: Whether a ``shut_down_with_drain`` is still waiting; ``shut_down`` clears it.
        self._drain = False

    def add(self, item: T) -> None:
        """Mark ``item`` as needing processing. Ignored after shutdown."""
        if self._shutting_down:
            return
        if item in self._dirty:
            return  # Stingy: it is already waiting, or will be queued again on ``done``.
        self._start_unfinished_work_updates()
        self._metrics.add(item)
        self._dirty.add(item)
        if item in self._processing:
            return  # Deferred: ``done`` puts it back on the queue.
        self._queue.append(item)
        self._wake_next_getter()

    def __len__(self) -> int:
        """The number of queued items (not counting in-flight ones): information only."""
        return len(self._queue)

    def unfinished(self) -> int:
        """Items queued or in flight (items waiting on a delayed add are not counted)."""
        return len(self._queue) + len(self._processing)

    def waiting(self, item: T) -> bool:
        """Whether ``item`` is queued and no worker has got it yet: its processing starts
        after this moment, so it sees whatever the caller has already changed."""
        return item in self._dirty and item not in self._processing

    async def get(self) -> T:
        """Wait for the next item and hand it to the caller, who now owns it.

        The caller must call :meth:`done` with the item when it has finished with it, whatever
        happened (use ``try``/``finally``); until then, the item is never handed out again.
        Raises :class:`ShutDown` once the queue is shut down and empty: the worker should then
        return. Items queued before the shutdown are still handed out.
        """
        while not self._queue:
            if self._shutting_down:
                raise ShutDown
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                if getter in self._getters:
                    self._getters.remove(getter)
                elif self._queue:
                    # We were woken for an item but are leaving: pass the wake-up on.
                    self._wake_next_getter()
                raise
        item = self._queue.popleft()
        self._metrics.get(item)
        self._processing.add(item)
        self._dirty.discard(item)
        return item

    def done(self, item: T) -> None:
        """Mark ``item`` as finished; if it was added again meanwhile, queue it again.

        Raises ``ValueError`` if the item is not being processed (a second ``done``, or a
        ``done`` without ``get``), which would otherwise let the item be queued twice.
        """
        if item not in self._processing:
            raise ValueError(f"done({item!r}) for an item that is not being processed")
        self._metrics.done(item)
        self._processing.discard(item)
        if item in self._dirty:
            self._queue.append(item)
            self._wake_next_getter()
        if not self._processing:
            # As in client-go, the drain ends when nothing is in flight, even if this item just
            # went back on the queue; ``get`` still hands it out before raising ``ShutDown``.
            self._wake_drainers()

    def shut_down(self) -> None:
        """Ignore new items and make ``get`` raise :class:`ShutDown` as soon as the queue is
        empty. Returns at once; wakes every blocked ``get`` and ``shut_down_with_drain``.
        Safe to call more than once, and after :meth:`shut_down_with_drain` to stop waiting
        for the drain (a second SIGTERM)."""
        self._drain = False
        self._shutdown()
        self._wake_drainers()

    async def shut_down_with_drain(self) -> None:
        """Like :meth:`shut_down`, then wait until every in-flight item is ``done``.

        The workers must keep calling ``done`` for everything they got, or this waits forever;
        put a timeout around it, or call :meth:`shut_down` to stop waiting. Items still queued
        but not yet handed out are not waited for (as in client-go), but ``get`` hands them out
        before it raises :class:`ShutDown`.
        """
        self._drain = True
        self._shutdown()
        while self._processing and self._drain:
            drainer = asyncio.get_running_loop().create_future()
            self._drainers.append(drainer)
            try:
                await drainer
            finally:
                if drainer in self._drainers:
                    self._drainers.remove(drainer)

    @property
    def shutting_down(self) -> bool:
        """Whether a shutdown has started."""
        return self._shutting_down

    def _shutdown(self) -> None:
        self._shutting_down = True
        if self._unfinished_work_timer is not None:
            self._unfinished_work_timer.cancel()
            self._unfinished_work_timer = None
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)

    def _wake_next_getter(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _wake_drainers(self) -> None:
        drainers, self._drainers = self._drainers, []
        for drainer in drainers:
            if not drainer.done():
                drainer.set_result(None)

    def _start_unfinished_work_updates(self) -> None:
        # client-go starts a goroutine with a ticker in the constructor. A timer needs a running
        # loop, which the constructor may not have, so the first add arms it instead; it re-arms
        # itself until shutdown. Queues without metrics never arm it.
        if self._metrics.enabled and self._unfinished_work_timer is None:
            self._schedule_unfinished_work_update()

    def _schedule_unfinished_work_update(self) -> None:
        self._unfinished_work_timer = self._clock.call_at(
            self._clock.now() + self._unfinished_work_update_period,
            self._update_unfinished_work,
        )

    def _update_unfinished_work(self) -> None:
        if self._shutting_down:
            return
        self._metrics.update_unfinished_work()
        self._schedule_unfinished_work_update()
