"""A controller's full resync, spread over its period: :class:`SpreadResync`.

This module owns the periodic "enqueue every key" that upstream controllers run (the quota
controller's informer resync, ``enqueueAll``). Upstream enqueues every key at one instant, once
per period. With 10 000 quotas that is 10 000 syncs at once every five minutes; most write
nothing, so they never suspend, and on tally's one event loop they compete with the webhook's
reviews and the watches for as long as the burst lasts (a create's p99 went from a few hundred
milliseconds to almost 2 s at 5 000 quotas while one ran).

Here each round takes the keys as they are when it starts and hands them to the queue evenly
over the period, a slice every ``tick`` seconds; the next round starts one period after this
one started. So every key is still enqueued once per period, at the same phase of each round
(the order of ``keys()``, stable while the keys are), and a status someone else edited is
corrected within a period and a tick, as upstream's within a period and the burst's length. The
first round starts one period after :meth:`SpreadResync.start`, as upstream's first resync
does: the start-up has just synced every key.

Built on :class:`~tally.workqueue.clock.Clock` timers, as the delaying queue is: no task, so
nothing that can die unwatched, and a :class:`~tally.workqueue.clock.FakeClock` steps it in
tests. A round whose ``keys`` or ``enqueue`` raises is logged and given up; the next round
comes as planned.

Left out: keys added during a round wait for the next one (a new object is synced when it
arrives, by its own event), and keys deleted during a round are still handed out (a sync of a
key that is gone finds nothing, as after any deletion).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from tally.workqueue import clock as clocks

K = TypeVar("K", bound=Hashable)

DEFAULT_TICK_S = 1.0
"""How often a round hands the queue its next slice: at 10 000 keys and 300 s, 34 keys a
second. Shorter periods tick at a tenth of the period, so a round still has ten slices."""


def due(count: int, elapsed: float, period: float) -> int:
    """How many of a round's ``count`` keys are due ``elapsed`` seconds into a round spread
    over ``period`` seconds: the share of the period gone, rounded up, so that the first key
    goes at once and the last one by the end of the period."""
    if elapsed <= 0:
        return 0 if count == 0 else 1
    if elapsed >= period:
        return count
    return min(count, math.ceil(count * elapsed / period))


class SpreadResync(Generic[K]):
    """Calls ``enqueue(key)`` for every key of ``keys()`` once per ``period`` seconds, spread
    evenly over the period (see the module docstring), from :meth:`start` until :meth:`stop`."""

    def __init__(
        self,
        keys: Callable[[], Iterable[K]],
        enqueue: Callable[[K], None],
        period: float,
        *,
        name: str,
        logger: logging.Logger,
        tick: float | None = None,
        clock: clocks.Clock | None = None,
    ) -> None:
        if period <= 0:
            raise ValueError(f"period must be positive, got {period}")
        self.keys = keys
        self.enqueue = enqueue
        self.period = period
        self.tick = tick if tick is not None else min(DEFAULT_TICK_S, period / 10)
        if self.tick <= 0:
            raise ValueError(f"tick must be positive, got {self.tick}")
        self.name = name
        self._logger = logger
        self._clock: clocks.Clock = clock if clock is not None else clocks.RealClock()
        self._timer: clocks.TimerHandle | None = None
        self._round_start = 0.0
        self._round: list[K] | None = None
        """The keys of the round under way, in order; None between rounds."""
        self._sent = 0
        """How many of them have been enqueued."""
        self.rounds = 0
        """Rounds begun (for tests and logs)."""

    @property
    def running(self) -> bool:
        return self._timer is not None

    def start(self) -> None:
        """Schedule the first round one period from now."""
        if self._timer is not None:
            raise RuntimeError(f"{self.name} already started")
        self._round_start = self._clock.now() + self.period
        self._round = None
        self._timer = self._clock.call_at(self._round_start, self._fire)

    async def stop(self) -> None:
        """Cancel what is scheduled; a round under way ends where it is."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._round = None

    def _fire(self) -> None:
        if self._timer is None:
            return  # stopped after this callback was scheduled
        now = self._clock.now()
        if self._round is None and now - self._round_start > self.tick:
            # The loop stalled past this round's start: the round starts now and is spread as
            # usual, rather than handing out at once what it would have spread so far.
            self._round_start = now
        try:
            self._advance(now)
        except Exception:
            self._logger.exception(
                "%s: round %d failed after %d keys; the next round starts as planned",
                self.name,
                self.rounds,
                self._sent,
            )
            self._round = None
        if self._round is None:
            self._round_start += self.period
            wake = self._round_start
        else:
            wake = min(now + self.tick, self._round_start + self.period)
        self._timer = self._clock.call_at(wake, self._fire)

    def _advance(self, now: float) -> None:
        if self._round is None:
            self.rounds += 1
            self._sent = 0
            self._round = list(self.keys())
            self._logger.debug("%s: round %d of %d keys", self.name, self.rounds, len(self._round))
        keys = self._round
        target = due(len(keys), now - self._round_start, self.period)
        while self._sent < target:
            key = keys[self._sent]
            self._sent += 1
            self.enqueue(key)
        if self._sent >= len(keys):
            self._round = None
