"""Benchmark: does tally's memory grow under churn, and with each kube-apiserver restart?

RSS alone cannot tell a leak from the allocator keeping what a peak (a re-list) once needed.
This runs one tally under tracemalloc (``bench/_traced_operator.py``) on an operator-mode
control plane of its own and compares snapshots of its traced Python memory:

1. set-up: ``--namespaces`` namespaces, each with a quota and ``--pods`` pods; then churn starts
   (configmaps created and, 50 creates later, deleted, at ``--rate`` per second) and runs to
   the end;
2. after a minute's warm-up, a snapshot; the churn phase (``--churn-minutes``); a snapshot;
3. ``--restarts`` kube-apiserver restarts (the soak's fault), a snapshot 40 s after each.

Reports the traced total at each snapshot, its growth per 10 minutes of churn and per restart
with the code that allocated the growth (file:line, the largest first), and VmRSS sampled
every 5 s (taken just before each snapshot too: a snapshot costs memory of its own).
Writes ``bench/results/memory.json`` and the picture beside it. Target (issue 17): traced growth
under churn < 1 MiB per 10 minutes.

Run: ``.venv/bin/python bench/memory.py [--churn-minutes 4] [--restarts 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

import _common
from _common import Figure, cluster, operator_process, write_results

TARGET_CHURN_MIB_PER_10MIN = 1.0
WARMUP_S = 60.0
AFTER_RESTART_S = 40.0
CHURN_WINDOW = 50
"""Each configmap lives for this many creates: the churn keeps a steady number of objects."""
TOP = 8
ENTRY_POINT = Path(__file__).resolve().parent / "_traced_operator.py"


class Traced:
    """The traced tally and its snapshots."""

    def __init__(self, tally: operator_process.TallyProcess, directory: Path) -> None:
        self.tally = tally
        self.directory = directory
        self.taken = 0
        self.rows: list[dict[str, Any]] = []
        self.snapshots: dict[str, tracemalloc.Snapshot] = {}

    @property
    def pid(self) -> int:
        assert self.tally.process is not None
        return self.tally.process.pid

    def rss_mib(self) -> float:
        return _common.memory_of(self.pid)[0] / 2**20

    def snapshot(self, label: str, started: float) -> None:
        rss = self.rss_mib()
        self.taken += 1
        os.kill(self.pid, signal.SIGUSR1)
        done = self.directory / f"snapshot-{self.taken}.done"
        deadline = time.monotonic() + 120
        while not done.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no snapshot {self.taken} within 120 s")
            time.sleep(0.2)
        snapshot = tracemalloc.Snapshot.load(str(self.directory / f"snapshot-{self.taken}.pickle"))
        self.snapshots[label] = snapshot
        traced = sum(stat.size for stat in snapshot.statistics("filename")) / 2**20
        self.rows.append({"label": label, "t_s": round(time.monotonic() - started, 1),
                          "traced_mib": round(traced, 3), "rss_mib": round(rss, 1)})  # fmt: skip
        print(f"{label}: traced {traced:.2f} MiB, RSS {rss:.1f} MiB", file=sys.stderr, flush=True)

    def growth(self, first: str, last: str) -> list[dict[str, Any]]:
        stats = self.snapshots[last].compare_to(self.snapshots[first], "lineno")
        return [
            {"where": f"{stat.traceback[0].filename}:{stat.traceback[0].lineno}",
             "kib": round(stat.size_diff / 1024, 1), "objects": stat.count_diff}
            for stat in stats[:TOP]
        ]  # fmt: skip


async def churn(
    api: client.ApiClient, namespaces: list[str], rate: float, stop: asyncio.Event
) -> int:
    core = client.CoreV1Api(api)
    index = 0
    while not stop.is_set():
        namespace = namespaces[index % len(namespaces)]
        # The API server is down during a restart: those requests fail, as any client's would.
        with contextlib.suppress(client.ApiException, OSError, asyncio.TimeoutError):
            await core.create_namespaced_config_map(
                namespace, {"metadata": {"name": f"churn-{index}"}, "data": {"a": "b" * 100}}
            )
        if index >= CHURN_WINDOW:
            old = index - CHURN_WINDOW
            with contextlib.suppress(client.ApiException, OSError, asyncio.TimeoutError):
                await core.delete_namespaced_config_map(
                    f"churn-{old}", namespaces[old % len(namespaces)]
                )
        index += 1
        await asyncio.sleep(1 / rate)
    return index


def _apply_crds(state: cluster.State) -> None:
    for crd in sorted((_common.REPO / "crds").glob("*.yaml")):
        _common.kubectl(state, "apply", "-f", str(crd))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        state = stack.enter_context(_common.control_plane("operator"))
        await asyncio.to_thread(_apply_crds, state)
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        tally = operator_process.TallyProcess(
            Path(state.kubeconfig), directory / "tally.log", bin_dir=Path(state.bin_dir),
            env={"TALLY_BENCH_SNAPSHOTS": str(directory)},
            entry_point=ENTRY_POINT,
        )  # fmt: skip
        stack.callback(tally.kill)
        api = await _common.api_client(state.kubeconfig)
        try:
            core = client.CoreV1Api(api)
            namespaces = [f"memory-{index}" for index in range(args.namespaces)]
            for namespace in namespaces:
                await core.create_namespace({"metadata": {"name": namespace}})
                await core.create_namespaced_resource_quota(namespace, {
                    "metadata": {"name": "q"},
                    "spec": {"hard": {"pods": str(args.pods * 2), "configmaps": "500"}},
                })  # fmt: skip
            await asyncio.to_thread(tally.start, 120)
            for namespace in namespaces:
                for index in range(args.pods):
                    await core.create_namespaced_pod(namespace, {
                        "metadata": {"name": f"p{index}"},
                        "spec": {"containers": [{"name": "a", "image": "registry.example/a:1"}]},
                    })  # fmt: skip
            traced = Traced(tally, directory)
            started = time.monotonic()
            rss: list[tuple[float, float]] = []

            async def sample() -> None:
                while True:
                    rss.append((round(time.monotonic() - started, 1), round(traced.rss_mib(), 1)))
                    await asyncio.sleep(5)

            stop = asyncio.Event()
            churning = asyncio.create_task(churn(api, namespaces, args.rate, stop))
            sampler = asyncio.create_task(sample())
            await asyncio.sleep(WARMUP_S)
            await asyncio.to_thread(traced.snapshot, "churn-start", started)
            await asyncio.sleep(args.churn_minutes * 60)
            await asyncio.to_thread(traced.snapshot, "churn-end", started)
            downs = []
            for index in range(args.restarts):
                downs.append(round(await asyncio.to_thread(cluster.restart_apiserver, state), 1))
                await asyncio.sleep(AFTER_RESTART_S)
                await asyncio.to_thread(traced.snapshot, f"restart-{index + 1}", started)
            stop.set()
            requests = await churning
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        finally:
            await api.close()
    rows = traced.rows
    churn_mib = rows[1]["traced_mib"] - rows[0]["traced_mib"]
    per_restart_kib = (
        (rows[-1]["traced_mib"] - rows[1]["traced_mib"]) * 1024 / args.restarts
        if args.restarts
        else 0.0
    )
    return {
        "sizes": {
            "namespaces": args.namespaces,
            "pods": args.namespaces * args.pods,
            "churn_rate": args.rate,
            "churn_minutes": args.churn_minutes,
            "restarts": args.restarts,
            "churn_requests": requests,
        },
        "snapshots": rows,
        "apiserver_down_s": downs,
        "churn_growth_mib_per_10min": round(churn_mib / args.churn_minutes * 10, 3),
        "growth_per_restart_kib": round(per_restart_kib, 1),
        "churn_growth_sites": traced.growth("churn-start", "churn-end"),
        "restart_growth_sites": (
            traced.growth("churn-end", rows[-1]["label"]) if args.restarts else []
        ),
        "rss_samples": rss,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--pods", type=int, default=30, help="pods per namespace")
    parser.add_argument("--rate", type=float, default=10.0, help="churn creates per second")
    parser.add_argument("--churn-minutes", type=float, default=4.0)
    parser.add_argument("--restarts", type=int, default=5)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    churn_rate = result["churn_growth_mib_per_10min"]
    print(f"traced growth under churn: {churn_rate:.3f} MiB per 10 min "
          f"(target < {TARGET_CHURN_MIB_PER_10MIN}); per restart: "
          f"{result['growth_per_restart_kib']:.1f} KiB")  # fmt: skip
    for phase in ("churn_growth_sites", "restart_growth_sites"):
        print(f"{phase}:")
        for site in result[phase]:
            print(f"  {site['kib']:+9.1f} KiB {site['objects']:+6d}  {site['where']}")
    write_results("memory", result, [
        Figure("traced growth under churn", "MiB per 10 min", churn_rate, None,
               target=f"< {TARGET_CHURN_MIB_PER_10MIN}"),
        Figure("traced growth per apiserver restart", "KiB", result["growth_per_restart_kib"],
               None),
    ])  # fmt: skip
    return 0 if churn_rate < TARGET_CHURN_MIB_PER_10MIN else 1


if __name__ == "__main__":
    sys.exit(main())
