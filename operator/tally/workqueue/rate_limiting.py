"""The rate-limiting queue: a delaying queue whose retries a rate limiter spaces out
(client-go ``rate_limiting_queue.go``).

This module owns the glue between the delaying queue and a
:class:`~tally.workqueue.limiters.RateLimiter`: ``add_rate_limited`` asks the limiter how long
the item should wait and calls ``add_after`` with that; ``forget`` and ``num_requeues`` pass
through to the limiter. That is all it does; the back-off policy lives in ``limiters.py``.

This is the queue a controller uses. Its worker loop (``runner.py``) calls ``forget`` after a
successful sync and ``add_rate_limited`` after a failed one, so one broken item backs off on
its own and a broken controller cannot spin.

Left out: a default limiter hidden in the constructor; the caller passes one (usually
:func:`~tally.workqueue.limiters.default_controller_rate_limiter`) so the policy is visible
where the queue is built.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

from tally.workqueue import clock as clocks
from tally.workqueue import delaying, limiters
from tally.workqueue import metrics as queue_metrics

T = TypeVar("T", bound=Hashable)


class RateLimitingQueue(delaying.DelayingQueue[T]):
    """A :class:`~tally.workqueue.delaying.DelayingQueue` with rate-limited re-adds.

    Remember to call :meth:`forget`! An item that is never forgotten keeps its failure count
    in the limiter forever: it leaks memory, and its next failure, however much later, backs
    off as if the old ones had just happened.
    """

    def __init__(
        self,
        rate_limiter: limiters.RateLimiter[T],
        *,
        name: str = "",
        clock: clocks.Clock | None = None,
        metrics_provider: queue_metrics.MetricsProvider | None = None,
        unfinished_work_update_period: float = (
            queue_metrics.DEFAULT_UNFINISHED_WORK_UPDATE_PERIOD
        ),
    ) -> None:
        """Build a queue whose ``add_rate_limited`` delays come from ``rate_limiter``.

        ``clock`` drives the delays of the queue only; a limiter that reads time (the token
        bucket) takes its own clock, so give both the same fake clock in tests.
        """
        super().__init__(
            name=name,
            clock=clock,
            metrics_provider=metrics_provider,
            unfinished_work_update_period=unfinished_work_update_period,
        )
        self._rate_limiter = rate_limiter

    def add_rate_limited(self, item: T) -> None:
        """Add ``item`` after the delay the rate limiter gives (which counts one failure)."""
        self.add_after(item, self._rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Stop the rate limiter tracking ``item``, after success or when giving up on it.

        This only resets the back-off; the worker still has to call ``done``.
        """
        self._rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        """How many times ``item`` was re-added rate-limited since it was last forgotten."""
        return self._rate_limiter.num_requeues(item)
