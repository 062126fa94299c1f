"""Benchmark: pod creates under one ClusterQuota over 1 000 namespaces, against the same creates
under per-namespace ResourceQuotas (tally both times, same control plane, same run).

One operator-mode control plane (``hack/cluster.py``, a temporary directory) with tally as a
subprocess. ``--namespaces`` namespaces (default 1 000) are created, all labelled so that one
ClusterQuota selects every one of them; ``--clients`` clients (default 20) create pods round
robin across the first ``--targets`` of them (default 100), each client sending its next create
as soon as the previous one is answered.

* **ResourceQuotas**: each target namespace has a ResourceQuota (``pods: 100000``) and no
  ClusterQuota exists: ``--creates`` creates, latency per request and creates per second.
* **ClusterQuota**: the ResourceQuotas are deleted and one ClusterQuota selects all the
  namespaces (``pods``: what exists plus the creates to come, so none is refused): the same
  creates. Then the time until its ``status.total.used`` equals the pods that exist (the
  convergence), and a burst of ``2 x headroom`` creates against a headroom of ``--headroom``
  pods (default 50): exactly that many must be admitted (over-admitted must be 0), every other
  create refused by the quota, never with a 409.

Every namespace first gets ``--fill`` pods (default 1), so that the ClusterQuota's status
lists every namespace it selects, as it does over a fleet of namespaces that all run something.
Then, under the ClusterQuota:

* **deletes elsewhere**: creates at ``--probe-rate`` per second (default 10, open loop: a
  request is timed from its scheduled send, so a stalled event loop shows in every request
  scheduled during the stall) into the target namespaces, for ``--probe-s`` seconds without
  deletions, then as long again while fill pods are deleted at ``--delete-rate`` per second
  (default 5), each in a namespace of its own across all of them: every deletion is a
  recalculation of the ClusterQuota. The creates' p99 with the deletions against without them
  (target <= 2x), and the time from the last deletion until the total equals the pods there
  are.

Prints creates/s and p50/p99 per phase and the ClusterQuota's ratios to the ResourceQuotas
(target: throughput >= 0.8x), the convergence (target <= 5 s), over-admission (target 0),
tally's resident memory, and writes the figures as JSON and a picture beside it (``--json``,
default ``bench/results/clusterquota.json``, and ``.png``).

Run: ``.venv/bin/python bench/clusterquota.py [--namespaces 1000] [--targets 100] [--fill 1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
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
    cluster_quota_plane,
    machine,
    memory_of,
    mib,
    percentile,
    until,
    write_results,
)
from _open_loop import OpenLoop, open_loop, poisson_offsets
from builders import pod  # tests/e2e/builders.py, put on sys.path by _common

LABEL = "bench.tally.dev/team"
CQ = "bench-team"
CQ_PATH = "/apis/tally.dev/v1alpha1/clusterquotas"
TARGET_THROUGHPUT_RATIO = 0.8
TARGET_CONVERGENCE_S = 5.0
TARGET_DELETES_P99_RATIO = 2.0
WAIT_S = 120.0
FILL_POD = "fill-{index}"


class Run:
    def __init__(self, raw: Raw, namespaces: list[str], clients: int) -> None:
        self.raw = raw
        self.namespaces = namespaces
        self.clients = clients
        self.next = 0

    async def creates(self, count: int, targets: list[str]) -> Loop:
        """``count`` pod creates round robin over ``targets``."""
        first = self.next
        self.next += count

        async def send(offset: int) -> None:
            index = first + offset
            namespace = targets[index % len(targets)]
            await self.raw.call(
                "POST", f"/api/v1/namespaces/{namespace}/pods", pod(f"p{index:06d}")
            )

        return await closed_loop(count, self.clients, send)

    async def probe(
        self, targets: list[str], rate: float, seconds: float, rng: random.Random
    ) -> OpenLoop:
        """Open-loop creates at ``rate`` per second for ``seconds`` into ``targets``."""
        first = self.next
        offsets = poisson_offsets(rate, int(rate * seconds), rng)
        self.next += len(offsets)

        async def send(offset: int) -> bool:
            index = first + offset
            namespace = targets[index % len(targets)]
            try:
                await self.raw.call(
                    "POST", f"/api/v1/namespaces/{namespace}/pods", pod(f"p{index:06d}")
                )
            except client.ApiException:
                return False
            return True

        return await open_loop(offsets, send)

    async def delete_fill(self, namespaces: list[str], rate: float) -> float:
        """Delete one fill pod in each of ``namespaces``, at ``rate`` per second (open loop);
        returns when the last deletion was answered (``time.monotonic``)."""

        async def send(index: int) -> bool:
            path = f"/api/v1/namespaces/{namespaces[index]}/pods/{FILL_POD.format(index=0)}"
            await self.raw.call("DELETE", path, query=[("gracePeriodSeconds", "0")])
            return True

        await open_loop([index / rate for index in range(len(namespaces))], send)
        return time.monotonic()

    async def pods(self) -> int:
        items = await self.raw.list_all("/api/v1/pods")
        mine = set(self.namespaces)
        return sum(1 for item in items if item["metadata"]["namespace"] in mine)

    async def until(self, path: str, done: Any, what: str) -> float:
        return await until(self.raw, path, done, what, within=WAIT_S)

    async def total_shows(self, field: str, pods: int, what: str) -> float:
        """Until the ClusterQuota's ``status.total.<field>.pods`` is ``pods``."""

        def done(cq: dict[str, Any]) -> bool:
            total = (cq.get("status") or {}).get("total") or {}
            return bool((total.get(field) or {}).get("pods") == str(pods))

        return await self.until(f"{CQ_PATH}/{CQ}", done, what)


async def measure(
    kubeconfig: str, tally_pid: int, namespaces: int, targets: int, creates: int, clients: int,
    headroom: int, fill: int, probe_rate: float, probe_s: float, delete_rate: float,
) -> dict[str, Any]:  # fmt: skip
    api = await api_client(kubeconfig, pool=clients + 40)
    raw = Raw(api)
    names = [f"bench-cq-{index:04d}" for index in range(namespaces)]
    run = Run(raw, names, clients)
    try:
        print(f"creating {namespaces} namespaces ...", file=sys.stderr, flush=True)
        await bounded(
            (
                lambda name=name: raw.create(
                    "/api/v1/namespaces",
                    {"metadata": {"name": name, "labels": {LABEL: "a"}}},
                )
                for name in names
            ),
            concurrency=32,
        )
        chosen = names[:targets]
        for name in chosen:  # pods need the default service account
            await run.until(
                f"/api/v1/namespaces/{name}/serviceaccounts/default", lambda _: True, "an SA"
            )
        if fill:
            await every_service_account(raw, names)
            await bounded(
                (
                    lambda name=name, index=index: raw.create(
                        f"/api/v1/namespaces/{name}/pods", pod(FILL_POD.format(index=index))
                    )
                    for name in names
                    for index in range(fill)
                ),
                concurrency=32,
                label="fill pods",
                total=namespaces * fill,
            )
        # Phase 1: per-namespace ResourceQuotas only.
        await bounded(
            (
                lambda name=name: raw.create(
                    f"/api/v1/namespaces/{name}/resourcequotas",
                    {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "100000"}}},
                )
                for name in chosen
            ),
            concurrency=32,
        )
        for name in chosen:
            await run.until(
                f"/api/v1/namespaces/{name}/resourcequotas/q",
                lambda q: ((q.get("status") or {}).get("used") or {}).get("pods") == str(fill),
                "a quota's status",
            )
        print("measuring: ResourceQuotas ...", file=sys.stderr, flush=True)
        await run.creates(clients * 2, chosen)  # warm-up
        rq = await run.creates(creates, chosen)
        for name in chosen:
            await raw.call("DELETE", f"/api/v1/namespaces/{name}/resourcequotas/q")
        # Phase 2: one ClusterQuota over every namespace.
        existing = await run.pods()
        hard = existing + clients * 2 + creates
        await raw.call(
            "POST",
            CQ_PATH,
            {
                "apiVersion": "tally.dev/v1alpha1",
                "kind": "ClusterQuota",
                "metadata": {"name": CQ},
                "spec": {
                    "namespaceSelector": {"matchLabels": {LABEL: "a"}},
                    "quota": {"hard": {"pods": str(hard)}},
                },
            },
        )
        await run.total_shows("used", existing, "the ClusterQuota's first status")
        print("measuring: ClusterQuota ...", file=sys.stderr, flush=True)
        await run.creates(clients * 2, chosen)  # warm-up
        cq = await run.creates(creates, chosen)
        created = await run.pods()
        converged = await run.total_shows("used", created, "the total to equal the pods")
        # Deletes elsewhere: every one a recalculation of the ClusterQuota.
        deletes: dict[str, Any] | None = None
        if fill:
            print("measuring: deletes elsewhere ...", file=sys.stderr, flush=True)
            room = created + 2 * int(probe_rate * probe_s) + 1  # none is refused by the quota
            await raw.merge_patch(
                f"{CQ_PATH}/{CQ}", {"spec": {"quota": {"hard": {"pods": str(room)}}}}
            )
            await run.total_shows("hard", room, "the new limit in the status")
            rng = random.Random(7)
            quiet = await run.probe(chosen, probe_rate, probe_s, rng)
            victims = rng.sample(names, min(len(names), int(delete_rate * probe_s)))
            deleting, last_deleted = await asyncio.gather(
                run.probe(chosen, probe_rate, probe_s, rng), run.delete_fill(victims, delete_rate)
            )
            remaining = await run.pods()
            await run.total_shows("used", remaining, "the total to drop by the deletions")
            deletes = {
                "rate_per_s": delete_rate,
                "deleted": len(victims),
                "probe_rate_per_s": probe_rate,
                "without": open_summary(quiet),
                "with": open_summary(deleting),
                "converged_after_last_s": time.monotonic() - last_deleted,
            }
            created = remaining
        # Over-admission: a burst of 2 x headroom against a headroom of `headroom` pods.
        await raw.merge_patch(
            f"{CQ_PATH}/{CQ}", {"spec": {"quota": {"hard": {"pods": str(created + headroom)}}}}
        )
        await run.total_shows("hard", created + headroom, "the new limit in the status")
        burst = await run.creates(2 * headroom, names)
        after = await run.pods()
        rss, _ = memory_of(tally_pid)
        return {
            "machine": machine(),
            "namespaces": namespaces,
            "targets": targets,
            "clients": clients,
            "resourcequotas": {**rq.summary(), "refused": len(rq.refusals)},
            "clusterquota": {**cq.summary(), "refused": len(cq.refusals)},
            "convergence_s": converged,
            "fill": fill,
            "deletes": deletes,
            "burst": {
                "headroom": headroom,
                "admitted": after - created,
                "over_admitted": max(0, after - created - headroom),
                "conflicts": sum(1 for r in burst.refusals if r.startswith("409")),
                "refused": len(burst.refusals),
            },
            "tally_rss_bytes": rss,
        }
    finally:
        await api.close()


async def every_service_account(raw: Raw, names: list[str]) -> None:
    """Until every namespace in ``names`` has its default service account (pods need it)."""
    wanted = set(names)
    started = time.monotonic()
    while True:
        accounts = await raw.list_all(
            "/api/v1/serviceaccounts", query=[("fieldSelector", "metadata.name=default")]
        )
        wanted -= {item["metadata"]["namespace"] for item in accounts}
        if not wanted:
            return
        if time.monotonic() - started > WAIT_S:
            raise RuntimeError(f"{len(wanted)} namespaces still have no default service account")
        await asyncio.sleep(1.0)


def open_summary(loop: OpenLoop) -> dict[str, float]:
    """Admitted and refused creates, p50 and p99 from their scheduled send times."""
    latencies = sorted(loop.latencies)
    return {
        "creates": len(latencies),
        "refused": loop.refused,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def report(result: dict[str, Any]) -> bool:
    rq, cq, burst = result["resourcequotas"], result["clusterquota"], result["burst"]
    print(
        f"clusterquota: {result['namespaces']} namespaces selected by one ClusterQuota; "
        f"{result['clients']} clients create pods across {result['targets']} of them"
    )
    print(f"machine: {result['machine']}")
    print(f"{'':16}{'creates/s':>11}{'p50':>10}{'p99':>10}{'refused':>9}")
    for label, side in (("ResourceQuotas", rq), ("ClusterQuota", cq)):
        print(f"{label:16}{side['throughput_per_s']:>11.1f}{side['p50_ms']:>8.1f}ms"
              f"{side['p99_ms']:>8.1f}ms{side['refused']:>9}")  # fmt: skip
    ratio = cq["throughput_per_s"] / rq["throughput_per_s"]
    p99_ratio = cq["p99_ms"] / rq["p99_ms"]
    throughput_ok = ratio >= TARGET_THROUGHPUT_RATIO
    converged_ok = result["convergence_s"] <= TARGET_CONVERGENCE_S
    admitted_ok = burst["over_admitted"] == 0 and burst["admitted"] == burst["headroom"]
    print(f"ratio ClusterQuota/ResourceQuotas: throughput {ratio:.2f}x "
          f"({'meets' if throughput_ok else 'misses'} >= {TARGET_THROUGHPUT_RATIO}x), "
          f"p99 {p99_ratio:.2f}x")  # fmt: skip
    print(f"status converged {result['convergence_s']:.2f} s after the creates "
          f"({'meets' if converged_ok else 'misses'} <= {TARGET_CONVERGENCE_S} s)")  # fmt: skip
    print(f"burst of {2 * burst['headroom']} against a headroom of {burst['headroom']}: "
          f"{burst['admitted']} admitted, {burst['over_admitted']} over-admitted, "
          f"{burst['conflicts']} refused with 409")  # fmt: skip
    deletes_ok = True
    deletes = result.get("deletes")
    if deletes:
        without, with_ = deletes["without"], deletes["with"]
        deletes_ratio = with_["p99_ms"] / without["p99_ms"]
        deletes_ok = deletes_ratio <= TARGET_DELETES_P99_RATIO and not with_["refused"]
        print(f"creates at {deletes['probe_rate_per_s']:g}/s (open loop) under the ClusterQuota, "
              f"without / with {deletes['deleted']} deletes elsewhere at "
              f"{deletes['rate_per_s']:g}/s: p50 {without['p50_ms']:.1f} / "
              f"{with_['p50_ms']:.1f} ms, "
              f"p99 {without['p99_ms']:.1f} / {with_['p99_ms']:.1f} ms = {deletes_ratio:.2f}x "
              f"({'meets' if deletes_ok else 'misses'} <= {TARGET_DELETES_P99_RATIO:g}x); "
              f"refused {without['refused']} / {with_['refused']}; total right "
              f"{deletes['converged_after_last_s']:.2f} s after the last delete")  # fmt: skip
    print(f"tally RSS at the end: {mib(result['tally_rss_bytes'])}")
    refused = rq["refused"] or cq["refused"]
    return throughput_ok and converged_ok and admitted_ok and deletes_ok and not refused


def figures_of(result: dict[str, Any]) -> list[Figure]:
    """The ClusterQuota's figures against the same creates under per-namespace ResourceQuotas."""
    rq, cq, burst = result["resourcequotas"], result["clusterquota"], result["burst"]
    reference = "ResourceQuotas"
    figures = [
        Figure("throughput", "creates/s", cq["throughput_per_s"], rq["throughput_per_s"],
               reference_name=reference, better="higher",
               target=f">= {TARGET_THROUGHPUT_RATIO}x"),
        Figure("p50 latency", "ms", cq["p50_ms"], rq["p50_ms"], reference_name=reference),
        Figure("p99 latency", "ms", cq["p99_ms"], rq["p99_ms"], reference_name=reference),
        Figure("status converged", "s", result["convergence_s"], None,
               target=f"<= {TARGET_CONVERGENCE_S} s"),
        Figure(f"burst of {2 * burst['headroom']}: admitted past the headroom", "pods",
               burst["over_admitted"], None, target="0"),
        Figure("tally resident memory", "MiB", result["tally_rss_bytes"] / 2**20, None),
    ]  # fmt: skip
    deletes = result.get("deletes")
    if deletes:
        figures.append(Figure(
            "p99 of creates with deletes elsewhere", "ms", deletes["with"]["p99_ms"],
            deletes["without"]["p99_ms"], reference_name="without deletes",
            target=f"<= {TARGET_DELETES_P99_RATIO:g}x",
        ))  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--creates", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--headroom", type=int, default=50)
    parser.add_argument("--fill", type=int, default=1, help="pods in every namespace first")
    parser.add_argument("--probe-rate", type=float, default=10.0)
    parser.add_argument("--probe-s", type=float, default=20.0)
    parser.add_argument("--delete-rate", type=float, default=5.0)
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "results" / "clusterquota.json"
    )
    args = parser.parse_args(argv)
    with cluster_quota_plane() as (operator, tally):
        assert tally.process is not None
        result = asyncio.run(
            measure(
                operator.kubeconfig, tally.process.pid, args.namespaces, args.targets,
                args.creates, args.clients, args.headroom, args.fill, args.probe_rate,
                args.probe_s, args.delete_rate,
            )
        )  # fmt: skip
        ok = report(result)
    write_results("clusterquota", result, figures_of(result), path=args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
