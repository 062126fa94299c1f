"""Work queue metrics: what the queue records, when, and how Prometheus exposes it.

Ported from client-go ``util/workqueue/metrics_test.go`` (``TestMetrics``,
``TestMetricShutdown``) with a recording provider and a fake clock, plus checks of the
Prometheus provider's names and labels in a private registry. Named ``test_workqueue_metrics``
so it cannot clash with other ``test_metrics.py`` files under ``tests/``.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tally.workqueue import clock as clocks
from tally.workqueue import delaying, queue
from tally.workqueue import metrics as wq_metrics

pytestmark = pytest.mark.unit

US = 1e-6


class RecordingMetric:
    """client-go's ``testMetric``: counts incs and decs, keeps the last set and observation."""

    def __init__(self) -> None:
        self.inc_count = 0
        self.dec_count = 0
        self.set_value = 0.0
        self.set_count = 0
        self.observed_value = 0.0
        self.observed_count = 0

    def inc(self) -> None:
        self.inc_count += 1

    def dec(self) -> None:
        self.dec_count += 1

    def set(self, value: float, /) -> None:
        self.set_value = value
        self.set_count += 1

    def observe(self, value: float, /) -> None:
        self.observed_value = value
        self.observed_count += 1

    def gauge_value(self) -> float:
        return self.set_value if self.set_count else float(self.inc_count - self.dec_count)


class RecordingProvider:
    """client-go's ``testMetricsProvider``: one recording metric per kind."""

    def __init__(self) -> None:
        self.depth = RecordingMetric()
        self.adds = RecordingMetric()
        self.latency = RecordingMetric()
        self.duration = RecordingMetric()
        self.unfinished = RecordingMetric()
        self.longest = RecordingMetric()
        self.retries = RecordingMetric()

    def new_depth_metric(self, name: str) -> wq_metrics.GaugeMetric:
        return self.depth

    def new_adds_metric(self, name: str) -> wq_metrics.CounterMetric:
        return self.adds

    def new_latency_metric(self, name: str) -> wq_metrics.HistogramMetric:
        return self.latency

    def new_work_duration_metric(self, name: str) -> wq_metrics.HistogramMetric:
        return self.duration

    def new_unfinished_work_seconds_metric(self, name: str) -> wq_metrics.SettableGaugeMetric:
        return self.unfinished

    def new_longest_running_processor_seconds_metric(
        self, name: str
    ) -> wq_metrics.SettableGaugeMetric:
        return self.longest

    def new_retries_metric(self, name: str) -> wq_metrics.CounterMetric:
        return self.retries


# client-go: TestMetrics
async def test_metrics() -> None:
    provider = RecordingProvider()
    clock = clocks.FakeClock()
    q: queue.Queue[str] = queue.Queue(
        name="test", clock=clock, metrics_provider=provider, unfinished_work_update_period=1e-3
    )

    q.add("foo")
    assert 1.0 == provider.adds.gauge_value()
    assert 1.0 == provider.depth.gauge_value()

    clock.step(50 * US)
    item = await q.get()  # start processing
    assert "foo" == item
    assert 50 * US == pytest.approx(provider.latency.observed_value)
    assert 1 == provider.latency.observed_count

    for _ in range(5):  # add it back while processing; multiple adds are de-duped
        q.add(item)
    assert 2.0 == provider.adds.gauge_value()
    assert 1.0 == provider.depth.gauge_value()  # one thing remains in the queue

    clock.step(25 * US)
    q.done(item)  # finish it up
    assert 25 * US == pytest.approx(provider.duration.observed_value)
    assert 1 == provider.duration.observed_count
    assert 1.0 == provider.depth.gauge_value()  # one thing remains in the queue

    item = await q.get()  # it should be back on the queue
    assert "foo" == item
    assert 25 * US == pytest.approx(provider.latency.observed_value)
    assert 2 == provider.latency.observed_count

    # The periodic update runs on the clock: 1 ms after the item was handed out it has been
    # running 1 ms, the only and longest one in flight.
    updates = provider.unfinished.set_count
    clock.step(1e-3)
    assert updates < provider.unfinished.set_count
    assert 1e-3 == pytest.approx(provider.unfinished.gauge_value())
    assert 1e-3 == pytest.approx(provider.longest.gauge_value())

    q.done(item)  # finish that one up
    assert 1e-3 == pytest.approx(provider.duration.observed_value)
    assert 2 == provider.duration.observed_count
    q.shut_down()


# client-go: TestMetricShutdown
def test_no_unfinished_work_update_after_shutdown() -> None:
    provider = RecordingProvider()
    clock = clocks.FakeClock()
    q: queue.Queue[str] = queue.Queue(
        name="test", clock=clock, metrics_provider=provider, unfinished_work_update_period=1e-3
    )
    q.add("foo")
    clock.step(1e-3)
    assert 1 == provider.unfinished.set_count

    q.shut_down()
    clock.step(3600)
    assert 1 == provider.unfinished.set_count, "unexpected update after shutdown"
    assert not clock.has_waiters()


# client-go newQueueMetrics: no name, or the no-op provider, means no metrics and no timer.
@pytest.mark.parametrize(
    ("name", "provider"),
    [
        pytest.param("", RecordingProvider(), id="unnamed"),
        pytest.param("test", None, id="no-provider"),
        pytest.param("test", wq_metrics.NoopMetricsProvider(), id="noop-provider"),
    ],
)
def test_metrics_disabled(name: str, provider: wq_metrics.MetricsProvider | None) -> None:
    clock = clocks.FakeClock()
    q: delaying.DelayingQueue[str] = delaying.DelayingQueue(
        name=name, clock=clock, metrics_provider=provider
    )
    q.add("foo")
    q.add_after("bar", 0)
    assert not clock.has_waiters()
    if isinstance(provider, RecordingProvider):
        assert 0 == provider.adds.inc_count
        assert 0 == provider.retries.inc_count


# client-go delaying queue: every add_after counts as a retry, even a collapsed one.
def test_retries_counted_by_add_after() -> None:
    provider = RecordingProvider()
    clock = clocks.FakeClock()
    q: delaying.DelayingQueue[str] = delaying.DelayingQueue(
        name="test", clock=clock, metrics_provider=provider
    )
    q.add_after("foo", 1)
    q.add_after("foo", 2)
    q.add_after("bar", 0)
    assert 3 == provider.retries.inc_count


def _sample(registry: CollectorRegistry, metric: str, name: str) -> float | None:
    return registry.get_sample_value(metric, {"name": name})


# component-base workqueue metrics: names, label `name`, values after a short script.
async def test_prometheus_provider() -> None:
    registry = CollectorRegistry()
    provider = wq_metrics.PrometheusMetricsProvider(registry)
    clock = clocks.FakeClock()
    q: delaying.DelayingQueue[str] = delaying.DelayingQueue(
        name="primary", clock=clock, metrics_provider=provider
    )
    other: queue.Queue[str] = queue.Queue(name="priority", clock=clock, metrics_provider=provider)

    q.add("a")
    q.add("b")
    q.add_after("c", 10)  # a retry, still waiting at the end
    other.add("x")
    clock.step(0.25)
    item = await q.get()
    clock.step(0.25)  # the 0.5 s unfinished-work update: "a" has run for 0.25 s
    assert 0.25 == _sample(registry, "workqueue_unfinished_work_seconds", "primary")
    assert 0.25 == _sample(registry, "workqueue_longest_running_processor_seconds", "primary")
    q.done(item)
    clock.step(0.5)  # the next update: nothing in flight

    assert 1.0 == _sample(registry, "workqueue_depth", "primary")
    assert 2.0 == _sample(registry, "workqueue_adds_total", "primary")
    assert 1.0 == _sample(registry, "workqueue_retries_total", "primary")
    assert 1.0 == _sample(registry, "workqueue_queue_duration_seconds_count", "primary")
    assert 0.25 == _sample(registry, "workqueue_queue_duration_seconds_sum", "primary")
    assert 1.0 == _sample(registry, "workqueue_work_duration_seconds_count", "primary")
    assert 0.25 == _sample(registry, "workqueue_work_duration_seconds_sum", "primary")
    assert 0.0 == _sample(registry, "workqueue_unfinished_work_seconds", "primary")
    assert 0.0 == _sample(registry, "workqueue_longest_running_processor_seconds", "primary")
    assert 1.0 == _sample(registry, "workqueue_depth", "priority")
    assert 1.0 == _sample(registry, "workqueue_adds_total", "priority")

    exposition = generate_latest(registry).decode()
    for metric in (
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
        "workqueue_retries_total",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
    ):
        lines = [line for line in exposition.splitlines() if line.startswith(metric + "{")]
        assert any('name="primary"' in line for line in lines), metric
    q.shut_down()
    other.shut_down()


# component-base: duration buckets are 10 ns to 10 s by powers of ten.
def test_duration_buckets() -> None:
    expected = [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0]
    assert expected == pytest.approx(list(wq_metrics.DURATION_BUCKETS))
