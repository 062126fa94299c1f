"""The token bucket: ``golang.org/x/time/rate``'s ``Limiter`` for one event loop.

This module owns tally's one token-bucket arithmetic. Three upstream users share it, each
through the ``rate.Limiter`` method it calls:

* the work queue's overall retry limit (:class:`tally.workqueue.limiters.BucketRateLimiter`,
  client-go's ``BucketRateLimiter``): :meth:`TokenBucket.reserve`, ``Reserve().Delay()``;
* the PodSet client's client-side QPS limit (``flowcontrol.NewTokenBucketRateLimiter``, which
  ``tally.podset.client.token_bucket`` builds from the settings): :meth:`TokenBucket.wait`;
* the event correlator's spam filter (``flowcontrol.NewTokenBucketPassiveRateLimiter`` in
  :mod:`tally.machinery.correlator`): :meth:`TokenBucket.allow`, ``AllowN(now, 1)``.

The model, as upstream: the bucket holds at most ``burst`` tokens and gains ``qps`` a second;
it starts full. Tokens are counted lazily: the bucket remembers how many it held at the last
take, and when, and adds what accrued since whenever it is asked again. ``reserve`` always
takes a token, borrowing it from the future when the bucket is empty (the count goes negative),
and answers how long until that token exists; so callers served one after another are spaced
exactly ``1/qps`` apart. ``allow`` takes a token only if one is there now, and changes nothing
otherwise.

Times come from an injectable :class:`~tally.workqueue.clock.Clock` (``now()``, seconds), or
are passed in, as ``rate.Limiter``'s ``*N(t, n)`` methods take them. Passed-in times may be on a
finer scale than seconds, given by ``per_second``: the spam filter passes wall-clock
nanoseconds (``per_second=1e9``), so that its arithmetic is upstream's to the nanosecond.

Left out: taking more than one token at once, ``SetLimit``/``SetBurst``, an infinite limit,
cancelling a reservation (a cancelled :meth:`TokenBucket.wait` keeps its token: at worst one is
lost per cancellation), and the refusal ``Reserve`` gives when ``burst`` is below 1 (callers
that reserve check ``burst`` themselves). Thread safety: everything runs on one loop, so
upstream's mutex is not needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tally.workqueue import clock as clocks


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` saved; starts full (``rate.NewLimiter``)."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: clocks.Clock | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        per_second: float = 1.0,
    ) -> None:
        """``clock`` is read (``now()``, seconds) by :meth:`reserve`, :meth:`allow` and
        :meth:`wait` when no time is passed in; ``sleep`` is what :meth:`wait` sleeps with.
        ``per_second`` is how many units of the passed-in times make a second: a bucket built
        with anything but 1.0 must be given every time, never read the clock."""
        self.qps = qps
        self.burst = burst
        self._clock: clocks.Clock = clock if clock is not None else clocks.RealClock()
        self._sleep = sleep
        self._per_second = per_second
        #: Tokens in the bucket at ``_last``; negative while tokens are borrowed in advance.
        #: Never more than ``burst``.
        self._tokens = float(burst)
        #: When a token was last taken; ``None`` before the first (Go's zero time, which
        #: fills the bucket to ``burst``).
        self._last: float | None = None

    def _advance(self, now: float) -> float:
        """The tokens the bucket holds at ``now`` (``advance``): those at the last take plus
        what accrued since, up to ``burst``. A ``now`` before the last take accrues nothing."""
        if self._last is None:
            return float(self.burst)
        last = min(self._last, now)
        return min(float(self.burst), self._tokens + (now - last) / self._per_second * self.qps)

    def reserve(self, now: float | None = None) -> float:
        """Take one token at ``now`` (default: the clock's), borrowing it if there is none, and
        return the seconds until it exists: 0 when it was there (``Reserve().Delay()``)."""
        if now is None:
            now = self._clock.now()
        self._tokens = self._advance(now) - 1
        self._last = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def allow(self, now: float | None = None) -> bool:
        """Take one token at ``now`` (default: the clock's) if there is one; False, and nothing
        taken, otherwise (``AllowN(now, 1)``)."""
        if now is None:
            now = self._clock.now()
        tokens = self._advance(now) - 1
        # Go's wait is a Duration, whole nanoseconds, truncated: a deficit worth less than 1 ns
        # is no wait at all.
        wait_ns = int(1e9 * (-tokens / self.qps)) if tokens < 0 else 0
        if self.burst < 1 or wait_ns > 0:
            return False
        self._tokens = tokens
        self._last = now
        return True

    async def wait(self) -> None:
        """Reserve a token now and sleep until it exists (``flowcontrol``'s ``Accept``, or
        ``Wait`` without a context): callers that wait together are served in call order,
        ``1/qps`` apart."""
        delay = self.reserve()
        if delay > 0:
            await self._sleep(delay)
