"""The delaying queue: a plain work queue plus ``add_after`` (client-go ``delaying_queue.go``).

This module owns delayed adds: an item handed to ``add_after`` waits, outside the queue, until
its deadline and is then added like any other. Controllers use it to retry after a failure
without a hot loop, and to schedule periodic work (a full resync).

Rules, as in client-go: a delay of zero or less adds at once; while an item waits, another
``add_after`` of the same item keeps whichever deadline is earlier (so a long back-off never
delays a fresh, sooner request); items falling due at once are added in deadline order; and
waiting items are dropped at shutdown.

Built differently from client-go, on purpose: client-go runs a ``waitingLoop`` goroutine fed
through a buffered channel and woken by a timer and a 10 s heartbeat ("insurance against weird
things happening"). Here ``add_after`` puts the entry straight into a heap, and one timer,
scheduled through the injected :class:`~tally.workqueue.clock.Clock`, is kept armed for the
earliest deadline. There is no task that could die unwatched, no channel that could fill up,
and nothing for a heartbeat to rescue, so there is none. Tests step a
:class:`~tally.workqueue.clock.FakeClock` and see items land synchronously.

Left out: ``NewDelayingQueueWithCustomQueue`` (the delaying queue is a subclass, not a wrapper).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import TypeVar

from tally.workqueue import clock as clocks
from tally.workqueue import metrics as queue_metrics
from tally.workqueue import queue

T = TypeVar("T", bound=Hashable)


class DelayingQueue(queue.Queue[T]):
    """A :class:`~tally.workqueue.queue.Queue` that can also add an item after a delay.

    Every promise of the plain queue holds; delayed items join it when their deadline passes.
    With the default :class:`~tally.workqueue.clock.RealClock`, ``add_after`` with a positive
    delay must run on the event loop (a coroutine or a loop callback), which arms the timer.
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
        """Build a delaying queue; ``clock`` schedules the deadlines (a fake one in tests)."""
        super().__init__(
            name=name,
            clock=clock,
            metrics_provider=metrics_provider,
            unfinished_work_update_period=unfinished_work_update_period,
        )
        self._retry_metrics = queue_metrics.new_retry_metrics(name, metrics_provider)
        #: Entries waiting for their deadline: ``(ready_at, sequence, item)``. The sequence
        #: breaks ties in insertion order. An entry is live only while ``_waiting[item]`` is its
        #: ``(ready_at, sequence)``; superseded entries stay in the heap and are skipped.
        self._heap: list[tuple[float, int, T]] = []
        #: The live deadline of each waiting item; each item waits at most once.
        self._waiting: dict[T, tuple[float, int]] = {}
        self._sequence = itertools.count()
        #: The one timer, armed for ``_timer_at``, the earliest live deadline; ``None`` when
        #: nothing waits.
        self._timer: clocks.TimerHandle | None = None
        self._timer_at: float | None = None

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` once ``delay`` seconds have passed; at once if ``delay <= 0``.

        If the item is already waiting, the earlier of the two deadlines wins. Ignored after
        shutdown. Counts as a retry in the ``workqueue_retries_total`` metric.
        """
        if self.shutting_down:
            return
        self._retry_metrics.retry()
        if delay <= 0:
            self.add(item)
            return
        ready_at = self._clock.now() + delay
        existing = self._waiting.get(item)
        if existing is not None and existing[0] <= ready_at:
            return  # The earlier deadline wins.
        key = (ready_at, next(self._sequence))
        self._waiting[item] = key
        heapq.heappush(self._heap, (*key, item))
        self._arm_timer()

    def shut_down(self) -> None:
        """See :meth:`Queue.shut_down`; also drops every item still waiting for its deadline."""
        super().shut_down()
        self._stop_waiting()

    async def shut_down_with_drain(self) -> None:
        """See :meth:`Queue.shut_down_with_drain`; waiting items are dropped first."""
        # No await separates these two steps, so no add_after can slip in between them.
        self._stop_waiting()
        await super().shut_down_with_drain()

    def _stop_waiting(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None
        self._heap.clear()
        self._waiting.clear()

    def _drop_stale_head(self) -> None:
        while self._heap:
            ready_at, sequence, item = self._heap[0]
            if self._waiting.get(item) == (ready_at, sequence):
                return
            heapq.heappop(self._heap)

    def _arm_timer(self) -> None:
        """Keep exactly one timer, set for the earliest live deadline."""
        self._drop_stale_head()
        ready_at = self._heap[0][0] if self._heap else None
        if ready_at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = ready_at
        if ready_at is not None:
            self._timer = self._clock.call_at(ready_at, self._on_timer)

    def _on_timer(self) -> None:
        """Add every item whose deadline has passed, earliest first, then re-arm."""
        self._timer = None
        self._timer_at = None
        if self.shutting_down:
            return
        now = self._clock.now()
        while self._heap:
            ready_at, sequence, item = self._heap[0]
            if ready_at > now:
                break
            heapq.heappop(self._heap)
            if self._waiting.get(item) == (ready_at, sequence):
                del self._waiting[item]
                self.add(item)
        self._arm_timer()
