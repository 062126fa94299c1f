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
* ``count/`` resources quotas name that tally does not count, and why:
  ``tally_uncounted_resource{resource, reason}`` (1 each; the reason is the Event's on the
  quotas, e.g. ``FailedList`` while the API server cannot list the kind);
* leader election: ``tally_leader{identity}``, 1 while this process runs the controllers (it
  holds the Lease, or runs without election), else 0; the sum over replicas should be 1;
* the event loop: ``tally_event_loop_lag_seconds``, how late a timer set every 0.1 s fired
  (what readiness waits on at the start, :mod:`tally.app.readiness`);
* the webhook server's certificate: ``tally_webhook_certificate_expiry_timestamp_seconds``, the
  notAfter (Unix time) of the certificate it presents now, set whenever one is loaded (at
  start-up, after a renewal, after someone else replaced it), so an alert sees a renewal that
  stopped happening.

Served by aiohttp (already Kopf's server library) on the operator's own loop rather than
prometheus-client's HTTP server, but **rendered in a worker thread**. The text grows with the
quotas (kube-state-metrics' shapes are a series per quota, resource and type, and per
ClusterQuota, namespace and resource): at 5 000 ResourceQuotas and one ClusterQuota over their
5 000 namespaces it is 8 MB. Through prometheus-client's exposition that was 0.8-1.2 s of CPU
(at 10 000, twice that), and on the loop every scrape held each review that long; in a thread
it still held the interpreter's lock, which the loop needs at every turn (after a large
tally's start, 57 % of its samples were the renders of a scrape every 5 s). So the two
families keep each series' line as text (:class:`TextGauge`), and the same 8 MB render in
64-84 ms. The thread stays: the loop keeps its turns during what remains (the interpreter
hands the lock over every few milliseconds). The metrics prometheus-client keeps are safe to
read from another thread (each family copies its children under its lock); the text
families' series, and what a scrape reads of tally's own state (the uncounted resources, the
oldest pending charge), are read on the loop first (:meth:`Metrics.render`), never from the
thread. One render at a time: scrapes that come meanwhile wait for it.

**Who may read them** (``TALLY_METRICS_AUTH``, ``Settings.metrics_auth_mode``): quota names,
namespaces and every tenant's usage are not for anyone who reaches the port. As
controller-runtime's secure metrics serve them, ``kubernetes`` serves HTTPS with a certificate
made in memory at start-up (:func:`self_signed_context`: nobody holds its CA, so scrapers skip
verification; what they prove is who *they* are) and lets a request through only when the API
server authenticates its bearer token and allows its user ``get`` on ``/metrics``
(:func:`with_authentication_and_authorization`, the decisions and caches in
:mod:`tally.machinery.delegating_auth`, the reviews on the API in
:mod:`tally.kube.access_reviews`). ``none`` serves plain HTTP to anyone, meant for a loopback
address. Left out: a certificate of the operator's own (mounted files) and client certificates.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tally.app.settings import is_loopback
from tally.charges import ReleaseReason
from tally.machinery import delegating_auth
from tally.machinery.validation import is_dns1123_subdomain
from tally.quota.identity import CLUSTER_QUOTA_KIND, QuotaKey
from tally.quota.quantity import Quantity
from tally.webhook import certs, tls
from tally.workqueue import PrometheusMetricsProvider

logger = logging.getLogger(__name__)

LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Seconds, from a millisecond to ten: a charge's confirmation, the event loop's lag."""

CONDITION_STATUSES = ("true", "false", "unknown")
"""The ``status`` label values of a condition series, kube-state-metrics' spelling."""

_NANOS = 1_000_000_000


def _value(text: str) -> float:
    """A quantity's text as a gauge's value."""
    return Quantity.parse(text).nanos / _NANOS


class _TextSeries:
    """One series of a :class:`TextGauge`: its line up to the value, and the value."""

    __slots__ = ("head", "value")

    def __init__(self, head: str) -> None:
        self.head = head
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)


_go_float: Callable[[float], str] = floatToGoString
"""A sample's value as the text format writes it (prometheus-client's own, which has no type
hints)."""


def _escape_label_value(value: str) -> str:
    """The text format's escaping of a label value (backslash, line feed, double quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class TextGauge(Collector):
    """A gauge family that keeps each series' line up to its value as text, for the families
    with a series per quota, resource and type (``kube_resourcequota``) or per ClusterQuota,
    namespace and resource: at 5 000 quotas, prometheus-client's exposition formatted 8 MB
    of them at every scrape, label by label (each name checked, each value escaped, sorted),
    and that was most of what a large tally spent after its start. Set and removed as a
    :class:`prometheus_client.Gauge` with labels is; :meth:`text` renders the family as
    ``generate_latest`` does (tested against it), from a :meth:`snapshot` taken on the loop
    so that another thread may render it."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._order = sorted(range(len(self.labelnames)), key=lambda i: self.labelnames[i])
        self._series: dict[tuple[str, ...], _TextSeries] = {}
        help_text = documentation.replace("\\", "\\\\").replace("\n", "\\n")
        self._header = f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"

    def labels(self, *values: object) -> _TextSeries:
        key = self._key(values)
        series = self._series.get(key)
        if series is None:
            pairs = ",".join(
                f'{self.labelnames[i]}="{_escape_label_value(key[i])}"' for i in self._order
            )
            series = self._series[key] = _TextSeries(f"{self.name}{{{pairs}}} ")
        return series

    def remove(self, *values: object) -> None:
        self._series.pop(self._key(values), None)

    def _key(self, values: tuple[object, ...]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values, not {values}")
        return tuple(str(value) for value in values)

    def snapshot(self) -> list[_TextSeries]:
        return list(self._series.values())

    def text(self, snapshot: list[_TextSeries]) -> str:
        return self._header + "".join(
            [f"{series.head}{_go_float(series.value)}\n" for series in snapshot]
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, series in list(self._series.items()):
            family.add_metric(list(key), series.value)
        yield family


class Metrics:
    """Every metric tally exports, in one private registry."""

    def __init__(self) -> None:
        # Every metric but the two families that grow with the quotas, which render their own
        # text (TextGauge); ``registry`` below holds all of them.
        self._plain = CollectorRegistry()
        self._rendering = asyncio.Lock()
        self._oldest_age: Callable[[], float | None] | None = None
        self._uncounted = _Uncounted(dict)
        self._plain.register(self._uncounted)
        self.workqueue = PrometheusMetricsProvider(self._plain)
        self.sync_duration = Histogram(
            "tally_resourcequota_sync_duration_seconds",
            "Time to recalculate one ResourceQuota and write its status if it changed.",
            registry=self._plain,
        )
        self.sync_errors = Counter(
            "tally_resourcequota_sync_errors",
            "ResourceQuota syncs that failed and were requeued with backoff.",
            registry=self._plain,
        )
        self.resource_quota = TextGauge(
            "kube_resourcequota",
            "Information about resource quota (kube-state-metrics shape), from tally.",
            ("namespace", "resourcequota", "resource", "type"),
        )
        self.admission_requests = Counter(
            "tally_admission_requests",
            "Quota admission decisions, by resource and result "
            "(allowed, ignored, forbidden, conflict, error).",
            ["resource", "result"],
            registry=self._plain,
        )
        self.admission_duration = Histogram(
            "tally_admission_duration_seconds",
            "Time from receiving an admission request to its decision.",
            ["resource"],
            registry=self._plain,
        )
        self.admission_batch_size = Histogram(
            "tally_admission_batch_size",
            "Requests of one namespace checked together in one pass.",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
            registry=self._plain,
        )
        self.admission_conflicts = Counter(
            "tally_admission_write_conflicts",
            "Quota status reservations that lost their compare-and-swap (409).",
            registry=self._plain,
        )
        self.admission_retries = Counter(
            "tally_admission_retries",
            "Passes that re-read quotas to retry failed reservations.",
            registry=self._plain,
        )
        self.admission_rejudged = Counter(
            "tally_admission_rejudged_refusals",
            "Refusals judged again by the next pass: their pass gave back a charge they were "
            "judged against.",
            registry=self._plain,
        )
        self.charges_confirmed = Counter(
            "tally_admission_charges_confirmed",
            "Charges admission wrote whose objects then appeared in tally's caches.",
            registry=self._plain,
        )
        self.charge_confirmation = Histogram(
            "tally_admission_charge_confirmation_seconds",
            "Time from admission recording a charge to its object in tally's caches "
            "(what TALLY_CHARGE_CONFIRM_TIMEOUT must exceed).",
            buckets=LATENCY_BUCKETS,
            registry=self._plain,
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
            registry=self._plain,
        )
        # Every reason from the start, at 0: a series born at its first release shows no
        # increase to rate() or increase(), and the unverified alert would miss it.
        for reason in ReleaseReason:
            self.charges_released.labels(reason.value)
        self.charges_late = Counter(
            "tally_admission_charges_late",
            "Objects that appeared after their charge had been released as unconfirmed "
            "(TALLY_CHARGE_CONFIRM_TIMEOUT is too short for this cluster).",
            registry=self._plain,
        )
        self.oldest_unconfirmed_charge = Gauge(
            "tally_admission_oldest_unconfirmed_charge_seconds",
            "Age of the oldest charge still waiting for its object (0: none).",
            registry=self._plain,
        )
        self.cluster_quota_usage = Gauge(
            "tally_clusterquota_usage",
            "A ClusterQuota's total over its namespaces (the shape of kube-state-metrics' "
            "openshift_clusterresourcequota_usage).",
            ["name", "resource", "type"],
            registry=self._plain,
        )
        self.cluster_quota_namespace_usage = TextGauge(
            "tally_clusterquota_namespace_usage",
            "A ClusterQuota's usage in one namespace it selects "
            "(openshift_clusterresourcequota_namespace_usage).",
            ("name", "namespace", "resource", "type"),
        )
        self.cluster_quota_status_bytes = Gauge(
            "tally_clusterquota_status_bytes",
            "The size of the status a ClusterQuota's last sync wrote or tried to write (JSON, "
            "bytes): it grows with every namespace listed, and the API server refuses an "
            "object past etcd's request limit (1.5 MiB by default).",
            ["name"],
            registry=self._plain,
        )
        self.cluster_quota_condition = Gauge(
            "tally_clusterquota_status_condition",
            "1 for a ClusterQuota condition's current status, 0 for the others (the shape of "
            "kube-state-metrics' *_status_condition); UsageComputed is false while the usage "
            "of some object cannot be computed.",
            ["name", "condition", "status"],
            registry=self._plain,
        )
        self.enforcing_gauge = Gauge(
            "tally_enforcing",
            "1 for each kind of quota this process enforces (ResourceQuota, ClusterQuota); "
            "ResourceQuota is 0 where the cluster's own quota system is on.",
            ["kind"],
            registry=self._plain,
        )
        self.leader = Gauge(
            "tally_leader",
            "1 while this process runs the controllers (it holds the leader election's Lease, "
            "or leader election is off), else 0.",
            ["identity"],
            registry=self._plain,
        )
        self.heap_trim_duration = Histogram(
            "tally_heap_trim_duration_seconds",
            "Time one return of freed heap memory to the operating system took (glibc's "
            "malloc_trim, every TALLY_HEAP_TRIM_PERIOD seconds, on a worker thread).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self._plain,
        )
        self.loop_lag = Histogram(
            "tally_event_loop_lag_seconds",
            "How late a timer set every 0.1 s on the event loop fired: how long anything ready "
            "to run (a review's next step, a watch event) waited for its turn.",
            buckets=LATENCY_BUCKETS,
            registry=self._plain,
        )
        self.webhook_certificate_expiry = Gauge(
            "tally_webhook_certificate_expiry_timestamp_seconds",
            "notAfter, as Unix time, of the serving certificate the webhook server presents "
            "(0 until one is loaded).",
            registry=self._plain,
        )
        # The series exported per quota by (resource, hard/used), so that names dropped from a
        # quota (or a deleted quota) stop being exported instead of keeping their last value
        # forever; each held so that a sync sets it without asking the family again (a
        # ``labels`` look-up is most of what setting a value costs, and ten a sync were 14 % of
        # a cold start's first pass).
        self._series: dict[QuotaKey, dict[tuple[str, str], Any]] = {}
        # Per ClusterQuota, what its series were last set from: the total's text by (resource,
        # hard/used), and each listed namespace's share as the status wrote it.
        self._cluster_series: dict[
            str, tuple[dict[tuple[str, str], str], dict[str, Mapping[str, Any]]]
        ] = {}
        # Condition types each ClusterQuota's status carries (series to drop with it).
        self._cluster_conditions: dict[str, set[str]] = {}
        self._text_families = (self.resource_quota, self.cluster_quota_namespace_usage)
        # All of them, as prometheus-client reads a registry (``get_sample_value``, tests).
        self.registry = CollectorRegistry()
        self.registry.register(self._plain)
        for family in self._text_families:
            self.registry.register(family)

    # -- tally.resourcequota.controller.SyncObserver

    def quota_synced(
        self, key: QuotaKey, hard: Mapping[str, Quantity], used: Mapping[str, Quantity]
    ) -> None:
        namespace, name = key
        series = self._series.setdefault(key, {})
        for resource, kind in [
            (resource, kind)
            for resource, kind in series
            if resource not in (hard if kind == "hard" else used)
        ]:
            self.resource_quota.remove(namespace, name, resource, kind)
            del series[(resource, kind)]
        for kind, values in (("hard", hard), ("used", used)):
            for resource, quantity in values.items():
                child = series.get((resource, kind))
                if child is None:
                    child = series[(resource, kind)] = self.resource_quota.labels(
                        namespace, name, resource, kind
                    )
                child.set(quantity.nanos / _NANOS)

    def quota_deleted(self, key: QuotaKey) -> None:
        for resource, kind in self._series.pop(key, {}):
            self.resource_quota.remove(*key, resource, kind)

    # -- tally.clusterquota.controller.SyncObserver

    def cluster_quota_synced(self, name: str, status: Mapping[str, Any]) -> None:
        # Each status carries every selected namespace's usage, and most of it is what the
        # last one carried: a namespace's share is compared as written, and only a value whose
        # text changed is parsed and set (at 10 000 namespaces, parsing and setting all of them
        # cost the loop 130 ms a status, and collecting every value's text to compare 25 ms).
        total = status.get("total") or {}
        totals: dict[tuple[str, str], str] = {}
        for kind in ("hard", "used"):
            for resource, text in (total.get(kind) or {}).items():
                totals[(resource, kind)] = str(text)
        shares: dict[str, Mapping[str, Any]] = {}
        for entry in status.get("namespaces") or []:
            used = (entry.get("status") or {}).get("used")
            shares[entry["namespace"]] = used if isinstance(used, Mapping) else {}
        before_totals, before_shares = self._cluster_series.get(name, ({}, {}))
        for resource, kind in before_totals.keys() - totals.keys():
            self.cluster_quota_usage.remove(name, resource, kind)
        for (resource, kind), text in totals.items():
            if before_totals.get((resource, kind)) != text:
                self.cluster_quota_usage.labels(name, resource, kind).set(_value(text))
        for namespace in before_shares.keys() - shares.keys():
            for resource in before_shares[namespace]:
                self.cluster_quota_namespace_usage.remove(name, namespace, resource, "used")
        for namespace, used in shares.items():
            previous = before_shares.get(namespace)
            if previous == used:
                continue
            previous = previous or {}
            for resource in previous.keys() - used.keys():
                self.cluster_quota_namespace_usage.remove(name, namespace, resource, "used")
            for resource, text in used.items():
                if previous.get(resource) != text:
                    series = self.cluster_quota_namespace_usage.labels(
                        name, namespace, resource, "used"
                    )
                    series.set(_value(str(text)))
        self._cluster_series[name] = (totals, shares)
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

    def cluster_quota_status_size(self, name: str, size: int) -> None:
        self.cluster_quota_status_bytes.labels(name).set(size)

    def cluster_quota_deleted(self, name: str) -> None:
        with contextlib.suppress(KeyError):
            self.cluster_quota_status_bytes.remove(name)
        totals, shares = self._cluster_series.pop(name, ({}, {}))
        for resource, kind in totals:
            self.cluster_quota_usage.remove(name, resource, kind)
        for namespace, used in shares.items():
            for resource in used:
                self.cluster_quota_namespace_usage.remove(name, namespace, resource, "used")
        for kind in self._cluster_conditions.pop(name, set()):
            self._remove_cluster_condition(name, kind)

    def _remove_cluster_condition(self, name: str, kind: str) -> None:
        for choice in CONDITION_STATUSES:
            self.cluster_quota_condition.remove(name, kind, choice)

    def sync_finished(self, duration: float, error: Exception | None) -> None:
        self.sync_duration.observe(duration)
        if error is not None:
            self.sync_errors.inc()

    # -- tally.admission.metrics.AdmissionMetrics

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
        self._oldest_age = oldest_age

    def watch_uncounted(self, problems: Callable[[], Mapping[str, str]]) -> None:
        """Report, at every scrape, the resources quotas name that tally does not count
        (``problems``: resource to reason), as ``tally_uncounted_resource{resource, reason}``."""
        self._uncounted.problems = problems

    def read_state(self) -> None:
        """On the event loop, before a render: the values a scrape takes from tally's own
        state (which the loop changes), so that the render reads none of it."""
        if self._oldest_age is not None:
            self.oldest_unconfirmed_charge.set(self._oldest_age() or 0.0)
        self._uncounted.read()

    def enforcing(self, *, resource_quotas: bool) -> None:
        self.enforcing_gauge.labels("ResourceQuota").set(1 if resource_quotas else 0)
        self.enforcing_gauge.labels(CLUSTER_QUOTA_KIND).set(1)

    def heap_trimmed(self, seconds: float) -> None:
        self.heap_trim_duration.observe(seconds)

    # -- tally.app.readiness

    def loop_lagged(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)

    # -- leader election

    def leading(self, identity: str, leading: bool) -> None:
        self.leader.labels(identity).set(1 if leading else 0)

    # -- tally.webhook.tls.ServingTLS

    def webhook_certificate_loaded(self, not_after: datetime.datetime) -> None:
        """The webhook server presents, from now on, a certificate valid until ``not_after``."""
        self.webhook_certificate_expiry.set(not_after.timestamp())

    # -- serving

    def exposition(self) -> bytes:
        """The text format, rendered here and now (tests; :meth:`render` serves scrapes)."""
        self.read_state()
        return self._render([family.snapshot() for family in self._text_families])

    async def render(self) -> bytes:
        """The text format for a scrape: tally's state and the large families' series read on
        the loop, the text rendered in a worker thread (the module says why), one render at a
        time."""
        async with self._rendering:
            self.read_state()
            snapshots = [family.snapshot() for family in self._text_families]
            return await asyncio.to_thread(self._render, snapshots)

    def _render(self, snapshots: list[list[_TextSeries]]) -> bytes:
        texts = [
            family.text(snapshot)
            for family, snapshot in zip(self._text_families, snapshots, strict=True)
        ]
        return generate_latest(self._plain) + "".join(texts).encode()

    async def serve(
        self,
        addr: str,
        port: int,
        *,
        reviewer: delegating_auth.Reviewer | None = None,
        tls_hosts: Sequence[str] | None = None,
    ) -> web.AppRunner:
        """Start ``GET /metrics`` on ``addr:port``; the caller cleans the runner up.

        With ``reviewer`` (``TALLY_METRICS_AUTH`` resolved to ``kubernetes``): over HTTPS with
        a certificate made now for ``tls_hosts`` (default :func:`serving_hosts`), every request
        judged by :class:`~tally.machinery.delegating_auth.DelegatingAuth` asking ``reviewer``.
        Without: plain HTTP to anyone who reaches the port, with a warning unless ``addr`` is a
        loopback address.
        """

        async def metrics(_: web.Request) -> web.Response:
            response = web.Response(body=await self.render())
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response

        middlewares: list[Middleware] = []
        context: ssl.SSLContext | None = None
        if reviewer is not None:
            middlewares.append(
                with_authentication_and_authorization(delegating_auth.DelegatingAuth(reviewer))
            )
            context = self_signed_context(
                tls_hosts if tls_hosts is not None else serving_hosts(),
                datetime.datetime.now(datetime.UTC),
            )
        else:
            warning = open_metrics_warning(addr, port)
            if warning:
                logger.warning("%s", warning)
        app = web.Application(middlewares=middlewares)
        app.add_routes([web.get("/metrics", metrics)])
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, addr, port, ssl_context=context).start()
        logger.info(
            "serving metrics at %s://%s:%d/metrics (%s)",
            "https" if context is not None else "http",
            addr,
            port,
            "to users the API server allows get on /metrics"
            if reviewer is not None
            else "to anyone who reaches the port",
        )
        return runner


# -- secure serving (TALLY_METRICS_AUTH=kubernetes)

SELF_SIGNED_VALIDITY: Final = datetime.timedelta(days=365)
"""Of the certificate made at start-up (client-go's ``GenerateSelfSignedCertKey``, which
controller-runtime's metrics server makes without a cert dir, lasts a year too). Never renewed:
nobody holds its CA, so every client skips verification, its dates included (Prometheus'
``insecure_skip_verify`` and curl's ``-k`` check nothing of the certificate)."""


def serving_hosts() -> tuple[str, ...]:
    """The names the metrics certificate carries: the pod's name (``HOSTNAME`` in a pod, else
    the host's name), when it is a DNS name, then ``localhost`` and ``127.0.0.1`` (client-go's
    ``GenerateSelfSignedCertKey("localhost", [127.0.0.1])``). The first is its common name."""
    name = (os.environ.get("HOSTNAME") or socket.gethostname()).lower()
    hosts = ["localhost", "127.0.0.1"]
    if not is_dns1123_subdomain(name) and name != "localhost":
        hosts.insert(0, name)
    return tuple(hosts)


def self_signed_context(hosts: Sequence[str], now: datetime.datetime) -> ssl.SSLContext:
    """A server context presenting a certificate for ``hosts`` (common name ``hosts[0]``)
    signed by a CA made with it, both kept in memory only: as client-go's
    ``GenerateSelfSignedCertKey``, the chain served is the certificate and that CA.

    ``ssl`` loads a pair only from files: they are written to a private temporary directory
    for the moment of loading and removed at once.
    """
    common_name = hosts[0]
    ca, ca_key = certs.new_ca(now, SELF_SIGNED_VALIDITY, common_name=f"{common_name}-ca")
    cert, key = certs.new_serving_certificate(
        ca, ca_key, hosts, now, SELF_SIGNED_VALIDITY, common_name=common_name
    )
    material = certs.Material(cas=(ca,), ca_key=ca_key, cert=cert, key=key)
    context = tls.server_context()
    with tempfile.TemporaryDirectory(prefix="tally-metrics-tls-") as directory:
        chain, private = Path(directory, certs.TLS_CRT), Path(directory, certs.TLS_KEY)
        private.touch(mode=0o600)
        private.write_bytes(material.key_pem)
        chain.write_bytes(material.cert_pem + material.ca_bundle)
        context.load_cert_chain(chain, private)
    return context


def open_metrics_warning(addr: str, port: int) -> str:
    """Why serving ``/metrics`` unauthenticated on ``addr`` is a risk; "" on a loopback
    address, which only this host reaches."""
    if is_loopback(addr):
        return ""
    return (
        f"TALLY_METRICS_AUTH=none with TALLY_METRICS_ADDR={addr!r}: /metrics (quota names, "
        f"namespaces, every tenant's usage) is served over plain HTTP to anyone who reaches "
        f"port {port}; set TALLY_METRICS_AUTH=kubernetes (or leave it unset: auto is "
        "kubernetes on this address), or bind TALLY_METRICS_ADDR to 127.0.0.1"
    )


def with_authentication_and_authorization(auth: delegating_auth.DelegatingAuth) -> Middleware:
    """controller-runtime's ``filters.WithAuthenticationAndAuthorization`` as aiohttp
    middleware: a request reaches its handler only when ``auth`` allows it, and is answered
    otherwise with ``auth``'s verdict (401 with ``WWW-Authenticate``, 403, 503) as text."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        verdict = await auth.check(request.headers.get(hdrs.AUTHORIZATION))
        if verdict.allowed:
            return await handler(request)
        headers = {hdrs.WWW_AUTHENTICATE: verdict.challenge} if verdict.challenge else None
        return web.Response(status=verdict.status, text=verdict.message + "\n", headers=headers)

    return middleware


class _Uncounted(Collector):
    """``tally_uncounted_resource``: 1 for each resource some quota counts (``count/<r>.<g>``)
    that tally does not, labelled with why (the Event reason on those quotas: ``FailedList``,
    ``Forbidden``, ``UnknownResource``, ``UnsupportedResource``); nothing when all are counted.
    Read at scrape time from the dynamic kinds' problems, so a problem solved leaves no series.
    """

    def __init__(self, problems: Callable[[], Mapping[str, str]]) -> None:
        self.problems = problems
        """What to read at each scrape (:meth:`Metrics.watch_uncounted`); nothing until set."""
        self._read: list[tuple[str, str]] = []

    def read(self) -> None:
        """Read ``problems`` now, on the loop that changes them; :meth:`collect` reports this."""
        self._read = sorted(self.problems().items())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tally_uncounted_resource",
            "Resources a quota counts that tally does not count, by reason (1 each)",
            labels=["resource", "reason"],
        )
        for resource, reason in self._read:
            family.add_metric([resource, reason], 1.0)
        yield family
