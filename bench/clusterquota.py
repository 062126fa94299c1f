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

Prints creates/s and p50/p99 per phase and the ClusterQuota's ratios to the ResourceQuotas
(target: throughput >= 0.8x), the convergence (target <= 5 s), over-admission (target 0),
tally's resident memory, and writes the figures as JSON and a picture beside it (``--json``,
default ``bench/results/clusterquota.json``, and ``.png``).

Run: ``.venv/bin/python bench/clusterquota.py [--namespaces 1000] [--targets 100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

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
    until,
    write_results,
)
from builders import pod  # tests/e2e/builders.py, put on sys.path by _common

LABEL = "bench.tally.dev/team"
CQ = "bench-team"
CQ_PATH = "/apis/tally.dev/v1alpha1/clusterquotas"
TARGET_THROUGHPUT_RATIO = 0.8
TARGET_CONVERGENCE_S = 5.0
WAIT_S = 120.0


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

    async def pods(self) -> int:
        items = await self.raw.list_all("/api/v1/pods")
        mine = set(self.namespaces)
        return sum(1 for item in items if item["metadata"]["namespace"] in mine)

    async def until(self, path: str, done: Any, what: str) -> float:
        return await until(self.raw, path, done, what, within=WAIT_S)


async def measure(
    kubeconfig: str, tally_pid: int, namespaces: int, targets: int, creates: int, clients: int,
    headroom: int,
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
                lambda q: ((q.get("status") or {}).get("used") or {}).get("pods") == "0",
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
        await run.until(
            f"{CQ_PATH}/{CQ}",
            lambda cq: (
                ((cq.get("status") or {}).get("total") or {}).get("used", {}).get("pods")
                == str(existing)
            ),
            "the ClusterQuota's first status",
        )
        print("measuring: ClusterQuota ...", file=sys.stderr, flush=True)
        await run.creates(clients * 2, chosen)  # warm-up
        cq = await run.creates(creates, chosen)
        created = await run.pods()
        converged = await run.until(
            f"{CQ_PATH}/{CQ}",
            lambda cq: (
                ((cq.get("status") or {}).get("total") or {}).get("used", {}).get("pods")
                == str(created)
            ),
            "the total to equal the pods",
        )
        # Over-admission: a burst of 2 x headroom against a headroom of `headroom` pods.
        await raw.merge_patch(
            f"{CQ_PATH}/{CQ}", {"spec": {"quota": {"hard": {"pods": str(created + headroom)}}}}
        )
        await run.until(
            f"{CQ_PATH}/{CQ}",
            lambda cq: (
                ((cq.get("status") or {}).get("total") or {}).get("hard", {}).get("pods")
                == str(created + headroom)
            ),
            "the new limit in the status",
        )
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
    print(f"tally RSS at the end: {mib(result['tally_rss_bytes'])}")
    refused = rq["refused"] or cq["refused"]
    return throughput_ok and converged_ok and admitted_ok and not refused


def figures_of(result: dict[str, Any]) -> list[Figure]:
    """The ClusterQuota's figures against the same creates under per-namespace ResourceQuotas."""
    rq, cq, burst = result["resourcequotas"], result["clusterquota"], result["burst"]
    reference = "ResourceQuotas"
    return [
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--creates", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--headroom", type=int, default=50)
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "results" / "clusterquota.json"
    )
    args = parser.parse_args(argv)
    with cluster_quota_plane() as (operator, tally):
        assert tally.process is not None
        result = asyncio.run(
            measure(
                operator.kubeconfig, tally.process.pid, args.namespaces, args.targets,
                args.creates, args.clients, args.headroom,
            )
        )  # fmt: skip
        ok = report(result)
    write_results("clusterquota", result, figures_of(result), path=args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
