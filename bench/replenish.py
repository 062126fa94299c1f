"""Benchmark: pod delete → the quota's ``status.used`` lowered, tally against upstream.

Starts two local control planes with ``hack/cluster.py`` (each in a temporary directory): one in
reference mode (kube-controller-manager's resourcequota controller and upstream quota admission)
and one in operator mode with tally running as a subprocess (``kopf run operator/main.py``, the
same command as the e2e tests). On each, one namespace holds one quota (``pods``,
``count/pods``, ``requests.cpu``) and ``--deletions`` + ``--warmup`` pods, created after the
quota (charged at admission). Then pods are deleted one at a time, alternating between the two
sides so that background load hits both alike; each latency runs from just before the DELETE
request to the arrival, on a watch of the quota opened before the run, of the status whose
``used.pods`` shows the deletion. The warm-up deletions are not counted.

Prints p50 / p95 / max per side and tally's ratios to upstream (target: <= 1.0x),
with the input size and the machine (nproc, Python, Kubernetes version), and writes the
figures as JSON and a picture beside it (``bench/results/replenish.json``, ``.png``). Cleans up
both control planes and tally whatever happens.

Run: ``.venv/bin/python bench/replenish.py [--deletions 60] [--warmup 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from kubernetes_asyncio import client, config, watch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "tests" / "e2e")]

from operator_process import TallyProcess  # noqa: E402

import cluster  # noqa: E402
from _common import Figure, write_results  # noqa: E402

NAMESPACE = "bench-replenish"
QUOTA = "q"
IMAGE = "registry.example/app:1"
TARGET_RATIO = 1.0
WAIT_S = 60.0


class QuotaWatch:
    """Every status of one quota as a watch delivers it, with the time it arrived."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self.pods: int | None = None
        self.arrived = 0.0
        self.changed = asyncio.Condition()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            stream = watch.Watch().stream(
                self.core.list_namespaced_resource_quota,
                self.namespace,
                field_selector=f"metadata.name={self.name}",
                timeout_seconds=3600,
            )
            async for event in stream:
                arrived = time.perf_counter()
                used = ((event["raw_object"].get("status") or {}).get("used")) or {}
                if "pods" not in used:
                    continue
                async with self.changed:
                    self.pods, self.arrived = int(used["pods"]), arrived
                    self.changed.notify_all()

    async def until(self, pods: int) -> float:
        """Wait until ``used.pods == pods``; return when that status arrived."""
        async with asyncio.timeout(WAIT_S), self.changed:
            await self.changed.wait_for(lambda: self.pods == pods)
            return self.arrived

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class Side:
    def __init__(self, label: str, api: client.ApiClient) -> None:
        self.label = label
        self.api = api
        self.core = client.CoreV1Api(api)
        self.watch = QuotaWatch(api, NAMESPACE, QUOTA)
        self.latencies: list[float] = []

    async def prepare(self, pods: int) -> None:
        await self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        while True:  # pods are refused until the namespace's default service account exists
            accounts = await self.core.list_namespaced_service_account(NAMESPACE)
            if any(a.metadata.name == "default" for a in accounts.items):
                break
            await asyncio.sleep(0.2)
        self.watch.start()
        hard = {"pods": "100k", "count/pods": "100k", "requests.cpu": "10k"}
        await self.core.create_namespaced_resource_quota(
            NAMESPACE, {"metadata": {"name": QUOTA}, "spec": {"hard": hard}}
        )
        await self.watch.until(0)
        for index in range(pods):
            container = {"name": "a", "image": IMAGE, "resources": {"requests": {"cpu": "10m"}}}
            await self.core.create_namespaced_pod(
                NAMESPACE, {"metadata": {"name": f"p{index}"}, "spec": {"containers": [container]}}
            )
        await self.watch.until(pods)

    async def delete(self, index: int, remaining: int, *, record: bool) -> None:
        started = time.perf_counter()
        await self.core.delete_namespaced_pod(f"p{index}", NAMESPACE, grace_period_seconds=0)
        arrived = await self.watch.until(remaining)
        if record:
            self.latencies.append(arrived - started)


async def api_client(kubeconfig: str) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


async def measure(
    reference: cluster.State, operator: cluster.State, deletions: int, warmup: int
) -> tuple[Side, Side]:
    upstream = Side("upstream", await api_client(reference.kubeconfig))
    tally = Side("tally", await api_client(operator.kubeconfig))
    sides = (upstream, tally)
    total = deletions + warmup
    try:
        await asyncio.gather(*(side.prepare(total) for side in sides))
        for index in range(total):
            # Alternate which side goes first, so neither always follows the other's load.
            order = sides if index % 2 == 0 else sides[::-1]
            for side in order:
                await side.delete(index, total - index - 1, record=index >= warmup)
    finally:
        for side in sides:
            await side.watch.stop()
            await side.api.close()
    return upstream, tally


@contextlib.contextmanager
def control_plane(mode: str) -> Iterator[cluster.State]:
    directory = Path(tempfile.mkdtemp(prefix=f"tally-bench-{mode}-"))
    try:
        # Simulated nodes: the pods run, and a delete is a kubelet's graceful one, on both sides.
        with cluster.running(directory, mode, nodes=cluster.DEFAULT_NODES) as state:
            yield state
    finally:
        cluster.down(directory, clean=True, quiet=True)


def queue_view(metrics_url: str) -> str:
    """tally's own account of its primary quota queue: time waiting, time in a sync."""
    sums: dict[str, float] = {}
    with contextlib.suppress(OSError), urllib.request.urlopen(metrics_url, timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if 'name="resourcequota_primary"' not in line:
                continue
            metric = line.split("{")[0]
            if metric.endswith(("_sum", "_count")):
                sums[metric] = sums.get(metric, 0.0) + float(line.split()[-1])
    parts = []
    for metric, what in (
        ("workqueue_queue_duration_seconds", "queued"),
        ("workqueue_work_duration_seconds", "syncing"),
    ):
        count = sums.get(f"{metric}_count", 0.0)
        if count:
            parts.append(f"{what} {sums[f'{metric}_sum'] / count * 1000:.1f} ms")
    return ", ".join(parts) or "no metrics"


def report(upstream: Side, tally: Side, deletions: int, warmup: int, tally_view: str) -> None:
    """Print the figures and write them (``bench/results/replenish.json``)."""

    def ms(value: float) -> str:
        return f"{value * 1000:8.1f} ms"

    print(f"replenish: pod delete -> quota status.used updated; {deletions} deletions per side "
          f"(+{warmup} warm-up), one namespace of {deletions + warmup} pods, one quota "
          f"(pods, count/pods, requests.cpu)")  # fmt: skip
    print(f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, "
          f"Kubernetes {cluster.kubernetes_version()}, {platform.machine()}")  # fmt: skip
    print(f"{'':10}{'p50':>11}{'p95':>11}{'max':>11}")
    rows = {}
    for side in (upstream, tally):
        values = side.latencies
        rows[side.label] = (statistics.median(values), percentile(values, 0.95), max(values))
        p50, p95, worst = rows[side.label]
        print(f"{side.label:10}{ms(p50):>11}{ms(p95):>11}{ms(worst):>11}")
    p50_ratio = rows["tally"][0] / rows["upstream"][0]
    p95_ratio = rows["tally"][1] / rows["upstream"][1]
    verdict = "meets" if max(p50_ratio, p95_ratio) <= TARGET_RATIO else "misses"
    print(f"ratio tally/upstream: p50 {p50_ratio:.2f}x, p95 {p95_ratio:.2f}x "
          f"({verdict} the target <= {TARGET_RATIO:.1f}x)")  # fmt: skip
    print(f"tally's own view, mean per quota sync (all syncs, warm-up included): {tally_view}")
    target = f"<= {TARGET_RATIO:.1f}x"
    write_results(
        "replenish",
        {
            "deletions": deletions,
            "warmup": warmup,
            "latencies_s": {side.label: side.latencies for side in (upstream, tally)},
            "tally_view": tally_view,
        },
        [
            Figure("delete -> used lowered, p50", "ms", rows["tally"][0] * 1000,
                   rows["upstream"][0] * 1000, target=target),
            Figure("delete -> used lowered, p95", "ms", rows["tally"][1] * 1000,
                   rows["upstream"][1] * 1000, target=target),
            Figure("delete -> used lowered, max", "ms", rows["tally"][2] * 1000,
                   rows["upstream"][2] * 1000),
        ],
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deletions", type=int, default=60, help="measured per side (>= 50)")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured first deletions")
    args = parser.parse_args(argv)
    if args.deletions < 50:
        parser.error("--deletions must be at least 50")
    with contextlib.ExitStack() as stack:
        print("starting the reference and operator control planes ...", file=sys.stderr)
        reference = stack.enter_context(control_plane("reference"))
        operator = stack.enter_context(control_plane("operator"))
        log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tally.log"
        tally_process = TallyProcess(Path(operator.kubeconfig), log, bin_dir=Path(operator.bin_dir))
        stack.callback(tally_process.kill)
        tally_process.start()
        print("measuring ...", file=sys.stderr)
        upstream, tally = asyncio.run(measure(reference, operator, args.deletions, args.warmup))
        report(upstream, tally, args.deletions, args.warmup, queue_view(tally_process.metrics_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
