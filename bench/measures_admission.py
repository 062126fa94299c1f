"""Benchmark: admission throughput of custom-resource creates under a ClusterQuota with CEL
measures, against the same creates under the same ClusterQuota counting them only (issue 14).

Why: a measure is evaluated by tally's webhook on every create of its kind. ``bench/measures.py``
times one evaluation in-process (tens of µs); this measures what measures cost where it
matters, end to end: the API server's call to the webhook, tally's judgement and its status
write (which carries the measures' totals too), on the same machine as everything else.

One operator-mode control plane (``hack/cluster.py``, a temporary directory) with tally as a
subprocess, a CRD ``databases.db.bench.example.com`` (``spec`` keeps unknown fields) and
``--namespaces`` namespaces (default 10) selected by one ClusterQuota. Two phases:

* **count only**: the ClusterQuota's ``hard`` names ``count/databases.db.bench.example.com``
  alone (1 000 000: nothing is refused);
* **measures**: the same ClusterQuota also defines three typical measures and names them in
  ``hard`` with room for every create: ``object.spec.storageGB``, the same with a ``when``
  filter (``object.spec.tier == "gold"``), and ``quantity(object.spec.size)``.

In each phase ``--clients`` clients (default 20) create ``--creates`` databases (default 1 000)
of one shape (eight spec fields) round robin across the namespaces, each client sending its
next create as soon as the previous one is answered; latency is per request, throughput is
creates per second of wall time. The machine is shared, so the creates run in ``--blocks``
blocks per phase (default 4) in the order count, measures, measures, count, … (each phase's
blocks centred on the same moment: a load that drifts hits both alike); the ClusterQuota is
patched between phases.

Every create must be judged, so before measuring: tally's webhook configuration must cover
``databases`` (it is rewritten a moment after a ClusterQuota first names the kind) for longer
than tally's settle time; after each switch the ClusterQuota's status must show the new
``hard`` and exactly the usage of what was created (the count and, with measures, every sum);
then a dry-run create far past the measures' limits must be refused naming a measure (measures
phase) or admitted (count-only phase: admission no longer applies the measures). Then
``--clients`` creates of warm-up, not counted.

Prints creates/s, p50 and p99 per phase, the ratios measures / count only, CPU per create of
tally and of the control plane's processes, tally's mean webhook decision time and its
resident memory, the load average; writes the figures as JSON and a picture beside it
(default ``bench/results/measures_admission.json`` and ``.png``).

Run: ``.venv/bin/python bench/measures_admission.py [--creates 1000] [--clients 20]`` (under a
minute on the 2-core machine, 1-2 minutes when it is loaded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from _common import (
    REPO,
    Figure,
    Loop,
    Raw,
    api_client,
    bounded,
    closed_loop,
    cluster,
    cluster_quota_plane,
    cpu_seconds,
    kubectl,
    machine,
    memory_of,
    mib,
    operator_process,
    percentile,
    until,
    write_results,
)
from tally.quota.quantity import Quantity, parse_quantity
from tally.webhook.registrar import RULES_SETTLE_S

GROUP = "db.bench.example.com"
PLURAL = "databases"
COUNT = f"count/{PLURAL}.{GROUP}"
LABEL = "bench.tally.dev/measures"
CQ = "bench-measures"
CQ_PATH = "/apis/tally.dev/v1alpha1/clusterquotas"
WEBHOOKS_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
STORAGE = "bench.example.com/storage-gb"
GOLD = "bench.example.com/gold-storage-gb"
SIZE = "bench.example.com/size"
MEASURES = [
    {"name": STORAGE, "expression": "object.spec.storageGB"},
    {"name": GOLD, "expression": "object.spec.storageGB", "when": 'object.spec.tier == "gold"'},
    {"name": SIZE, "expression": "quantity(object.spec.size)"},
]
# Room for every create in both phases: nothing may be refused.
HARD_COUNT = {COUNT: "1000000"}
HARD_MEASURES = {STORAGE: "1000000000", GOLD: "1000000000", SIZE: "100Pi"}
TIERS = ("gold", "silver", "bronze")
SIZES = ("512Mi", "10Gi", "100Gi", "1Ti")
PHASES = ("count only", "measures")
WAIT_S = 120.0


def database(index: int, **spec: Any) -> dict[str, Any]:
    """Database ``index``: the same shape for every create, values cycling with the index."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Database",
        "metadata": {"name": f"d{index:06d}", "labels": {"app": "bench"}},
        "spec": {
            "engine": "postgres",
            "version": "16.4",
            "tier": TIERS[index % len(TIERS)],
            "storageGB": 1 + index % 500,
            "size": SIZES[index % len(SIZES)],
            "replicas": 1 + index % 3,
            "backup": {"schedule": "0 3 * * *", "retentionDays": 7},
            "parameters": {"max_connections": "200", "shared_buffers": "1GB"},
            **spec,
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Database", "plural": PLURAL, "singular": "database"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                }}},
            }],
        },
    }  # fmt: skip


@dataclass
class Usage:
    """What the admitted databases add up to: the status the ClusterQuota must show."""

    count: int = 0
    storage: int = 0
    gold: int = 0
    size: Quantity = field(default_factory=lambda: Quantity.from_int(0))

    def add(self, body: dict[str, Any]) -> None:
        spec = body["spec"]
        self.count += 1
        self.storage += spec["storageGB"]
        self.gold += spec["storageGB"] if spec["tier"] == "gold" else 0
        self.size = self.size + parse_quantity(spec["size"])

    def shown_by(self, cq: dict[str, Any], measured: bool) -> bool:
        """Whether ``cq``'s status has the phase's ``hard`` and exactly this usage."""
        total = (cq.get("status") or {}).get("total") or {}
        hard, used = total.get("hard") or {}, total.get("used") or {}
        wanted = {**HARD_COUNT, **(HARD_MEASURES if measured else {})}
        if set(hard) != set(wanted) or set(used) != set(wanted):
            return False
        expected = {COUNT: Quantity.from_int(self.count)}
        if measured:
            expected |= {
                STORAGE: Quantity.from_int(self.storage),
                GOLD: Quantity.from_int(self.gold),
                SIZE: self.size,
            }
        return all(parse_quantity(used[name]) == value for name, value in expected.items())


@dataclass
class Phase:
    """One phase's figures, summed over its blocks."""

    name: str
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    refusals: list[str] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)
    decision_s: float = 0.0
    """tally's own admission time (``tally_admission_duration_seconds``) during the blocks."""
    decisions: float = 0.0

    def summary(self) -> dict[str, Any]:
        creates = len(self.latencies)
        return {
            "creates": creates,
            "throughput_per_s": creates / self.wall_s,
            "p50_ms": statistics.median(self.latencies) * 1000,
            "p99_ms": percentile(self.latencies, 0.99) * 1000,
            "max_ms": max(self.latencies) * 1000,
            "refused": len(self.refusals),
            "cpu_ms_per_create": {
                name: seconds / creates * 1000 for name, seconds in self.cpu_s.items()
            },
            "tally_mean_decision_ms": self.decision_s / self.decisions * 1000
            if self.decisions
            else None,
            "latencies_ms": [round(value * 1000, 2) for value in self.latencies],
        }


class Bench:
    def __init__(
        self,
        raw: Raw,
        tally: operator_process.TallyProcess,
        pids: dict[str, int],
        namespaces: list[str],
        clients: int,
    ) -> None:
        self.raw = raw
        self.tally = tally
        self.pids = pids
        """Processes whose CPU time the measured blocks count: tally and the control plane."""
        self.namespaces = namespaces
        self.clients = clients
        self.usage = Usage()
        self.next = 0
        self.phase = ""

    def path(self, namespace: str) -> str:
        return f"/apis/{GROUP}/v1/namespaces/{namespace}/{PLURAL}"

    async def creates(self, count: int) -> Loop:
        """``count`` creates round robin over the namespaces; each admitted one is added to the
        usage the status must show."""
        first = self.next
        self.next += count

        async def send(offset: int) -> None:
            index = first + offset
            body = database(index)
            await self.raw.call("POST", self.path(self.namespaces[index % len(self.namespaces)]),
                                body)  # fmt: skip
            self.usage.add(body)

        return await closed_loop(count, self.clients, send)

    async def setup(self) -> None:
        await bounded(
            (
                lambda name=name: self.raw.create(
                    "/api/v1/namespaces", {"metadata": {"name": name, "labels": {LABEL: "a"}}}
                )
                for name in self.namespaces
            ),
            concurrency=10,
        )
        await self.raw.call(
            "POST",
            CQ_PATH,
            {
                "apiVersion": "tally.dev/v1alpha1",
                "kind": "ClusterQuota",
                "metadata": {"name": CQ},
                "spec": {
                    "namespaceSelector": {"matchLabels": {LABEL: "a"}},
                    "quota": {"hard": HARD_COUNT},
                },
            },
        )
        # The webhook configuration is rewritten a moment after a quota first names the kind;
        # for RULES_SETTLE_S after that, tally's controller still recalculates on every create
        # (admission might have missed some): wait that out so that neither phase pays it.
        configuration = self.tally.webhook_configuration.split("/")[1]
        await until(
            self.raw, f"{WEBHOOKS_PATH}/{configuration}", covers_databases,
            "tally's webhook rules to cover databases", within=WAIT_S,
        )  # fmt: skip
        await asyncio.sleep(RULES_SETTLE_S + 1.0)

    async def switch(self, phase: str) -> None:
        """Patch the ClusterQuota to ``phase``, wait until tally judges by it, warm up."""
        measured = phase == "measures"
        hard: dict[str, str | None] = {**HARD_COUNT}
        hard |= HARD_MEASURES if measured else dict.fromkeys(HARD_MEASURES)
        await self.raw.merge_patch(
            f"{CQ_PATH}/{CQ}",
            {"spec": {"measures": measure_specs() if measured else None, "quota": {"hard": hard}}},
        )
        await until(
            self.raw, f"{CQ_PATH}/{CQ}", lambda cq: self.usage.shown_by(cq, measured),
            f"the ClusterQuota's status for {phase!r}", within=WAIT_S,
        )  # fmt: skip
        # The status comes from tally's quota controller; the probe asks its admission side.
        probe = database(10**6, storageGB=10**12, tier="gold", size="50Pi")
        probe["metadata"]["name"] = "probe"

        async def probed() -> bool:
            try:
                await self.raw.call(
                    "POST", self.path(self.namespaces[0]), probe, query=[("dryRun", "All")]
                )
            except client.ApiException as error:
                return measured and error.status == 403 and STORAGE in str(error.body)
            return not measured

        await until_async(probed, f"admission to judge by {phase!r}")
        self.phase = phase
        warm_up = await self.creates(self.clients)
        if warm_up.refusals:
            raise RuntimeError(f"warm-up refused: {warm_up.refusals[:3]}")

    async def block(self, phase: Phase, count: int) -> None:
        if self.phase != phase.name:
            await self.switch(phase.name)
        cpu_before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        decision_before = self.tally.metric_sum("tally_admission_duration_seconds_sum")
        decisions_before = self.tally.metric_sum("tally_admission_duration_seconds_count")
        loop = await self.creates(count)
        for name, pid in self.pids.items():
            phase.cpu_s[name] = phase.cpu_s.get(name, 0.0) + cpu_seconds(pid) - cpu_before[name]
        phase.decision_s += (
            self.tally.metric_sum("tally_admission_duration_seconds_sum") - decision_before
        )
        phase.decisions += (
            self.tally.metric_sum("tally_admission_duration_seconds_count") - decisions_before
        )
        phase.latencies += loop.latencies
        phase.wall_s += loop.wall_s
        phase.refusals += loop.refusals
        rate = len(loop.latencies) / loop.wall_s
        print(f"  {phase.name}: {len(loop.latencies)} creates, {rate:.0f}/s", file=sys.stderr,
              flush=True)  # fmt: skip


def measure_specs() -> list[dict[str, Any]]:
    return [{**spec, "resource": {"group": GROUP, "resource": PLURAL}} for spec in MEASURES]


def covers_databases(configuration: dict[str, Any]) -> bool:
    return any(
        GROUP in rule.get("apiGroups", []) and PLURAL in rule.get("resources", [])
        for webhook in configuration.get("webhooks") or []
        for rule in webhook.get("rules") or []
    )


async def until_async(probe: Callable[[], Awaitable[bool]], what: str) -> None:
    """``until`` for a probe that is itself a request (a dry-run create, not a GET)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await probe():
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def measure(
    state: cluster.State,
    tally: operator_process.TallyProcess,
    namespaces: int,
    creates: int,
    clients: int,
    blocks: int,
) -> dict[str, Any]:
    assert tally.process is not None
    api = await api_client(state.kubeconfig, pool=clients + 10)
    started_machine = machine()
    bench = Bench(
        Raw(api),
        tally,
        {"tally": tally.process.pid, **state.pids},
        [f"bench-measures-{index:02d}" for index in range(namespaces)],
        clients,
    )
    phases = {name: Phase(name) for name in PHASES}
    try:
        await bench.setup()
        per_block = [creates // blocks + (1 if i < creates % blocks else 0) for i in range(blocks)]
        for index, count in enumerate(per_block):
            # count, measures, measures, count, …: both phases centred on the same moment.
            order = PHASES if index % 2 == 0 else PHASES[::-1]
            for name in order:
                await bench.block(phases[name], count)
        # Every admitted create charged: the count (and the sums, when the measures are on).
        measured = bench.phase == "measures"
        settled = await until(
            bench.raw, f"{CQ_PATH}/{CQ}", lambda cq: bench.usage.shown_by(cq, measured),
            "the ClusterQuota's final status", within=WAIT_S,
        )  # fmt: skip
        rss, peak = memory_of(tally.process.pid)
    finally:
        await api.close()
    count_only, with_measures = (phases[name].summary() for name in PHASES)
    return {
        "machine": started_machine,
        "load_average_end": list(os.getloadavg()),
        "namespaces": namespaces,
        "clients": clients,
        "creates_per_phase": creates,
        "blocks_per_phase": blocks,
        "measures": measure_specs(),
        "count_only": count_only,
        "measures_phase": with_measures,
        "ratios": {
            "throughput": with_measures["throughput_per_s"] / count_only["throughput_per_s"],
            "p50": with_measures["p50_ms"] / count_only["p50_ms"],
            "p99": with_measures["p99_ms"] / count_only["p99_ms"],
            "tally_cpu_per_create": with_measures["cpu_ms_per_create"]["tally"]
            / count_only["cpu_ms_per_create"]["tally"],
        },
        "status_settled_after_s": settled,
        "databases_created": bench.usage.count,
        "tally_rss_bytes": rss,
        "tally_peak_rss_bytes": peak,
    }


def report(result: dict[str, Any]) -> bool:
    sides = {"count only": result["count_only"], "measures": result["measures_phase"]}
    print(
        f"measures_admission: {result['clients']} clients create {result['creates_per_phase']} "
        f"databases per phase across {result['namespaces']} namespaces selected by one "
        f"ClusterQuota, {result['blocks_per_phase']} alternating blocks per phase"
    )
    for spec in result["measures"]:
        when = f" when {spec['when']}" if "when" in spec else ""
        print(f"  measure {spec['name']}: {spec['expression']}{when}")
    print(f"machine: {result['machine']}")
    print(f"load average at the end: {', '.join(f'{v:.1f}' for v in result['load_average_end'])}")
    print(f"{'':12}{'creates/s':>11}{'p50':>10}{'p99':>10}{'max':>10}{'refused':>9}"
          f"{'tally CPU/create':>18}{'in tally':>10}")  # fmt: skip
    for label, side in sides.items():
        decision = side["tally_mean_decision_ms"]
        print(f"{label:12}{side['throughput_per_s']:>11.1f}{side['p50_ms']:>8.1f}ms"
              f"{side['p99_ms']:>8.1f}ms{side['max_ms']:>8.0f}ms{side['refused']:>9}"
              f"{side['cpu_ms_per_create']['tally']:>16.2f}ms"
              f"{decision if decision is not None else float('nan'):>8.2f}ms")  # fmt: skip
    ratios = result["ratios"]
    print(f"ratio measures / count only: throughput {ratios['throughput']:.2f}x, "
          f"p50 {ratios['p50']:.2f}x, p99 {ratios['p99']:.2f}x, "
          f"tally CPU per create {ratios['tally_cpu_per_create']:.2f}x")  # fmt: skip
    for label, side in sides.items():
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in side["cpu_ms_per_create"].items())
        print(f"{label} CPU per create (ms): {parts}")
    print(f"status matched every admitted create ({result['databases_created']}) "
          f"{result['status_settled_after_s']:.2f} s after the last block")  # fmt: skip
    print(f"tally RSS at the end: {mib(result['tally_rss_bytes'])} "
          f"(peak {mib(result['tally_peak_rss_bytes'])})")  # fmt: skip
    return not any(side["refused"] for side in sides.values())


def figures_of(result: dict[str, Any]) -> list[Figure]:
    """The measures phase (tally's bars) against the count-only phase."""
    count_only, measures = result["count_only"], result["measures_phase"]
    reference = "count only"
    with_measures = f"with {len(result['measures'])} measures"
    return [
        Figure(f"throughput {with_measures}", "creates/s", measures["throughput_per_s"],
               count_only["throughput_per_s"], reference_name=reference, better="higher"),
        Figure(f"p50 latency {with_measures}", "ms", measures["p50_ms"], count_only["p50_ms"],
               reference_name=reference),
        Figure(f"p99 latency {with_measures}", "ms", measures["p99_ms"], count_only["p99_ms"],
               reference_name=reference),
        Figure(f"tally CPU per create {with_measures}", "ms",
               measures["cpu_ms_per_create"]["tally"], count_only["cpu_ms_per_create"]["tally"],
               reference_name=reference),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--creates", type=int, default=1000, help="measured creates per phase")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks per phase")
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "results" / "measures_admission.json"
    )
    args = parser.parse_args(argv)
    with cluster_quota_plane() as (state, tally):
        kubectl(state, "apply", "-f", "-", input=json.dumps(crd()))
        kubectl(state, "wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}",
                "--timeout=60s")  # fmt: skip
        print("measuring ...", file=sys.stderr, flush=True)
        result = asyncio.run(
            measure(state, tally, args.namespaces, args.creates, args.clients, args.blocks)
        )
    ok = report(result)
    write_results("measures_admission", result, figures_of(result), path=args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
