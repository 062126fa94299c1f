"""The soak's checker (``bench/soak.py``): the invariants, judged from the cluster's objects and
the replicas' logs, never from tally's own view.

It owns the truth (what each object uses, as upstream's evaluators count it, recomputed from
LISTs), the judges (an object admitted past a quota's hard; a status that differs from the
truth), the checking during churn and in the quiet periods that end each cycle, and the verdict
on the requests that failed and the tracebacks in the logs. The workload (``soak_workload``)
tells it which quotas and ClusterQuotas are changing and since when each is in force; the
faults (``soak_faults``) tell it which moments are excused.

* **during churn**: every few seconds, from LISTs, no quota's resource summed over its objects
  exceeds its hard while the latest of those objects was created after the hard (and, for a
  ClusterQuota, its namespaces) last changed: that object was admitted past the limit (the
  argument: when the last-created object was admitted, every other object of the LIST already
  existed, so its admission saw at least the sum minus its own share).
* **quiet periods**: churn stopped, every quota's ``status.used`` (a ClusterQuota's
  ``status.total.used``) must equal the truth recomputed from a fresh LIST within
  ``CONVERGENCE_BOUND_S`` (the time it took is recorded), and every PodSet must have exactly
  ``spec.replicas`` pods.
* **at the end**: every request must have ended in an admission, a quota's 403 or (a delete or
  update of something already gone) a 404, and no replica's log may hold a traceback, except
  in the fault windows.

Creation times are second-granular, so "created after the hard changed" means created at or
after the next whole second. ClusterQuota membership follows a namespace's labels through
tally's namespace cache: a create in a namespace relabelled within ``MEMBERSHIP_GRACE_S`` is
not judged against the ClusterQuota it joined.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio import client

from _common import Raw
from soak_faults import Faults

if TYPE_CHECKING:
    from soak_workload import Clock, Workload

CONVERGENCE_BOUND_S = 30.0
"""How long a quiet period waits for every status to match the truth before it is a
violation (the issue's target, reported separately, is 10 s)."""
MEMBERSHIP_GRACE_S = 5.0


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


def quota_hards(quota: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    return (quota.get("spec") or {}).get("hard") or {}, (quota.get("status") or {}).get(
        "hard"
    ) or {}


def cluster_quota_hards(cq: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    spec = ((cq.get("spec") or {}).get("quota") or {}).get("hard") or {}
    status = (((cq.get("status") or {}).get("total") or {}).get("hard")) or {}
    return spec, status


async def in_force(
    raw: Raw, path: str, hards: Callable[[dict[str, Any]], tuple[dict[str, str], dict[str, str]]]
) -> float:
    """When the quota at ``path`` is in force: its status's hard is its spec's (upstream's
    admission, like tally's, judges a quota by ``status.hard``; a create before the first
    status is charged to nobody). Waits up to ``CONVERGENCE_BOUND_S``; a quota gone (or
    not readable) is in force at once, for what that means."""
    deadline = time.monotonic() + CONVERGENCE_BOUND_S
    while time.monotonic() < deadline:
        try:
            spec, status = hards(await raw.call("GET", path, request_timeout=5.0))
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


# -- the replicas' logs ----------------------------------------------------------------------


_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")


def stamp_of(line: str) -> float | None:
    stamp = _STAMP.match(line)
    if stamp is None:
        return None
    return (
        time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000
    )


def tracebacks_in(log: Path) -> list[tuple[float | None, str]]:
    """Each traceback in a replica's log with the time of the log line it follows."""
    found: list[tuple[float | None, str]] = []
    at: float | None = None
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    index = 0
    while index < len(lines):
        line = lines[index]
        stamp = stamp_of(line)
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


# -- the checker ----------------------------------------------------------------------------


@dataclass
class Checker:
    raw: Raw
    clock: Clock
    workload: Workload
    faults: Faults
    violations: list[dict[str, Any]] = field(default_factory=list)
    convergence: list[float] = field(default_factory=list)
    podset_settle: list[float] = field(default_factory=list)
    snapshots: int = 0

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
        workload = self.workload
        for quota in snap.quotas:
            namespace = quota["metadata"]["namespace"]
            after = snap.quotas_after.get((namespace, quota["metadata"]["name"]))
            if (
                namespace not in workload.quota_stable
                or namespace in workload.changing
                or after is None
                or after["spec"] != quota["spec"]
                or not snap.live(namespace)
            ):
                continue
            objects = list(snap.in_namespaces({namespace}))
            for found in over_admitted(
                objects, quota["spec"].get("hard") or {}, workload.quota_stable[namespace]
            ):
                self.violation("over_hard", quota=f"resourcequota/{namespace}/q", **found)
        for cq in snap.cluster_quotas:
            team = cq["metadata"]["name"].removeprefix("cq-")
            after = snap.cluster_quotas_after.get(cq["metadata"]["name"])
            if (
                team not in workload.cq_stable
                or f"cq-{team}" in workload.changing
                or workload.relabelling
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
            for found in over_admitted(objects, hard, workload.cq_stable[team]):
                self.violation("over_hard", quota=f"clusterquota/{cq['metadata']['name']}", **found)

    def violation(self, kind: str, **detail: Any) -> None:
        entry = {"kind": kind, "at": round(self.clock.now(), 2), **detail}
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
        for namespace in self.workload.podset_namespaces():
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
        while not self.clock.stopping:
            if self.clock.churning.is_set():
                with contextlib.suppress(Exception):
                    self.check_over(await self.snapshot())
            await asyncio.sleep(2.0)

    async def quiet(self, final: bool = False) -> None:
        """Churn stopped: every status must reach the truth, every PodSet its replicas."""
        self.clock.churning.clear()
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
            self.clock.churning.set()

    def judge_errors_and_logs(self) -> list[dict[str, Any]]:
        for error in self.workload.errors:
            if not self.faults.excused(error["at"]):
                self.violation("undecided", **error)
        tracebacks = []
        for replica in self.faults.replicas:
            for at, text in tracebacks_in(replica.process.log):
                relative = at - self.clock.t0 if at is not None else None
                entry = {
                    "replica": replica.name,
                    "at": None if relative is None else round(relative, 2),
                    "traceback": text[-1500:],
                }
                tracebacks.append(entry)
                if relative is None or (relative >= 0 and not self.faults.excused(relative)):
                    self.violation("traceback", **entry)
        return tracebacks
