"""Soak and chaos: steady churn on an operator-mode control plane with two tally replicas (leader
election on) behind a round-robin balancer, while tally, the API server and etcd fail
underneath; invariants checked from the objects themselves.

    .venv/bin/python bench/soak.py --minutes 30   # bench/results/soak.json, .png, -timeline.png

What runs (all on loopback, all real: ``hack/cluster.py``'s etcd, kube-apiserver and
kube-controller-manager, two ``kopf run`` replicas started from a copy of ``operator/`` taken at
the start, so edits to the working tree during a long run never reach a restarted replica):

* **churn**: ``--clients`` concurrent clients at ``--rate`` requests per second in total over
  ``--namespaces`` namespaces, each with a ResourceQuota on pods, services (NodePort and
  LoadBalancer counted), PVCs and storage, configmaps and secrets, four fifths of them
  labelled into the five teams of five ClusterQuotas (pods, services): creates (most aimed at
  quotas that are already full, since creates outnumber deletes), updates and deletes of
  every kind; quotas and ClusterQuotas changed, quotas deleted and created again; namespaces
  relabelled from team to team; PodSets (in namespaces of their own) scaled; namespaces with
  a quota and objects created and deleted.
* **faults**, one per cycle at a random moment, every kind in turn (shuffled per round):
  ``kill_replica`` (the follower SIGKILLed, restarted), ``kill_leader`` (the Lease holder
  SIGKILLed, restarted as a candidate), ``restart_apiserver``, ``pause_etcd``
  (SIGSTOP/SIGCONT for 2-3.5 s), ``cut_connections`` (every webhook connection reset at the
  balancer). A replica that exits on its own (a leader that could not renew its Lease exits by
  design) is restarted, as a kubelet would, and counted.
* **invariants** (never from tally's own view): every few seconds, from LISTs, no quota's
  resource summed over its objects exceeds its hard while the latest of those objects was
  created after the hard (and, for a ClusterQuota, its namespaces) last changed: that object
  was admitted past the limit (the argument: when the last-created object was admitted, every
  other object of the LIST already existed, so its admission saw at least the sum minus its
  own share). At the end of each cycle churn stops: every quota's ``status.used`` (a
  ClusterQuota's ``status.total.used``) must equal the truth recomputed from a fresh LIST
  within ``CONVERGENCE_BOUND_S`` (the time it took is recorded), and every PodSet must have
  exactly ``spec.replicas`` pods. Every request must end in an admission, a quota's 403 or (a
  delete or update of something already gone) a 404, except from a second before a fault
  until ``FAULT_SETTLE_S`` after it recovered. No replica's log may hold a traceback outside
  those windows.
* **memory**: each replica's VmRSS every 2 s; the slope over the last half of the run by least
  squares, each process (a restarted replica is a new one) with its own intercept and its first
  ``WARMUP_S`` left out; and the same with a process that takes the Lease starting a segment
  there (the *steady-role* slope: a new leader's controllers and first syncs are a step, the
  cost of the role, which the plain slope reads as growth). ``--faults none`` runs the churn
  alone (processes that live the whole run); ``--traced-every S`` runs the replicas under
  tracemalloc with a snapshot every S seconds (what grows in the Python heap, as
  ``bench/memory.py`` reads it).

Creation times are second-granular, so "created after the hard changed" means created at or
after the next whole second. ClusterQuota membership follows a namespace's labels through
tally's namespace cache: a create in a namespace relabelled within ``MEMBERSHIP_GRACE_S`` is
not judged against the ClusterQuota it joined.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio import client

import _common  # first: it puts hack/ and tests/e2e/ on sys.path for the imports below

# isort: split
import operator_process
from balancer import RoundRobinBalancer

import cluster
from _common import REPO, Raw, api_client, kubectl

RESULTS = REPO / "bench" / "results"
FAULT_KINDS = ("kill_replica", "kill_leader", "restart_apiserver", "pause_etcd", "cut_connections")
TEAMS = ("t0", "t1", "t2", "t3", "t4")
OWN_NAMESPACE = "tally-system"
LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S = 7, 5.0, 1.0
"""Shorter than the Deployment's 15/10/2 so that a killed leader is replaced within a cycle;
the renew deadline outlasts the longest etcd pause (3.5 s) plus one retry period."""
CONVERGENCE_BOUND_S = 30.0
"""How long a quiet period waits for every status to match the truth before it is a
violation (the issue's target, reported separately, is 10 s)."""
FAULT_SETTLE_S = 5.0
"""Seconds after a fault's recovery during which a failed request is excused: pooled
connections to a restarted API server fail once, a Lease changes hands."""
MEMBERSHIP_GRACE_S = 5.0
EXIT_LEAD_S = 10.0
"""A replica that exits on its own (a leader that lost its Lease) began stopping up to a renew
deadline before the supervisor saw it gone: its webhook port closed first."""
WARMUP_S = 60.0
CYCLE_S = 100.0
"""About how long each cycle (churn, one fault, more churn, a quiet period) lasts: 30 minutes
give 18 cycles, every fault kind three times or more, and each replica a few minutes between
kills for its memory slope."""
REQUEST_TIMEOUT_S = 30.0
QUOTA_MESSAGES = ("exceeded quota:", "exceeded cluster quota:")
IMAGE = "registry.k8s.io/pause:3.10"

RQ_HARD = {
    "pods": ("4", "3", "5"),
    "services": ("3", "2", "4"),
    "services.nodeports": ("2", "1", "3"),
    "services.loadbalancers": ("1", "0", "2"),
    "persistentvolumeclaims": ("2", "1", "3"),
    "requests.storage": ("3Gi", "2Gi", "4Gi"),
    "configmaps": ("4", "3", "5"),
    "secrets": ("3", "2", "4"),
}
"""Each resource's hard values; the first at creation, a change picks any."""
CQ_HARD = {"pods": ("12", "9", "15"), "services": ("8", "6", "10")}
PODSET_NAMESPACE_HARD = {"pods": "40"}
PODSETS_PER_NAMESPACE, PODSET_MAX_REPLICAS = 2, 10


# -- quantities and usage (upstream's evaluators, for the few shapes churn creates) -----------

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(text: str) -> int:
    """Whole-number quantities only: everything here counts objects or bytes."""
    found = re.fullmatch(r"(\d+)([kMG]i?|Ki)?", text.strip())
    if found is None:
        raise ValueError(f"unexpected quantity {text!r}")
    return int(found.group(1)) * _SUFFIX[found.group(2) or ""]


def usage(kind: str, item: dict[str, Any]) -> dict[str, int]:
    """What one object uses, as upstream's evaluators count it (the resources hard names)."""
    spec = item.get("spec") or {}
    if kind == "pods":
        if (item.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return {}
        return {"pods": 1}
    if kind == "services":
        kind_ = spec.get("type", "ClusterIP")
        used = {"services": 1}
        if kind_ in ("NodePort", "LoadBalancer"):
            used["services.nodeports"] = len(spec.get("ports") or [])
        if kind_ == "LoadBalancer":
            used["services.loadbalancers"] = 1
        return used
    if kind == "persistentvolumeclaims":
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "0")
        return {"persistentvolumeclaims": 1, "requests.storage": quantity(storage)}
    return {kind: 1}


KINDS = ("pods", "services", "persistentvolumeclaims", "configmaps", "secrets")


@dataclass
class Snapshot:
    """One round of LISTs: objects by kind, quotas and ClusterQuotas read before and after
    them (a quota whose spec moved in between is not judged), and namespaces."""

    taken: float
    objects: dict[str, list[dict[str, Any]]]
    quotas: list[dict[str, Any]]
    quotas_after: dict[tuple[str, str], dict[str, Any]]
    cluster_quotas: list[dict[str, Any]]
    cluster_quotas_after: dict[str, dict[str, Any]]
    namespaces: dict[str, dict[str, Any]]
    namespaces_after: dict[str, dict[str, Any]]

    def live(self, namespace: str) -> bool:
        ns = self.namespaces.get(namespace)
        return ns is not None and (ns.get("status") or {}).get("phase") != "Terminating"

    def in_namespaces(self, namespaces: set[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        for kind, items in self.objects.items():
            for item in items:
                if item["metadata"]["namespace"] in namespaces:
                    yield kind, item

    def team_namespaces(self, team: str) -> set[str]:
        return {
            name
            for name, ns in self.namespaces.items()
            if (ns["metadata"].get("labels") or {}).get("team") == team and self.live(name)
        }


def totals(objects: Iterator[tuple[str, dict[str, Any]]]) -> dict[str, int]:
    summed: Counter[str] = Counter()
    for kind, item in objects:
        summed.update(usage(kind, item))
    return dict(summed)


def creation(item: dict[str, Any]) -> float:
    stamp = item["metadata"]["creationTimestamp"]
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def over_admitted(
    objects: list[tuple[str, dict[str, Any]]], hard: dict[str, str], stable_since: float
) -> list[dict[str, Any]]:
    """Each resource over its hard whose latest-created user was created at or after the
    whole second following ``stable_since`` (see the module's docstring for why that object
    was admitted past the limit)."""
    found = []
    for resource, limit in hard.items():
        users = [
            (creation(item), kind, item)
            for kind, item in objects
            if usage(kind, item).get(resource)
        ]
        used = sum(usage(kind, item)[resource] for _, kind, item in users)
        if used <= quantity(limit) or not users:
            continue
        latest, kind, item = max(users, key=lambda user: user[0])
        if latest >= math.ceil(stable_since):
            found.append(
                {
                    "resource": resource,
                    "used": used,
                    "hard": limit,
                    "object": f"{kind}/{item['metadata']['namespace']}/{item['metadata']['name']}",
                    "created": item["metadata"]["creationTimestamp"],
                }
            )
    return found


def used_differs(
    status_used: dict[str, str] | None, hard: dict[str, str], truth: dict[str, int]
) -> dict[str, Any]:
    """The resources of ``hard`` whose status differs from the truth, as
    ``{resource: (status, truth)}``."""
    differ = {}
    for resource in hard:
        shown = (status_used or {}).get(resource)
        if shown is None or quantity(shown) != truth.get(resource, 0):
            differ[resource] = (shown, truth.get(resource, 0))
    return differ


# -- the replicas --------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    process: operator_process.TallyProcess
    incarnation: int = 0
    busy: bool = False
    ready: bool = False
    """Its webhook serves: the balancer sends it connections (a Service sends them to ready
    endpoints only)."""
    """A fault owns it right now: the supervisor leaves it alone."""

    @property
    def pid(self) -> int | None:
        p = self.process.process
        return p.pid if p is not None and p.poll() is None else None


def leader_value(replica: Replica) -> float | None:
    try:
        with urllib.request.urlopen(replica.process.metrics_url, timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.search(r"^tally_leader\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def snapshot_operator(into: Path, traced: bool = False) -> Path:
    """A copy of ``operator/`` to run the replicas from; its ``main.py``, or with ``traced``
    a copy of ``bench/_traced_operator.py`` beside it that loads it under tracemalloc."""
    target = into / "operator"
    shutil.copytree(REPO / "operator", target, ignore=shutil.ignore_patterns("__pycache__"))
    if not traced:
        return target / "main.py"
    (into / "bench").mkdir()
    return Path(shutil.copy(REPO / "bench" / "_traced_operator.py", into / "bench"))


# -- the run -------------------------------------------------------------------------------


@dataclass
class Settings:
    minutes: float = 10.0
    namespaces: int = 50
    clients: int = 8
    rate: float = 25.0
    seed: int = 0
    out_dir: Path = RESULTS
    name: str = "soak"
    logs: Path = Path(tempfile.gettempdir()) / "tally-soak-logs"
    faults: tuple[str, ...] = FAULT_KINDS
    """The fault kinds injected in turn; none gives a run of churn alone, whose processes live
    the whole run (the memory slope of a process that no fault restarts)."""
    traced_every_s: float = 0.0
    """When positive, the replicas run under tracemalloc and write a snapshot of their traced
    Python memory this often into ``<logs>/snapshots-<replica>-<process>/`` (to find what
    grows; tracing slows tally and costs memory, so such a run's figures are not the soak's)."""


@dataclass
class Soak:
    settings: Settings
    state: cluster.State
    raw: Raw
    replicas: list[Replica]
    balancer: RoundRobinBalancer
    rng: random.Random
    t0: float = field(default_factory=time.time)
    churning: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    ops: Counter[str] = field(default_factory=Counter)
    op_series: list[tuple[float, str, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    convergence: list[float] = field(default_factory=list)
    podset_settle: list[float] = field(default_factory=list)
    rss: list[tuple[float, str, int, float]] = field(default_factory=list)
    connections: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(seconds, replica, process, connections to the API server): the RSS's largest part
    that a burst can leave behind (~320 KiB each)."""
    snapshots: int = 0
    names: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    quota_present: dict[str, bool] = field(default_factory=dict)
    quota_stable: dict[str, float] = field(default_factory=dict)
    cq_stable: dict[str, float] = field(default_factory=dict)
    changing: set[str] = field(default_factory=set)
    relabelling: int = 0
    """Relabels in flight: which ClusterQuota's membership moves is not known until the
    answer, so none is judged meanwhile."""
    serial: int = 0

    # -- helpers

    def now(self) -> float:
        return time.time() - self.t0

    def fixed(self) -> list[str]:
        return [f"soak-{i:02d}" for i in range(self.settings.namespaces)]

    def podset_namespaces(self) -> list[str]:
        return ["soak-ps-0", "soak-ps-1"]

    def unique(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.serial}"

    async def request(
        self,
        op: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> str:
        """One churn request, classified: ``ok``, ``denied`` (a quota's 403), ``gone`` (404
        of a delete or update) or ``error`` (recorded with its status and message)."""
        started = time.time()
        status, message = 0, ""
        try:
            await self.raw.call(
                method, path, body, content_type=content_type, request_timeout=REQUEST_TIMEOUT_S
            )
            outcome = "ok"
        except client.ApiException as error:
            status = int(error.status or 0)
            try:
                message = json.loads(error.body or "{}").get("message", "")
            except ValueError:
                message = str(error.body)
            if status == 403 and any(m in message for m in QUOTA_MESSAGES):
                outcome = "denied"
            elif status == 404 and method in ("DELETE", "PATCH"):
                outcome = "gone"
            elif status == 409 and op == "create_quota" and "already exists" in message:
                # Its delete timed out during a fault yet happened: the quota is there.
                outcome = "gone"
            else:
                outcome = "error"
        except Exception as error:
            message = f"{type(error).__name__}: {error}"
            outcome = "error"
        self.ops[f"{op}:{outcome}"] += 1
        self.op_series.append((time.time() - self.t0, op, outcome))
        if outcome == "error":
            self.errors.append(
                {
                    "at": round(started - self.t0, 2),
                    "op": op,
                    "path": path,
                    "status": status,
                    "message": message[:300],
                }
            )
        return outcome

    # -- setup

    def quota_body(self, hard: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "q"},
            "spec": {"hard": hard},
        }

    def cq_body(self, team: str, hard: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "tally.dev/v1alpha1",
            "kind": "ClusterQuota",
            "metadata": {"name": f"cq-{team}"},
            "spec": {"namespaceSelector": {"matchLabels": {"team": team}}, "quota": {"hard": hard}},
        }

    async def setup(self) -> None:
        raw = self.raw
        for team in TEAMS:
            await raw.create(
                "/apis/tally.dev/v1alpha1/clusterquotas",
                self.cq_body(team, {k: v[0] for k, v in CQ_HARD.items()}),
            )
            self.cq_stable[team] = time.time()
        fixed = self.fixed()
        for index, namespace in enumerate(fixed):
            labels = {"soak": "true"}
            if index < len(fixed) * 4 // 5:
                labels["team"] = TEAMS[index % len(TEAMS)]
            await raw.create(
                "/api/v1/namespaces", {"metadata": {"name": namespace, "labels": labels}}
            )
            await raw.create(
                f"/api/v1/namespaces/{namespace}/resourcequotas",
                self.quota_body({k: v[0] for k, v in RQ_HARD.items()}),
            )
            self.quota_present[namespace] = True
            self.quota_stable[namespace] = time.time()
        for namespace in self.podset_namespaces():
            await raw.create(
                "/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {"soak": "true"}}}
            )
            await raw.create(
                f"/api/v1/namespaces/{namespace}/resourcequotas",
                self.quota_body(PODSET_NAMESPACE_HARD),
            )
            self.quota_stable[namespace] = time.time()
        # The quotas are in force (their first status written) before churn judges them.
        for namespace in [*fixed, *self.podset_namespaces()]:
            self.quota_stable[namespace] = await self.in_force(
                f"/api/v1/namespaces/{namespace}/resourcequotas/q", quota_hards
            )
        for team in TEAMS:
            self.cq_stable[team] = await self.in_force(
                f"/apis/tally.dev/v1alpha1/clusterquotas/cq-{team}", cluster_quota_hards
            )
        for namespace in [*fixed, *self.podset_namespaces()]:
            await _common.until(
                raw,
                f"/api/v1/namespaces/{namespace}/serviceaccounts/default",
                lambda _: True,
                f"{namespace}'s service account",
            )
        for namespace in self.podset_namespaces():
            for index in range(PODSETS_PER_NAMESPACE):
                body = podset_body(f"ps-{index}", 3)
                await raw.create(f"/apis/tally.dev/v1alpha1/namespaces/{namespace}/podsets", body)

    # -- churn

    async def churn_client(self) -> None:
        spacing = self.settings.clients / self.settings.rate
        ops = list(OPERATIONS)
        weights = [OPERATIONS[op][0] for op in ops]
        while not self.stopping:
            await self.churning.wait()
            if self.stopping:
                return
            started = time.monotonic()
            op = self.rng.choices(ops, weights)[0]
            await OPERATIONS[op][1](self)
            await asyncio.sleep(max(0.0, spacing - (time.monotonic() - started)))

    async def create_object(
        self, kind: str, body: dict[str, Any], namespace: str | None = None
    ) -> None:
        namespace = namespace or self.rng.choice(self.fixed())
        name = self.unique(kind[:3])
        body = {**body, "metadata": {"name": name, "labels": {"soak": "true"}}}
        outcome = await self.request(
            f"create_{kind}", "POST", f"/api/v1/namespaces/{namespace}/{kind}", body
        )
        if outcome in ("ok", "error"):  # an error may have created it all the same
            self.names[(namespace, kind)].add(name)

    async def delete_object(self, kind: str) -> None:
        namespace = self.rng.choice(self.fixed())
        known = self.names[(namespace, kind)]
        if not known:
            return
        name = self.rng.choice(sorted(known))
        known.discard(name)
        await self.request(
            f"delete_{kind}", "DELETE", f"/api/v1/namespaces/{namespace}/{kind}/{name}"
        )

    async def update_object(self, kind: str) -> None:
        namespace = self.rng.choice(self.fixed())
        known = self.names[(namespace, kind)]
        if not known:
            return
        name = self.rng.choice(sorted(known))
        patch = {"metadata": {"labels": {"touched": str(self.rng.randrange(1000))}}}
        await self.request(
            f"update_{kind}",
            "PATCH",
            f"/api/v1/namespaces/{namespace}/{kind}/{name}",
            patch,
            "application/merge-patch+json",
        )

    async def change_quota(self) -> None:
        namespace = self.rng.choice(self.fixed())
        if namespace in self.changing:
            return
        self.changing.add(namespace)
        try:
            path = f"/api/v1/namespaces/{namespace}/resourcequotas"
            if not self.quota_present.get(namespace):
                await self.request(
                    "create_quota",
                    "POST",
                    path,
                    self.quota_body({k: v[0] for k, v in RQ_HARD.items()}),
                )
                self.quota_present[namespace] = True
            elif self.rng.random() < 0.2:
                await self.request("delete_quota", "DELETE", f"{path}/q")
                self.quota_present[namespace] = False
            else:
                hard = {k: self.rng.choice(v) for k, v in RQ_HARD.items()}
                await self.request(
                    "change_quota",
                    "PATCH",
                    f"{path}/q",
                    {"spec": {"hard": hard}},
                    "application/merge-patch+json",
                )
        finally:
            self.quota_stable[namespace] = await self.in_force(
                f"/api/v1/namespaces/{namespace}/resourcequotas/q", quota_hards
            )
            self.changing.discard(namespace)

    async def in_force(
        self, path: str, hards: Callable[[dict[str, Any]], tuple[dict[str, str], dict[str, str]]]
    ) -> float:
        """When the quota at ``path`` is in force: its status's hard is its spec's (upstream's
        admission, like tally's, judges a quota by ``status.hard``; a create before the first
        status is charged to nobody). Waits up to ``CONVERGENCE_BOUND_S``; a quota gone (or
        not readable) is in force at once, for what that means."""
        deadline = time.monotonic() + CONVERGENCE_BOUND_S
        while time.monotonic() < deadline:
            try:
                spec, status = hards(await self.raw.call("GET", path, request_timeout=5.0))
                if {k: quantity(v) for k, v in spec.items()} == {
                    k: quantity(v) for k, v in status.items()
                }:
                    break
            except client.ApiException as error:
                if error.status == 404:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.2)
        return time.time()

    async def change_cluster_quota(self) -> None:
        team = self.rng.choice(TEAMS)
        key = f"cq-{team}"
        if key in self.changing:
            return
        self.changing.add(key)
        try:
            hard = {k: self.rng.choice(v) for k, v in CQ_HARD.items()}
            await self.request(
                "change_clusterquota",
                "PATCH",
                f"/apis/tally.dev/v1alpha1/clusterquotas/{key}",
                {"spec": {"quota": {"hard": hard}}},
                "application/merge-patch+json",
            )
        finally:
            self.cq_stable[team] = await self.in_force(
                f"/apis/tally.dev/v1alpha1/clusterquotas/{key}", cluster_quota_hards
            )
            self.changing.discard(key)

    async def relabel_namespace(self) -> None:
        namespace = self.rng.choice(self.fixed())
        team = self.rng.choice([*TEAMS, None])
        key = f"ns-{namespace}"
        if key in self.changing:
            return
        self.changing.add(key)
        self.relabelling += 1
        try:
            await self.request(
                "relabel_namespace",
                "PATCH",
                f"/api/v1/namespaces/{namespace}",
                {"metadata": {"labels": {"team": team}}},
                "application/merge-patch+json",
            )
        finally:
            # Which team it left is not known without a read; every team's membership moved.
            for t in TEAMS:
                self.cq_stable[t] = time.time() + MEMBERSHIP_GRACE_S
            self.changing.discard(key)
            self.relabelling -= 1

    async def scale_podset(self) -> None:
        namespace = self.rng.choice(self.podset_namespaces())
        name = f"ps-{self.rng.randrange(PODSETS_PER_NAMESPACE)}"
        await self.request(
            "scale_podset",
            "PATCH",
            f"/apis/tally.dev/v1alpha1/namespaces/{namespace}/podsets/{name}",
            {"spec": {"replicas": self.rng.randrange(PODSET_MAX_REPLICAS + 1)}},
            "application/merge-patch+json",
        )

    async def namespace_churn(self) -> None:
        """Namespaces with a quota and a few objects, made and deleted: what CI clusters do all
        day, and what per-quota memory in tally must survive."""
        alive: list[tuple[float, str]] = []
        while not self.stopping:
            await self.churning.wait()
            if self.stopping:
                return
            namespace = self.unique("soak-tmp")
            if (
                await self.request(
                    "create_namespace",
                    "POST",
                    "/api/v1/namespaces",
                    {"metadata": {"name": namespace, "labels": {"soak": "tmp"}}},
                )
                == "ok"
            ):
                alive.append((time.monotonic(), namespace))
                path = f"/api/v1/namespaces/{namespace}/resourcequotas"
                await self.request(
                    "create_quota",
                    "POST",
                    path,
                    self.quota_body({"configmaps": "3", "secrets": "2", "services": "1"}),
                )
                self.quota_stable[namespace] = await self.in_force(f"{path}/q", quota_hards)
                for kind, body in (
                    ("configmaps", CONFIGMAP),
                    ("configmaps", CONFIGMAP),
                    ("secrets", SECRET),
                    ("services", service("ClusterIP")),
                    ("secrets", SECRET),
                    ("secrets", SECRET),
                ):
                    await self.create_object(kind, body, namespace)
            while alive and time.monotonic() - alive[0][0] > 20:
                _, gone = alive.pop(0)
                await self.request("delete_namespace", "DELETE", f"/api/v1/namespaces/{gone}")
            await asyncio.sleep(3.0)

    # -- faults

    async def leader(self) -> Replica | None:
        values = await asyncio.gather(*(asyncio.to_thread(leader_value, r) for r in self.replicas))
        leading = [r for r, v in zip(self.replicas, values, strict=True) if v == 1.0]
        return leading[0] if len(leading) == 1 else None

    async def wait_leader(self, within: float = 60.0) -> Replica | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if (found := await self.leader()) is not None:
                return found
            await asyncio.sleep(0.5)
        return None

    async def start_replica(self, replica: Replica) -> None:
        replica.incarnation += 1
        if self.settings.traced_every_s > 0:
            snapshots = self.settings.logs / f"snapshots-{replica.name}-{replica.incarnation}"
            snapshots.mkdir(parents=True, exist_ok=True)
            replica.process.extra_env["TALLY_BENCH_SNAPSHOTS"] = str(snapshots)
        await asyncio.to_thread(replica.process.start, 120.0, registered=False)
        replica.ready = True

    async def inject(self, kind: str) -> None:
        started = time.time()
        detail: dict[str, Any] = {}
        disrupted_until: float | None = None
        """When what the fault broke works again: the kill, the API server ready again, etcd
        resumed (a replica restarting is not a disruption: the balancer skips it)."""
        if kind in ("kill_replica", "kill_leader"):
            leader = await self.wait_leader()
            if kind == "kill_leader":
                target = leader or self.rng.choice(self.replicas)
            else:
                target = next((r for r in self.replicas if r is not leader), self.replicas[0])
            target.busy = True
            try:
                assert target.process.process is not None
                target.ready = False
                target.process.process.send_signal(signal.SIGKILL)
                await asyncio.to_thread(target.process.process.wait)
                disrupted_until = time.time()
                detail["replica"] = target.name
                await asyncio.sleep(1.0)
                await self.start_replica(target)
            finally:
                target.busy = False
            new_leader = await self.wait_leader()
            detail["leader_after"] = new_leader.name if new_leader else None
        elif kind == "restart_apiserver":
            detail["unavailable_s"] = round(
                await asyncio.to_thread(cluster.restart_apiserver, self.state), 2
            )
        elif kind == "pause_etcd":
            pid = self.state.pids["etcd"]
            seconds = self.rng.uniform(2.0, 3.5)
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
            detail["paused_s"] = round(seconds, 2)
        elif kind == "cut_connections":
            detail["connections"] = self.balancer.cut()
        recovered = time.time()
        self.faults.append(
            {
                "kind": kind,
                "at": round(started - self.t0, 2),
                "disrupted_until": round((disrupted_until or recovered) - self.t0, 2),
                "recovered": round(recovered - self.t0, 2),
                **detail,
            }
        )
        print(
            f"  [{self.now():6.0f} s] fault {kind} {detail} ({recovered - started:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    async def supervise(self) -> None:
        """Restart a replica that exited on its own, as the kubelet restarts a container."""
        while not self.stopping:
            await asyncio.sleep(1.0)
            for replica in self.replicas:
                process = replica.process.process
                if replica.busy or process is None or process.poll() is None:
                    continue
                replica.busy = True
                replica.ready = False
                try:
                    at = time.time()
                    self.exits.append(
                        {
                            "replica": replica.name,
                            "at": round(at - self.t0, 2),
                            "code": process.returncode,
                        }
                    )
                    print(
                        f"  [{self.now():6.0f} s] {replica.name} exited ({process.returncode}); "
                        "restarting",
                        file=sys.stderr,
                        flush=True,
                    )
                    await self.start_replica(replica)
                    # The exit is a fault of its own: requests around it are excused like a kill's.
                    self.faults.append(
                        {
                            "kind": "exit",
                            "at": round(at - self.t0, 2),
                            "disrupted_until": round(at - self.t0, 2),
                            "recovered": round(self.now(), 2),
                            "replica": replica.name,
                        }
                    )
                finally:
                    replica.busy = False

    async def sample_memory(self) -> None:
        every = self.settings.traced_every_s
        next_snapshot = every
        while not self.stopping:
            if every > 0 and self.now() >= next_snapshot:
                next_snapshot += every
                for replica in self.replicas:
                    if replica.pid is not None and not replica.busy:
                        with contextlib.suppress(OSError):
                            os.kill(replica.pid, signal.SIGUSR1)
            for replica in self.replicas:
                pid = replica.pid
                if pid is None:
                    continue
                with contextlib.suppress(OSError, KeyError):
                    rss, _ = _common.memory_of(pid)
                    self.rss.append((self.now(), replica.name, replica.incarnation, rss / 2**20))
                with contextlib.suppress(OSError, ValueError):
                    connected = len(
                        _common.operator_process.established_connections(pid, self.api_port)
                    )
                    self.connections.append(
                        (self.now(), replica.name, replica.incarnation, connected)
                    )
            await asyncio.sleep(2.0)

    # -- invariants

    async def snapshot(self) -> Snapshot:
        async def listed(path: str) -> list[dict[str, Any]]:
            return await self.raw.list_all(path)

        taken = time.time()
        quotas = await listed("/api/v1/resourcequotas")
        cqs = await listed("/apis/tally.dev/v1alpha1/clusterquotas")
        namespaces = await listed("/api/v1/namespaces")
        objects = {kind: await listed(f"/api/v1/{kind}") for kind in KINDS}
        quotas_after = await listed("/api/v1/resourcequotas")
        cqs_after = await listed("/apis/tally.dev/v1alpha1/clusterquotas")
        namespaces_after = await listed("/api/v1/namespaces")
        self.snapshots += 1
        return Snapshot(
            taken,
            objects,
            quotas,
            {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in quotas_after},
            cqs,
            {c["metadata"]["name"]: c for c in cqs_after},
            {n["metadata"]["name"]: n for n in namespaces},
            {n["metadata"]["name"]: n for n in namespaces_after},
        )

    def check_over(self, snap: Snapshot) -> None:
        for quota in snap.quotas:
            namespace = quota["metadata"]["namespace"]
            after = snap.quotas_after.get((namespace, quota["metadata"]["name"]))
            if (
                namespace not in self.quota_stable
                or namespace in self.changing
                or after is None
                or after["spec"] != quota["spec"]
                or not snap.live(namespace)
            ):
                continue
            objects = list(snap.in_namespaces({namespace}))
            for found in over_admitted(
                objects, quota["spec"].get("hard") or {}, self.quota_stable[namespace]
            ):
                self.violation("over_hard", quota=f"resourcequota/{namespace}/q", **found)
        for cq in snap.cluster_quotas:
            team = cq["metadata"]["name"].removeprefix("cq-")
            after = snap.cluster_quotas_after.get(cq["metadata"]["name"])
            if (
                team not in self.cq_stable
                or f"cq-{team}" in self.changing
                or self.relabelling
                or after is None
                or after["spec"] != cq["spec"]
            ):
                continue
            members = snap.team_namespaces(team)
            members_after = {
                n
                for n, ns in snap.namespaces_after.items()
                if (ns["metadata"].get("labels") or {}).get("team") == team
            }
            if members != members_after:
                continue
            objects = list(snap.in_namespaces(members))
            hard = (cq["spec"].get("quota") or {}).get("hard") or {}
            for found in over_admitted(objects, hard, self.cq_stable[team]):
                self.violation("over_hard", quota=f"clusterquota/{cq['metadata']['name']}", **found)

    def violation(self, kind: str, **detail: Any) -> None:
        entry = {"kind": kind, "at": round(self.now(), 2), **detail}
        # The same over-admission is seen by every later snapshot while the objects stay.
        if kind == "over_hard" and any(
            v.get("object") == entry["object"] and v.get("resource") == entry["resource"]
            for v in self.violations
        ):
            return
        self.violations.append(entry)
        print(f"  VIOLATION {entry}", file=sys.stderr, flush=True)

    def differences(self, snap: Snapshot) -> dict[str, Any]:
        """Every quota whose status differs from the truth of ``snap``."""
        differ: dict[str, Any] = {}
        for quota in snap.quotas:
            namespace = quota["metadata"]["namespace"]
            if not snap.live(namespace) or not namespace.startswith("soak"):
                continue
            hard = quota["spec"].get("hard") or {}
            truth = totals(snap.in_namespaces({namespace}))
            found = used_differs((quota.get("status") or {}).get("used"), hard, truth)
            if found:
                differ[f"resourcequota/{namespace}/{quota['metadata']['name']}"] = found
        for cq in snap.cluster_quotas:
            team = cq["metadata"]["name"].removeprefix("cq-")
            hard = (cq["spec"].get("quota") or {}).get("hard") or {}
            truth = totals(snap.in_namespaces(snap.team_namespaces(team)))
            used = ((cq.get("status") or {}).get("total") or {}).get("used")
            found = used_differs(used, hard, truth)
            if found:
                differ[f"clusterquota/{cq['metadata']['name']}"] = found
        return differ

    async def podsets_differ(self) -> dict[str, Any]:
        differ = {}
        for namespace in self.podset_namespaces():
            podsets = await self.raw.list_all(
                f"/apis/tally.dev/v1alpha1/namespaces/{namespace}/podsets"
            )
            pods = await self.raw.list_all(f"/api/v1/namespaces/{namespace}/pods")
            for podset in podsets:
                name = podset["metadata"]["name"]
                owned = [
                    p
                    for p in pods
                    if not p["metadata"].get("deletionTimestamp")
                    and any(
                        ref.get("controller")
                        and ref.get("kind") == "PodSet"
                        and ref.get("name") == name
                        for ref in p["metadata"].get("ownerReferences") or []
                    )
                ]
                if len(owned) != podset["spec"]["replicas"]:
                    differ[f"{namespace}/{name}"] = (len(owned), podset["spec"]["replicas"])
        return differ

    async def checker(self) -> None:
        while not self.stopping:
            if self.churning.is_set():
                with contextlib.suppress(Exception):
                    self.check_over(await self.snapshot())
            await asyncio.sleep(2.0)

    async def quiet(self, final: bool = False) -> None:
        """Churn stopped: every status must reach the truth, every PodSet its replicas."""
        self.churning.clear()
        await asyncio.sleep(0.5)  # requests in flight end (a churn step never waits long)
        started = time.monotonic()
        last: dict[str, Any] = {}
        while True:
            try:
                snap = await self.snapshot()
                self.check_over(snap)
                last = self.differences(snap)
            except Exception as error:
                last = {"error": repr(error)}
            if not last:
                self.convergence.append(time.monotonic() - started)
                break
            if time.monotonic() - started > CONVERGENCE_BOUND_S:
                self.violation("not_converged", differences=last)
                self.convergence.append(math.inf)
                break
            await asyncio.sleep(0.25)
        began = time.monotonic()
        while True:
            try:
                differ = await self.podsets_differ()
            except Exception as error:
                differ = {"error": repr(error)}
            if not differ:
                self.podset_settle.append(time.monotonic() - began)
                break
            if time.monotonic() - began > CONVERGENCE_BOUND_S:
                self.violation("podset_replicas", differences=differ, final=final)
                break
            await asyncio.sleep(0.5)
        if not final:
            self.churning.set()

    # -- the schedule

    async def run(self) -> None:
        total = self.settings.minutes * 60
        kinds = self.settings.faults
        cycles = max(len(kinds), round(total / CYCLE_S))
        cycle = total / cycles
        order: list[str | None] = [] if kinds else [None] * cycles
        while len(order) < cycles:
            round_: list[str | None] = list(kinds)
            self.rng.shuffle(round_)
            order.extend(round_)
        workers = [asyncio.create_task(self.churn_client()) for _ in range(self.settings.clients)]
        workers += [
            asyncio.create_task(task())
            for task in (self.namespace_churn, self.supervise, self.sample_memory, self.checker)
        ]
        self.t0 = time.time()
        self.churning.set()
        try:
            for index in range(cycles):
                begin = index * cycle
                churn_until = begin + cycle * 0.8
                await asyncio.sleep(
                    max(0.0, begin + self.rng.uniform(0.1, 0.35) * cycle - self.now())
                )
                fault = order[index]
                if fault is not None:
                    await self.inject(fault)
                await asyncio.sleep(max(3.0, churn_until - self.now()))
                await self.quiet()
                print(
                    f"  [{self.now():6.0f} s] cycle {index + 1}/{cycles}: converged in "
                    f"{self.convergence[-1]:.2f} s; ops {sum(self.ops.values())}, "
                    f"violations {len(self.violations)}",
                    file=sys.stderr,
                    flush=True,
                )
                await asyncio.sleep(max(0.0, (index + 1) * cycle - self.now()))
            await self.quiet(final=True)
        finally:
            self.stopping = True
            self.churning.set()
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    # -- the report

    def excused(self, at: float) -> bool:
        return any(
            f["at"] - (EXIT_LEAD_S if f["kind"] == "exit" else 1.0)
            <= at
            <= f["disrupted_until"] + FAULT_SETTLE_S
            for f in self.faults
        )

    def judge_errors_and_logs(self) -> list[dict[str, Any]]:
        for error in self.errors:
            if not self.excused(error["at"]):
                self.violation("undecided", **error)
        tracebacks = []
        for replica in self.replicas:
            for at, text in tracebacks_in(replica.process.log):
                relative = at - self.t0 if at is not None else None
                entry = {
                    "replica": replica.name,
                    "at": None if relative is None else round(relative, 2),
                    "traceback": text[-1500:],
                }
                tracebacks.append(entry)
                if relative is None or (relative >= 0 and not self.excused(relative)):
                    self.violation("traceback", **entry)
        return tracebacks

    @property
    def api_port(self) -> int:
        port = urlsplit(self.state.server).port
        assert port is not None, self.state.server
        return port

    def memory_report(self) -> dict[str, Any]:
        total = self.now()
        report = {}
        for replica in self.replicas:
            samples = [(t, inc, mib) for t, name, inc, mib in self.rss if name == replica.name]
            if not samples:
                continue
            taken = [at - self.t0 for at in acquisitions_in(replica.process.log)]
            half = last_half(samples, total)
            by_role = last_half(role_segments(samples, taken), total)
            connected = [c for _, name, _, c in self.connections if name == replica.name]
            report[replica.name] = {
                "api_connections_end": connected[-1] if connected else None,
                "api_connections_max": max(connected, default=None),
                "start_mib": round(samples[0][2], 1),
                "end_mib": round(samples[-1][2], 1),
                "max_mib": round(max(s[2] for s in samples), 1),
                "processes": replica.incarnation,
                "slope_mib_per_10min": slope_per_10min(half),
                "slope_samples": len(half),
                "leads_taken": len(taken),
                "steady_role_slope_mib_per_10min": slope_per_10min(by_role),
                "steady_role_samples": len(by_role),
            }
        return report

    def report(self, tracebacks: list[dict[str, Any]], setup_s: float) -> dict[str, Any]:
        by_kind: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        for key, count in self.ops.items():
            op, outcome = key.rsplit(":", 1)
            by_kind[op] += count
            outcomes[outcome] += count
        faults = Counter(f["kind"] for f in self.faults)
        finite = [c for c in self.convergence if math.isfinite(c)]
        return {
            "settings": {
                "minutes": self.settings.minutes,
                "namespaces": self.settings.namespaces,
                "clients": self.settings.clients,
                "rate_per_s": self.settings.rate,
                "seed": self.settings.seed,
                "faults": list(self.settings.faults),
                "lease_s": [LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S],
            },
            "machine": _common.machine(),
            "setup_s": round(setup_s, 1),
            "duration_s": round(self.now(), 1),
            "operations": dict(sorted(by_kind.items())),
            "outcomes": dict(outcomes),
            "operations_by_outcome": dict(sorted(self.ops.items())),
            "faults": {kind: faults.get(kind, 0) for kind in (*FAULT_KINDS, "exit")},
            "fault_log": self.faults,
            "replica_exits": self.exits,
            "violations": len(self.violations),
            "violation_list": self.violations[:100],
            "errors": len(self.errors),
            "errors_by_kind": dict(
                Counter(
                    f"{e['status']}: {re.sub(r'[0-9]+', 'N', e['message'])[:90]}"
                    for e in self.errors
                ).most_common(20)
            ),
            "errors_excused": sum(1 for e in self.errors if self.excused(e["at"])),
            "error_samples": self.errors[:30],
            "snapshots_checked": self.snapshots,
            "quiet_periods": len(self.convergence),
            "convergence_s": [round(c, 2) if math.isfinite(c) else None for c in self.convergence],
            "worst_convergence_s": round(max(finite), 2) if finite else None,
            "not_converged": len(self.convergence) - len(finite),
            "podset_settle_s": [round(c, 2) for c in self.podset_settle],
            "tracebacks": len(tracebacks),
            "traceback_list": tracebacks[:20],
            "memory": self.memory_report(),
            # Every 5th sample (10 s apart): (seconds, replica, process, MiB), for a later look.
            "api_connection_samples": [
                [round(t, 1), name, process, connected]
                for index, (t, name, process, connected) in enumerate(self.connections)
                if index % 5 == 0
            ],
            "rss_samples": [
                [round(t, 1), name, process, round(mib, 1)]
                for index, (t, name, process, mib) in enumerate(self.rss)
                if index % 5 == 0
            ],
        }


def quota_hards(quota: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    return (quota.get("spec") or {}).get("hard") or {}, (quota.get("status") or {}).get(
        "hard"
    ) or {}


def cluster_quota_hards(cq: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    spec = ((cq.get("spec") or {}).get("quota") or {}).get("hard") or {}
    status = (((cq.get("status") or {}).get("total") or {}).get("hard")) or {}
    return spec, status


# -- objects -------------------------------------------------------------------------------

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "spec": {
        "containers": [{"name": "app", "image": IMAGE}],
        "automountServiceAccountToken": False,
    },
}
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}}
SECRET = {"apiVersion": "v1", "kind": "Secret", "stringData": {"k": "v"}}
PVC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


def service(type_: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "spec": {"type": type_, "ports": [{"port": 80}], "selector": {"app": "x"}},
    }


def podset_body(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "PodSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": IMAGE}]},
            },
        },
    }


def _creating(
    kind: str, body: Callable[[Soak], dict[str, Any]]
) -> Callable[[Soak], Awaitable[None]]:
    async def op(soak: Soak) -> None:
        await soak.create_object(kind, body(soak))

    return op


def _deleting(kind: str) -> Callable[[Soak], Awaitable[None]]:
    async def op(soak: Soak) -> None:
        await soak.delete_object(kind)

    return op


def _updating(kind: str) -> Callable[[Soak], Awaitable[None]]:
    async def op(soak: Soak) -> None:
        await soak.update_object(kind)

    return op


OPERATIONS: dict[str, tuple[float, Callable[[Soak], Awaitable[None]]]] = {
    "create_pod": (5, _creating("pods", lambda s: POD)),
    "delete_pod": (3, _deleting("pods")),
    "update_pod": (1, _updating("pods")),
    "create_service": (
        3,
        _creating(
            "services", lambda s: service(s.rng.choice(["ClusterIP", "NodePort", "LoadBalancer"]))
        ),
    ),
    "delete_service": (2, _deleting("services")),
    "update_service": (1, _updating("services")),
    "create_pvc": (2, _creating("persistentvolumeclaims", lambda s: PVC)),
    "delete_pvc": (1, _deleting("persistentvolumeclaims")),
    "create_configmap": (3, _creating("configmaps", lambda s: CONFIGMAP)),
    "delete_configmap": (2, _deleting("configmaps")),
    "update_configmap": (1, _updating("configmaps")),
    "create_secret": (2, _creating("secrets", lambda s: SECRET)),
    "delete_secret": (1, _deleting("secrets")),
    "update_secret": (1, _updating("secrets")),
    "quota": (0.6, Soak.change_quota),
    "clusterquota": (0.3, Soak.change_cluster_quota),
    "relabel": (0.3, Soak.relabel_namespace),
    "podset": (1, Soak.scale_podset),
}
"""Name → (weight, operation). Creates outweigh deletes: quotas stay full, and most creates
are judged against a full quota."""


# -- the API server and the logs ------------------------------------------------------------


_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")


def _stamp_of(line: str) -> float | None:
    stamp = _STAMP.match(line)
    if stamp is None:
        return None
    return (
        time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000
    )


def acquisitions_in(log: Path) -> list[float]:
    """When a replica's processes took the Lease (``leader election: … acquired lease``), in
    the order of its log (every process of the replica appends to it)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [
        at
        for line in lines
        if "leader election:" in line and " acquired lease " in line
        for at in [_stamp_of(line)]
        if at is not None
    ]


def tracebacks_in(log: Path) -> list[tuple[float | None, str]]:
    """Each traceback in a replica's log with the time of the log line it follows."""
    found: list[tuple[float | None, str]] = []
    at: float | None = None
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    index = 0
    while index < len(lines):
        line = lines[index]
        stamp = _stamp_of(line)
        if stamp is not None:
            at = stamp
        if line.startswith("Traceback (most recent call last)"):
            end = index + 1
            while (
                end < len(lines)
                and not _STAMP.match(lines[end])
                and not lines[end].startswith("=====")
            ):
                end += 1
            found.append((at, "\n".join(lines[max(0, index - 1) : end])))
            index = end
            continue
        index += 1
    return found


Sample = tuple[float, int, float]
"""Seconds into the run, the process (or segment) it belongs to, MiB."""


def last_half(samples: list[Sample], total: float) -> list[Sample]:
    """The (seconds, segment, MiB) samples of the run's last half, each segment's first
    ``WARMUP_S`` left out."""
    firsts: dict[int, float] = {}
    for t, segment, _ in samples:
        firsts.setdefault(segment, t)
    return [
        (t, segment, mib)
        for t, segment, mib in samples
        if t >= total / 2 and t - firsts[segment] >= WARMUP_S
    ]


def role_segments(samples: list[Sample], taken: list[float]) -> list[Sample]:
    """(seconds, process, MiB) samples renumbered by process and role: a process that takes
    the Lease at one of ``taken`` (seconds) starts a segment there, as a restarted one does.
    A new leader starts its controllers and syncs every quota: a step in memory that is the
    cost of the role, not growth."""
    segments: dict[tuple[int, int], int] = {}
    renumbered = []
    for t, process, mib in samples:
        role = sum(1 for at in taken if at <= t)
        segment = segments.setdefault((process, role), len(segments))
        renumbered.append((t, segment, mib))
    return renumbered


def slope_per_10min(samples: list[Sample]) -> float | None:
    """Least-squares slope (MiB per 10 minutes) of (seconds, process, MiB), one intercept per
    process; None with fewer than 10 samples."""
    if len(samples) < 10:
        return None
    groups: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t, inc, mib in samples:
        groups[inc].append((t, mib))
    numerator = denominator = 0.0
    for points in groups.values():
        mean_t = sum(t for t, _ in points) / len(points)
        mean_m = sum(m for _, m in points) / len(points)
        numerator += sum((t - mean_t) * (m - mean_m) for t, m in points)
        denominator += sum((t - mean_t) ** 2 for t, _ in points)
    return round(numerator / denominator * 600, 3) if denominator else None


# -- the picture -----------------------------------------------------------------------------


def draw(soak: Soak, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, ops) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for replica in soak.replicas:
        for inc in sorted({inc for _, n, inc, _ in soak.rss if n == replica.name}):
            points = [(t / 60, m) for t, n, i, m in soak.rss if n == replica.name and i == inc]
            memory.plot(
                *zip(*points, strict=True),
                color="C0" if replica.name == "a" else "C1",
                label=f"replica {replica.name}" if inc == 1 else None,
            )
    memory.set_ylabel("RSS (MiB)")
    memory.legend(loc="upper left")
    connections = memory.twinx()
    for replica in soak.replicas:
        for inc in sorted({inc for _, n, inc, _ in soak.connections if n == replica.name}):
            counts = [
                (t / 60, c) for t, n, i, c in soak.connections if n == replica.name and i == inc
            ]
            connections.plot(
                *zip(*counts, strict=True),
                color="C0" if replica.name == "a" else "C1",
                linestyle=":",
                linewidth=0.8,
            )
    connections.set_ylabel("connections to the API server (dotted)")
    end = int(soak.now()) + 1
    for outcome, color in (("ok", "C2"), ("denied", "C3"), ("gone", "C7"), ("error", "k")):
        buckets = [0] * (end // 10 + 1)
        for t, _, o in soak.op_series:
            if o == outcome and t >= 0:
                buckets[int(t) // 10] += 1
        ops.plot(
            [i * 10 / 60 for i in range(len(buckets))],
            [b / 10 for b in buckets],
            color=color,
            label=outcome,
        )
    ops.set_ylabel("requests per s (10 s bins)")
    ops.set_xlabel("minutes")
    ops.legend(loc="upper left")
    colors = dict(zip((*FAULT_KINDS, "exit"), ("C4", "C5", "C6", "C8", "C9", "k"), strict=True))
    for axis in (memory, ops):
        for fault in soak.faults:
            axis.axvline(
                fault["at"] / 60, color=colors[fault["kind"]], linestyle="--", linewidth=0.8
            )
    for kind, color in colors.items():
        ops.plot([], [], color=color, linestyle="--", label=kind)
    ops.legend(loc="upper left", fontsize="small", ncol=2)
    memory.set_title(f"soak: {soak.settings.minutes:g} min, {len(soak.violations)} violations")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# -- main ----------------------------------------------------------------------------------


async def soak(settings: Settings) -> dict[str, Any]:
    """One run; the report (also written as JSON and a picture to ``settings.out_dir``)."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tally-soak-")))
        entry_point = snapshot_operator(work, traced=settings.traced_every_s > 0)
        print("starting an operator-mode control plane ...", file=sys.stderr, flush=True)
        state = stack.enter_context(_common.control_plane("operator"))
        for crd in ("clusterquotas", "podsets"):
            kubectl(state, "apply", "-f", str(REPO / "crds" / f"{crd}.tally.dev.yaml"))
            kubectl(
                state,
                "wait",
                "--for=condition=Established",
                f"crd/{crd}.tally.dev",
                "--timeout=60s",
            )
        kubectl(state, "create", "namespace", OWN_NAMESPACE)
        replicas: list[Replica] = []
        balancer = RoundRobinBalancer(
            lambda: [r.process.webhook_port for r in replicas if r.ready and r.pid]
        )
        await balancer.start()
        env = {
            "PYTHONPATH": str(work / "operator"),
            "TALLY_NAMESPACE": OWN_NAMESPACE,
            "TALLY_LEADER_ELECTION": "true",
            "TALLY_LEADER_ELECTION_LEASE_DURATION": str(LEASE_DURATION_S),
            "TALLY_LEADER_ELECTION_RENEW_DEADLINE": str(RENEW_DEADLINE_S),
            "TALLY_LEADER_ELECTION_RETRY_PERIOD": str(RETRY_PERIOD_S),
            "TALLY_WEBHOOK_REMOVE_ON_EXIT": "false",
            "TALLY_WEBHOOK_CERT_SECRET": f"{OWN_NAMESPACE}/tally-webhook-tls",
            "TALLY_WEBHOOK_URL_PORT": str(balancer.port),
        }
        logs = settings.logs
        shutil.rmtree(logs, ignore_errors=True)
        for name in ("a", "b"):
            process = operator_process.TallyProcess(
                Path(state.kubeconfig),
                logs / f"tally-{name}.log",
                bin_dir=Path(state.bin_dir),
                env=env,
                entry_point=entry_point,
            )
            stack.callback(process.kill)
            replicas.append(Replica(name, process))
        api = await api_client(state.kubeconfig, pool=settings.clients * 4 + 20)
        try:
            soak_ = Soak(
                settings, state, Raw(api), replicas, balancer, random.Random(settings.seed)
            )
            await asyncio.gather(*(soak_.start_replica(r) for r in replicas))
            if await soak_.wait_leader() is None:
                raise RuntimeError("no leader")
            await _common.until(
                soak_.raw,
                "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/tally.dev",
                lambda c: all(
                    str(balancer.port) in w["clientConfig"].get("url", "") for w in c["webhooks"]
                ),
                "the webhook configuration naming the balancer",
            )
            await soak_.setup()
            setup_s = time.monotonic() - began
            print(
                f"set up in {setup_s:.0f} s; soaking for {settings.minutes:g} min",
                file=sys.stderr,
                flush=True,
            )
            await soak_.run()
            tracebacks = soak_.judge_errors_and_logs()
            result = soak_.report(tracebacks, setup_s)
        finally:
            await balancer.close()
            await api.close()
        write(result, settings.out_dir / f"{settings.name}.json")
        draw(soak_, settings.out_dir / f"{settings.name}-timeline.png")
        return result


def figures(result: dict[str, Any]) -> list[_common.Figure]:
    """The figures the issue judges the soak by; none has a reference (upstream has no soak)."""
    worst = result["worst_convergence_s"]
    found = [
        _common.Figure("violations", "count", float(result["violations"]), None, target="== 0"),
        _common.Figure(
            "worst convergence", "s", math.nan if worst is None else float(worst), None,
            target="<= 10",
        ),
    ]  # fmt: skip
    for name, memory in sorted(result["memory"].items()):
        if memory["slope_mib_per_10min"] is not None:
            found.append(
                _common.Figure(
                    f"RSS slope, replica {name}", "MiB per 10 min",
                    float(memory["slope_mib_per_10min"]), None, target="< 1",
                )
            )  # fmt: skip
        if memory.get("steady_role_slope_mib_per_10min") is not None:
            found.append(
                _common.Figure(
                    f"RSS slope in a steady role, replica {name}", "MiB per 10 min",
                    float(memory["steady_role_slope_mib_per_10min"]), None, target="< 1",
                )
            )  # fmt: skip
    return found


def write(result: dict[str, Any], path: Path) -> None:
    """``soak.json`` through the benchmarks' shared writer (and its bar picture,
    ``soak.png``); the time series goes to ``soak-timeline.png`` (:func:`draw`)."""
    _common.write_results(path.stem, result, figures(result), path=path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=float, default=25.0, help="requests per second, all clients")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", default="soak")
    parser.add_argument("--logs", type=Path, default=Settings.logs, help="the replicas' logs")
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help="comma-separated fault kinds injected in turn, or none (default: every kind)",
    )
    parser.add_argument(
        "--traced-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="run the replicas under tracemalloc, a snapshot this often (to find what grows)",
    )
    args = parser.parse_args(argv)
    faults = tuple(k for k in args.faults.split(",") if k and k != "none")
    unknown = sorted(set(faults) - set(FAULT_KINDS))
    if unknown:
        parser.error(f"unknown fault kinds {unknown}: choose from {', '.join(FAULT_KINDS)}")
    settings = Settings(
        args.minutes,
        args.namespaces,
        args.clients,
        args.rate,
        args.seed,
        args.out_dir,
        args.name,
        args.logs,
        faults,
        args.traced_every,
    )
    result = asyncio.run(soak(settings))
    summary = {
        k: result[k]
        for k in (
            "operations",
            "outcomes",
            "faults",
            "violations",
            "worst_convergence_s",
            "tracebacks",
            "memory",
        )
    }
    print(json.dumps(summary, indent=1))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
