"""Benchmark: what a tenant's view of a ClusterQuota costs, as objects or as an aggregated API.

tally keeps an AppliedClusterQuota in every namespace a ClusterQuota selects
(``tally.clusterquota.applied``): each charge moves the total every one of them shows, so a
burst of creates is a burst of writes. The other design serves the same objects from an
extension API server through the aggregation layer (``bench/_aggregated_view.py``, built for
this measurement): no writes, but a server on the cluster's path. This measures both on one
operator-mode control plane (``hack/cluster.py``, simulated nodes), tally as a subprocess:

* ``--namespaces`` namespaces (default 1 000), one ClusterQuota selecting them all;
* ``--tenant-watches`` tenants (default 100), each a user holding only the built-in ``view``
  role in one of the target namespaces, watching that namespace's view through the API server;
* a burst of pod creates at Poisson times (``--rate``, default 20/s, for ``--seconds``, default
  30) round robin over the first ``--targets`` namespaces (default 100), in three phases, each
  from a quiet plane, tally restarted between them: no view (``TALLY_APPLIED_QUOTAS=false``),
  objects (``true``), and the aggregated API (``false`` plus the extension server, registered
  as a deployer would: APIService, ExternalName Service, RBAC; ``--no-aggregated`` leaves it
  out);
* for each phase: CPU per create of tally (and the extension server), kube-apiserver and etcd
  (from the burst's start until the plane is quiet, over the creates), the ClusterQuota's
  status writes; with a view, the view's writes (the events of a cluster-wide watch: one per
  write for the objects; none for the API), per second over the burst and at the busiest
  second; the staleness of a namespace's own share (from a create's answer to the first event
  showing it, on the cluster-wide watch and on its tenant's, p50/p99) and of the total (from
  the last create's answer to every namespace showing the final total); the time from the
  ClusterQuota's first status to a view in every namespace;
* then the view's server SIGKILLed: whether a tenant still reads the view, whether the group's
  discovery answers, and how long the deletion of a namespace no ClusterQuota selects takes
  (if not within 90 s, how long after the server is back).

Writes ``bench/results/applied.json`` and its picture (or ``--results``). Cleans up the plane
and the processes whatever happens. No target: the issue asks for the cost to be stated.

Run: ``.venv/bin/python bench/applied.py [--namespaces 1000] [--rate 20] [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import contextlib
import datetime
import functools
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch

from _common import (
    REPO,
    Figure,
    Raw,
    api_client,
    bounded,
    cluster,
    control_plane,
    cpu_seconds,
    kubectl,
    machine,
    operator_process,
    percentile,
    until,
    write_results,
)
from _open_loop import open_loop
from builders import pod  # tests/e2e/builders.py, put on sys.path by _common
from tally.quota.quantity import parse_quantity
from tally.webhook import certs

LABEL = "bench.tally.dev/applied"
CQ = "bench-applied"
GROUP, VERSION, PLURAL = "tally.dev", "v1alpha1", "appliedclusterquotas"
CQ_PATH = "/apis/tally.dev/v1alpha1/clusterquotas"
VIEW_GROUP = "view.tally.dev"
"""The aggregated API's group (``bench/_aggregated_view.py``)."""
VIEW_API_SERVICE = f"v1alpha1.{VIEW_GROUP}"
VIEW_SERVICE = ("kube-system", "tally-applied-view")
DOWN_SETTLE_S = 5.0
"""Once the view's server is known to be down (the APIService unavailable, for the aggregated
API), this long before the checks: the aggregator refreshes the group's discovery on the
APIService's change."""
DOWN_DELETE_WAIT_S = 90.0
WAIT_S = 300.0
QUIET_CORES = 0.15
"""Below this many cores for tally, kube-apiserver and etcd together, the plane is quiet."""


def count(quantity: str) -> int:
    """A pod count as the API server writes it ("1k" for 1000)."""
    return parse_quantity(quantity).nanos // 1_000_000_000


class ClusterWatch:
    """A cluster-wide watch of one custom kind from :meth:`start` to :meth:`stop`, each
    event's object handed to ``seen`` with the time it arrived; ``events`` is what ``seen``
    keeps."""

    def __init__(
        self, api: client.ApiClient, group: str, plural: str,
        seen: Callable[[list[Any], float, Any], None],
    ) -> None:  # fmt: skip
        self.custom = client.CustomObjectsApi(api)
        self.group, self.plural, self.seen = group, plural, seen
        self.events: list[Any] = []
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            stream = watch.Watch().stream(
                self.custom.list_cluster_custom_object, self.group, VERSION, self.plural,
                timeout_seconds=3600,
            )  # fmt: skip
            async for event in stream:
                self.seen(self.events, time.perf_counter(), event["raw_object"])

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def applied_watch(api: client.ApiClient, group: str) -> ClusterWatch:
    """Every event of a cluster-wide watch of AppliedClusterQuotas (in ``group``): when it
    arrived, its namespace, its own pods and the total's (:func:`record`)."""
    return ClusterWatch(api, group, PLURAL, record)


def status_writes(api: client.ApiClient) -> ClusterWatch:
    """When each write of a ClusterQuota arrived: the writes every side pays, a view or not."""
    return ClusterWatch(api, GROUP, "clusterquotas",
                        lambda events, arrived, _: events.append(arrived))  # fmt: skip


def record(events: list[Any], arrived: float, obj: Any) -> None:
    """An event's object as (arrived, namespace, its own pods, the total's), if it shows both."""
    status = obj.get("status") or {}
    own = ((status.get("namespace") or {}).get("used") or {}).get("pods")
    total = ((status.get("total") or {}).get("used") or {}).get("pods")
    if own is not None and total is not None:
        events.append((arrived, obj["metadata"]["namespace"], count(own), count(total)))


class TenantWatches:
    """One watch per namespace, each as a user who holds only the built-in ``view`` role
    there (a RoleBinding made here), through the API server: the tenants' own
    ``kubectl get -w``, which an aggregated API answers itself and the objects' API server
    answers from its watch cache."""

    def __init__(self, api: client.ApiClient, group: str, namespaces: list[str]) -> None:
        self.api = api
        self.group = group
        self.namespaces = namespaces
        self.events: list[tuple[float, str, int, int]] = []
        self.tasks: list[asyncio.Task[None]] = []

    @staticmethod
    def user(namespace: str) -> str:
        return f"tenant-of-{namespace}"

    @staticmethod
    async def grant(raw: Raw, namespaces: list[str]) -> None:
        await bounded(
            (lambda ns=ns: raw.create(
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
                    "metadata": {"name": "bench-tenant-view"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "view"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": TenantWatches.user(ns)}]})
             for ns in namespaces),
            concurrency=16,
        )  # fmt: skip

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._run(ns)) for ns in self.namespaces]

    async def _run(self, namespace: str) -> None:
        session = self.api.rest_client.pool_manager
        url = (f"{self.api.configuration.host}/apis/{self.group}/{VERSION}/namespaces/"
               f"{namespace}/{PLURAL}?watch=1&timeoutSeconds=3600")  # fmt: skip
        headers = {"Impersonate-User": self.user(namespace), "Accept": "application/json"}
        while True:
            forever = aiohttp.ClientTimeout(total=None)
            async with session.get(url, headers=headers, timeout=forever) as response:
                if response.status != 200:
                    raise RuntimeError(f"a tenant's watch in {namespace}: HTTP {response.status}"
                                       f" {(await response.text())[:200]}")  # fmt: skip
                async for line in response.content:
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            record(self.events, time.perf_counter(), event["object"])

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        failed = [t for t in self.tasks if not t.cancelled() and t.exception() is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} tenant watches failed") from failed[0].exception()

    def check(self) -> None:
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError("a tenant's watch ended") from task.exception()


def own_staleness(
    events: list[tuple[float, str, int, int]], answers: list[tuple[float, str, int]]
) -> list[float]:
    """For each create (answered at, namespace, the namespace's pods with it), the time until
    an event of that namespace's object showed at least that many pods."""
    by_namespace: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for arrived, namespace, own, _ in events:
        by_namespace[namespace].append((arrived, own))
    found = []
    for answered, namespace, pods in answers:
        history = by_namespace[namespace]
        start = bisect.bisect_left(history, answered, key=lambda entry: entry[0])
        seen = next((at for at, own in history[start:] if own >= pods), None)
        if seen is not None:
            found.append(seen - answered)
    return found


def total_staleness(
    events: list[tuple[float, str, int, int]], namespaces: list[str], total: int, since: float
) -> float | None:
    """From ``since`` until every namespace's object had shown ``total``."""
    latest: dict[str, float] = {}
    for arrived, namespace, _, shown in events:
        if shown == total and namespace not in latest:
            latest[namespace] = arrived
    if any(namespace not in latest for namespace in namespaces):
        return None
    return max(0.0, max(latest.values()) - since)


async def settled(watcher: ClusterWatch, names: list[str], total: int, since: float) -> None:
    """Until every namespace's object has shown ``total`` (or WAIT_S passed)."""
    for _ in range(int(WAIT_S / 0.5)):
        if total_staleness(watcher.events, names, total, since) is not None:
            return
        if watcher.task is not None and watcher.task.done():
            watcher.task.result()  # its failure, not a five-minute wait
            raise RuntimeError("the AppliedClusterQuota watch ended")
        await asyncio.sleep(0.5)


class Phase:
    def __init__(self, raw: Raw, pids: dict[str, int], targets: list[str]) -> None:
        self.raw = raw
        self.pids = pids
        self.targets = targets
        self.counts: dict[str, int] = defaultdict(int)
        self.answers: list[tuple[float, str, int]] = []
        self.sent = 0

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    async def burst(self, rate: float, seconds: float, seed: int, prefix: str) -> dict[str, Any]:
        rng = random.Random(seed)
        offsets, at = [], rng.expovariate(rate)
        while at < seconds:
            offsets.append(at)
            at += rng.expovariate(rate)

        async def send(index: int) -> bool:
            namespace = self.targets[index % len(self.targets)]
            try:
                await self.raw.call("POST", f"/api/v1/namespaces/{namespace}/pods",
                                    pod(f"{prefix}{index:05d}"))  # fmt: skip
            except client.ApiException:
                return False
            self.counts[namespace] += 1
            self.answers.append((time.perf_counter(), namespace, self.counts[namespace]))
            return True

        before, started = self.cpu(), time.perf_counter()
        loop = await open_loop(offsets, send)
        last = time.perf_counter()
        quiet = await self.quiet()
        after = self.cpu()
        admitted = len(loop.latencies)
        return {
            "creates": admitted,
            "refused": loop.refused,
            "started": started,
            "last_answer": last,
            "seconds": last - started,
            "quiet_after_s": quiet,
            "p99_ms": percentile(loop.latencies, 0.99) * 1000 if loop.latencies else None,
            "cpu_ms_per_create": {
                name: (after[name] - before[name]) * 1000 / max(1, admitted) for name in after
            },
        }

    async def quiet(self) -> float:
        """Seconds until tally, kube-apiserver and etcd together use under QUIET_CORES."""
        started = time.perf_counter()
        previous, at = sum(self.cpu().values()), time.perf_counter()
        while time.perf_counter() - started < WAIT_S:
            await asyncio.sleep(1.0)
            now, when = sum(self.cpu().values()), time.perf_counter()
            if (now - previous) / (when - at) < QUIET_CORES:
                return when - started
            previous, at = now, when
        return time.perf_counter() - started


async def prepare(raw: Raw, names: list[str], targets: list[str]) -> None:
    print(f"creating {len(names)} namespaces ...", file=sys.stderr, flush=True)
    await bounded(
        (lambda name=name: raw.create("/api/v1/namespaces",
                                      {"metadata": {"name": name, "labels": {LABEL: "a"}}})
         for name in names),
        concurrency=32,
    )  # fmt: skip
    for name in targets:  # pods need the default service account
        await until(raw, f"/api/v1/namespaces/{name}/serviceaccounts/default", lambda _: True,
                    "a service account", within=WAIT_S)  # fmt: skip


async def create_cluster_quota(raw: Raw, hard: int) -> None:
    await raw.call("POST", CQ_PATH, {
        "apiVersion": "tally.dev/v1alpha1", "kind": "ClusterQuota", "metadata": {"name": CQ},
        "spec": {"namespaceSelector": {"matchLabels": {LABEL: "a"}},
                 "quota": {"hard": {"pods": str(hard)}}},
    })  # fmt: skip
    await until(raw, f"{CQ_PATH}/{CQ}",
                lambda cq: "used" in ((cq.get("status") or {}).get("total") or {}),
                "the ClusterQuota's first status", within=WAIT_S)  # fmt: skip


async def applied_everywhere(raw: Raw, group: str, count: int) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < WAIT_S:
        items = await raw.list_all(f"/apis/{group}/{VERSION}/{PLURAL}")
        if len(items) >= count:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)
    raise RuntimeError(f"fewer than {count} AppliedClusterQuotas after {WAIT_S} s")


def start_tally(state: Any, log: Path, applied: bool) -> operator_process.TallyProcess:
    tally = operator_process.TallyProcess(
        Path(state.kubeconfig), log, bin_dir=Path(state.bin_dir),
        env={"TALLY_APPLIED_QUOTAS": "true" if applied else "false"},
    )  # fmt: skip
    try:  # once returned, the caller stops it; a failure before that stops it here
        tally.start()
    except BaseException:
        tally.kill()
        raise
    return tally


def register_view(state: Any, directory: Path, port: int) -> None:
    """What a deployer of the aggregated API applies, as an admin: a serving pair for its
    Service's name (in ``directory``), the ExternalName Service pointing at 127.0.0.1 (the
    local planes have no Service network; the aggregator resolves such a Service to its
    name), the APIService with the pair's CA, a ClusterRole aggregating reads of the view into
    ``view``, ``edit`` and ``admin``, and the two rights every extension API server needs,
    given to tally's ServiceAccount (the server runs with its token)."""
    namespace, name = VIEW_SERVICE
    material = certs.new_material([f"{name}.{namespace}.svc"], datetime.datetime.now(datetime.UTC))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(material.cert_pem)
    (directory / "tls.key").write_bytes(material.key_pem)
    account = {"kind": "ServiceAccount", "name": "tally", "namespace": "tally-system"}
    readers = {f"rbac.authorization.k8s.io/aggregate-to-{role}": "true"
               for role in ("view", "edit", "admin")}  # fmt: skip
    objects = [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {"type": "ExternalName", "externalName": "127.0.0.1",
                  "ports": [{"name": "https", "port": port}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": VIEW_API_SERVICE},
         "spec": {"group": VIEW_GROUP, "version": VERSION, "groupPriorityMinimum": 1000,
                  "versionPriority": 15, "caBundle": base64.b64encode(material.ca_bundle).decode(),
                  "service": {"namespace": namespace, "name": name, "port": port}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "tally-applied-view-reader", "labels": readers},
         "rules": [{"apiGroups": [VIEW_GROUP], "resources": [PLURAL],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "tally-applied-view-authentication", "namespace": "kube-system"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "extension-apiserver-authentication-reader"},
         "subjects": [account]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "tally-applied-view-auth-delegator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:auth-delegator"},
         "subjects": [account]},
    ]  # fmt: skip
    kubectl(state, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": objects}))  # fmt: skip


def start_view(state: Any, log: Path) -> operator_process.TallyProcess:
    """The aggregated API's server (``bench/_aggregated_view.py``), run by ``kopf run`` as tally
    is, with tally's ServiceAccount; registered first, then waited for until the API server
    reports its APIService available."""
    port = cluster.free_port()
    register_view(state, log.with_name("view-tls"), port)
    view = operator_process.TallyProcess(
        Path(state.kubeconfig), log, bin_dir=Path(state.bin_dir),
        entry_point=REPO / "bench" / "_aggregated_view.py",
        env={"TALLY_WEBHOOK_ENABLED": "false", "TALLY_VIEW_PORT": str(port),
             "TALLY_VIEW_TLS_DIR": str(log.with_name("view-tls"))},
    )  # fmt: skip
    try:  # once returned, the caller stops it; a failure before that stops it here
        view.start()
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.CalledProcessError):
                available = "jsonpath={.status.conditions[?(@.type=='Available')].status}"
                conditions = kubectl(state, "get", "apiservice", VIEW_API_SERVICE, "-o", available)
                if conditions == "True":
                    return view
            time.sleep(0.5)
        raise RuntimeError(f"{VIEW_API_SERVICE} never became available:\n{view.log_text()}")
    except BaseException:
        view.kill()
        raise


def restart_view(state: Any, logs: Path, stack: contextlib.ExitStack) -> None:
    view = start_view(state, logs / "view-again.log")
    stack.callback(view.kill)


def crash(process: operator_process.TallyProcess) -> None:
    """SIGKILL, as a node lost or an OOM kill stops a server."""
    assert process.process is not None
    process.process.kill()
    process.process.wait()


class Side:
    """How one phase serves the view: ``off`` (nothing), ``objects`` (tally writes
    AppliedClusterQuotas), ``aggregated`` (``bench/_aggregated_view.py`` serves them)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.group = VIEW_GROUP if name == "aggregated" else GROUP
        self.shows = name != "off"


async def measure_phase(
    state: Any, pids: dict[str, int], names: list[str], targets: list[str],
    args: argparse.Namespace, side: Side,
) -> dict[str, Any]:  # fmt: skip
    api = await api_client(state.kubeconfig, pool=64 + args.tenant_watches)
    raw = Raw(api)
    phase = Phase(raw, pids, targets)
    watcher = applied_watch(api, side.group)
    tenants = TenantWatches(api, side.group, targets[: args.tenant_watches])
    cluster_quotas = status_writes(api)
    result: dict[str, Any] = {"side": side.name, "applied": side.shows}
    try:
        cluster_quotas.start()
        if side.shows:
            watcher.start()
            result["applied_everywhere_s"] = await applied_everywhere(raw, side.group, len(names))
            result["applied_everywhere_writes"] = (
                len(watcher.events) if side.name == "objects" else 0
            )
            print(f"  an AppliedClusterQuota in every namespace after "
                  f"{result['applied_everywhere_s']:.1f} s", file=sys.stderr)  # fmt: skip
            tenants.start()
        # Every side starts its burst from a quiet plane: the first phase's tally has just
        # seen the namespaces and the ClusterQuota created.
        await phase.quiet()
        tenants.check()
        before_events, before_tenant = len(watcher.events), len(tenants.events)
        before_writes = len(cluster_quotas.events)
        burst = await phase.burst(args.rate, args.seconds, args.seed, side.name[:3])
        result.update(burst)
        result["clusterquota_status_writes"] = len(
            [at for at in cluster_quotas.events[before_writes:]
             if burst["started"] <= at <= burst["last_answer"]])  # fmt: skip
        if side.shows:
            total = count((((await raw.call("GET", f"{CQ_PATH}/{CQ}")).get("status") or {})
                           .get("total") or {}).get("used", {}).get("pods", "0"))  # fmt: skip
            await settled(watcher, names, total, burst["last_answer"])
            tenants.check()
            events = watcher.events[before_events:]
            window = [at for at, *_ in events if burst["started"] <= at <= burst["last_answer"]]
            per_second: dict[int, int] = defaultdict(int)
            for at in window:
                per_second[int(at - burst["started"])] += 1
            own = own_staleness(events, phase.answers)
            watched = set(tenants.namespaces)
            tenant_own = own_staleness(tenants.events[before_tenant:],
                                       [a for a in phase.answers if a[1] in watched])  # fmt: skip
            # Objects: each event of the cluster-wide watch is one write the API server took.
            # Aggregated: the server's own events; the API server took no write of the view.
            writes = len(events) if side.name == "objects" else 0
            result.update({
                "watch_events": len(events),
                "writes": writes,
                "writes_per_s_during_burst":
                    (len(window) if side.name == "objects" else 0) / max(1e-9, burst["seconds"]),
                "writes_busiest_second":
                    max(per_second.values(), default=0) if side.name == "objects" else 0,
                "watch_events_per_s_during_burst": len(window) / max(1e-9, burst["seconds"]),
                "own_staleness_p50_s": percentile(own, 0.5) if own else None,
                "own_staleness_p99_s": percentile(own, 0.99) if own else None,
                "own_seen": len(own),
                "tenant_watches": len(tenants.namespaces),
                "tenant_events": len(tenants.events) - before_tenant,
                "tenant_own_staleness_p50_s": percentile(tenant_own, 0.5) if tenant_own else None,
                "tenant_own_staleness_p99_s":
                    percentile(tenant_own, 0.99) if tenant_own else None,
                "total_staleness_s": total_staleness(events, names, total, burst["last_answer"]),
                "final_total": total,
            })  # fmt: skip
        return result
    finally:
        await watcher.stop()
        await tenants.stop()
        await cluster_quotas.stop()
        await api.close()


async def while_down(
    state: Any, kill: Callable[[], None], restart: Callable[[], None] | None, group: str,
    read_in: str, doomed: str,
) -> dict[str, Any]:  # fmt: skip
    """What a cluster sees once the view's server is gone (``kill``): how long until the API
    server reports the APIService unavailable (aggregated only), whether a tenant can still
    read the view in ``read_in``, whether the group's discovery answers, and whether the
    deletion of the namespace ``doomed`` (which the ClusterQuota does not select) finishes;
    if not within DOWN_DELETE_WAIT_S, how long after ``restart`` it does."""
    api = await api_client(state.kubeconfig)
    raw = Raw(api)
    found: dict[str, Any] = {}
    try:
        kill()
        killed = time.perf_counter()
        if group == VIEW_GROUP:
            found["unavailable_after_s"] = None
            while time.perf_counter() - killed < WAIT_S:
                service = await raw.call(
                    "GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{VIEW_API_SERVICE}"
                )
                conditions = (service.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Available" and c.get("status") == "False"
                       for c in conditions):  # fmt: skip
                    found["unavailable_after_s"] = time.perf_counter() - killed
                    break
                await asyncio.sleep(0.5)
        await asyncio.sleep(DOWN_SETTLE_S)
        try:
            await raw.call("GET", f"/apis/{group}/{VERSION}/namespaces/{read_in}/{PLURAL}/{CQ}")
            found["view_read"] = 200
        except client.ApiException as error:
            found["view_read"] = error.status
        try:
            await raw.call("GET", f"/apis/{group}/{VERSION}")
            found["discovery"] = 200
        except client.ApiException as error:
            found["discovery"] = error.status
        started = time.perf_counter()
        await raw.call("DELETE", f"/api/v1/namespaces/{doomed}")
        found["namespace_deleted_s"] = await gone(raw, doomed, started, found)
        if found["namespace_deleted_s"] is None and restart is not None:
            restarted = time.perf_counter()
            await asyncio.to_thread(restart)
            found["restarted_after_s"] = restarted - started
            found["namespace_deleted_after_restart_s"] = await gone(raw, doomed, restarted, {})
        return found
    finally:
        await api.close()


async def gone(raw: Raw, namespace: str, since: float, found: dict[str, Any]) -> float | None:
    """Seconds from ``since`` until ``namespace`` is gone (None after DOWN_DELETE_WAIT_S);
    the True conditions it showed last go into ``found``."""
    while time.perf_counter() - since < DOWN_DELETE_WAIT_S:
        try:
            current = await raw.call("GET", f"/api/v1/namespaces/{namespace}")
        except client.ApiException as error:
            if error.status != 404:
                raise
            return time.perf_counter() - since
        found["namespace_conditions"] = [
            {k: c.get(k) for k in ("type", "status", "reason", "message")}
            for c in (current.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"
        ]  # fmt: skip
        await asyncio.sleep(1.0)
    return None


def report(results: dict[str, Any], args: argparse.Namespace) -> list[Figure]:
    off, on, agg = results["off"], results["objects"], results.get("aggregated")
    print(f"applied: {args.namespaces} namespaces under one ClusterQuota; creates at "
          f"{args.rate}/s for {args.seconds} s over {args.targets} of them; "
          f"{args.tenant_watches} tenants watching their own")  # fmt: skip
    print(f"machine: {results['machine']}")
    sides = [("without a view", off), ("objects", on)] + ([("aggregated", agg)] if agg else [])
    for label, side in sides:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in side["cpu_ms_per_create"].items())
        print(f"{label}: {side['creates']} creates, p99 {side['p99_ms']:.0f} ms, CPU per create: "
              f"{parts} ms; quiet {side['quiet_after_s']:.0f} s after; "
              f"{side['clusterquota_status_writes']} ClusterQuota status writes")  # fmt: skip
        if not side["applied"]:
            continue
        print(f"  view writes: {side['writes']}, {side['writes_per_s_during_burst']:.1f}/s "
              f"during the burst (busiest second {side['writes_busiest_second']}); "
              f"{side['watch_events']} events to the cluster-wide watch")  # fmt: skip
        print(f"  own share shown: p50 {side['own_staleness_p50_s']:.2f} s, p99 "
              f"{side['own_staleness_p99_s']:.2f} s ({side['own_seen']} of {side['creates']}); "
              f"to the tenants' watches p50 {side['tenant_own_staleness_p50_s'] or 0:.2f} s, "
              f"p99 {side['tenant_own_staleness_p99_s'] or 0:.2f} s")  # fmt: skip
        total = side["total_staleness_s"]
        print(f"  every namespace shows the final total {total:.1f} s after the last create"
              if total is not None else "  a namespace never showed the final total")  # fmt: skip
        print(f"  first view in every namespace: {side['applied_everywhere_s']:.1f} s after the "
              f"ClusterQuota's first status")  # fmt: skip
        print(f"  with its server down: {side.get('down')}")
    reference = {"reference_name": "no view"}
    figures = []
    for label, side in [("objects", on)] + ([("aggregated", agg)] if agg else []):
        view_cpu = side["cpu_ms_per_create"]["tally"] + side["cpu_ms_per_create"].get("view", 0.0)
        total = side["total_staleness_s"]
        figures += [
            Figure(f"{label}: tally CPU per create", "ms", view_cpu,
                   off["cpu_ms_per_create"]["tally"], **reference),
            Figure(f"{label}: kube-apiserver CPU per create", "ms",
                   side["cpu_ms_per_create"]["kube-apiserver"],
                   off["cpu_ms_per_create"]["kube-apiserver"], **reference),
            Figure(f"{label}: view writes during the burst", "writes/s",
                   side["writes_per_s_during_burst"], None),
            Figure(f"{label}: own share shown, p99", "s", side["own_staleness_p99_s"] or 0.0,
                   None),
            Figure(f"{label}: final total shown everywhere", "s",
                   total if total is not None else -1.0, None),
        ]  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument(
        "--tenant-watches",
        type=int,
        default=100,
        help="tenants watching their own namespace's view (among the targets)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-aggregated", action="store_true", help="leave out the aggregated API's phase"
    )
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.tenant_watches > args.targets:
        parser.error("--tenant-watches may not exceed --targets")
    names = [f"bench-acq-{index:04d}" for index in range(args.namespaces)]
    targets = names[: args.targets]
    doomed = {"objects": "bench-acq-doomed-objects", "aggregated": "bench-acq-doomed-aggregated"}
    results: dict[str, Any] = {"machine": machine(), "namespaces": args.namespaces,
                               "targets": args.targets, "rate": args.rate,
                               "seconds": args.seconds,
                               "tenant_watches": args.tenant_watches}  # fmt: skip
    sides = [Side("off"), Side("objects")] + ([] if args.no_aggregated else [Side("aggregated")])
    with contextlib.ExitStack() as stack:
        print("starting an operator-mode control plane ...", file=sys.stderr, flush=True)
        state = stack.enter_context(control_plane("operator"))
        for crd in ("clusterquotas.tally.dev.yaml", "appliedclusterquotas.tally.dev.yaml"):
            kubectl(state, "apply", "-f", str(REPO / "crds" / crd))
        kubectl(state, "apply", "-f", str(REPO / "manifests" / "rbac-namespace-users.yaml"))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        hard = 10 * int(args.rate * args.seconds) + 1000

        async def setup() -> None:
            api = await api_client(state.kubeconfig, pool=64)
            try:
                raw = Raw(api)
                await prepare(raw, names, targets)
                for name in doomed.values():  # not selected
                    await raw.create("/api/v1/namespaces", {"metadata": {"name": name}})
                await TenantWatches.grant(raw, targets[: args.tenant_watches])
                await create_cluster_quota(raw, hard)
            finally:
                await api.close()

        for side in sides:
            tally = start_tally(state, logs / f"tally-{side.name}.log", side.name == "objects")
            stack.callback(tally.kill)
            assert tally.process is not None
            pids = {"tally": tally.process.pid, "kube-apiserver": state.pids["kube-apiserver"],
                    "etcd": state.pids["etcd"]}  # fmt: skip
            view: operator_process.TallyProcess | None = None
            if side.name == "aggregated":
                view = start_view(state, logs / "view.log")
                stack.callback(view.kill)
                assert view.process is not None
                pids["view"] = view.process.pid
            if side.name == "off":
                asyncio.run(setup())
            print(f"measuring: {side.name} ...", file=sys.stderr, flush=True)
            results[side.name] = asyncio.run(measure_phase(state, pids, names, targets, args, side))
            if side.shows:
                server = view if view is not None else tally
                restart: Callable[[], None] | None = None
                if view is not None:
                    restart = functools.partial(restart_view, state, logs, stack)
                print("  its server down ...", file=sys.stderr, flush=True)
                results[side.name]["down"] = asyncio.run(while_down(
                    state, lambda server=server: crash(server), restart, side.group,
                    targets[0], doomed[side.name]))  # fmt: skip
            tally.stop()
    figures = report(results, args)
    write_results("applied", results, figures, path=args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
