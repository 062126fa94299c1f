"""tally.app.metrics: kube_resourcequota follows each quota's names; sync metrics count."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import generate_latest

from tally.app import metrics as tally_metrics
from tally.app.metrics import Metrics, TextGauge
from tally.quota.quantity import parse_quantity

pytestmark = pytest.mark.unit


def sample(metrics: Metrics, metric: str, **labels: str) -> float | None:
    """As a scrape sees it: tally's own state read first (``Metrics.read_state``)."""
    metrics.read_state()
    return metrics.registry.get_sample_value(metric, labels)


def test_quota_series_follow_the_quota() -> None:
    metrics = Metrics()
    key = ("team-a", "compute")
    metrics.quota_synced(
        key,
        {"requests.cpu": parse_quantity("2"), "pods": parse_quantity("10")},
        {"requests.cpu": parse_quantity("750m"), "pods": parse_quantity("3")},
    )
    labels = {"namespace": "team-a", "resourcequota": "compute"}
    assert (
        sample(metrics, "kube_resourcequota", **labels, resource="requests.cpu", type="used")
        == 0.75
    )
    assert sample(metrics, "kube_resourcequota", **labels, resource="pods", type="hard") == 10.0

    # pods dropped from the quota: its series go, the others stay.
    metrics.quota_synced(
        key, {"requests.cpu": parse_quantity("2")}, {"requests.cpu": parse_quantity("1")}
    )
    assert sample(metrics, "kube_resourcequota", **labels, resource="pods", type="hard") is None
    assert (
        sample(metrics, "kube_resourcequota", **labels, resource="requests.cpu", type="used") == 1.0
    )

    # pods back, in hard only: its hard series is exported again, its used one is not.
    metrics.quota_synced(
        key,
        {"requests.cpu": parse_quantity("2"), "pods": parse_quantity("5")},
        {"requests.cpu": parse_quantity("1")},
    )
    assert sample(metrics, "kube_resourcequota", **labels, resource="pods", type="hard") == 5.0
    assert sample(metrics, "kube_resourcequota", **labels, resource="pods", type="used") is None

    metrics.quota_deleted(key)
    assert (
        sample(metrics, "kube_resourcequota", **labels, resource="requests.cpu", type="hard")
        is None
    )
    assert sample(metrics, "kube_resourcequota", **labels, resource="pods", type="hard") is None


def test_sync_duration_and_errors() -> None:
    metrics = Metrics()
    metrics.sync_finished(0.01, None)
    metrics.sync_finished(0.02, RuntimeError("409"))
    assert sample(metrics, "tally_resourcequota_sync_duration_seconds_count") == 2.0
    assert sample(metrics, "tally_resourcequota_sync_errors_total") == 1.0


def test_exposition_has_client_go_workqueue_names() -> None:
    metrics = Metrics()
    metrics.workqueue.new_adds_metric("resourcequota_primary").inc()
    text = metrics.exposition().decode()
    assert 'workqueue_adds_total{name="resourcequota_primary"} 1.0' in text


def test_admission_metrics() -> None:
    metrics = Metrics()
    metrics.request_finished("pods", "allowed", 0.004)
    metrics.request_finished("pods", "forbidden", 0.002)
    metrics.batch_checked(3)
    metrics.write_conflicted()
    metrics.retried()
    metrics.rejudged(2)
    labels = {"resource": "pods", "result": "forbidden"}
    assert sample(metrics, "tally_admission_requests_total", **labels) == 1.0
    assert sample(metrics, "tally_admission_duration_seconds_count", resource="pods") == 2.0
    assert sample(metrics, "tally_admission_batch_size_sum") == 3.0
    assert sample(metrics, "tally_admission_write_conflicts_total") == 1.0
    assert sample(metrics, "tally_admission_retries_total") == 1.0
    assert sample(metrics, "tally_admission_rejudged_refusals_total") == 2.0


def test_leader_gauge_follows_leadership() -> None:
    metrics = Metrics()
    metrics.leading("tally-0_abc", False)
    assert sample(metrics, "tally_leader", identity="tally-0_abc") == 0.0
    metrics.leading("tally-0_abc", True)
    assert sample(metrics, "tally_leader", identity="tally-0_abc") == 1.0
    assert 'tally_leader{identity="tally-0_abc"} 1.0' in metrics.exposition().decode()


def test_webhook_certificate_expiry_is_the_served_certificates_end() -> None:
    metrics = Metrics()
    name = "tally_webhook_certificate_expiry_timestamp_seconds"
    assert 0.0 == sample(metrics, name)  # no certificate loaded yet
    # 1970 to 2030: 60 years, 15 of them leap years (1972 … 2028): 21 915 days of 86 400 s.
    metrics.webhook_certificate_loaded(datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))
    assert 1_893_456_000.0 == sample(metrics, name)
    # A renewal moves it: one day later.
    metrics.webhook_certificate_loaded(datetime.datetime(2030, 1, 2, tzinfo=datetime.UTC))
    assert 1_893_542_400.0 == sample(metrics, name)


def test_cluster_quota_conditions_follow_the_status() -> None:
    metrics = Metrics()
    computed = {"type": "UsageComputed", "status": "False", "reason": "EvaluationFailed"}
    metrics.cluster_quota_synced("team", {"total": {}, "conditions": [computed]})

    def condition(status: str) -> float | None:
        labels = {"name": "team", "condition": "UsageComputed", "status": status}
        return metrics.registry.get_sample_value("tally_clusterquota_status_condition", labels)

    assert (0.0, 1.0, 0.0) == tuple(condition(s) for s in ("true", "false", "unknown"))
    recovered = {**computed, "status": "True"}
    metrics.cluster_quota_synced("team", {"total": {}, "conditions": [recovered]})
    assert 1.0 == condition("true")
    assert 0.0 == condition("false")
    # A status without the condition, and a deleted ClusterQuota, leave no series behind.
    metrics.cluster_quota_synced("team", {"total": {}})
    assert condition("true") is None
    metrics.cluster_quota_synced("team", {"total": {}, "conditions": [computed]})
    metrics.cluster_quota_deleted("team")
    assert condition("false") is None


def test_every_release_reason_is_exported_from_the_start() -> None:
    # At 0 before the first release: a series born at its first release shows no increase,
    # and the unverified-charges alert would miss that release.
    metrics = Metrics()
    name = "tally_admission_charges_released_total"
    reasons = ("unconfirmed", "refused", "unverified", "duplicate")
    assert [0.0] * 4 == [sample(metrics, name, reason=reason) for reason in reasons]
    metrics.charge_released("unverified")
    metrics.charge_released("unverified")
    metrics.charge_released("duplicate")
    assert [0.0, 0.0, 2.0, 1.0] == [sample(metrics, name, reason=reason) for reason in reasons]


def test_uncounted_resources_are_read_at_each_scrape() -> None:
    metrics = Metrics()
    problems: dict[str, str] = {}
    metrics.watch_uncounted(lambda: problems)
    name = "tally_uncounted_resource"
    assert sample(metrics, name, resource="convs.example.com", reason="FailedList") is None
    problems["convs.example.com"] = "FailedList"
    assert 1.0 == sample(metrics, name, resource="convs.example.com", reason="FailedList")
    problems.clear()  # counted again: the series is gone, not 0
    assert sample(metrics, name, resource="convs.example.com", reason="FailedList") is None


def test_the_oldest_pending_charge_is_read_at_each_scrape() -> None:
    metrics = Metrics()
    oldest: list[float | None] = [None]
    metrics.watch_charges(lambda: oldest[0])
    name = "tally_admission_oldest_unconfirmed_charge_seconds"
    assert 0.0 == sample(metrics, name)  # none pending
    oldest[0] = 2.5
    assert 2.5 == sample(metrics, name)


async def test_a_scrape_reads_tallys_state_on_the_loop_and_renders_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = Metrics()
    loop_thread = threading.get_ident()
    read_on: list[int] = []

    def problems() -> dict[str, str]:
        read_on.append(threading.get_ident())
        return {"convs.example.com": "FailedList"}

    def oldest() -> float:
        read_on.append(threading.get_ident())
        return 4.0

    metrics.watch_uncounted(problems)
    metrics.watch_charges(oldest)
    metrics.quota_synced(("a", "q"), {"pods": parse_quantity("2")}, {})
    rendered_on: list[int] = []
    exposition, family_text = tally_metrics.generate_latest, metrics.resource_quota.text

    def generate_latest(registry: Any) -> bytes:
        rendered_on.append(threading.get_ident())
        return exposition(registry)

    def text(snapshot: Any) -> str:
        rendered_on.append(threading.get_ident())
        return family_text(snapshot)

    monkeypatch.setattr(tally_metrics, "generate_latest", generate_latest)
    monkeypatch.setattr(metrics.resource_quota, "text", text)
    text_rendered = (await metrics.render()).decode()
    assert (
        'kube_resourcequota{namespace="a",resource="pods",resourcequota="q",type="hard"} 2.0'
        in (text_rendered)
    )
    text = text_rendered
    assert 'tally_uncounted_resource{reason="FailedList",resource="convs.example.com"} 1.0' in text
    assert "tally_admission_oldest_unconfirmed_charge_seconds 4.0" in text
    assert read_on == [loop_thread, loop_thread]
    assert 2 == len(rendered_on)  # the registry's metrics and the quotas' family
    assert all(ident != loop_thread for ident in rendered_on)


def test_cluster_quota_series_follow_each_status() -> None:
    metrics = Metrics()

    def status(a_cpu: str, b_cpu: str | None) -> dict[str, Any]:
        spaces = [{"namespace": "team-a", "status": {"used": {"requests.cpu": a_cpu}}}]
        if b_cpu is not None:
            spaces.append({"namespace": "team-b", "status": {"used": {"requests.cpu": b_cpu}}})
        return {
            "total": {"hard": {"requests.cpu": "4"}, "used": {"requests.cpu": "1500m"}},
            "namespaces": spaces,
        }

    usage, share = "tally_clusterquota_usage", "tally_clusterquota_namespace_usage"
    metrics.cluster_quota_synced("team", status("500m", "1"))
    assert 4.0 == sample(metrics, usage, name="team", resource="requests.cpu", type="hard")
    assert 1.5 == sample(metrics, usage, name="team", resource="requests.cpu", type="used")

    def cpu(namespace: str) -> float | None:
        return sample(
            metrics, share, name="team", namespace=namespace, resource="requests.cpu", type="used"
        )

    assert (cpu("team-a"), cpu("team-b")) == (0.5, 1.0)
    # team-a's share moved; team-b's did not; then team-b leaves the status (it uses nothing).
    metrics.cluster_quota_synced("team", status("750m", "1"))
    assert (cpu("team-a"), cpu("team-b")) == (0.75, 1.0)
    metrics.cluster_quota_synced("team", status("750m", None))
    assert (cpu("team-a"), cpu("team-b")) == (0.75, None)
    # pods is limited too, then no longer: its series come and go, in the total and the share.
    with_pods = status("750m", None)
    with_pods["total"]["hard"]["pods"] = "10"
    with_pods["total"]["used"]["pods"] = "2"
    with_pods["namespaces"][0]["status"]["used"]["pods"] = "2"

    def pods(namespace: str) -> float | None:
        return sample(
            metrics, share, name="team", namespace=namespace, resource="pods", type="used"
        )

    metrics.cluster_quota_synced("team", with_pods)
    assert (2.0, 10.0, 2.0) == (
        pods("team-a"),
        sample(metrics, usage, name="team", resource="pods", type="hard"),
        sample(metrics, usage, name="team", resource="pods", type="used"),
    )
    metrics.cluster_quota_synced("team", status("750m", None))
    assert (None, None, 0.75) == (
        pods("team-a"),
        sample(metrics, usage, name="team", resource="pods", type="hard"),
        cpu("team-a"),
    )
    metrics.cluster_quota_deleted("team")
    assert cpu("team-a") is None
    assert sample(metrics, usage, name="team", resource="requests.cpu", type="hard") is None


def test_a_cluster_quota_status_size_is_a_gauge_until_it_is_deleted() -> None:
    metrics = Metrics()
    metrics.cluster_quota_status_size("team", 1_300_000)
    assert 1_300_000.0 == sample(metrics, "tally_clusterquota_status_bytes", name="team")
    metrics.cluster_quota_status_size("team", 900)
    assert 900.0 == sample(metrics, "tally_clusterquota_status_bytes", name="team")
    metrics.cluster_quota_deleted("team")
    assert sample(metrics, "tally_clusterquota_status_bytes", name="team") is None
    # A ClusterQuota deleted before its first sync had no size: nothing to remove.
    metrics.cluster_quota_deleted("other")


ODD_LABELS = [
    ("team-a", "compute", "requests.cpu", "hard"),
    ('quo"te', "back\\slash", "line\nfeed", "used"),
    ("ünïcode", "", "count/widgets.example.com", "hard"),
]
"""Label values with every character the text format escapes, and some it does not."""
ODD_VALUES = [0.0, -0.0, 1.0, 0.75, 1e-9, 2.0**53 + 1, 1e21, 123456789.125, float("inf"),
              float("-inf"), float("nan")]  # fmt: skip


def test_a_text_gauge_renders_as_prometheus_client_renders_the_same_gauge() -> None:
    documentation = "Help with a back\\slash and a\nline feed."
    labelnames = ("namespace", "resourcequota", "resource", "type")  # not in sorted order
    registry = CollectorRegistry()
    reference = Gauge("kube_resourcequota", documentation, labelnames, registry=registry)
    ours = TextGauge("kube_resourcequota", documentation, labelnames)
    for index, labels in enumerate(ODD_LABELS * len(ODD_VALUES)):
        value = ODD_VALUES[index % len(ODD_VALUES)]
        reference.labels(*labels).set(value)
        ours.labels(*labels).set(value)
    reference.labels("gone", "q", "pods", "used").set(1)
    ours.labels("gone", "q", "pods", "used").set(1)
    reference.remove("gone", "q", "pods", "used")
    ours.remove("gone", "q", "pods", "used")
    ours.remove("never", "there", "pods", "used")  # as Gauge.remove: nothing to drop
    assert generate_latest(registry).decode() == ours.text(ours.snapshot())
    # And read through a registry as any other collector.
    mine = CollectorRegistry()
    mine.register(ours)
    assert generate_latest(registry) == generate_latest(mine)


def test_a_text_gauge_with_no_series_renders_its_header_only() -> None:
    registry = CollectorRegistry()
    Gauge("tally_clusterquota_namespace_usage", "h", ["name"], registry=registry)
    ours = TextGauge("tally_clusterquota_namespace_usage", "h", ["name"])
    assert generate_latest(registry).decode() == ours.text(ours.snapshot())


def test_a_text_gauge_refuses_a_wrong_number_of_label_values() -> None:
    ours = TextGauge("kube_resourcequota", "h", ("namespace", "resourcequota"))
    with pytest.raises(ValueError, match="2 label values"):
        ours.labels("only-one")


def test_a_scrape_holds_every_family_once() -> None:
    metrics = Metrics()
    metrics.quota_synced(("a", "q"), {"pods": parse_quantity("2")}, {"pods": parse_quantity("1")})
    metrics.cluster_quota_synced(
        "shared",
        {"total": {"hard": {"pods": "4"}, "used": {"pods": "1"}},
         "namespaces": [{"namespace": "a", "status": {"used": {"pods": "1"}}}]},
    )  # fmt: skip
    text = metrics.exposition().decode()
    families = (
        "kube_resourcequota",
        "tally_clusterquota_namespace_usage",
        "tally_clusterquota_usage",
        "tally_resourcequota_sync_duration_seconds",
    )
    for family in families:
        assert 1 == text.count(f"# TYPE {family} "), family
    share = 'name="shared",namespace="a",resource="pods",type="used"'
    assert f"tally_clusterquota_namespace_usage{{{share}}} 1.0" in text
