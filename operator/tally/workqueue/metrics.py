"""Work queue metrics: what is measured, the provider protocol, a no-op default and Prometheus.

This module owns the bookkeeping behind client-go's ``util/workqueue/metrics.go``: how deep a
queue is, how many adds it took, how long items wait before a worker gets them, how long
workers take, how much work is in flight and unfinished, and how many retries the delaying
queue scheduled. The queue calls four hooks (``add``, ``get``, ``done``,
``update_unfinished_work``), the delaying queue one (``retry``); a :class:`MetricsProvider`
decides where the numbers go.

As in client-go, a queue without a name, or with the no-op provider, records nothing and does
no clock reads at all, so unnamed queues in tests cost nothing.

Lock rule. client-go's ``defaultQueueMetrics`` "expects the caller to lock before setting any
metrics". tally has no lock: every hook is called on the event loop, synchronously, from inside
a queue method that changes the queue's state with no ``await`` in between. That gives the same
guarantee (the metric and the queue state change together, and no two hooks interleave). Never
call these hooks from another thread. The Prometheus metric objects are thread-safe on their own,
so an exposition thread (``prometheus_client.start_http_server``) may read them at any time.

:class:`PrometheusMetricsProvider` produces the metric names and help texts of
``k8s.io/component-base/metrics/prometheus/workqueue``: ``workqueue_depth``,
``workqueue_adds_total``, ``workqueue_queue_duration_seconds``,
``workqueue_work_duration_seconds``, ``workqueue_unfinished_work_seconds``,
``workqueue_longest_running_processor_seconds`` and ``workqueue_retries_total``, each with one
label, ``name``. ``prometheus_client`` is imported only when that provider is built, so the
rest of the work queue does not depend on it.

Left out: client-go's process-wide ``SetProvider`` (a provider is passed to each queue instead,
so tests never share global state), and the deprecated microsecond metrics.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from tally.workqueue import clock as clocks

if TYPE_CHECKING:
    import prometheus_client

T = TypeVar("T", bound=Hashable)

#: How often the queue recomputes ``unfinished_work_seconds`` and
#: ``longest_running_processor_seconds`` (client-go's ``defaultUnfinishedWorkUpdatePeriod``).
#: Half a second is frequent enough for a scrape interval of seconds and costs one pass over the
#: in-flight items, which is at most the number of workers.
DEFAULT_UNFINISHED_WORK_UPDATE_PERIOD = 0.5

#: Buckets of both duration histograms: 10 ns to 10 s by powers of ten, as in component-base
#: (``ExponentialBuckets(10e-9, 10, 10)``), so dashboards built for Kubernetes controllers work.
DURATION_BUCKETS: tuple[float, ...] = tuple(10e-9 * 10**i for i in range(10))


class GaugeMetric(Protocol):
    """A value that goes up and down by one."""

    def inc(self) -> None: ...
    def dec(self) -> None: ...


class SettableGaugeMetric(Protocol):
    """A value that is set outright."""

    def set(self, value: float, /) -> None: ...


class CounterMetric(Protocol):
    """A value that only goes up."""

    def inc(self) -> None: ...


class HistogramMetric(Protocol):
    """A distribution of observed values."""

    def observe(self, value: float, /) -> None: ...


class MetricsProvider(Protocol):
    """Builds the metrics of one named queue; each method is called once per queue."""

    def new_depth_metric(self, name: str) -> GaugeMetric: ...
    def new_adds_metric(self, name: str) -> CounterMetric: ...
    def new_latency_metric(self, name: str) -> HistogramMetric: ...
    def new_work_duration_metric(self, name: str) -> HistogramMetric: ...
    def new_unfinished_work_seconds_metric(self, name: str) -> SettableGaugeMetric: ...
    def new_longest_running_processor_seconds_metric(self, name: str) -> SettableGaugeMetric: ...
    def new_retries_metric(self, name: str) -> CounterMetric: ...


class _NoopMetric:
    def inc(self) -> None:
        pass

    def dec(self) -> None:
        pass

    def set(self, value: float, /) -> None:
        pass

    def observe(self, value: float, /) -> None:
        pass


_NOOP_METRIC = _NoopMetric()


class NoopMetricsProvider:
    """The default provider: every metric is a no-op, and queues skip metrics entirely."""

    def new_depth_metric(self, name: str) -> GaugeMetric:
        return _NOOP_METRIC

    def new_adds_metric(self, name: str) -> CounterMetric:
        return _NOOP_METRIC

    def new_latency_metric(self, name: str) -> HistogramMetric:
        return _NOOP_METRIC

    def new_work_duration_metric(self, name: str) -> HistogramMetric:
        return _NOOP_METRIC

    def new_unfinished_work_seconds_metric(self, name: str) -> SettableGaugeMetric:
        return _NOOP_METRIC

    def new_longest_running_processor_seconds_metric(self, name: str) -> SettableGaugeMetric:
        return _NOOP_METRIC

    def new_retries_metric(self, name: str) -> CounterMetric:
        return _NOOP_METRIC


class QueueMetrics(Generic[T]):
    """The hooks a plain queue calls; this base class records nothing (client-go ``noMetrics``).

    ``enabled`` tells the queue whether to bother running the periodic unfinished-work update.
    """

    enabled = False

    def add(self, item: T) -> None:
        """An item became dirty and was queued (not called for collapsed adds)."""

    def get(self, item: T) -> None:
        """A worker took the item off the queue."""

    def done(self, item: T) -> None:
        """A worker finished the item."""

    def update_unfinished_work(self) -> None:
        """Recompute the in-flight gauges; called periodically while the queue runs."""


class DefaultQueueMetrics(QueueMetrics[T]):
    """Records queue metrics through a provider's metric objects (client-go
    ``defaultQueueMetrics``). Call only as the lock rule in the module docstring says."""

    enabled = True

    def __init__(self, name: str, provider: MetricsProvider, clock: clocks.Clock) -> None:
        self._clock = clock
        #: Current depth of the queue.
        self._depth = provider.new_depth_metric(name)
        #: Total number of adds handled.
        self._adds = provider.new_adds_metric(name)
        #: How long an item stays in the queue before a worker gets it.
        self._latency = provider.new_latency_metric(name)
        #: How long processing an item takes.
        self._work_duration = provider.new_work_duration_metric(name)
        #: Seconds of work in progress and not yet observed by ``work_duration``.
        self._unfinished_work_seconds = provider.new_unfinished_work_seconds_metric(name)
        #: Age of the longest-running item in progress.
        self._longest_running_processor = provider.new_longest_running_processor_seconds_metric(
            name
        )
        #: When each queued item was first added; an item re-added while queued keeps its
        #: first time, so latency measures the whole wait.
        self._add_times: dict[T, float] = {}
        #: When each in-flight item was handed to a worker.
        self._processing_start_times: dict[T, float] = {}

    def add(self, item: T) -> None:
        self._adds.inc()
        self._depth.inc()
        self._add_times.setdefault(item, self._clock.now())

    def get(self, item: T) -> None:
        now = self._clock.now()
        self._depth.dec()
        self._processing_start_times[item] = now
        start = self._add_times.pop(item, None)
        if start is not None:
            self._latency.observe(now - start)

    def done(self, item: T) -> None:
        start = self._processing_start_times.pop(item, None)
        if start is not None:
            self._work_duration.observe(self._clock.now() - start)

    def update_unfinished_work(self) -> None:
        # client-go notes that a summary would fit better, but Prometheus summaries cannot be
        # reset; two gauges are what every Kubernetes dashboard expects.
        now = self._clock.now()
        total = 0.0
        oldest = 0.0
        for start in self._processing_start_times.values():
            age = now - start
            total += age
            oldest = max(oldest, age)
        self._unfinished_work_seconds.set(total)
        self._longest_running_processor.set(oldest)


class RetryMetrics:
    """The hook the delaying queue calls for every ``add_after`` (client-go ``retryMetrics``)."""

    def __init__(self, retries: CounterMetric | None = None) -> None:
        self._retries = retries

    def retry(self) -> None:
        if self._retries is not None:
            self._retries.inc()


def new_queue_metrics(
    name: str, provider: MetricsProvider | None, clock: clocks.Clock
) -> QueueMetrics[T]:
    """Queue metrics for a queue called ``name``; nothing is recorded without a name or a
    real provider (client-go ``queueMetricsFactory.newQueueMetrics``)."""
    if not name or provider is None or isinstance(provider, NoopMetricsProvider):
        return QueueMetrics()
    return DefaultQueueMetrics(name, provider, clock)


def new_retry_metrics(name: str, provider: MetricsProvider | None) -> RetryMetrics:
    """Retry metrics for a queue called ``name``; a no-op without a name or a provider."""
    if not name or provider is None or isinstance(provider, NoopMetricsProvider):
        return RetryMetrics()
    return RetryMetrics(provider.new_retries_metric(name))


class PrometheusMetricsProvider:
    """Client-go-style ``workqueue_*`` metrics in a ``prometheus_client`` registry.

    Build one provider per registry and share it between all queues: the metric families are
    registered once, in the constructor, and each queue gets the children labelled with its
    ``name`` (registering the same family twice in one registry is an error in
    ``prometheus_client``). Queue names must be unique within the registry, or two queues add
    into the same series.
    """

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        # Imported here, not at the top: the queue itself must not depend on prometheus_client.
        import prometheus_client

        reg = prometheus_client.REGISTRY if registry is None else registry
        labels = ["name"]
        self._depth = prometheus_client.Gauge(
            "workqueue_depth", "Current depth of workqueue", labels, registry=reg
        )
        self._adds = prometheus_client.Counter(
            "workqueue_adds_total",
            "Total number of adds handled by workqueue",
            labels,
            registry=reg,
        )
        self._latency = prometheus_client.Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            labels,
            registry=reg,
            buckets=DURATION_BUCKETS,
        )
        self._work_duration = prometheus_client.Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            labels,
            registry=reg,
            buckets=DURATION_BUCKETS,
        )
        self._unfinished = prometheus_client.Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck threads. One can deduce the number of "
            "stuck threads by observing the rate at which this increases.",
            labels,
            registry=reg,
        )
        self._longest = prometheus_client.Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            labels,
            registry=reg,
        )
        self._retries = prometheus_client.Counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            labels,
            registry=reg,
        )

    def new_depth_metric(self, name: str) -> GaugeMetric:
        return self._depth.labels(name=name)

    def new_adds_metric(self, name: str) -> CounterMetric:
        return self._adds.labels(name=name)

    def new_latency_metric(self, name: str) -> HistogramMetric:
        return self._latency.labels(name=name)

    def new_work_duration_metric(self, name: str) -> HistogramMetric:
        return self._work_duration.labels(name=name)

    def new_unfinished_work_seconds_metric(self, name: str) -> SettableGaugeMetric:
        return self._unfinished.labels(name=name)

    def new_longest_running_processor_seconds_metric(self, name: str) -> SettableGaugeMetric:
        return self._longest.labels(name=name)

    def new_retries_metric(self, name: str) -> CounterMetric:
        return self._retries.labels(name=name)


if TYPE_CHECKING:
    # Compile-time checks, as client-go's `var _ Interface = &impl{}`.
    _noop: MetricsProvider = NoopMetricsProvider()
    _prometheus: MetricsProvider = PrometheusMetricsProvider()
