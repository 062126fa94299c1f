"""Time for tally's pure core: one ``Clock`` protocol, the real clock and a fake one.

This module owns the only place where the core learns what time it is and asks to be woken up
later. client-go passes a ``clock.WithTicker`` into its queues, and a ``clock.PassiveClock``
into its event correlator, "for testing purposes"; tally does the same with :class:`Clock`, so
the delaying queue, the token bucket, the queue metrics and the event recorder can all be
driven by a fake in tests. :class:`FakeClock` moves only when a test calls
:meth:`FakeClock.step` and never sleeps.

One protocol with two readings, because Python has no ``time.Time`` that carries both:

* :meth:`Clock.now` is ``float`` seconds on a monotonic scale, as everywhere in asyncio: what
  delays, deadlines and rates are measured on. Deadlines are absolute values on the clock's own
  scale; only differences between two readings of the same clock mean anything.
* :meth:`Clock.time_ns` is wall-clock nanoseconds since the Unix epoch: what Events carry
  (their timestamps, and the ``UnixNano`` in an aggregate's name). Only the event correlator
  reads it, and also measures its aggregation window and spam-filter refill on it, in integer
  nanoseconds as upstream's ``time.Time`` arithmetic does.

Why timers instead of a waiting loop: client-go's delaying queue runs a goroutine that selects
on a timer, a heartbeat and a channel of new entries. On a single asyncio event loop the same
effect needs no task at all: the delaying queue keeps one timer armed for its earliest deadline
(``call_at``), and the event loop (or the fake clock) calls it back. No task means nothing that
can die unwatched.

It lives in :mod:`tally.workqueue`, the bottom layer, so that every package above
(:mod:`tally.machinery` included) can take one.

Left out: tickers (the one periodic job, the unfinished-work metric, re-arms a timer), sleeping
(callers that sleep take an injectable ``sleep``), and thread safety (everything runs on one
loop).
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
    """Where the pure core reads the time and schedules wake-ups."""

    def now(self) -> float:
        """Monotonic time in seconds."""

    def time_ns(self) -> int:
        """Wall-clock time in nanoseconds since the Unix epoch (``time.time_ns``)."""

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Call ``callback`` once, as soon as ``now() >= when``.

        The callback runs on the event loop (or inside :meth:`FakeClock.step`), never inside
        this call, even when ``when`` is already in the past.
        """


class RealClock:
    """The monotonic and wall clocks, with callbacks scheduled on the running asyncio event loop.

    ``call_at`` must be called with a running loop (from a coroutine or a loop callback). The
    deadline is converted to a delay from ``now()`` before it is handed to the loop, so the
    loop's own time base (which a test plugin such as looptime may fake) does not have to match
    ``time.monotonic()``.
    """

    def now(self) -> float:
        return time.monotonic()

    def time_ns(self) -> int:
        return time.time_ns()

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

    Its wall clock is its own time read as seconds since the Unix epoch: both readings move
    together, and ``FakeClock()`` starts at the epoch.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        # (deadline, sequence, timer): the sequence keeps ties in scheduling order.
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._sequence = itertools.count()

    def now(self) -> float:
        return self._now

    def time_ns(self) -> int:
        return round(self._now * 1_000_000_000)

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
