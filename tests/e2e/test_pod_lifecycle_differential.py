"""Differential test of pod lifecycle as kubelets make it: the same scripts on upstream's quota
system and on tally, with pods run by the planes' simulated nodes (kwok, ``hack/kwok/stages.yaml``)
and never a hand-written status.

Each case runs on the reference plane (upstream quota admission and kube-controller-manager's
resourcequota and replicaset controllers) and on the operator plane (tally) at once, each in a
fresh namespace, and stops at named checkpoints. At a checkpoint a side waits for the pods to
reach the phases kwok gives them, then for its anchors (values computed by hand from upstream's
rules, ``pkg/quota/v1/evaluator/core/pods.go``: a pod in phase Succeeded or Failed, or deleted
and past ``deletionTimestamp + deletionGracePeriodSeconds``, charges only ``count/pods``), then
until its quota statuses are unchanged for ``STABLE_AFTER_S`` (2 s). The anchors must hold on
upstream (else the script did not do what it says), and tally's statuses must equal upstream's
at every checkpoint: the same quotas, ``status.hard`` and ``status.used`` names, numerically
equal values.

What it proves:

* completions: restartPolicy Never pods (kwok: Succeeded) and a Job's pod leave ``pods``,
  ``requests.*`` and ``limits.*`` when they complete, and stay in ``count/pods``; a pod kwok
  keeps Running for ``LATER_S`` counts until then;
* held deletion: a pod whose deletion kwok holds (``pod-delete.stage.kwok.x-k8s.io/delay``, a
  container ignoring SIGTERM) and that stays terminating past its grace period. Observed on
  upstream first: it still counts 15 s past ``deletionTimestamp + grace`` (nothing recounts: no
  event says the deadline passed, only the 5-minute full resync would) and stops counting within
  0.1 s of the next pod event in the namespace. So the script provokes the recounts: a
  ``spec.hard`` change a second after ``deletionTimestamp``, ``GRACE_S - 1`` s before the
  deadline (the pod still counts; a recount ending after the deadline fails the case); then,
  ``PAST_DEADLINE_S`` after the deadline, a check that nothing recounted by itself; then another
  pod's deletion (the pod no longer counts; within ``FILL_WITHIN_S``, both sides take well under
  a second). The "nothing recounted" check is skipped on a side whose 5-minute full resync ran
  in that window, seen by a canary quota whose hand-edited status only a full resync repairs;
* scopes: ``Terminating`` / ``NotTerminating`` (``activeDeadlineSeconds``) and ``BestEffort`` /
  ``NotBestEffort`` over running and completed pods, and a running pod moving from
  NotTerminating to Terminating when ``activeDeadlineSeconds`` is set on it;
* refill: a ReplicaSet (upstream) and a PodSet (tally) whose pod fails (kwok's ``pod-fail``
  stage: evicted) both create a replacement and leave the failed pod as it is (phase Failed,
  still owned, not deleted); the same ``status`` counts, the same Events, and the quota over
  them charges the failed pod to ``count/pods`` only.

Timing: kwok moves pods within a second; every wait is bounded (``KWOK_WITHIN_S`` for kwok,
``FILL_WITHIN_S`` for a quota's anchors, ``podset_differential.ANCHOR_WITHIN_S`` for a
workload's); the file takes about 80 s, the planes' start included.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from podset_differential import Side as WorkloadSide
from podset_differential import counts
from podset_e2e import PODSET, REPLICASET, Workload, install_podset_crd, list_pods
from quota_differential import (
    FILL_WITHIN_S,
    PriorityNames,
    Scenario,
    check_anchors,
    compare,
    settled,
)
from quota_differential import Side as QuotaSide

import builders
from tally.quota.quantity import parse_quantity
from tally_e2e import ControlPlane, RunningOperator, eventually

COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
DELETE_DELAY = "pod-delete.stage.kwok.x-k8s.io/delay"
FAIL_REASON = "pod-fail.stage.kwok.x-k8s.io/reason"
FAIL_MESSAGE = "pod-fail.stage.kwok.x-k8s.io/message"
# kwok runs a bound pod and completes a Never pod within a second; generous for a loaded machine.
KWOK_WITHIN_S = 30.0
# How long kwok keeps the `later` pod Running before it succeeds: room for a checkpoint.
LATER_S = 15
# The held pod's grace period: the first recount runs a second after its deletionTimestamp,
# that is GRACE_S - 1 s before its deadline.
GRACE_S = 6
# How long after the deadline the script checks that nothing recounted by itself.
PAST_DEADLINE_S = 2.0
# The scripts set no priority class.
NO_PRIORITIES = PriorityNames(high="unused", low="unused")

Anchors = Mapping[str, Mapping[str, str | None]]
Quotas = dict[str, dict[str, Any]]


async def _checkpoint(side: QuotaSide) -> None:
    """The script of a checkpoint's :class:`Scenario`: it has run already."""


def _scenario(label: str, anchors: Anchors | None = None) -> Scenario:
    return Scenario(label, _checkpoint, anchors or {})


# -- one side -------------------------------------------------------------------------------


@dataclass
class Side(QuotaSide):
    """A quota side (``quota_differential.Side``) whose pods kwok runs. It records
    the quotas seen at each checkpoint, the anchors they missed (``problems``), the checkpoints
    that could not be checked and why (``inconclusive``), and the pods kwok holds that the
    clean-up must remove at once (``forced``)."""

    checkpoints: dict[str, Quotas] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    inconclusive: dict[str, str] = field(default_factory=dict)
    forced: list[str] = field(default_factory=list)

    async def run(
        self,
        name: str,
        requests: Mapping[str, str] | None = None,
        limits: Mapping[str, str] | None = None,
        *,
        annotations: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> None:
        """A pod the scheduler binds and kwok runs (its annotations steer kwok's Stages)."""
        body = builders.pod(
            name,
            requests or None,
            limits or None,
            resources="always",
            annotations=annotations,
            spec=spec,
        )
        await self.core.create_namespaced_pod(self.namespace, body)

    async def job(self, name: str, resources: Mapping[str, str]) -> None:
        """A Job of one pod requesting and limited to ``resources`` (kwok: it succeeds)."""
        template = builders.pod(None, resources, resources, spec={"restartPolicy": "Never"})
        await client.BatchV1Api(self.api).create_namespaced_job(
            self.namespace,
            {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": template}},
        )

    async def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in await list_pods(self.api, self.namespace)}

    async def phases(
        self, expected: Mapping[str, str], *, within: float = KWOK_WITHIN_S
    ) -> dict[str, dict[str, Any]]:
        """Wait until every pod named is in its phase (kwok's doing); the pods then."""

        def reached(pods: dict[str, dict[str, Any]]) -> bool:
            return all(phase_of(pods.get(name)) == phase for name, phase in expected.items())

        return await eventually(
            self.pods,
            until=reached,
            within=within,
            what=f"{self.label}: pods in phases {dict(expected)}",
        )

    async def job_pod(self, job: str) -> str:
        """The name of the Job's pod, once there is one."""

        async def names() -> list[str]:
            found = await self.core.list_namespaced_pod(
                self.namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
            )
            return [p.metadata.name for p in found.items]

        found = await eventually(names, until=lambda n: len(n) == 1, what=f"the pod of job {job}")
        return found[0]

    async def checkpoint(self, label: str, anchors: Anchors) -> None:
        """Wait until the anchors hold (or ``FILL_WITHIN_S`` passed), then until the statuses
        settle; record the quotas and every anchor they miss."""
        scenario = _scenario(label, anchors)
        with contextlib.suppress(AssertionError):
            await eventually(
                self.quotas,
                until=lambda quotas: not check_anchors(scenario, self.label, quotas),
                within=FILL_WITHIN_S,
                what=f"{self.label}: anchors of {label!r}",
            )
        self.record(label, await settled(self), anchors)

    def record(self, label: str, quotas: Quotas, anchors: Anchors) -> None:
        self.checkpoints[label] = quotas
        self.problems += [
            f"{label!r}: {p}" for p in check_anchors(_scenario(label, anchors), self.label, quotas)
        ]

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(f"{self.label}: {problem}")

    async def annotate(self, name: str, annotations: Mapping[str, str]) -> None:
        await self.core.patch_namespaced_pod(
            name,
            self.namespace,
            {"metadata": {"annotations": dict(annotations)}},
            _content_type="application/merge-patch+json",
        )

    async def clean_up(self) -> None:
        """Remove at once the pods kwok would hold for minutes, and the scripts' finalizers."""
        for name in self.forced:
            with contextlib.suppress(client.ApiException):
                await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        await self.release()


def phase_of(pod: Mapping[str, Any] | None) -> str | None:
    return None if pod is None else (pod.get("status") or {}).get("phase")


def epoch(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.time()))


async def both(*scripts: Awaitable[None]) -> None:
    """Run the scripts to their end, each side's whatever the other's does; then raise the
    first failure."""
    results = await asyncio.gather(*scripts, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def differences(upstream: Side, tally: Side) -> list[str]:
    """Upstream's anchors first (the script must do what it says), then every checkpoint's
    statuses compared, then tally's anchors."""
    assert not upstream.problems, "the script did not do what it says on upstream:\n" + "\n".join(
        upstream.problems
    )
    assert list(upstream.checkpoints) == list(tally.checkpoints)
    problems: list[str] = []
    for label, theirs in upstream.checkpoints.items():
        if label in upstream.inconclusive or label in tally.inconclusive:
            continue
        problems += [
            f"{label!r}: {p}" for p in compare(_scenario(label), theirs, tally.checkpoints[label])
        ]
    return problems + tally.problems


Script = Callable[[Side], Awaitable[None]]


async def run_case(script: Script, upstream: Side, tally: Side) -> None:
    try:
        await both(script(upstream), script(tally))
    finally:
        await asyncio.gather(upstream.clean_up(), tally.clean_up())
    problems = differences(upstream, tally)
    assert not problems, "tally's quota status differs from upstream's:\n  " + "\n  ".join(problems)


# -- scripts --------------------------------------------------------------------------------


COMPUTE = ["pods", "count/pods", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"]


async def completions(side: Side) -> None:
    """Never pods and a Job's pod complete; one runs for ``LATER_S`` first."""
    await side.quota("compute", COMPUTE)
    await side.run("runs", {"cpu": "100m", "memory": "64Mi"}, {"cpu": "200m", "memory": "128Mi"})
    await side.run(
        "once", {"cpu": "300m", "memory": "32Mi"}, {"cpu": "300m", "memory": "32Mi"},
        restartPolicy="Never",
    )  # fmt: skip
    await side.run(
        "later", {"cpu": "500m", "memory": "16Mi"}, {"cpu": "1", "memory": "16Mi"},
        annotations={COMPLETE_DELAY: f"{LATER_S}s"}, restartPolicy="Never",
    )  # fmt: skip
    await side.job("batch", {"cpu": "700m", "memory": "8Mi"})
    job_pod = await side.job_pod("batch")
    await side.phases({"runs": "Running", "once": "Succeeded", "later": "Running",
                       job_pod: "Succeeded"})  # fmt: skip
    # Running: runs and later. In storage: all four.
    await side.checkpoint("later still running", {"compute": {
        "pods": "2", "count/pods": "4", "requests.cpu": "600m", "requests.memory": "80Mi",
        "limits.cpu": "1200m", "limits.memory": "144Mi",
    }})  # fmt: skip
    pods = await side.pods()
    side.expect(
        phase_of(pods.get("later")) == "Running",
        f"later completed before its checkpoint was read (LATER_S={LATER_S} too short here)",
    )
    await side.phases({"later": "Succeeded"}, within=LATER_S + KWOK_WITHIN_S)
    await side.checkpoint("later succeeded", {"compute": {
        "pods": "1", "count/pods": "4", "requests.cpu": "100m", "requests.memory": "64Mi",
        "limits.cpu": "200m", "limits.memory": "128Mi",
    }})  # fmt: skip


CANARY = "resync-canary"


async def held_deletion(side: Side) -> None:
    """A running pod deleted with a ``GRACE_S`` grace period whose deletion kwok holds for 10
    minutes; the recounts provoked before and after its deadline."""
    await side.root_ca()
    await side.quota("q", ["pods", "count/pods", "requests.cpu"])
    await side.quota(CANARY, ["configmaps"])
    await side.run("stuck", {"cpu": "100m"}, annotations={DELETE_DELAY: "10m"})
    side.forced.append("stuck")
    await side.run("trigger", {"cpu": "50m"})
    await side.phases({"stuck": "Running", "trigger": "Running"})
    running = {"q": {"pods": "2", "count/pods": "2", "requests.cpu": "150m"}}
    await side.checkpoint("both running", running)

    await side.core.delete_namespaced_pod("stuck", side.namespace, grace_period_seconds=GRACE_S)
    pod = (await side.pods())["stuck"]
    meta = pod["metadata"]
    side.expect(meta.get("deletionGracePeriodSeconds") == GRACE_S, f"deleted pod: {meta}")
    deletion = epoch(meta["deletionTimestamp"])
    deadline = deletion + GRACE_S

    # Between deletionTimestamp and the deadline: a recount (a spec.hard change) still counts it.
    await sleep_until(deletion + 1)
    await side.patch_hard("q", {"pods": "1000"})
    recounted_at = time.time()
    side.record("recounted before the deadline", await side.quotas(), running)
    side.expect(
        recounted_at < deadline,
        f"the recount before the deadline ended {recounted_at - deadline:.1f} s after it",
    )

    # Past the deadline, nothing has recounted by itself; unless a full resync ran since the
    # canary was edited (the only thing that repairs it).
    await side.core.patch_namespaced_resource_quota_status(
        CANARY,
        side.namespace,
        {"status": {"used": {"configmaps": "99"}}},
        _content_type="application/merge-patch+json",
    )
    await sleep_until(deadline + PAST_DEADLINE_S)
    quotas = await side.quotas()
    label = "past the deadline, nothing recounted"
    canary = quotas[CANARY]["status"]["used"]["configmaps"]
    if parse_quantity(canary) != parse_quantity("99"):
        side.inconclusive[label] = f"a full resync ran (the canary shows {canary})"
    side.record(label, {"q": quotas["q"]}, {} if label in side.inconclusive else running)
    await side.core.delete_namespaced_resource_quota(CANARY, side.namespace)

    # Another pod's deletion recounts the namespace: the held pod no longer counts (it is still
    # in storage: count/pods).
    await side.delete_pod("trigger")
    await side.checkpoint(
        "recounted after the deadline", {"q": {"pods": "0", "count/pods": "1", "requests.cpu": "0"}}
    )
    pods = await side.pods()
    side.expect(
        list(pods) == ["stuck"] and phase_of(pods["stuck"]) == "Running",
        f"the held pod is not held: {sorted(pods)}",
    )


async def scopes(side: Side) -> None:
    """Terminating / NotTerminating and BestEffort / NotBestEffort over running and completed
    pods; then a running pod given an ``activeDeadlineSeconds``."""
    await side.quota("terminating", ["pods", "count/pods"], scopes=["Terminating"])
    await side.quota("not-terminating", ["pods", "count/pods"], scopes=["NotTerminating"])
    await side.quota("best-effort", ["pods", "count/pods"], scopes=["BestEffort"])
    await side.quota(
        "not-best-effort", ["pods", "count/pods", "requests.cpu"], scopes=["NotBestEffort"]
    )
    await side.quota(
        "short-burstable", ["pods", "requests.cpu"], scopes=["Terminating", "NotBestEffort"]
    )
    await side.run("be")
    await side.run("be-deadline", activeDeadlineSeconds=3600)
    await side.run("burst", {"cpu": "100m"})
    await side.run("burst-deadline", {"cpu": "200m"}, activeDeadlineSeconds=3600)
    await side.run("be-once", activeDeadlineSeconds=600, restartPolicy="Never")
    await side.run("burst-once", {"cpu": "400m"}, restartPolicy="Never")
    await side.phases({
        "be": "Running", "be-deadline": "Running", "burst": "Running",
        "burst-deadline": "Running", "be-once": "Succeeded", "burst-once": "Succeeded",
    })  # fmt: skip
    # Terminating: be-deadline, burst-deadline (+ be-once in storage). BestEffort: be,
    # be-deadline (+ be-once). NotBestEffort: burst, burst-deadline (+ burst-once).
    await side.checkpoint("running and completed", {
        "terminating": {"pods": "2", "count/pods": "3"},
        "not-terminating": {"pods": "2", "count/pods": "3"},
        "best-effort": {"pods": "2", "count/pods": "3"},
        "not-best-effort": {"pods": "2", "count/pods": "3", "requests.cpu": "300m"},
        "short-burstable": {"pods": "1", "requests.cpu": "200m"},
    })  # fmt: skip
    await side.core.patch_namespaced_pod(
        "be",
        side.namespace,
        {"spec": {"activeDeadlineSeconds": 3600}},
        _content_type="application/merge-patch+json",
    )
    await side.checkpoint("be given a deadline", {
        "terminating": {"pods": "3", "count/pods": "4"},
        "not-terminating": {"pods": "1", "count/pods": "2"},
        "best-effort": {"pods": "2", "count/pods": "3"},
        "not-best-effort": {"pods": "2", "count/pods": "3", "requests.cpu": "300m"},
        "short-burstable": {"pods": "1", "requests.cpu": "200m"},
    })  # fmt: skip


# -- refill: ReplicaSet against PodSet ------------------------------------------------------

REPLICAS = 3
EVICTED = "The node was low on resource: memory."


async def refill(quota: Side, workload: WorkloadSide) -> None:
    """Three replicas; kwok evicts one (``pod-fail``); the workload replaces it."""
    name = "web"
    await quota.quota("pods", ["pods", "count/pods", "requests.cpu"])
    await workload.create(name, REPLICAS)
    ready = dict.fromkeys(("fullyLabeledReplicas", "readyReplicas", "availableReplicas"), REPLICAS)
    await workload.checkpoint("running", name, counts(REPLICAS, **ready))
    before = await workload.pod_names(name)
    victim = before[0]
    await quota.annotate(victim, {FAIL_REASON: "Evicted", FAIL_MESSAGE: EVICTED})
    await quota.phases({victim: "Failed"})
    # The failed pod is still owned and not being deleted: counted in the snapshot's pods.
    await workload.checkpoint(
        "one evicted and replaced", name, counts(REPLICAS + 1, replicas=REPLICAS, **ready)
    )
    pods = await quota.pods()
    failed = pods[victim]
    quota.expect(
        failed["status"].get("reason") == "Evicted"
        and failed["status"].get("message") == EVICTED
        and not failed["metadata"].get("deletionTimestamp")
        and workload.workload.controls(failed, name),
        f"the failed pod is not left as it was: {failed['metadata']} {failed['status']}",
    )
    active = sorted(
        n
        for n, p in pods.items()
        if workload.workload.controls(p, name) and phase_of(p) != "Failed"
    )
    quota.expect(
        len(active) == REPLICAS
        and victim not in active
        and set(before[1:]) <= set(active)
        and all(phase_of(pods[n]) == "Running" for n in active),
        f"not replaced by one running pod: {before} -> {active}",
    )
    status = (await workload.workload.get(quota.api, quota.namespace, name)).get("status") or {}
    # A failed pod is terminal, not terminating (upstream counts only pods being deleted).
    quota.expect(status.get("terminatingReplicas") == 0, f"{workload.workload.kind}: {status}")
    # Three running pods of 100m; the failed one is in storage.
    await quota.checkpoint(
        "one evicted and replaced",
        {"pods": {"pods": "3", "count/pods": "4", "requests.cpu": "300m"}},
    )
    creates = [("Normal", "SuccessfulCreate", 1, "Created pod: <pod>")] * (REPLICAS + 1)
    await workload.event_checkpoint("events", name, creates)


# -- tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podset_crd(control_plane: ControlPlane) -> None:
    install_podset_crd(control_plane)


@pytest.fixture(scope="module")
def tally(podset_crd: None, operator: RunningOperator) -> RunningOperator:
    """tally, started after the PodSet CRD is installed (so its PodSet controller runs)."""
    return operator


@pytest_asyncio.fixture
async def sides(
    tally: RunningOperator,
    api: client.ApiClient,
    namespace: str,
    reference_api: client.ApiClient,
    reference_namespace: str,
) -> tuple[Side, Side]:
    return (
        Side("upstream", reference_api, reference_namespace, NO_PRIORITIES),
        Side("tally", api, namespace, NO_PRIORITIES),
    )


async def test_completed_pods_leave_compute_usage_and_stay_in_count(
    sides: tuple[Side, Side],
) -> None:
    await run_case(completions, *sides)


async def test_held_deletion_stops_counting_past_its_grace_at_the_next_recount(
    sides: tuple[Side, Side],
) -> None:
    await run_case(held_deletion, *sides)


async def test_terminating_and_best_effort_scopes_over_running_pods(
    sides: tuple[Side, Side],
) -> None:
    await run_case(scopes, *sides)


def _workload_side(side: Side, workload: Workload, label: str) -> WorkloadSide:
    return WorkloadSide(label, side.api, side.namespace, workload)


async def test_podset_refills_a_failed_pod_as_a_replicaset_does(
    sides: tuple[Side, Side],
) -> None:
    upstream, ours = sides
    theirs_w = _workload_side(upstream, REPLICASET, "upstream ReplicaSet")
    ours_w = _workload_side(ours, PODSET, "tally PodSet")
    try:
        await both(refill(upstream, theirs_w), refill(ours, ours_w))
    finally:
        await asyncio.gather(upstream.clean_up(), ours.clean_up())
    workload_differences: list[str] = [
        f"{label}: upstream {theirs} != tally {ours_w.checkpoints.get(label)}"
        for label, theirs in theirs_w.checkpoints.items()
        if theirs != ours_w.checkpoints.get(label)
    ]
    problems = differences(upstream, ours)
    assert not workload_differences + problems, "tally differs from upstream:\n  " + "\n  ".join(
        workload_differences + problems
    )
