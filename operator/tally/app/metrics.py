"""Prometheus metrics: one registry, one ``/metrics`` endpoint on the operator's event loop.

* work queues: client-go's names (``workqueue_depth``, ``workqueue_adds_total``, …, label
  ``name``) through :class:`tally.workqueue.PrometheusMetricsProvider`;
* the quota controller: ``tally_resourcequota_sync_duration_seconds`` and
  ``tally_resourcequota_sync_errors_total``;
* quota admission: ``tally_admission_requests_total{resource,result}``, a latency histogram,
  batch sizes, conflicts and retries;
* quotas themselves, shaped like kube-state-metrics' ``kube_resourcequota{namespace,
  resourcequota, resource, type="hard"|"used"}``, so existing dashboards and alerts work;
* charges admission wrote until their objects appear (:mod:`tally.charges`):
  ``tally_admission_charges_confirmed_total``, ``tally_admission_charges_released_total{reason}``
  (``unconfirmed``, ``refused``, ``unverified``: the API could not be asked whether the object
  was stored, which an alert reads; ``duplicate``: one object's create charged twice; every
  reason exported from the start, at 0, so that an alert sees the first release),
  ``tally_admission_charges_late_total``, the confirmation latency and the age of the oldest
  pending charge;
* ClusterQuotas: ``tally_clusterquota_usage`` and ``tally_clusterquota_namespace_usage``
  (kube-state-metrics' OpenShift ClusterResourceQuota shapes), and
  ``tally_clusterquota_status_condition{name, condition, status}`` (the ``*_status_condition``
  shape: 1 for the condition's current status, 0 for the other two), which an alert reads to
  tell a ClusterQuota whose usage cannot be computed;
* leader election: ``tally_leader{identity}``, 1 while this process runs the controllers (it
  holds the Lease, or runs without election), else 0; the sum over replicas should be 1;
* the webhook server's certificate: ``tally_webhook_certificate_expiry_timestamp_seconds``, the
  notAfter (Unix time) of the certificate it presents now, set whenever one is loaded (at
  start-up, after a renewal, after someone else replaced it), so an alert sees a renewal that
  stopped happening.

Served by aiohttp (already Kopf's server library) on the operator's own loop rather than
prometheus-client's threaded HTTP server: tally keeps threads out of the process.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from tally.charges import ReleaseReason
from tally.quota.quantity import Quantity
from tally.resourcequota.controller import QuotaKey
from tally.workqueue import PrometheusMetricsProvider

logger = logging.getLogger(__name__)

CONDITION_STATUSES = ("true", "false", "unknown")
"""The ``status`` label values of a condition series, kube-state-metrics' spelling."""

_NANOS = 1_000_000_000


class Metrics:
    """Every metric tally exports, in one private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.workqueue = PrometheusMetricsProvider(self.registry)
        self.sync_duration = Histogram(
            "tally_resourcequota_sync_duration_seconds",
            "Time to recalculate one ResourceQuota and write its status if it changed.",
            registry=self.registry,
        )
        self.sync_errors = Counter(
            "tally_resourcequota_sync_errors",
            "ResourceQuota syncs that failed and were requeued with backoff.",
            registry=self.registry,
        )
        self.resource_quota = Gauge(
            "kube_resourcequota",
            "Information about resource quota (kube-state-metrics shape), from tally.",
            ["namespace", "resourcequota", "resource", "type"],
            registry=self.registry,
        )
        self.admission_requests = Counter(
            "tally_admission_requests",
            "Quota admission decisions, by resource and result "
            "(allowed, ignored, forbidden, conflict, error).",
            ["resource", "result"],
            registry=self.registry,
        )
        self.admission_duration = Histogram(
            "tally_admission_duration_seconds",
            "Time from receiving an admission request to its decision.",
            ["resource"],
            registry=self.registry,
        )
        self.admission_batch_size = Histogram(
            "tally_admission_batch_size",
            "Requests of one namespace checked together in one pass.",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
            registry=self.registry,
        )
        self.admission_conflicts = Counter(
            "tally_admission_write_conflicts",
            "Quota status reservations that lost their compare-and-swap (409).",
            registry=self.registry,
        )
        self.admission_retries = Counter(
            "tally_admission_retries",
            "Passes that re-read quotas to retry failed reservations.",
            registry=self.registry,
        )
        self.admission_rejudged = Counter(
            "tally_admission_rejudged_refusals",
            "Refusals judged again by the next pass: their pass gave back a charge they were "
            "judged against.",
            registry=self.registry,
        )
        self.charges_confirmed = Counter(
            "tally_admission_charges_confirmed",
            "Charges admission wrote whose objects then appeared in tally's caches.",
            registry=self.registry,
        )
        self.charge_confirmation = Histogram(
            "tally_admission_charge_confirmation_seconds",
            "Time from admission recording a charge to its object in tally's caches "
            "(what TALLY_CHARGE_CONFIRM_TIMEOUT must exceed).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.charges_released = Counter(
            "tally_admission_charges_released",
            "Charges admission wrote that were given back instead of confirmed, by reason: "
            "unconfirmed (not seen within TALLY_CHARGE_CONFIRM_TIMEOUT and not stored: refused "
            "after tally's answer, or another replica's charge held until then), refused (tally "
            "itself refused the request after writing its charge), unverified (the API could "
            "not be asked whether the object was stored: a 401/403, or no answer several times "
            "in a row), duplicate (a second charge for one created object).",
            ["reason"],
            registry=self.registry,
        )
        # Every reason from the start, at 0: a series born at its first release shows no
        # increase to rate() or increase(), and the unverified alert would miss it.
        for reason in ReleaseReason:
            self.charges_released.labels(reason.value)
        self.charges_late = Counter(
            "tally_admission_charges_late",
            "Objects that appeared after their charge had been released as unconfirmed "
            "(TALLY_CHARGE_CONFIRM_TIMEOUT is too short for this cluster).",
            registry=self.registry,
        )
        self.oldest_unconfirmed_charge = Gauge(
            "tally_admission_oldest_unconfirmed_charge_seconds",
            "Age of the oldest charge still waiting for its object (0: none).",
            registry=self.registry,
        )
        self.cluster_quota_usage = Gauge(
            "tally_clusterquota_usage",
            "A ClusterQuota's total over its namespaces (the shape of kube-state-metrics' "
            "openshift_clusterresourcequota_usage).",
            ["name", "resource", "type"],
            registry=self.registry,
        )
        self.cluster_quota_namespace_usage = Gauge(
            "tally_clusterquota_namespace_usage",
            "A ClusterQuota's usage in one namespace it selects "
            "(openshift_clusterresourcequota_namespace_usage).",
            ["name", "namespace", "resource", "type"],
            registry=self.registry,
        )
        self.cluster_quota_condition = Gauge(
            "tally_clusterquota_status_condition",
            "1 for a ClusterQuota condition's current status, 0 for the others (the shape of "
            "kube-state-metrics' *_status_condition); UsageComputed is false while the usage "
            "of some object cannot be computed.",
            ["name", "condition", "status"],
            registry=self.registry,
        )
        self.enforcing_gauge = Gauge(
            "tally_enforcing",
            "1 for each kind of quota this process enforces (ResourceQuota, ClusterQuota); "
            "ResourceQuota is 0 where the cluster's own quota system is on.",
            ["kind"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "tally_leader",
            "1 while this process runs the controllers (it holds the leader election's Lease, "
            "or leader election is off), else 0.",
            ["identity"],
            registry=self.registry,
        )
        self.heap_trim_duration = Histogram(
            "tally_heap_trim_duration_seconds",
            "Time one return of freed heap memory to the operating system took (glibc's "
            "malloc_trim, every TALLY_HEAP_TRIM_PERIOD seconds, on a worker thread).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.webhook_certificate_expiry = Gauge(
            "tally_webhook_certificate_expiry_timestamp_seconds",
            "notAfter, as Unix time, of the serving certificate the webhook server presents "
            "(0 until one is loaded).",
            registry=self.registry,
        )
        # The label sets exported per quota, so that names dropped from a quota (or a deleted
        # quota) stop being exported instead of keeping their last value forever.
        self._series: dict[QuotaKey, set[tuple[str, str]]] = {}
        self._cluster_series: dict[str, set[tuple[str, ...]]] = {}
        # Condition types each ClusterQuota's status carries (series to drop with it).
        self._cluster_conditions: dict[str, set[str]] = {}

    # -- tally.resourcequota.controller.SyncObserver

    def quota_synced(
        self, key: QuotaKey, hard: Mapping[str, Quantity], used: Mapping[str, Quantity]
    ) -> None:
        namespace, name = key
        current = {(resource, "hard") for resource in hard} | {(r, "used") for r in used}
        for resource, kind in self._series.get(key, set()) - current:
            self.resource_quota.remove(namespace, name, resource, kind)
        for kind, values in (("hard", hard), ("used", used)):
            for resource, quantity in values.items():
                self.resource_quota.labels(namespace, name, resource, kind).set(
                    quantity.nanos / _NANOS
                )
        self._series[key] = current

    def quota_deleted(self, key: QuotaKey) -> None:
        for resource, kind in self._series.pop(key, set()):
            self.resource_quota.remove(*key, resource, kind)

    # -- tally.clusterquota.controller.SyncObserver

    def cluster_quota_synced(self, name: str, status: Mapping[str, Any]) -> None:
        total = status.get("total") or {}
        current: dict[tuple[str, ...], float] = {}
        for kind in ("hard", "used"):
            for resource, text in (total.get(kind) or {}).items():
                current[("", resource, kind)] = Quantity.parse(text).nanos / _NANOS
        for entry in status.get("namespaces") or []:
            for resource, text in ((entry.get("status") or {}).get("used") or {}).items():
                current[(entry["namespace"], resource, "used")] = (
                    Quantity.parse(text).nanos / _NANOS
                )
        for stale in self._cluster_series.get(name, set()) - set(current):
            self._remove_cluster_series(name, stale)
        for labels, value in current.items():
            if not labels[0]:  # the total (no namespace is named "")
                self.cluster_quota_usage.labels(name, labels[1], labels[2]).set(value)
            else:
                self.cluster_quota_namespace_usage.labels(name, *labels).set(value)
        self._cluster_series[name] = set(current)
        conditions: set[str] = set()
        for entry in status.get("conditions") or []:
            if not isinstance(entry, Mapping) or not entry.get("type"):
                continue
            kind, state = str(entry["type"]), str(entry.get("status") or "").lower()
            conditions.add(kind)
            for choice in CONDITION_STATUSES:
                self.cluster_quota_condition.labels(name, kind, choice).set(
                    1 if choice == state else 0
                )
        for gone in self._cluster_conditions.get(name, set()) - conditions:
            self._remove_cluster_condition(name, gone)
        self._cluster_conditions[name] = conditions

    def cluster_quota_deleted(self, name: str) -> None:
        for labels in self._cluster_series.pop(name, set()):
            self._remove_cluster_series(name, labels)
        for kind in self._cluster_conditions.pop(name, set()):
            self._remove_cluster_condition(name, kind)

    def _remove_cluster_condition(self, name: str, kind: str) -> None:
        for choice in CONDITION_STATUSES:
            self.cluster_quota_condition.remove(name, kind, choice)

    def _remove_cluster_series(self, name: str, labels: tuple[str, ...]) -> None:
        if not labels[0]:
            self.cluster_quota_usage.remove(name, labels[1], labels[2])
        else:
            self.cluster_quota_namespace_usage.remove(name, *labels)

    def sync_finished(self, duration: float, error: Exception | None) -> None:
        self.sync_duration.observe(duration)
        if error is not None:
            self.sync_errors.inc()

    # -- tally.admission.evaluator.AdmissionMetrics

    def request_finished(self, resource: str, result: str, seconds: float) -> None:
        self.admission_requests.labels(resource, result).inc()
        self.admission_duration.labels(resource).observe(seconds)

    def batch_checked(self, size: int) -> None:
        self.admission_batch_size.observe(size)

    def write_conflicted(self) -> None:
        self.admission_conflicts.inc()

    def retried(self) -> None:
        self.admission_retries.inc()

    def rejudged(self, count: int) -> None:
        self.admission_rejudged.inc(count)

    # -- tally.charges.ChargeMetrics

    def charge_confirmed(self, seconds: float) -> None:
        self.charges_confirmed.inc()
        self.charge_confirmation.observe(seconds)

    def charge_released(self, reason: str) -> None:
        self.charges_released.labels(reason).inc()

    def charge_late(self) -> None:
        self.charges_late.inc()

    def watch_charges(self, oldest_age: Callable[[], float | None]) -> None:
        """Report the ledger's oldest pending charge at every scrape."""
        self.oldest_unconfirmed_charge.set_function(lambda: oldest_age() or 0.0)

    def enforcing(self, *, resource_quotas: bool) -> None:
        self.enforcing_gauge.labels("ResourceQuota").set(1 if resource_quotas else 0)
        self.enforcing_gauge.labels("ClusterQuota").set(1)

    def heap_trimmed(self, seconds: float) -> None:
        self.heap_trim_duration.observe(seconds)

    # -- leader election

    def leading(self, identity: str, leading: bool) -> None:
        self.leader.labels(identity).set(1 if leading else 0)

    # -- tally.webhook.tls.ServingTLS

    def webhook_certificate_loaded(self, not_after: datetime.datetime) -> None:
        """The webhook server presents, from now on, a certificate valid until ``not_after``."""
        self.webhook_certificate_expiry.set(not_after.timestamp())

    # -- serving

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    async def serve(self, addr: str, port: int) -> web.AppRunner:
        """Start ``GET /metrics`` on ``addr:port``; the caller cleans the runner up."""

        async def metrics(_: web.Request) -> web.Response:
            response = web.Response(body=self.exposition())
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics)])
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, addr, port).start()
        logger.info("serving metrics at http://%s:%d/metrics", addr, port)
        return runner
