"""tally's work queue: client-go's ``util/workqueue`` for one asyncio event loop.

This package is part of tally's pure core. It imports none of ``kopf``, ``kubernetes_asyncio``
or ``pydantic``, starts no thread, and needs no cluster. ``prometheus_client`` is imported only
when a :class:`PrometheusMetricsProvider` is built.

Being the bottom layer, it also holds the three pieces every layer above shares: the clock,
the token bucket and the watched task, so that each exists once.

One concern per module, each building on the one before, as the client-go interfaces do:

* ``clock``: the injectable :class:`Clock` (the whole pure core's), and :class:`FakeClock`
  for tests;
* ``tasks``: :func:`start_watched`, a task whose unexpected end is logged (for every layer);
* ``tokenbucket``: the :class:`TokenBucket` (``golang.org/x/time/rate``) every rate limit in
  tally is built on;
* ``queue``: the plain :class:`Queue` (fair, stingy, re-adds during processing, shutdown);
* ``delaying``: :class:`DelayingQueue` adds ``add_after``;
* ``limiters``: the :class:`RateLimiter` protocol and its implementations;
* ``rate_limiting``: :class:`RateLimitingQueue` adds ``add_rate_limited``, ``forget`` and
  ``num_requeues``;
* ``metrics``: client-go-style queue metrics, a no-op default and a Prometheus provider;
* ``runner``: :class:`WorkerPool`, the sample-controller worker loop as guarded tasks;
* ``resync``: :class:`SpreadResync`, a controller's full resync spread over its period.

This module only re-exports the names controllers use. Inside the package, modules import
each other as modules and use qualified names; this file is the one exception.
"""

from tally.workqueue.clock import Clock, FakeClock, RealClock
from tally.workqueue.delaying import DelayingQueue
from tally.workqueue.limiters import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    default_controller_rate_limiter,
)
from tally.workqueue.metrics import MetricsProvider, NoopMetricsProvider, PrometheusMetricsProvider
from tally.workqueue.queue import Queue, ShutDown
from tally.workqueue.rate_limiting import RateLimitingQueue
from tally.workqueue.resync import SpreadResync
from tally.workqueue.runner import DEFAULT_STOP_TIMEOUT, WorkerPool
from tally.workqueue.tasks import start_watched
from tally.workqueue.tokenbucket import TokenBucket

__all__ = [
    "DEFAULT_STOP_TIMEOUT",
    "BucketRateLimiter",
    "Clock",
    "DelayingQueue",
    "FakeClock",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "MetricsProvider",
    "NoopMetricsProvider",
    "PrometheusMetricsProvider",
    "Queue",
    "RateLimiter",
    "RateLimitingQueue",
    "RealClock",
    "ShutDown",
    "SpreadResync",
    "TokenBucket",
    "WorkerPool",
    "default_controller_rate_limiter",
    "start_watched",
]
