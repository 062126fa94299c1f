"""Benchmark: pod creates and quota replenishment under pod status churn, tally against upstream.

Issue 28's item 3, in patcher mode: a process of its own plays the kubelets of the churned pods
(``bench/_kubelet_patcher.py``) and patches their status at a set rate (phase Running, Ready
toggling, restart counts bumped: every update is a pod MODIFIED event that changes nothing any
quota counts). Those pods are unbound (``NO_SCHEDULER``), so the patcher is their only kubelet;
the planes have kube-scheduler and simulated nodes (``cluster.DEFAULT_NODES``, kwok), which bind
and run every other pod: each create is followed by its binding and kwok's status writes, and a
replenishment pod's deletion is confirmed by kwok as a kubelet confirms it.

Starts two local control planes side by side with ``hack/cluster.py`` (temporary directories):
reference mode (upstream's quota: kube-controller-manager's resourcequota controller and the API
server's ResourceQuota plugin, the *upstream* side) and operator mode with tally running as
deployed (``tests/e2e/operator_process.TallyProcess``: ``kopf run operator/main.py`` under its
ServiceAccount, webhook registered, mutual TLS; the *tally* side); and, unless ``--no-floor``, a
third plane in operator mode with no quota system at all, where the Go floor webhook
(``bench/admission.py``'s, built by ``hack/floor.py``) is registered for pod creates with tally's
failurePolicy and timeout (the *floor* side: what answering a review costs at all). The same
workload on each (the floor side has no quotas and no deletes, there being nothing to
replenish):

* ``--namespaces`` namespaces (default 3) with ``--pods`` pods between them (default 1 500,
  ``requests.cpu: 10m``), each under a quota on ``pods``, ``count/pods`` and ``requests.cpu``.
  The last namespace's quota is *tight*: its ``pods`` limit is reached half-way through the
  churn phase, so that creates there are refused from then on (over-admission is checked).
* one more namespace of pods to delete, under a quota of its own, for replenishment: pods are
  deleted one at a time at Poisson times (``--delete-rate``, default 2/s), each latency from
  just before its DELETE to the arrival, on a watch of that quota opened at the start, of the
  status whose ``used.pods`` shows it (as ``bench/replenish.py`` measures it). Each is also
  split, on a watch of that namespace's pods: the DELETE's own answer, and the time from the
  first event showing the deletion (its ``deletionTimestamp``) to that status, which is what
  the quota system adds (the two watches are separate streams of the same API server).
* creates at Poisson times (``--create-rate``, default 15/s; ``bench/_open_loop.py``: latency
  from each create's *scheduled* time, so a stall shows in every create scheduled during it),
  round robin over the namespaces; the same schedule on both sides.
* the kubelet patcher: status updates of the ``--pods`` pods, round robin, at
  ``--update-rate`` (default 250/s) from ``--clients`` concurrent clients (default 16), open loop
  (an update due more than 1 s ago is skipped: the rate *reached* is reported).

Phases, after an unrecorded warm-up of every activity (``--warmup-seconds``, default 5):

* **calm** (``--phase-seconds``, default 60 per side): creates and deletes, no status churn.
* **churn** (as long): creates, deletes and the patcher. Both latency phases run in
  ``--blocks`` blocks per side (default 2), rotating which side goes first, so that the
  background load of this shared machine hits every side alike.
* **quiet** (``--quiet-seconds``, default 10) then **status only** (``--status-seconds``,
  default 30): nothing, then the patcher alone. CPU per status update of each process is its
  CPU over the status-only phase, less its quiet rate over the same time, over the updates
  answered. On the tally side a Kopf operator that only watches pods, with tally's Kopf
  settings and a handler that does nothing (``bench/_kopf_watch.py``, started through
  ``TallyProcess``'s ``entry_point`` just for these two phases, so that it takes no CPU from
  tally's latency phases), runs beside tally: the cost of watching pods through Kopf before
  anything is done with an event. The same figure over the churn phase (less the calm phase's
  rate) is reported beside it.

After each block the benchmark waits until the side's processes are idle again (the pod
events still queued in tally's, kube-controller-manager's and the Kopf watch's watches handled),
so that no block pays for the one before it; that time counts in the block's CPU.

Every phase also records the machine's time (``/proc/stat``): the cores kept busy by processes
other than the side's, the patcher and this one (the idle other plane, and any other work on
the machine), the cores in interrupts and those the hypervisor took, so that a phase disturbed
by other work shows as such.

Targets (issue 28): create p99 under churn <= 1.5x upstream's; tally's CPU per status-only
update <= 1.2x the Kopf watch's; replenishment p50 under churn <= 1.0x upstream's. The floor
side's create latencies are printed and drawn beside tally's and upstream's, without a target.
Checks (the floor side: no create refused, every one admitted listed):
nothing over-admitted (``status.used`` never above ``hard`` at the end, no namespace holds more
pods than its quota's ``hard.pods``), every create charged exactly once (the final
``status.used`` of every quota equals what a LIST of its namespace's pods adds up to), no
refusal but the tight quota's. Exits 1 if a target is missed or a check fails.

Writes ``bench/results/churn.json`` and its picture (or ``--results``). Cleans up both control
planes, tally, the Kopf watch and the patchers whatever happens.

Run: ``.venv/bin/python bench/churn.py [--pods 1500] [--update-rate 250] [--create-rate 15]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import functools
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch

from _common import (
    REPO,
    Background,
    Figure,
    Raw,
    api_client,
    bounded,
    cluster,
    control_plane,
    cpu_seconds,
    machine,
    operator_process,
    percentile,
    write_results,
)
from _open_loop import open_loop, poisson_offsets
from admission import FloorWebhook, ensure_floor  # bench/admission.py
from builders import IMAGE, NO_SCHEDULER  # tests/e2e/builders.py, put on sys.path by _common
from tally.kube.rest import read_environment_once
from tally.quota.quantity import parse_quantity

BENCH = REPO / "bench"
QUOTA = "q"
NAMESPACE_PREFIX = "churn"
REPLENISH_NAMESPACE = "churn-replenish"
CPU_REQUEST_M = 10
WAIT_S = 120.0
OPEN_POOL = 32
SETTLED_CORES = 0.15
"""A side is idle again once its processes use less than this over a second (about three
times what they use with nothing to do: 0.03-0.06 cores)."""
SETTLE_WITHIN_S = 60.0
KOPF_WATCH = "kopf-watch"
LOAD_WATCH = "kopf-watch-beside-upstream"
"""``--kopf-watch-beside-upstream``'s process: the same do-nothing Kopf pod watch, on upstream's
plane through all of upstream's phases."""
LOADED_UPSTREAM = "upstream + Kopf watch"
"""What a load control's pictures call upstream's side."""
FLOOR = "floor"
"""The floor side's label and its webhook's process (``bench/admission.py``'s floor)."""
PATCHER = "kubelet-patcher"
"""The benchmark's own client: its CPU is recorded, never counted as a side's."""
BENCHMARK = "benchmark"
"""This process (the creates, deletes and the quota watch)."""
MACHINE = "machine"
"""Every process's time on every core (``/proc/stat``): what the side's processes used, and
what the rest of the machine did meanwhile (the other, idle plane; anything else that ran), so
that a phase disturbed by other work shows as such."""
INTERRUPTS = "interrupts"
"""Every core's time in interrupts (``/proc/stat``'s irq and softirq), no process's."""
STEAL = "stolen"
"""Time the hypervisor gave other machines while this one had work (``/proc/stat``'s steal)."""
NOT_PROCESSES = (MACHINE, INTERRUPTS, STEAL)

TARGET_CREATE_P99_UNDER_CHURN = 1.5
TARGET_CPU_VS_KOPF_WATCH = 1.2
TARGET_REPLENISH_P50_UNDER_CHURN = 1.0

LATENCY_PHASES = ("calm", "churn")


# -- the plan: sizes, schedules, limits (pure)


@dataclass(frozen=True)
class Plan:
    pods: int = 1500
    namespaces: int = 3
    create_rate: float = 15.0
    delete_rate: float = 2.0
    update_rate: float = 250.0
    clients: int = 16
    phase_s: float = 60.0
    blocks: int = 2
    quiet_s: float = 10.0
    status_s: float = 30.0
    warmup_s: float = 5.0
    seed: int = 1

    @property
    def names(self) -> list[str]:
        """The churned namespaces; the last one's quota is the tight one."""
        return [f"{NAMESPACE_PREFIX}-{index}" for index in range(self.namespaces)]

    @property
    def block_s(self) -> float:
        return self.phase_s / self.blocks

    def initial_pods(self) -> dict[str, int]:
        """The pods each churned namespace holds before the first phase."""
        share, extra = divmod(self.pods, self.namespaces)
        return {name: share + (index < extra) for index, name in enumerate(self.names)}


def within(rate: float, seconds: float, rng: random.Random) -> list[float]:
    """Poisson arrival times at ``rate`` per second that fall within ``seconds``."""
    offsets: list[float] = []
    while not offsets or offsets[-1] < seconds:
        more = poisson_offsets(rate, max(8, int(rate * seconds)), rng)
        start = offsets[-1] if offsets else 0.0
        offsets += [start + offset for offset in more]
    return offsets[: bisect.bisect_left(offsets, seconds)]


@dataclass(frozen=True)
class Block:
    """One block of a phase: what each side does in it, on the same schedule."""

    phase: str
    """``warm-up``, ``calm`` or ``churn``."""
    index: int
    seconds: float
    creates: list[float]
    deletes: list[float]
    churn: bool


def schedule(plan: Plan) -> list[Block]:
    """The warm-up, then each latency phase's blocks, in order; the schedules come from
    ``plan.seed`` alone, so both sides (and every run with that seed) get the same."""
    rng = random.Random(plan.seed)
    blocks = [Block("warm-up", 0, plan.warmup_s, within(plan.create_rate, plan.warmup_s, rng),
                    within(plan.delete_rate, plan.warmup_s, rng), churn=True)]  # fmt: skip
    for phase in LATENCY_PHASES:
        for index in range(plan.blocks):
            creates = within(plan.create_rate, plan.block_s, rng)
            deletes = within(plan.delete_rate, plan.block_s, rng)
            blocks.append(Block(phase, index, plan.block_s, creates, deletes, phase == "churn"))
    return blocks


def hard_pods(plan: Plan, blocks: list[Block]) -> dict[str, int | None]:
    """Each churned namespace's ``pods`` limit (None: not tight, never reached). Creates go
    round robin over the namespaces in schedule order; the last namespace's limit is what it
    holds once half of the churn phase's creates have been sent."""
    initial = plan.initial_pods()
    total = sum(len(block.creates) for block in blocks)
    churn = sum(len(block.creates) for block in blocks if block.phase == "churn")
    midpoint = total - churn + churn // 2
    tight = plan.names[-1]
    last = plan.namespaces - 1
    sent_there = sum(1 for index in range(midpoint) if index % plan.namespaces == last)
    return {name: (initial[name] + sent_there if name == tight else None) for name in plan.names}


def replenish_pods(blocks: list[Block]) -> int:
    """The pods the replenishment namespace starts with: one per delete, and a few spare."""
    return sum(len(block.deletes) for block in blocks) + 5


# -- what a phase saw (pure arithmetic)


@dataclass
class Record:
    """One phase on one side, summed over its blocks; times in seconds."""

    seconds: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    creates: list[float] = field(default_factory=list)
    """Latency of each admitted create, from its scheduled time."""
    refused: int = 0
    send_lags: list[float] = field(default_factory=list)
    replenish: list[float] = field(default_factory=list)
    """Delete -> a status of the quota showing it."""
    delete_answered: list[float] = field(default_factory=list)
    """Delete -> the API server's answer to it."""
    replenish_seen: list[float] = field(default_factory=list)
    """The deletion's first watch event -> a status of the quota showing it (the quota system's
    reaction; negative when the status arrived first, the two watches being separate streams)."""
    updates: int = 0
    update_seconds: float = 0.0
    update_latencies_ms: list[float] = field(default_factory=list)
    update_skipped: int = 0
    update_errors: Counter[str] = field(default_factory=Counter)
    drained_s: list[float] = field(default_factory=list)
    """After each block, until the side's processes were idle again (included in ``seconds``
    and in the CPU)."""

    def add_cpu(self, before: dict[str, float], after: dict[str, float]) -> None:
        for name, value in after.items():
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + value - before.get(name, value)

    def add_updates(self, patched: dict[str, Any]) -> None:
        """What the patcher answered for one of its runs."""
        self.updates += int(patched["updates"])
        self.update_seconds += float(patched["seconds"])
        self.update_latencies_ms += [float(value) for value in patched["latencies_ms"]]
        self.update_skipped += int(patched["skipped"])
        self.update_errors.update(patched["errors"])

    def summary(self) -> dict[str, Any]:
        """The phase's figures; latency keys only for what ran in it. ``other_cores``: the
        cores, on average, that processes other than this side's, the patcher and the benchmark
        kept busy; ``interrupt_cores`` and ``stolen_cores``: in interrupts, and taken by the
        hypervisor."""
        summary: dict[str, Any] = {"seconds": self.seconds, "cpu_s": dict(self.cpu_s)}
        if self.drained_s:
            summary["drained_s"] = list(self.drained_s)
        if MACHINE in self.cpu_s and self.seconds:
            mine = sum(s for name, s in self.cpu_s.items() if name not in NOT_PROCESSES)
            summary["other_cores"] = (self.cpu_s[MACHINE] - mine) / self.seconds
            summary["interrupt_cores"] = self.cpu_s.get(INTERRUPTS, 0.0) / self.seconds
            summary["stolen_cores"] = self.cpu_s.get(STEAL, 0.0) / self.seconds
        if self.creates or self.refused:
            summary |= {"creates": len(self.creates), "refused": self.refused}
        if self.creates:
            summary |= {
                "create_p50_ms": percentile(self.creates, 0.50) * 1000,
                "create_p99_ms": percentile(self.creates, 0.99) * 1000,
                "create_p99_9_ms": percentile(self.creates, 0.999) * 1000,
                "create_max_ms": max(self.creates) * 1000,
                "send_lag_p99_ms": percentile(self.send_lags, 0.99) * 1000,
            }
        if self.replenish:
            summary |= {
                "deletes": len(self.replenish),
                "replenish_p50_ms": percentile(self.replenish, 0.50) * 1000,
                "replenish_p99_ms": percentile(self.replenish, 0.99) * 1000,
                "replenish_max_ms": max(self.replenish) * 1000,
            }
        if self.delete_answered:
            summary["delete_answered_p50_ms"] = percentile(self.delete_answered, 0.50) * 1000
        if self.replenish_seen:
            summary |= {
                "replenish_seen_p50_ms": percentile(self.replenish_seen, 0.50) * 1000,
                "replenish_seen_p99_ms": percentile(self.replenish_seen, 0.99) * 1000,
            }
        if self.update_seconds:
            summary |= {
                "updates": self.updates,
                "updates_per_s": self.updates / self.update_seconds,
                "update_skipped": self.update_skipped,
                "update_errors": dict(self.update_errors),
            }
        if self.update_latencies_ms:
            summary |= {
                "update_p50_ms": percentile(self.update_latencies_ms, 0.50),
                "update_p99_ms": percentile(self.update_latencies_ms, 0.99),
            }
        return summary


def cpu_ms_per_update(phase: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """Each process's CPU per status update answered in ``phase`` (summaries), in ms: its CPU in
    the phase less what it spends at ``baseline``'s rate over the phase's time. Empty when no
    update was answered."""
    updates = phase.get("updates", 0)
    if not updates:
        return {}
    rates = {name: s / baseline["seconds"] for name, s in baseline["cpu_s"].items()}
    return {
        name: (s - rates.get(name, 0.0) * phase["seconds"]) / updates * 1000
        for name, s in phase["cpu_s"].items()
        if name not in (INTERRUPTS, STEAL)
    }


@dataclass(frozen=True)
class Target:
    name: str
    unit: str
    tally: float
    reference: float
    reference_name: str
    limit: float
    """The most tally / reference may be."""

    @property
    def ratio(self) -> float:
        return self.tally / self.reference if self.reference else float("inf")

    @property
    def met(self) -> bool:
        return self.ratio <= self.limit

    def line(self) -> str:
        verdict = "meets" if self.met else "misses"
        return (f"{self.name}: tally {self.tally:.2f} {self.unit}, {self.reference_name} "
                f"{self.reference:.2f} {self.unit}: {self.ratio:.2f}x ({verdict} <= "
                f"{self.limit}x)")  # fmt: skip


def targets(upstream: dict[str, Any], tally: dict[str, Any]) -> list[Target]:
    """Issue 28's three targets, from each side's summary (:func:`side_summary`)."""
    up_churn, tally_churn = upstream["phases"]["churn"], tally["phases"]["churn"]
    cpu = tally["cpu_ms_per_update"]["status only"]
    return [
        Target("create p99 under churn", "ms", tally_churn["create_p99_ms"],
               up_churn["create_p99_ms"], "upstream", TARGET_CREATE_P99_UNDER_CHURN),
        Target("CPU per status-only update", "ms", cpu["tally"], cpu[KOPF_WATCH],
               "Kopf pod watch", TARGET_CPU_VS_KOPF_WATCH),
        Target("replenishment p50 under churn", "ms", tally_churn["replenish_p50_ms"],
               up_churn["replenish_p50_ms"], "upstream", TARGET_REPLENISH_P50_UNDER_CHURN),
    ]  # fmt: skip


def side_summary(records: dict[str, Record]) -> dict[str, Any]:
    """Every phase's summary, and CPU per status update: over the status-only phase less the
    quiet phase's rate, and over the churn phase less the calm phase's rate."""
    phases = {name: record.summary() for name, record in records.items()}
    return {
        "phases": phases,
        "cpu_ms_per_update": {
            "status only": cpu_ms_per_update(phases["status only"], phases["quiet"]),
            "churn": cpu_ms_per_update(phases["churn"], phases["calm"]),
        },
    }


def figures_of(
    upstream: dict[str, Any], tally: dict[str, Any], found: list[Target]
) -> list[Figure]:
    """The picture's panels: tally's side against upstream's, the targets named."""
    goal = {target.name: f"<= {target.limit}x" for target in found}
    up, ta = upstream["phases"], tally["phases"]
    status_cpu = tally["cpu_ms_per_update"]["status only"]
    kcm = upstream["cpu_ms_per_update"]["status only"]["kube-controller-manager"]
    return [
        Figure("create p50, no churn", "ms", ta["calm"]["create_p50_ms"],
               up["calm"]["create_p50_ms"]),
        Figure("create p99, no churn", "ms", ta["calm"]["create_p99_ms"],
               up["calm"]["create_p99_ms"]),
        Figure("create p50, under churn", "ms", ta["churn"]["create_p50_ms"],
               up["churn"]["create_p50_ms"]),
        Figure("create p99, under churn", "ms", ta["churn"]["create_p99_ms"],
               up["churn"]["create_p99_ms"], target=goal["create p99 under churn"]),
        Figure("create p99.9, under churn", "ms", ta["churn"]["create_p99_9_ms"],
               up["churn"]["create_p99_9_ms"]),
        Figure("status updates reached, under churn", "updates/s", ta["churn"]["updates_per_s"],
               up["churn"]["updates_per_s"], better="higher"),
        Figure("replenishment p50, no churn", "ms", ta["calm"]["replenish_p50_ms"],
               up["calm"]["replenish_p50_ms"]),
        Figure("replenishment p50, under churn", "ms", ta["churn"]["replenish_p50_ms"],
               up["churn"]["replenish_p50_ms"], target=goal["replenishment p50 under churn"]),
        Figure("replenishment p99, under churn", "ms", ta["churn"]["replenish_p99_ms"],
               up["churn"]["replenish_p99_ms"]),
        Figure("replenishment p50 from the deletion's watch event, under churn", "ms",
               ta["churn"]["replenish_seen_p50_ms"], up["churn"]["replenish_seen_p50_ms"]),
        Figure("DELETE answered p50, under churn", "ms", ta["churn"]["delete_answered_p50_ms"],
               up["churn"]["delete_answered_p50_ms"]),
        Figure("CPU per status update: tally vs kube-controller-manager", "ms",
               status_cpu["tally"], kcm, reference_name="kube-controller-manager"),
        Figure("CPU per status update: tally vs a Kopf pod watch", "ms", status_cpu["tally"],
               status_cpu[KOPF_WATCH], reference_name="Kopf pod watch",
               target=goal["CPU per status-only update"]),
    ]  # fmt: skip


def load_control_figures(figures: list[Figure]) -> list[Figure]:
    """A load control's panels: those against upstream name what the grey bars are, upstream
    with the Kopf watch beside it, and show no target (issue 28's are against upstream alone);
    tally against its own plane's Kopf watch keeps its target."""
    return [
        replace(f, reference_name=LOADED_UPSTREAM, target=None)
        if f.reference_name == "upstream" else f
        for f in figures
    ]  # fmt: skip


def floor_lines(
    floor: dict[str, Any], tally: dict[str, Any], upstream: dict[str, Any]
) -> list[str]:
    """tally's and upstream's create latencies against the floor side's (no target: the floor
    is what answering a review costs the API server at all, with no quota system)."""
    lines = []
    for phase in LATENCY_PHASES:
        f, t, u = (side["phases"][phase] for side in (floor, tally, upstream))
        lines.append(
            f"{phase}: create p99 floor {f['create_p99_ms']:.1f} ms; tally / floor "
            f"{t['create_p99_ms'] / f['create_p99_ms']:.2f}x, upstream / floor "
            f"{u['create_p99_ms'] / f['create_p99_ms']:.2f}x"
        )
    return lines


def floor_figures(floor: dict[str, Any], tally: dict[str, Any]) -> list[Figure]:
    """The picture's panels against the floor side."""
    f, t = floor["phases"], tally["phases"]
    return [
        Figure("create p99, no churn: tally vs floor", "ms", t["calm"]["create_p99_ms"],
               f["calm"]["create_p99_ms"], reference_name="floor"),
        Figure("create p99, under churn: tally vs floor", "ms", t["churn"]["create_p99_ms"],
               f["churn"]["create_p99_ms"], reference_name="floor"),
    ]  # fmt: skip


# -- the checks (pure)


@dataclass(frozen=True)
class QuotaState:
    """One quota at the end, beside its namespace's pods from a LIST."""

    hard: dict[str, str]
    used: dict[str, str]
    pods: int
    requested_cpu_m: int
    """The sum of the listed pods' cpu requests, in millicores."""


def quota_problems(namespace: str, quota: QuotaState) -> list[str]:
    """What is wrong with ``quota`` at the end: a resource used above its hard limit, more pods
    than ``hard.pods`` (over-admitted), or a ``status.used`` that is not what the LIST adds up
    to (a create charged twice or never, a delete never replenished)."""
    problems = []
    expected = {"pods": quota.pods, "count/pods": quota.pods, "requests.cpu": quota.requested_cpu_m}
    for resource, listed in expected.items():
        milli = 1 if resource == "requests.cpu" else 1000
        hard = parse_quantity(quota.hard[resource]).milli_value()
        used_text = quota.used.get(resource)
        if used_text is None:
            problems.append(f"{namespace}: status.used has no {resource}")
            continue
        used = parse_quantity(used_text).milli_value()
        if used > hard:
            problems.append(f"{namespace}: {resource} used {used_text}, above hard "
                            f"{quota.hard[resource]}")  # fmt: skip
        if used != listed * milli:
            unit = "m" if resource == "requests.cpu" else ""
            problems.append(f"{namespace}: {resource} used {used_text}, the pods listed add up "
                            f"to {listed}{unit}")  # fmt: skip
    if quota.pods * 1000 > parse_quantity(quota.hard["pods"]).milli_value():
        problems.append(f"{namespace}: {quota.pods} pods, over hard pods {quota.hard['pods']}")
    return problems


def count_problems(listed: dict[str, int], expected: dict[str, int]) -> list[str]:
    """Namespaces whose pods (a LIST) are not what the benchmark was told: the pods it started
    with, plus the creates answered 201, less the deletes."""
    return [
        f"{namespace}: {listed.get(namespace, 0)} pods listed, {count} admitted and not deleted"
        for namespace, count in expected.items()
        if listed.get(namespace, 0) != count
    ]


def refusal_problems(refusals: list[str], tight: str) -> list[str]:
    """Refusals other than the tight quota's (``<namespace> <status>: <message>``)."""
    return [r for r in refusals if not (r.startswith(f"{tight} ") and "exceeded quota" in r)]


# -- the sides


class QuotaWatch(Background):
    """Every ``used.pods`` of one quota as a watch delivers it, with the time it arrived."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        super().__init__()
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self.history: list[tuple[float, int]] = []
        self.changed = asyncio.Condition()

    async def _run(self) -> None:
        while True:
            stream = watch.Watch().stream(
                self.core.list_namespaced_resource_quota, self.namespace,
                field_selector=f"metadata.name={self.name}", timeout_seconds=3600,
            )  # fmt: skip
            async for event in stream:
                arrived = time.perf_counter()
                used = ((event["raw_object"].get("status") or {}).get("used")) or {}
                if "pods" not in used:
                    continue
                async with self.changed:
                    self.history.append((arrived, int(used["pods"])))
                    self.changed.notify_all()

    async def lowered(self, to: int, since: float) -> float:
        """When a status with ``used.pods <= to`` first arrived after ``since``."""
        async with asyncio.timeout(WAIT_S), self.changed:
            await self.changed.wait_for(lambda: first_at_most(self.history, to, since) is not None)
        arrived = first_at_most(self.history, to, since)
        assert arrived is not None
        return arrived


def first_at_most(history: list[tuple[float, int]], to: int, since: float) -> float | None:
    """The arrival time of the first status in ``history`` (arrival order) at or after
    ``since`` whose value is at most ``to``."""
    for arrived, value in history[bisect.bisect_left(history, since, key=lambda entry: entry[0]) :]:
        if value <= to:
            return arrived
    return None


def shows_deletion(event_type: str, metadata: dict[str, Any]) -> bool:
    """Whether a pod's watch event shows it deleted: DELETED, or a ``deletionTimestamp``."""
    return event_type == "DELETED" or bool(metadata.get("deletionTimestamp"))


class DeletionWatch(Background):
    """When each pod of one namespace was first seen deleted on a watch: the event that sets
    its ``deletionTimestamp`` (from which on a quota no longer counts a pod deleted without a
    grace period), or its DELETED event if that came first."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        super().__init__()
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self.changed = asyncio.Condition()

    async def _run(self) -> None:
        while True:
            stream = watch.Watch().stream(
                self.core.list_namespaced_pod, self.namespace, timeout_seconds=3600
            )
            async for event in stream:
                arrived = time.perf_counter()
                metadata = event["raw_object"].get("metadata") or {}
                name = str(metadata.get("name") or "")
                if name in self.seen or not shows_deletion(event["type"], metadata):
                    continue
                async with self.changed:
                    self.seen[name] = arrived
                    self.changed.notify_all()

    async def deleted(self, name: str) -> float:
        """When ``name``'s deletion was first seen."""
        async with asyncio.timeout(WAIT_S), self.changed:
            await self.changed.wait_for(lambda: name in self.seen)
        return self.seen[name]


ANSWER_LIMIT = 2**26
"""The longest line the patcher may answer: each run's answer holds every update's latency
(about 7 bytes each), past asyncio's default 64 KiB at 250/s for 40 s."""


class Patcher:
    """``bench/_kubelet_patcher.py`` as a subprocess, its connections open between runs."""

    def __init__(self, kubeconfig: str, namespaces: list[str], clients: int) -> None:
        self.command = [sys.executable, str(BENCH / "_kubelet_patcher.py"), kubeconfig,
                        *namespaces, f"--clients={clients}"]  # fmt: skip
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> int:
        """Start it; the pods it updates."""
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            cwd=REPO, limit=ANSWER_LIMIT,
        )  # fmt: skip
        return int((await self._answer())["ready"])

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def run(self, seconds: float, rate: float) -> dict[str, Any]:
        assert self.process is not None
        assert self.process.stdin is not None
        self.process.stdin.write(f"run {seconds} {rate}\n".encode())
        await self.process.stdin.drain()
        return await self._answer()

    async def _answer(self) -> dict[str, Any]:
        assert self.process is not None
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the kubelet patcher exited with {await self.process.wait()}")
        return dict(json.loads(line))

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


def pod_body(name: str, *, played: bool = False) -> dict[str, Any]:
    """A pod of the workload; ``played``: left unbound (``NO_SCHEDULER``), its status the
    patcher's to write, so that no simulated kubelet writes it too."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "image": IMAGE,
                "resources": {"requests": {"cpu": f"{CPU_REQUEST_M}m"}},
            }
        ]
    }
    if played:
        spec["schedulerName"] = NO_SCHEDULER
    return {"metadata": {"name": name, "labels": {"app": "churn"}}, "spec": spec}


class Side:
    def __init__(
        self, label: str, plane: cluster.State, api: client.ApiClient, pids: dict[str, int],
        plan: Plan, *, floor: FloorWebhook | None = None,
    ) -> None:  # fmt: skip
        """``floor``: the floor side (no quota system: no quotas, no deletes to replenish; the
        floor webhook reviews its pod creates)."""
        self.label = label
        self.floor = floor
        self.plane = plane
        self.api = api
        # No thread-pool hops per request for the proxy variables and ~/.netrc: on a saturated
        # machine they would add to every create's latency, on both sides.
        read_environment_once(api, str(api.configuration.host))
        self.raw = Raw(api)
        self.pids = pids
        """The processes whose CPU each block records."""
        self.plan = plan
        self.watch = QuotaWatch(api, REPLENISH_NAMESPACE, QUOTA)
        self.deletions = DeletionWatch(api, REPLENISH_NAMESPACE)
        self.patcher = Patcher(plane.kubeconfig, plan.names, plan.clients)
        self.records: dict[str, Record] = {}
        self.created = 0
        self.refusals: list[str] = []
        self.admitted: Counter[str] = Counter()
        """Creates answered 201, per namespace."""
        self.deleted = 0
        self.replenish_pods = 0
        self.deleting = asyncio.Lock()
        self.listed: dict[str, int] = {}
        """Each namespace's pods at the end, from a LIST."""

    def cpu(self) -> dict[str, float]:
        machine = machine_seconds(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))
        return {**machine, **{name: cpu_seconds(pid) for name, pid in self.pids.items()}}

    @property
    def quota(self) -> bool:
        """Whether a quota system runs on this side (upstream's or tally)."""
        return self.floor is None

    async def prepare(self, hard: dict[str, int | None], replenish: int) -> None:
        """Namespaces, quotas whose status is filled in, then the pods, charged at admission.
        On the floor side: the floor webhook registered, the namespaces and the pods."""
        if self.floor is not None:
            await self.raw.call(
                "POST",
                "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                self.floor.configuration(),
            )
            replenish = 0  # nothing to replenish: no deletes
        self.replenish_pods = replenish
        names = [*self.plan.names, REPLENISH_NAMESPACE]
        for name in names:
            await self.raw.create("/api/v1/namespaces", {"metadata": {"name": name}})
        for name in names:  # pods are refused until the default service account exists
            await self._until(f"/api/v1/namespaces/{name}/serviceaccounts/default",
                              lambda _: True, "a default service account")  # fmt: skip
        if self.floor is not None:
            await self._prepare_pods({**self.plan.initial_pods()})
            await self.floor.until_reviewed(self.create, lambda: self.refusals[-1])
            return
        self.watch.start()
        self.deletions.start()
        room = 100_000
        for name in names:
            pods = hard.get(name) or room
            limits = {"pods": str(pods), "count/pods": str(pods), "requests.cpu": str(room)}
            body = {"metadata": {"name": QUOTA}, "spec": {"hard": limits}}
            await self.raw.create(f"/api/v1/namespaces/{name}/resourcequotas", body)
        for name in names:
            await self._until_used(name, 0)
        initial = {**self.plan.initial_pods(), REPLENISH_NAMESPACE: replenish}
        await self._prepare_pods(initial)
        for name, count in initial.items():
            await self._until_used(name, count)

    async def _prepare_pods(self, initial: dict[str, int]) -> None:
        """Create the pods each namespace starts with, then start the kubelet patcher."""
        jobs = [
            (lambda name=name, index=index: self.raw.create(
                f"/api/v1/namespaces/{name}/pods",
                pod_body(f"p{index:05d}", played=name != REPLENISH_NAMESPACE)))
            for name, count in initial.items()
            for index in range(count)
        ]  # fmt: skip
        await bounded(jobs, 20, label=f"{self.label}: pods", total=len(jobs))
        print(f"  {self.label}: {sum(initial.values())} pods created; starting its kubelet "
              f"patcher", file=sys.stderr, flush=True)  # fmt: skip
        churned = await self.patcher.start()
        assert churned == self.plan.pods, f"the patcher found {churned} pods"
        self.pids[PATCHER] = self.patcher.pid

    def expected_pods(self) -> dict[str, int]:
        """The pods each namespace should hold: as prepared, plus the creates admitted, less the
        deletes."""
        expected = {name: count + self.admitted[name]
                    for name, count in self.plan.initial_pods().items()}  # fmt: skip
        return {**expected, REPLENISH_NAMESPACE: self.replenish_pods - self.deleted}

    async def _until(self, path: str, done: Callable[[dict[str, Any]], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            with contextlib.suppress(client.ApiException):
                if done(await self.raw.call("GET", path)):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: timed out waiting for {what}")
            await asyncio.sleep(0.1)

    async def _until_used(self, namespace: str, pods: int) -> None:
        await self._until(
            f"/api/v1/namespaces/{namespace}/resourcequotas/{QUOTA}",
            lambda q: ((q.get("status") or {}).get("used") or {}).get("pods") == str(pods),
            f"{namespace}'s quota to show {pods} pods",
        )

    async def create(self, _: int = 0) -> bool:
        """One pod create, round robin over the churned namespaces; whether it was admitted."""
        index = self.created
        self.created += 1
        namespace = self.plan.names[index % self.plan.namespaces]
        try:
            await self.raw.call("POST", f"/api/v1/namespaces/{namespace}/pods",
                                pod_body(f"c{index:05d}"))  # fmt: skip
        except client.ApiException as error:
            try:
                message = json.loads(error.body or "{}").get("message", error.body)
            except ValueError:
                message = error.body
            self.refusals.append(f"{namespace} {error.status}: {message}"[:400])
            return False
        self.admitted[namespace] += 1
        return True

    async def delete(self, record: Record) -> None:
        """Delete the next pod of the replenishment namespace and wait for its quota to show
        it; one at a time (each latency is then one deletion's)."""
        async with self.deleting:
            index = self.deleted
            self.deleted += 1
            name = f"p{index:05d}"
            started = time.perf_counter()
            await self.raw.call(
                "DELETE", f"/api/v1/namespaces/{REPLENISH_NAMESPACE}/pods/{name}",
                query=[("gracePeriodSeconds", "0")],
            )  # fmt: skip
            record.delete_answered.append(time.perf_counter() - started)
            arrived = await self.watch.lowered(self.replenish_pods - index - 1, started)
            record.replenish.append(arrived - started)
            record.replenish_seen.append(arrived - await self.deletions.deleted(name))

    async def block(self, record: Record, block: Block) -> None:
        """One block: its creates and deletes at their scheduled times, the patcher if it
        churns; the CPU of every process from its start to its last answer."""

        async def delete(_: int) -> bool:
            await self.delete(record)
            return True

        deletes = block.deletes if self.quota else []

        async def churn() -> dict[str, Any] | None:
            if not block.churn:
                return None
            return await self.patcher.run(block.seconds, self.plan.update_rate)

        before = self.cpu()
        started = time.perf_counter()
        patched, created, _, _ = await asyncio.gather(
            churn(), open_loop(block.creates, self.create), open_loop(deletes, delete),
            asyncio.sleep(block.seconds),
        )  # fmt: skip
        record.drained_s.append(await self.drained())
        record.seconds += time.perf_counter() - started
        record.add_cpu(before, self.cpu())
        record.creates += created.latencies
        record.refused += created.refused
        record.send_lags += created.send_lags
        if patched is not None:
            record.add_updates(patched)

    async def drained(self) -> float:
        """Wait until this side's processes are idle again: the pod events a block left in
        their watches are handled within the block's CPU, and not during the next block (the
        other side's, perhaps). The seconds it took."""
        return await settle(
            lambda: sum(s for name, s in self.cpu().items() if name not in NOT_PROCESSES),
            SETTLED_CORES, within=SETTLE_WITHIN_S,
        )  # fmt: skip

    async def quiet_then_status(self) -> None:
        """The quiet phase, then the patcher alone."""
        quiet = self.records["quiet"] = Record()
        before = self.cpu()
        started = time.perf_counter()
        await asyncio.sleep(self.plan.quiet_s)
        quiet.seconds = time.perf_counter() - started
        quiet.add_cpu(before, self.cpu())
        status = self.records["status only"] = Record()
        before = self.cpu()
        started = time.perf_counter()
        status.add_updates(await self.patcher.run(self.plan.status_s, self.plan.update_rate))
        status.drained_s.append(await self.drained())
        status.seconds = time.perf_counter() - started
        status.add_cpu(before, self.cpu())

    async def listed_pods(self) -> dict[str, int]:
        """Each namespace's pods, from a LIST."""
        return {
            name: len(await self.raw.list_all(f"/api/v1/namespaces/{name}/pods"))
            for name in [*self.plan.names, REPLENISH_NAMESPACE]
        }

    async def quotas(self) -> dict[str, QuotaState]:
        """Every quota once its ``used.pods`` equals its namespace's pods (or after
        ``WAIT_S``), beside the LIST; none on the floor side."""
        found: dict[str, QuotaState] = {}
        if not self.quota:
            return found
        for name in [*self.plan.names, REPLENISH_NAMESPACE]:
            deadline = time.monotonic() + WAIT_S
            while True:
                pods = await self.raw.list_all(f"/api/v1/namespaces/{name}/pods")
                quota = await self.raw.call(
                    "GET", f"/api/v1/namespaces/{name}/resourcequotas/{QUOTA}"
                )
                status = quota.get("status") or {}
                used = dict(status.get("used") or {})
                if used.get("pods") == str(len(pods)) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            cpu_m = sum(
                parse_quantity(c["resources"]["requests"]["cpu"]).milli_value()
                for pod in pods
                for c in pod["spec"]["containers"]
            )
            found[name] = QuotaState(dict(quota["spec"]["hard"]), used, len(pods), cpu_m)
        return found


def machine_seconds(stat: str, ticks_per_s: float) -> dict[str, float]:
    """From ``/proc/stat``'s text, every core's time so far: in processes (user, nice, system:
    what the processes' own times add up to; guests are inside user), in interrupts (irq,
    softirq: loopback networking among them, which no process is charged) and stolen (by the
    hypervisor, for other machines)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(value) for value in stat.splitlines()[0].split()[1:9]
    )
    return {
        MACHINE: (user + nice + system) / ticks_per_s,
        INTERRUPTS: (irq + softirq) / ticks_per_s,
        STEAL: steal / ticks_per_s,
    }


async def settle(busy: Callable[[], float], cores: float, *, within: float = 90.0) -> float:
    """Wait until the processes ``busy`` reads the CPU seconds of use less than ``cores`` over
    a second (until what a burst of events left them to do is done); the seconds it took,
    ``within`` at most."""
    started = time.monotonic()
    last = busy()
    while time.monotonic() - started < within:
        await asyncio.sleep(1.0)
        now = busy()
        if now - last < cores:
            break
        last = now
    return time.monotonic() - started


async def measure(
    plan: Plan, reference: cluster.State, operator: cluster.State, tally_pid: int,
    start_kopf_watch: Callable[[], int], floor_plane: cluster.State | None = None,
    floor: FloorWebhook | None = None, load_watch_pid: int | None = None,
) -> tuple[list[Side], dict[str, int | None], dict[str, dict[str, QuotaState]]]:  # fmt: skip
    """Every phase on every side, then every quota beside its pods; the sides, the tight
    limits and the quotas (none on the floor side, whose pods are counted by a LIST:
    ``Side.listed``). ``load_watch_pid``: the Kopf pod watch running on upstream's plane
    (``--kopf-watch-beside-upstream``), whose CPU upstream's side then records."""
    blocks = schedule(plan)
    hard = hard_pods(plan, blocks)
    replenish = replenish_pods(blocks)
    sides = [
        Side("upstream", reference, await api_client(reference.kubeconfig, pool=OPEN_POOL),
             {**reference.pids, BENCHMARK: os.getpid(),
              **({LOAD_WATCH: load_watch_pid} if load_watch_pid is not None else {})},
             plan),
    ]  # fmt: skip
    if floor_plane is not None and floor is not None:
        assert floor.process is not None
        sides.append(
            Side(FLOOR, floor_plane, await api_client(floor_plane.kubeconfig, pool=OPEN_POOL),
                 {**floor_plane.pids, FLOOR: floor.process.pid, BENCHMARK: os.getpid()}, plan,
                 floor=floor)
        )  # fmt: skip
    sides.append(
        Side("tally", operator, await api_client(operator.kubeconfig, pool=OPEN_POOL),
             {**operator.pids, "tally": tally_pid, BENCHMARK: os.getpid()}, plan)
    )  # fmt: skip
    try:
        await asyncio.gather(*(side.prepare(hard, replenish) for side in sides))
        for side in sides:
            for name in ("warm-up", *LATENCY_PHASES):
                side.records[name] = Record()
        for number, block in enumerate(blocks):
            shift = number % len(sides)
            order = sides[shift:] + sides[:shift]
            for side in order:
                await side.block(side.records[block.phase], block)
            print(f"  {block.phase} block {block.index + 1} done "
                  f"({', then '.join(s.label for s in order)})", file=sys.stderr,
                  flush=True)  # fmt: skip
        for side in sides:
            if side.label == "tally":
                side.pids[KOPF_WATCH] = pid = await asyncio.to_thread(start_kopf_watch)
                took = await settle(functools.partial(cpu_seconds, pid), 0.03)
                print(f"  the Kopf pod watch is up and settled ({took:.0f} s)", file=sys.stderr,
                      flush=True)  # fmt: skip
            await side.quiet_then_status()
            print(f"  {side.label}: quiet and status-only phases done", file=sys.stderr,
                  flush=True)  # fmt: skip
        quotas = {side.label: await side.quotas() for side in sides}
        for side in sides:
            side.listed = (
                {ns: quota.pods for ns, quota in quotas[side.label].items()}
                if side.quota
                else await side.listed_pods()
            )
    finally:
        for side in sides:
            await side.patcher.stop()
            await side.watch.stop()
            await side.deletions.stop()
            await side.api.close()
    return sides, hard, quotas


# -- the report


def ms(value: float) -> str:
    return f"{value:8.1f} ms"


def report(plan: Plan, sides: list[Side], hard: dict[str, int | None],
           quotas: dict[str, dict[str, QuotaState]], started_on: str, revision: str,
           results: Path | None, floor_reviews: int | None = None,
           load_control: bool = False) -> bool:  # fmt: skip
    """Print and write the figures; whether every target was met and every check passed.
    ``floor_reviews``: the reviews the floor webhook said it allowed (None: no floor side).
    ``load_control``: upstream's plane carried a Kopf pod watch (``--kopf-watch-beside-
    upstream``): the comparisons with upstream are a diagnosis, not issue 28's targets."""
    summaries = {side.label: side_summary(side.records) for side in sides}
    print(f"churn (patcher mode): {plan.pods} pods in {plan.namespaces} namespaces, status "
          f"updates at {plan.update_rate:g}/s from {plan.clients} clients, creates at "
          f"{plan.create_rate:g}/s, deletes at {plan.delete_rate:g}/s; phases of "
          f"{plan.phase_s:g} s per side in {plan.blocks} rotating blocks; quiet "
          f"{plan.quiet_s:g} s, status only {plan.status_s:g} s")  # fmt: skip
    print(f"machine at the start: {started_on}")
    print(f"tally at {revision}")
    if load_control:
        print("LOAD CONTROL: a do-nothing Kopf pod watch ran on upstream's plane through all of "
              "upstream's phases; the comparisons with upstream below are not issue 28's "
              "targets")  # fmt: skip
    print(f"{'':22}{'creates':>8}{'p50':>12}{'p99':>12}{'p99.9':>12}{'refused':>8}"
          f"{'updates/s':>11}{'replenish p50':>15}{'p99':>12}")  # fmt: skip
    for label, summary in summaries.items():
        for name in LATENCY_PHASES:
            s = summary["phases"][name]
            rate = f"{s['updates_per_s']:.0f}" if "updates_per_s" in s else "-"
            replenish = (f"{ms(s['replenish_p50_ms']):>15}{ms(s['replenish_p99_ms']):>12}"
                         if "replenish_p50_ms" in s else f"{'-':>15}{'-':>12}")  # fmt: skip
            print(f"{label + ', ' + name:22}{s['creates']:>8}{ms(s['create_p50_ms']):>12}"
                  f"{ms(s['create_p99_ms']):>12}{ms(s['create_p99_9_ms']):>12}"
                  f"{s['refused']:>8}{rate:>11}{replenish}")  # fmt: skip
    for label, summary in summaries.items():
        split = [
            f"{name}: the DELETE answered {s['delete_answered_p50_ms']:.1f} ms, from the "
            f"deletion's watch event {s['replenish_seen_p50_ms']:.1f} / "
            f"{s['replenish_seen_p99_ms']:.1f} ms"
            for name in LATENCY_PHASES
            if "replenish_seen_p50_ms" in (s := summary["phases"][name])
        ]  # fmt: skip
        if split:
            print(f"{label}: replenishment p50 (p99), " + "; ".join(split))
    for label, summary in summaries.items():
        status = summary["phases"]["status only"]
        print(f"{label}: status only {status['updates_per_s']:.0f} updates/s "
              f"({status['update_skipped']} skipped, errors {status['update_errors'] or 'none'}, "
              f"answered p50 {status.get('update_p50_ms', 0):.1f} ms)")  # fmt: skip
        for phase, per in summary["cpu_ms_per_update"].items():
            parts = ", ".join(f"{name} {value:.3f}" for name, value in per.items())
            print(f"  CPU ms per status update ({phase}): {parts}")
        drained = ", ".join(f"{name} {max(s['drained_s']):.0f} s"
                            for name, s in summary["phases"].items()
                            if "drained_s" in s)  # fmt: skip
        print(f"  idle again after a block within: {drained}")
    for label, summary in summaries.items():
        parts = ", ".join(f"{name} {s['other_cores']:.2f} / {s['interrupt_cores']:.2f} / "
                          f"{s['stolen_cores']:.2f}"
                          for name, s in summary["phases"].items())  # fmt: skip
        print(f"{label}: cores busy in other processes / in interrupts / stolen: {parts}")
    found = targets(summaries["upstream"], summaries["tally"])
    for target in found:
        print(target.line() + (" [load control]" if load_control else ""))
    if FLOOR in summaries:
        for line in floor_lines(summaries[FLOOR], summaries["tally"], summaries["upstream"]):
            print(line)
    problems: dict[str, list[str]] = {}
    tight = plan.names[-1]
    for side in sides:
        mine = [p for ns, quota in quotas[side.label].items() for p in quota_problems(ns, quota)]
        # Without a quota no create may be refused at all.
        mine += [
            f"refused: {r}"
            for r in (refusal_problems(side.refusals, tight) if side.quota else side.refusals)
        ]
        mine += count_problems(side.listed, side.expected_pods())  # fmt: skip
        problems[side.label] = mine
        listed = ", ".join(f"{ns} {count}" for ns, count in side.listed.items())
        tight_note = (f" (the tight quota {tight}: {side.listed[tight]} pods, hard {hard[tight]})"
                      if side.quota else "")  # fmt: skip
        checked_note = ("every quota matches its pods" if side.quota
                        else "every create admitted and listed")  # fmt: skip
        print(f"{side.label}: {side.created} creates sent, {len(side.refusals)} refused"
              f"{tight_note}; pods per namespace {listed}; "
              f"{checked_note if not mine else 'PROBLEMS:'}")  # fmt: skip
        for problem in mine[:10]:
            print(f"  {problem}")
    checked = not any(problems.values())
    met = all(target.met for target in found)
    if not checked:
        print("ERROR: a quota was over-admitted or does not match its pods, or a create was "
              "refused by something other than the tight quota")  # fmt: skip
    result: dict[str, Any] = {
        "machine": started_on,
        "mode": "patcher",
        "plan": asdict(plan),
        "tight_namespace": tight,
        "hard_pods": hard,
        "tally_revision": revision,
        "sides": summaries,
        "targets": [{**asdict(t), "ratio": t.ratio, "met": t.met} for t in found],
        "quotas": {
            label: {ns: asdict(quota) for ns, quota in states.items()}
            for label, states in quotas.items()
        },
        "refusals": {side.label: len(side.refusals) for side in sides},
        "problems": problems,
        "ok": checked and met,
        "load_control": load_control,
    }
    if floor_reviews is not None:
        result["floor_reviews_allowed"] = floor_reviews
    figures = figures_of(summaries["upstream"], summaries["tally"], found)
    if load_control:
        figures = load_control_figures(figures)
    if FLOOR in summaries:
        figures += floor_figures(summaries[FLOOR], summaries["tally"])
    # A load control's figures never replace the standard run's picture.
    write_results("churn-load-control" if load_control else "churn", result, figures,
                  path=results)  # fmt: skip
    return checked and met


def source_revision() -> str:
    from admission import source_revision as revision  # bench/admission.py

    return revision()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Plan()
    parser.add_argument("--pods", type=int, default=defaults.pods, help="pods churned")
    parser.add_argument("--namespaces", type=int, default=defaults.namespaces)
    parser.add_argument("--update-rate", type=float, default=defaults.update_rate,
                        help="status updates/s the patcher aims at")  # fmt: skip
    parser.add_argument("--clients", type=int, default=defaults.clients,
                        help="the patcher's concurrent clients")  # fmt: skip
    parser.add_argument("--create-rate", type=float, default=defaults.create_rate)
    parser.add_argument("--delete-rate", type=float, default=defaults.delete_rate)
    parser.add_argument("--phase-seconds", type=float, default=defaults.phase_s,
                        help="calm and churn phases, per side")  # fmt: skip
    parser.add_argument("--blocks", type=int, default=defaults.blocks)
    parser.add_argument("--quiet-seconds", type=float, default=defaults.quiet_s)
    parser.add_argument("--status-seconds", type=float, default=defaults.status_s)
    parser.add_argument("--warmup-seconds", type=float, default=defaults.warmup_s)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                        help="a third side: the Go floor webhook on a plane without a quota "
                             "system")  # fmt: skip
    parser.add_argument("--kopf-watch-beside-upstream", action="store_true",
                        help="a load control: the do-nothing Kopf pod watch also runs on "
                             "upstream's plane through all of upstream's phases, so that "
                             "upstream's figures carry the CPU a Python pod watch takes "
                             "from the shared machine (the comparisons are then not issue "
                             "28's targets; written to bench/results/"
                             "churn-load-control.json)")  # fmt: skip
    parser.add_argument("--results", type=Path, default=None,
                        help="JSON to write (bench/results/churn.json)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.namespaces < 2:
        parser.error("--namespaces must be at least 2 (the last one's quota is the tight one)")
    plan = Plan(args.pods, args.namespaces, args.create_rate, args.delete_rate,
                args.update_rate, args.clients, args.phase_seconds, args.blocks,
                args.quiet_seconds, args.status_seconds, args.warmup_seconds,
                args.seed)  # fmt: skip
    started_on = machine()
    revision = source_revision()
    with contextlib.ExitStack() as stack:
        if args.floor:
            ensure_floor()
        print("starting the control planes ...", file=sys.stderr)
        reference = stack.enter_context(control_plane("reference"))
        operator = stack.enter_context(control_plane("operator"))
        floor_plane: cluster.State | None = None
        floor: FloorWebhook | None = None
        if args.floor:
            floor_plane = stack.enter_context(control_plane("operator"))
            pki = cluster.webhook_client_pki(Path(floor_plane.dir))
            assert pki is not None, "an operator-mode control plane presents a client certificate"
            floor = FloorWebhook(Path(stack.enter_context(tempfile.TemporaryDirectory())), pki.ca)
            stack.callback(floor.stop)
            floor.start()
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        tally = operator_process.TallyProcess(
            Path(operator.kubeconfig), logs / "tally.log", bin_dir=Path(operator.bin_dir)
        )
        stack.callback(tally.kill)
        tally.start()
        assert tally.process is not None

        def kopf_watch(plane: cluster.State, log: str) -> operator_process.TallyProcess:
            """The do-nothing Kopf pod watch (``bench/_kopf_watch.py``) on ``plane``."""
            return operator_process.TallyProcess(
                Path(plane.kubeconfig), logs / log, bin_dir=Path(plane.bin_dir),
                entry_point=BENCH / "_kopf_watch.py",
                env={"TALLY_WEBHOOK_ENABLED": "false"},  # start() then waits for liveness only
            )  # fmt: skip

        watcher = kopf_watch(operator, "kopf-watch.log")
        stack.callback(watcher.kill)

        def start_kopf_watch() -> int:
            watcher.start()
            assert watcher.process is not None
            return int(watcher.process.pid)

        load_watch_pid: int | None = None
        if args.kopf_watch_beside_upstream:
            load_watch = kopf_watch(reference, "kopf-watch-beside-upstream.log")
            stack.callback(load_watch.kill)
            load_watch.start()
            assert load_watch.process is not None
            load_watch_pid = load_watch.process.pid

        print("measuring ...", file=sys.stderr)
        try:
            sides, hard, quotas = asyncio.run(
                measure(plan, reference, operator, tally.process.pid, start_kopf_watch,
                        floor_plane, floor, load_watch_pid)
            )  # fmt: skip
        except BaseException:
            print(f"--- tally's log (tail) ---\n{tally.log_text()}", file=sys.stderr)
            raise
        floor_reviews = None
        if floor is not None:
            floor.stop()
            floor_reviews = floor.allowed
        ok = report(plan, sides, hard, quotas, started_on, revision, args.results, floor_reviews,
                    load_control=args.kopf_watch_beside_upstream)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
