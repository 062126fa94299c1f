"""Time for the work queue: a two-method ``Clock`` protocol, the real clock and a fake one.

This module owns the only place where the work queue learns what time it is and asks to be woken
up later. client-go passes a ``clock.WithTicker`` into its queues "for testing purposes"; tally
does the same with :class:`Clock`, so the delaying queue, the token bucket and the queue metrics
can all be driven by :class:`FakeClock` in tests, which moves only when a test calls
:meth:`FakeClock.step` and never sleeps.

Why timers instead of a waiting loop: client-go's delaying queue runs a goroutine that selects
on a timer, a heartbeat and a channel of new entries. On a single asyncio event loop the same
effect needs no task at all: the delaying queue keeps one timer armed for its earliest deadline
(``call_at``), and the event loop (or the fake clock) calls it back. No task means nothing that
can die unwatched.

Times are ``float`` seconds on a monotonic scale, as everywhere in asyncio. Deadlines are
absolute values on the clock's own scale; only differences between two readings of the same
clock mean anything.

Left out: wall-clock time (nothing here needs dates), tickers (the one periodic job, the
unfinished-work metric, re-arms a timer), and thread safety (everything runs on one loop).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled; ``asyncio.TimerHandle`` is one."""

    def cancel(self) -> None:
        """Stop the callback from running; a no-op if it already ran or was cancelled."""


class Clock(Protocol):
    """Where the work queue reads the time and schedules wake-ups."""

    def now(self) -> float:
        """Monotonic time in seconds."""

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Call ``callback`` once, as soon as ``now() >= when``.

        The callback runs on the event loop (or inside :meth:`FakeClock.step`), never inside
        this call, even when ``when`` is already in the past.
        """


class RealClock:
    """The monotonic clock, with callbacks scheduled on the running asyncio event loop.

    ``call_at`` must be called with a running loop (from a coroutine or a loop callback). The
    deadline is converted to a delay from ``now()`` before it is handed to the loop, so the
    loop's own time base (which a test plugin such as looptime may fake) does not have to match
    ``time.monotonic()``.
    """

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - self.now()), callback)


class _FakeTimer:
    """One callback scheduled on a :class:`FakeClock`."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that moves only when told to, for tests (k8s.io/utils/clock/testing).

    :meth:`step` advances the time and runs every due callback synchronously, earliest deadline
    first (ties in scheduling order), including callbacks scheduled by those callbacks if they
    are due too. Nothing ever sleeps, so a test of a 1000 s back-off runs in microseconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        # (deadline, sequence, timer): the sequence keeps ties in scheduling order.
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._sequence = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        timer = _FakeTimer(callback)
        heapq.heappush(self._timers, (when, next(self._sequence), timer))
        return timer

    def has_waiters(self) -> bool:
        """Whether any callback is still scheduled (client-go's ``FakeClock.HasWaiters``)."""
        return any(not timer.cancelled for _, _, timer in self._timers)

    def step(self, delta: float) -> None:
        """Advance the time by ``delta`` seconds and run the callbacks that fall due."""
        self.set_time(self._now + delta)

    def set_time(self, now: float) -> None:
        """Jump to ``now`` and run the callbacks that fall due (time never goes back)."""
        self._now = max(self._now, now)
        while self._timers and self._timers[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.cancelled = True
                timer.callback()
