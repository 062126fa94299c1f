"""The soak's workload (``bench/soak.py``): what the tenants create, change and delete.

It owns the objects of the run (the fixed namespaces and their quotas, the teams' ClusterQuotas,
the PodSets), the churn over them (``OPERATIONS``: creates outweigh deletes, so most creates
meet a full quota; quotas, ClusterQuotas and team labels changed; PodSets scaled; namespaces
with a quota and objects made and deleted) and the record of every churn request and its
outcome. It also keeps what the checker (``soak_checker``) needs to judge fairly: which quotas
are being changed right now and since when each one's current hard is in force. :class:`Clock`
is the run's time and phase, shared by every part of the soak.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

import _common
from _common import Raw
from soak_checker import MEMBERSHIP_GRACE_S, cluster_quota_hards, in_force, quota_hards

TEAMS = ("t0", "t1", "t2", "t3", "t4")
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


@dataclass
class Clock:
    """The run's time and phase: ``t0`` when churn began, whether it runs now (``churning``,
    cleared by the checker's quiet periods) and whether the run is ending (``stopping``)."""

    t0: float = field(default_factory=time.time)
    churning: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False

    def now(self) -> float:
        return time.time() - self.t0


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


def quota_body(hard: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q"},
        "spec": {"hard": hard},
    }


def cq_body(team: str, hard: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "ClusterQuota",
        "metadata": {"name": f"cq-{team}"},
        "spec": {"namespaceSelector": {"matchLabels": {"team": team}}, "quota": {"hard": hard}},
    }


# -- the workload --------------------------------------------------------------------------


@dataclass
class Workload:
    raw: Raw
    rng: random.Random
    clock: Clock
    namespaces: int
    clients: int
    rate: float
    ops: Counter[str] = field(default_factory=Counter)
    op_series: list[tuple[float, str, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
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

    def fixed(self) -> list[str]:
        return [f"soak-{i:02d}" for i in range(self.namespaces)]

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
        self.op_series.append((self.clock.now(), op, outcome))
        if outcome == "error":
            self.errors.append(
                {
                    "at": round(started - self.clock.t0, 2),
                    "op": op,
                    "path": path,
                    "status": status,
                    "message": message[:300],
                }
            )
        return outcome

    # -- setup

    async def setup(self) -> None:
        raw = self.raw
        for team in TEAMS:
            await raw.create(
                "/apis/tally.dev/v1alpha1/clusterquotas",
                cq_body(team, {k: v[0] for k, v in CQ_HARD.items()}),
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
                quota_body({k: v[0] for k, v in RQ_HARD.items()}),
            )
            self.quota_present[namespace] = True
            self.quota_stable[namespace] = time.time()
        for namespace in self.podset_namespaces():
            await raw.create(
                "/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {"soak": "true"}}}
            )
            await raw.create(
                f"/api/v1/namespaces/{namespace}/resourcequotas",
                quota_body(PODSET_NAMESPACE_HARD),
            )
            self.quota_stable[namespace] = time.time()
        # The quotas are in force (their first status written) before churn judges them.
        for namespace in [*fixed, *self.podset_namespaces()]:
            self.quota_stable[namespace] = await in_force(
                raw, f"/api/v1/namespaces/{namespace}/resourcequotas/q", quota_hards
            )
        for team in TEAMS:
            self.cq_stable[team] = await in_force(
                raw, f"/apis/tally.dev/v1alpha1/clusterquotas/cq-{team}", cluster_quota_hards
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
        spacing = self.clients / self.rate
        ops = list(OPERATIONS)
        weights = [OPERATIONS[op][0] for op in ops]
        while not self.clock.stopping:
            await self.clock.churning.wait()
            if self.clock.stopping:
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
                    quota_body({k: v[0] for k, v in RQ_HARD.items()}),
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
            self.quota_stable[namespace] = await in_force(
                self.raw, f"/api/v1/namespaces/{namespace}/resourcequotas/q", quota_hards
            )
            self.changing.discard(namespace)

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
            self.cq_stable[team] = await in_force(
                self.raw, f"/apis/tally.dev/v1alpha1/clusterquotas/{key}", cluster_quota_hards
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
        while not self.clock.stopping:
            await self.clock.churning.wait()
            if self.clock.stopping:
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
                    quota_body({"configmaps": "3", "secrets": "2", "services": "1"}),
                )
                self.quota_stable[namespace] = await in_force(self.raw, f"{path}/q", quota_hards)
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


def _creating(
    kind: str, body: Callable[[Workload], dict[str, Any]]
) -> Callable[[Workload], Awaitable[None]]:
    async def op(workload: Workload) -> None:
        await workload.create_object(kind, body(workload))

    return op


def _deleting(kind: str) -> Callable[[Workload], Awaitable[None]]:
    async def op(workload: Workload) -> None:
        await workload.delete_object(kind)

    return op


def _updating(kind: str) -> Callable[[Workload], Awaitable[None]]:
    async def op(workload: Workload) -> None:
        await workload.update_object(kind)

    return op


OPERATIONS: dict[str, tuple[float, Callable[[Workload], Awaitable[None]]]] = {
    "create_pod": (5, _creating("pods", lambda w: POD)),
    "delete_pod": (3, _deleting("pods")),
    "update_pod": (1, _updating("pods")),
    "create_service": (
        3,
        _creating(
            "services", lambda w: service(w.rng.choice(["ClusterIP", "NodePort", "LoadBalancer"]))
        ),
    ),
    "delete_service": (2, _deleting("services")),
    "update_service": (1, _updating("services")),
    "create_pvc": (2, _creating("persistentvolumeclaims", lambda w: PVC)),
    "delete_pvc": (1, _deleting("persistentvolumeclaims")),
    "create_configmap": (3, _creating("configmaps", lambda w: CONFIGMAP)),
    "delete_configmap": (2, _deleting("configmaps")),
    "update_configmap": (1, _updating("configmaps")),
    "create_secret": (2, _creating("secrets", lambda w: SECRET)),
    "delete_secret": (1, _deleting("secrets")),
    "update_secret": (1, _updating("secrets")),
    "quota": (0.6, Workload.change_quota),
    "clusterquota": (0.3, Workload.change_cluster_quota),
    "relabel": (0.3, Workload.relabel_namespace),
    "podset": (1, Workload.scale_podset),
}
"""Name → (weight, operation). Creates outweigh deletes: quotas stay full, and most creates
are judged against a full quota."""
