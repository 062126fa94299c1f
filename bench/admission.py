"""Benchmark: pod creates under a quota, 20 concurrent clients — tally's webhook against upstream.

Starts two local control planes with ``hack/cluster.py`` (temporary directories): reference mode
(upstream's ResourceQuota admission plugin inside kube-apiserver) and operator mode with tally
running as a subprocess (``kopf run operator/main.py``, as the e2e tests run it) and its webhook
registered. On each, one namespace holds one quota (``pods: 100000``, ``requests.cpu: 100k``,
``requests.memory: 100Ti``) whose status has been filled in, so every create is charged.

``--creates`` pod creates per side (default 1 000) come from ``--clients`` concurrent clients
(default 20): each client sends its next create as soon as the previous one is answered. The
creates run in ``--blocks`` blocks per side, alternating which side goes first, so that the
background load of this shared machine hits both sides alike; a warm-up block per side is not
counted. Latency is per request (from sending the create to its answer); throughput is creates
per second of block wall time. After the run, each quota's ``status.used.pods`` must equal the
number of pods created (every create charged exactly once).

Prints p50 / p95 / p99 / max and throughput per side, tally's ratios to upstream (targets:
p99 <= 1.2x, throughput >= 1.0x), a few of tally's own admission metrics, the input
size and the machine. Cleans up both control planes and tally whatever happens.

Run: ``.venv/bin/python bench/admission.py [--creates 1000] [--clients 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from _common import (
    Raw,
    api_client,
    cluster,
    control_plane,
    cpu_seconds,
    machine,
    operator_process,
    percentile,
)

NAMESPACE = "bench-admission"
QUOTA = "q"
HARD = {"pods": "100000", "requests.cpu": "100k", "requests.memory": "100Ti"}
IMAGE = "registry.example/app:1"
TARGET_P99_RATIO = 1.2
TARGET_THROUGHPUT_RATIO = 1.0
WAIT_S = 60.0


class Side:
    def __init__(self, label: str, api: client.ApiClient, pids: dict[str, int]) -> None:
        self.label = label
        self.api = api
        self.pids = pids
        """The processes that serve this side, whose CPU time the measured blocks count."""
        self.cpu_s: dict[str, float] = dict.fromkeys(pids, 0.0)
        self.raw = Raw(api)
        self.latencies: list[float] = []
        self.busy_s = 0.0
        self.created = 0
        self.failures: list[str] = []
        self.charged = -1
        """The quota's ``status.used.pods`` after the run."""

    async def prepare(self) -> None:
        await self.raw.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        await self._until(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
            lambda page: any(a["metadata"]["name"] == "default" for a in page["items"]),
            "the default service account",
        )
        await self.raw.call(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/resourcequotas",
            {"metadata": {"name": QUOTA}, "spec": {"hard": HARD}},
        )
        # Admission charges only a quota whose status is filled in (both systems).
        await self._until(
            f"/api/v1/namespaces/{NAMESPACE}/resourcequotas/{QUOTA}",
            lambda quota: (
                set((quota.get("status") or {}).get("hard") or {}) == set(HARD)
                and ((quota.get("status") or {}).get("used") or {}).get("pods") == "0"
            ),
            "the quota's status",
        )

    async def _until(self, path: str, done: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while True:
            answer = await self.raw.call("GET", path)
            if done(answer):
                return answer
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: timed out waiting for {what}: {answer}")
            await asyncio.sleep(0.1)

    async def block(self, creates: int, clients: int, *, record: bool) -> None:
        """``creates`` pod creates from ``clients`` concurrent clients."""
        remaining = creates

        async def one_client() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                index = self.created
                self.created += 1
                body = {
                    "metadata": {"name": f"p{index:05d}", "labels": {"app": "bench"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "app",
                                "image": IMAGE,
                                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                            }
                        ]
                    },
                }
                started = time.perf_counter()
                try:
                    await self.raw.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)
                except client.ApiException as error:
                    self.failures.append(f"{error.status}: {error.body!r}"[:300])
                    continue
                if record:
                    self.latencies.append(time.perf_counter() - started)

        cpu_before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(clients):
                group.create_task(one_client())
        if record:
            self.busy_s += time.perf_counter() - started
            for name, pid in self.pids.items():
                self.cpu_s[name] += cpu_seconds(pid) - cpu_before[name]

    async def charged_pods(self) -> int:
        """The quota's ``status.used.pods`` as it stands."""
        path = f"/api/v1/namespaces/{NAMESPACE}/resourcequotas/{QUOTA}"
        quota = await self.raw.call("GET", path)
        return int(quota["status"]["used"]["pods"])


async def measure(
    reference: cluster.State,
    operator: cluster.State,
    tally_pid: int,
    creates: int,
    clients: int,
    blocks: int,
) -> tuple[Side, Side]:
    upstream = Side(
        "upstream", await api_client(reference.kubeconfig, pool=clients + 10), reference.pids
    )
    tally = Side(
        "tally",
        await api_client(operator.kubeconfig, pool=clients + 10),
        {**operator.pids, "tally": tally_pid},
    )
    sides = (upstream, tally)
    try:
        await asyncio.gather(*(side.prepare() for side in sides))
        for side in sides:
            await side.block(clients * 2, clients, record=False)
        per_block = [creates // blocks + (1 if i < creates % blocks else 0) for i in range(blocks)]
        for index, count in enumerate(per_block):
            order = sides if index % 2 == 0 else sides[::-1]
            for side in order:
                await side.block(count, clients, record=True)
            print(f"  block {index + 1}/{blocks} done", file=sys.stderr, flush=True)
        for side in sides:
            side.charged = await side.charged_pods()
    finally:
        for side in sides:
            await side.api.close()
    return upstream, tally


CONFIRMATION_BUCKET = "tally_admission_charge_confirmation_seconds_bucket"


def tally_metrics(url: str) -> dict[str, float]:
    """The sums and counters the report prints; the charge-confirmation histogram's buckets
    as ``<name>:<le>``."""
    wanted = (
        "tally_admission_duration_seconds_sum",
        "tally_admission_duration_seconds_count",
        "tally_admission_batch_size_sum",
        "tally_admission_batch_size_count",
        "tally_admission_write_conflicts_total",
        "tally_admission_retries_total",
        "tally_admission_charges_confirmed_total",
        "tally_admission_charges_released_total",
        "tally_admission_charges_late_total",
    )
    values: dict[str, float] = {}
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name == CONFIRMATION_BUCKET:
                name += ":" + line.split('le="')[1].split('"')[0]
            elif name not in wanted:
                continue
            values[name] = values.get(name, 0.0) + float(line.split()[-1])
    return values


def confirmation_quantile(metrics: dict[str, float], fraction: float) -> str:
    """The histogram bucket that holds the ``fraction`` quantile of tally's admission answer →
    object in its cache latency, as ``<= <le> s`` (what TALLY_CHARGE_CONFIRM_TIMEOUT is chosen
    from)."""
    buckets = sorted(
        (float(key.split(":")[1]), count)
        for key, count in metrics.items()
        if key.startswith(CONFIRMATION_BUCKET + ":")
    )
    total = buckets[-1][1] if buckets else 0.0
    for bound, count in buckets:
        if total and count >= fraction * total:
            return f"<= {bound:g} s"
    return "n/a"


def report(
    upstream: Side, tally: Side, creates: int, clients: int, blocks: int, metrics: dict[str, float]
) -> bool:
    def ms(value: float) -> str:
        return f"{value * 1000:7.1f} ms"

    print(f"admission: {creates} pod creates per side from {clients} concurrent clients in "
          f"{blocks} alternating blocks (+{clients * 2} warm-up), one namespace, one quota "
          f"({', '.join(f'{k}: {v}' for k, v in HARD.items())})")  # fmt: skip
    print(f"machine: {machine()}")
    print(f"{'':10}{'p50':>11}{'p95':>11}{'p99':>11}{'max':>11}{'throughput':>14}")
    rows: dict[str, tuple[float, float, float, float]] = {}
    for side in (upstream, tally):
        values = side.latencies
        throughput = len(values) / side.busy_s
        rows[side.label] = (
            statistics.median(values),
            percentile(values, 0.95),
            percentile(values, 0.99),
            throughput,
        )
        p50, p95, p99, _ = rows[side.label]
        print(f"{side.label:10}{ms(p50):>11}{ms(p95):>11}{ms(p99):>11}{ms(max(values)):>11}"
              f"{throughput:>10.1f} /s")  # fmt: skip
    ratios = [rows["tally"][i] / rows["upstream"][i] for i in range(4)]
    p99_ok = ratios[2] <= TARGET_P99_RATIO
    throughput_ok = ratios[3] >= TARGET_THROUGHPUT_RATIO
    print(f"ratio tally/upstream: p50 {ratios[0]:.2f}x, p95 {ratios[1]:.2f}x, "
          f"p99 {ratios[2]:.2f}x ({'meets' if p99_ok else 'misses'} <= {TARGET_P99_RATIO}x), "
          f"throughput {ratios[3]:.2f}x "
          f"({'meets' if throughput_ok else 'misses'} >= {TARGET_THROUGHPUT_RATIO}x)")  # fmt: skip
    count = metrics.get("tally_admission_duration_seconds_count", 0.0)
    batches = metrics.get("tally_admission_batch_size_count", 0.0)
    if count and batches:
        print(f"tally's own view: {count:.0f} admission requests, mean decision "
              f"{metrics['tally_admission_duration_seconds_sum'] / count * 1000:.1f} ms, mean "
              f"batch {metrics['tally_admission_batch_size_sum'] / batches:.1f}, "
              f"{metrics.get('tally_admission_write_conflicts_total', 0):.0f} write conflicts, "
              f"{metrics.get('tally_admission_retries_total', 0):.0f} retries")  # fmt: skip
    confirmed = metrics.get("tally_admission_charges_confirmed_total", 0.0)
    print(f"tally's charges: {confirmed:.0f} confirmed by the watch (answer -> object in the "
          f"cache: p50 {confirmation_quantile(metrics, 0.5)}, p99 "
          f"{confirmation_quantile(metrics, 0.99)}, p99.9 "
          f"{confirmation_quantile(metrics, 0.999)}), "
          f"{metrics.get('tally_admission_charges_released_total', 0):.0f} released, "
          f"{metrics.get('tally_admission_charges_late_total', 0):.0f} late")  # fmt: skip
    # On a shared 2-core machine a side is as fast as the CPU its processes need per create.
    for side in (upstream, tally):
        per_create = {
            name: seconds / len(side.latencies) * 1000 for name, seconds in side.cpu_s.items()
        }
        parts = ", ".join(f"{name} {value:.2f}" for name, value in per_create.items())
        print(f"{side.label} CPU per create: {sum(per_create.values()):.2f} ms ({parts})")
    ok = True
    for side in (upstream, tally):
        charged = side.charged
        admitted = side.created - len(side.failures)
        print(f"{side.label}: {admitted} pods admitted, {len(side.failures)} refused, quota "
              f"status.used.pods {charged}")  # fmt: skip
        for failure in side.failures[:5]:
            print(f"  refused: {failure}")
        ok = ok and charged == admitted and not side.failures
    if not ok:
        print("ERROR: a create was refused or the quota's usage does not match what was admitted")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--creates", type=int, default=1000, help="measured creates per side")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks per side")
    parser.add_argument(
        "--profile", type=Path, help="run tally under cProfile and write its profile here"
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        print("starting the reference and operator control planes ...", file=sys.stderr)
        reference = stack.enter_context(control_plane("reference"))
        operator = stack.enter_context(control_plane("operator"))
        log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tally.log"
        profile = ("-m", "cProfile", "-o", str(args.profile.resolve())) if args.profile else ()
        tally_process = operator_process.TallyProcess(
            Path(operator.kubeconfig), log, bin_dir=Path(operator.bin_dir), interpreter_args=profile
        )
        stack.callback(tally_process.kill)
        tally_process.start()
        assert tally_process.process is not None
        tally_pid = tally_process.process.pid
        print("measuring ...", file=sys.stderr)
        upstream, tally = asyncio.run(
            measure(reference, operator, tally_pid, args.creates, args.clients, args.blocks)
        )
        metrics = tally_metrics(tally_process.metrics_url)
        ok = report(upstream, tally, args.creates, args.clients, args.blocks, metrics)
        if args.profile:
            tally_process.stop()  # graceful: cProfile writes the profile on exit
            print(f"tally's profile: {args.profile}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
