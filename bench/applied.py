"""Benchmark: what the AppliedClusterQuotas cost, one ClusterQuota over 1 000 namespaces.

tally keeps an AppliedClusterQuota in every namespace a ClusterQuota selects
(``tally.clusterquota.applied``): each charge moves the total every one of them shows, so a
burst of creates is a burst of writes. This measures that cost on one operator-mode control
plane (``hack/cluster.py``, simulated nodes) with tally as a subprocess:

* ``--namespaces`` namespaces (default 1 000), one ClusterQuota selecting them all;
* a burst of pod creates at Poisson times (``--rate``, default 20/s, for ``--seconds``, default
  30) round robin over the first ``--targets`` namespaces (default 100), twice: with
  ``TALLY_APPLIED_QUOTAS=false`` (no applied objects) and with them (tally restarted between
  the phases, the same plane);
* for each phase: tally's CPU per create (its CPU from the burst's start until the plane is
  quiet, over the creates), kube-apiserver's and etcd's the same way, and, with the applied
  objects, the writes the API server took (the events of a cluster-wide watch of
  appliedclusterquotas: one per write), per second over the burst and at the busiest second;
  the staleness of a namespace's own share (from a create's answer to the first event of that
  namespace's object showing it, p50/p99) and of the total (from the last create's answer to
  every object showing the final total); and the time from the ClusterQuota's creation to an
  object in every namespace.

Writes ``bench/results/applied.json`` and its picture (or ``--results``). Cleans up the plane
and tally whatever happens. No target: the issue asks for the cost to be stated.

Run: ``.venv/bin/python bench/applied.py [--namespaces 1000] [--rate 20] [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch

from _common import (
    REPO,
    Figure,
    Raw,
    api_client,
    bounded,
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

LABEL = "bench.tally.dev/applied"
CQ = "bench-applied"
GROUP, VERSION, PLURAL = "tally.dev", "v1alpha1", "appliedclusterquotas"
CQ_PATH = "/apis/tally.dev/v1alpha1/clusterquotas"
WAIT_S = 300.0
QUIET_CORES = 0.15
"""Below this many cores for tally, kube-apiserver and etcd together, the plane is quiet."""


def count(quantity: str) -> int:
    """A pod count as the API server writes it ("1k" for 1000)."""
    return parse_quantity(quantity).nanos // 1_000_000_000


class AppliedWatch:
    """Every event of a cluster-wide watch of AppliedClusterQuotas: when it arrived, its
    namespace, its own pods and the total's."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.events: list[tuple[float, str, int, int]] = []
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            stream = watch.Watch().stream(
                self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                timeout_seconds=3600,
            )  # fmt: skip
            async for event in stream:
                arrived = time.perf_counter()
                obj = event["raw_object"]
                status = obj.get("status") or {}
                own = ((status.get("namespace") or {}).get("used") or {}).get("pods")
                total = ((status.get("total") or {}).get("used") or {}).get("pods")
                if own is None or total is None:
                    continue
                namespace = obj["metadata"]["namespace"]
                self.events.append((arrived, namespace, count(own), count(total)))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


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


async def settled(watcher: AppliedWatch, names: list[str], total: int, since: float) -> None:
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


async def applied_everywhere(raw: Raw, count: int) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < WAIT_S:
        items = await raw.list_all(f"/apis/{GROUP}/{VERSION}/{PLURAL}")
        if len(items) >= count:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)
    raise RuntimeError(f"fewer than {count} AppliedClusterQuotas after {WAIT_S} s")


def start_tally(state: Any, log: Path, applied: bool) -> operator_process.TallyProcess:
    tally = operator_process.TallyProcess(
        Path(state.kubeconfig), log, bin_dir=Path(state.bin_dir),
        env={"TALLY_APPLIED_QUOTAS": "true" if applied else "false"},
    )  # fmt: skip
    tally.start()
    return tally


async def measure_phase(
    state: Any, tally_pid: int, names: list[str], targets: list[str], args: argparse.Namespace,
    applied: bool,
) -> dict[str, Any]:  # fmt: skip
    api = await api_client(state.kubeconfig, pool=64)
    raw = Raw(api)
    pids = {"tally": tally_pid, "kube-apiserver": state.pids["kube-apiserver"],
            "etcd": state.pids["etcd"]}  # fmt: skip
    phase = Phase(raw, pids, targets)
    watcher = AppliedWatch(api)
    result: dict[str, Any] = {"applied": applied}
    try:
        if applied:
            watcher.start()
            result["applied_everywhere_s"] = await applied_everywhere(raw, len(names))
            result["applied_everywhere_writes"] = len(watcher.events)
            print(f"  an AppliedClusterQuota in every namespace after "
                  f"{result['applied_everywhere_s']:.1f} s", file=sys.stderr)  # fmt: skip
            await phase.quiet()
        before_events = len(watcher.events)
        burst = await phase.burst(args.rate, args.seconds, args.seed,
                                  "on" if applied else "off")  # fmt: skip
        result.update(burst)
        if applied:
            events = watcher.events[before_events:]
            total = count((((await raw.call("GET", f"{CQ_PATH}/{CQ}")).get("status") or {})
                           .get("total") or {}).get("used", {}).get("pods", "0"))  # fmt: skip
            await settled(watcher, names, total, burst["last_answer"])
            events = watcher.events[before_events:]
            window = [at for at, *_ in events if burst["started"] <= at <= burst["last_answer"]]
            per_second: dict[int, int] = defaultdict(int)
            for at in window:
                per_second[int(at - burst["started"])] += 1
            own = own_staleness(events, phase.answers)
            result.update({
                "writes": len(events),
                "writes_per_s_during_burst": len(window) / max(1e-9, burst["seconds"]),
                "writes_busiest_second": max(per_second.values(), default=0),
                "own_staleness_p50_s": percentile(own, 0.5) if own else None,
                "own_staleness_p99_s": percentile(own, 0.99) if own else None,
                "own_seen": len(own),
                "total_staleness_s": total_staleness(events, names, total, burst["last_answer"]),
                "final_total": total,
            })  # fmt: skip
        return result
    finally:
        await watcher.stop()
        await api.close()


def report(results: dict[str, Any], args: argparse.Namespace) -> list[Figure]:
    off, on = results["off"], results["on"]
    print(f"applied: {args.namespaces} namespaces under one ClusterQuota; creates at "
          f"{args.rate}/s for {args.seconds} s over {args.targets} of them")  # fmt: skip
    print(f"machine: {results['machine']}")
    for label, side in (("without", off), ("with", on)):
        parts = ", ".join(f"{k} {v:.2f}" for k, v in side["cpu_ms_per_create"].items())
        print(f"{label} AppliedClusterQuotas: {side['creates']} creates, p99 "
              f"{side['p99_ms']:.0f} ms, CPU per create: {parts} ms; quiet "
              f"{side['quiet_after_s']:.0f} s after")  # fmt: skip
    print(f"writes: {on['writes']} in all, {on['writes_per_s_during_burst']:.1f}/s during the "
          f"burst, {on['writes_busiest_second']} in its busiest second")  # fmt: skip
    print(f"a namespace's own share shown: p50 {on['own_staleness_p50_s']:.2f} s, p99 "
          f"{on['own_staleness_p99_s']:.2f} s after the create's answer ({on['own_seen']} of "
          f"{on['creates']})")  # fmt: skip
    total = on["total_staleness_s"]
    print(f"every namespace shows the final total {total:.1f} s after the last create"
          if total is not None else "some namespace never showed the final total")  # fmt: skip
    print(f"first view in every namespace: {on['applied_everywhere_s']:.1f} s after the "
          f"ClusterQuota's first status")  # fmt: skip
    return [
        Figure("tally CPU per create", "ms", on["cpu_ms_per_create"]["tally"],
               off["cpu_ms_per_create"]["tally"], reference_name="no applied objects"),
        Figure("kube-apiserver CPU per create", "ms", on["cpu_ms_per_create"]["kube-apiserver"],
               off["cpu_ms_per_create"]["kube-apiserver"], reference_name="no applied objects"),
        Figure("etcd CPU per create", "ms", on["cpu_ms_per_create"]["etcd"],
               off["cpu_ms_per_create"]["etcd"], reference_name="no applied objects"),
        Figure("applied writes during the burst", "writes/s", on["writes_per_s_during_burst"],
               None),
        Figure("own share shown, p99", "s", on["own_staleness_p99_s"] or 0.0, None),
        Figure("final total shown everywhere", "s", total if total is not None else -1.0, None),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args(argv)
    names = [f"bench-acq-{index:04d}" for index in range(args.namespaces)]
    targets = names[: args.targets]
    results: dict[str, Any] = {"machine": machine(), "namespaces": args.namespaces,
                               "targets": args.targets, "rate": args.rate,
                               "seconds": args.seconds}  # fmt: skip
    with contextlib.ExitStack() as stack:
        print("starting an operator-mode control plane ...", file=sys.stderr, flush=True)
        state = stack.enter_context(control_plane("operator"))
        for crd in ("clusterquotas.tally.dev.yaml", "appliedclusterquotas.tally.dev.yaml"):
            kubectl(state, "apply", "-f", str(REPO / "crds" / crd))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        hard = 10 * int(args.rate * args.seconds) + 1000

        async def setup() -> None:
            api = await api_client(state.kubeconfig, pool=64)
            try:
                raw = Raw(api)
                await prepare(raw, names, targets)
                await create_cluster_quota(raw, hard)
            finally:
                await api.close()

        for applied in (False, True):
            tally = start_tally(state, logs / f"tally-{applied}.log", applied)
            stack.callback(tally.kill)
            assert tally.process is not None
            if not applied:
                asyncio.run(setup())
            print(f"measuring {'with' if applied else 'without'} AppliedClusterQuotas ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            results["on" if applied else "off"] = asyncio.run(measure_phase(
                state, tally.process.pid, names, targets, args, applied))  # fmt: skip
            tally.stop()
    figures = report(results, args)
    write_results("applied", results, figures, path=args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
