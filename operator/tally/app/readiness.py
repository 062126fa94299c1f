"""Whether this replica should be sent reviews: what ``GET /readyz`` answers the kubelet.

**Why the webhook port being open is not enough.** A replica opens its webhook port once its
caches are synced, but Kopf's watches start only after that, each with a listing of its own,
and every listed object goes through Kopf's per-event machinery on the one event loop that also
answers reviews (at 30 000 pods, about 85 s of one core; ``docs/performance.md``). A review
sent meanwhile waits behind that replay. So the replica reports ready only once its loop is
prompt: a timer set every :data:`SAMPLE_INTERVAL_S` fired at most ``TALLY_READINESS_MAX_LOOP_LAG``
late, every time, for ``TALLY_READINESS_WINDOW`` seconds in a row since the webhook serves.
How late a timer fires is how long anything ready to run waits for its turn, a review's next
step included; it is what the loop's load costs an answer, whatever the load is.

**After the start-up re-list.** Kopf's watches list every kind after tally's own LISTs, and
what was deleted in between is reported by neither, so every kind is listed once more about
30 s after the start (:mod:`tally.machinery.informers`). At 10 000 pods that re-list is about
3 s of the loop's time; a replica ready before it would take reviews into it. The runtime
passes that work as ``pending``: the window starts only once no start-up re-list is scheduled
or under way, so no replica is ready sooner than about 35 s after its start (the re-list's
30 s, then the window).

**After Kopf's listings.** A prompt loop alone can mislead at scale: the replay is no steady
load (the API server sends each listing at its own pace, and the loop may wait for the next
part of it). At 150 000 pods a 5 s window came in a pause while the listings were still
arriving (the loop was still busy 30 s later), and creates judged after it waited up to 3.4 s.
So ``pending`` also holds until every object the caches held when the watches began has been
delivered again by Kopf, or is gone (:class:`tally.machinery.informers.ListingReplay`),
whatever pauses come between.

**Latched.** Once ready, a replica stays ready while it serves. Readiness decides where a
Service sends reviews. Taking a serving replica out under a burst would send its share to the
others, and in a one-replica deployment leave no endpoint: with ``failurePolicy: Fail`` every
create the webhook judges would then be refused, which is worse than a slow answer. Load after
the start is admission's to absorb (its lanes, its limits), not the probe's. A stop (SIGTERM)
makes it unready at once.

**Bounded.** A replica that would never be ready leaves the webhook without endpoints, so it
reports ready anyway, with a warning: when its start-up work made no progress for
``TALLY_READINESS_TIMEOUT`` seconds (a watch that never lists; a listing still arriving is
progress, however long it takes at scale), or when its loop never quietened for that long
after the start-up work was done (a cluster whose steady load keeps it late).

Every lag is observed (``tally_event_loop_lag_seconds``), so a dashboard shows how late the
loop runs at any time, not only at the start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from aiohttp import web

from tally.workqueue.tasks import cancel_and_wait, start_watched

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL_S: Final = 0.1
"""How often the loop's lag is sampled: often enough that a 5 s window holds 50 samples; one
sleeping task, which costs the loop nothing measurable."""


class Readiness:
    """The replica's readiness, from the moments it is told (:meth:`serving`,
    :meth:`stopping`) and the loop lags it observes (:meth:`observe`); times are the event
    loop's clock (``loop.time()``), passed in so that the decision is plain data."""

    def __init__(
        self,
        *,
        max_lag: float,
        window: float,
        timeout: float,
        on_lag: Callable[[float], None] | None = None,
        pending: Callable[[], str | None] | None = None,
    ) -> None:
        """``pending``: start-up work still to come on the loop, as a reason (None when there
        is none); the window starts only once it is done."""
        if not 0 < window <= timeout:
            raise ValueError(f"window ({window} s) must be positive and at most the timeout "
                             f"({timeout} s)")  # fmt: skip
        self.max_lag = max_lag
        self.window = window
        self.timeout = timeout
        self._on_lag = on_lag
        self._pending = pending
        self._pending_at: float | None = None
        """The last check that found start-up work pending."""
        self._waiting_for: str | None = None
        """What that check found pending."""
        self._progress_at: float | None = None
        """The last check that found the pending work moved on (another reason)."""
        self._serving_since: float | None = None
        self._late: tuple[float, float] | None = None
        """(when, how late) of the last sample over ``max_lag``."""
        self._ready = False
        self._stopping = False

    def serving(self, now: float) -> None:
        """The webhook serves from synced caches (or, with the webhook off, the caches are
        synced): the window starts."""
        if self._serving_since is None:
            self._serving_since = now

    def stopping(self) -> None:
        """The process stops: unready from now on, so that the endpoint leaves the Service."""
        self._stopping = True

    def observe(self, lag: float, now: float) -> None:
        """A timer fired ``lag`` seconds late at ``now``."""
        if self._on_lag is not None:
            self._on_lag(lag)
        if lag > self.max_lag:
            self._late = (now, lag)
        self.check(now)

    def check(self, now: float) -> tuple[bool, str]:
        """(ready, why): what ``/readyz`` answers at ``now``."""
        if self._stopping:
            return False, "stopping"
        if self._ready:
            return True, "ok"
        since = self._serving_since
        if since is None:
            return False, "starting: the caches are not synced yet, the webhook does not serve"
        late_at, lag = self._late if self._late is not None else (since, 0.0)
        waiting_for = self._pending() if self._pending is not None else None
        if waiting_for is not None:
            if self._waiting_for is not None and waiting_for != self._waiting_for:
                self._progress_at = now
            self._waiting_for = waiting_for
            self._pending_at = now
        pending_at = since if self._pending_at is None else self._pending_at
        progress_at = since if self._progress_at is None else max(since, self._progress_at)
        prompt_for = now - max(since, late_at, pending_at)
        if prompt_for >= self.window:
            self._ready = True
            logger.info(
                "ready: the event loop ran at most %.3f s late for %.1f s (%.1f s after the "
                "webhook began to serve)", self.max_lag, self.window, now - since,
            )  # fmt: skip
            return True, "ok"
        if waiting_for is not None and now - progress_at >= self.timeout:
            self._ready = True
            logger.warning(
                "ready with start-up work still pending: it made no progress for %.0f s "
                "(%.0f s after the webhook began to serve), %s", self.timeout, now - since,
                waiting_for,
            )  # fmt: skip
            return True, "ok"
        if waiting_for is None and now - max(since, pending_at) >= self.timeout:
            self._ready = True
            logger.warning(
                "ready without a prompt event loop: %.0f s after the start-up work was done "
                "(%.0f s after the webhook began to serve), a timer still fired %.3f s late "
                "%.1f s ago (TALLY_READINESS_MAX_LOOP_LAG %.3f s); reviews may wait that long",
                self.timeout, now - since, lag, now - late_at, self.max_lag,
            )  # fmt: skip
            return True, "ok"
        if waiting_for is not None:
            return False, f"starting: {waiting_for}"
        if lag > self.max_lag:
            return False, (
                f"starting: the event loop ran {lag:.3f} s late {now - late_at:.1f} s ago "
                f"(ready after {self.window:g} s at most {self.max_lag:g} s late)"
            )
        return False, (
            f"starting: the webhook serves since {now - since:.1f} s (ready after "
            f"{self.window:g} s with the event loop at most {self.max_lag:g} s late)"
        )


async def sample_loop_lag(
    observe: Callable[[float, float], None], interval: float = SAMPLE_INTERVAL_S
) -> None:
    """Forever: sleep ``interval``, and tell ``observe(lag, now)`` how late the wake-up was."""
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(interval)
        now = loop.time()
        observe(max(0.0, now - before - interval), now)


class ReadinessEndpoint:
    """``GET /readyz`` over plain HTTP, with the loop-lag sampler beside it.

    Plain HTTP to anyone, as controller-runtime's health probes: the kubelet probes without
    credentials, and the answer says nothing about any tenant (``ok``, or why not yet)."""

    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None

    async def start(self, addr: str, port: int) -> None:
        """Sample the loop's lag, and serve ``/readyz`` on ``addr:port`` (port 0: only the
        lag is sampled, for the metric)."""
        loop = asyncio.get_running_loop()
        if port:
            await self._serve(loop, addr, port)
        self._sampler = start_watched(
            sample_loop_lag(self.readiness.observe), name="loop-lag-sampler", logger=logger
        )

    async def _serve(self, loop: asyncio.AbstractEventLoop, addr: str, port: int) -> None:

        async def readyz(_: web.Request) -> web.Response:
            ready, why = self.readiness.check(loop.time())
            return web.Response(status=200 if ready else 503, text=why + "\n")

        app = web.Application()
        app.add_routes([web.get("/readyz", readyz)])
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, addr, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        logger.info("serving readiness at http://%s:%d/readyz", addr, port)

    async def stop(self) -> None:
        sampler, self._sampler = self._sampler, None
        await cancel_and_wait(sampler)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
