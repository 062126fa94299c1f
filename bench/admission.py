"""Benchmark: pod creates under a quota — tally's webhook against upstream and against the floor.

Starts local control planes with ``hack/cluster.py`` (temporary directories): reference mode
(upstream's ResourceQuota admission plugin inside kube-apiserver, the *upstream* side) and
operator mode with tally running as a subprocess (``kopf run operator/main.py``, as the e2e tests
run it, with mutual TLS) and its webhook registered (the *tally* side). On each, one namespace
holds one quota (``pods: 100000``, ``requests.cpu: 100k``, ``requests.memory: 100Ti``) whose
status has been filled in, so every create is charged.

The *floor* side (modes ``floor`` and ``open``) is a third, operator-mode control plane without
tally, where the floor webhook (``hack/floor``: Go, standard library only, built on demand by
``hack/floor.py``) is registered for pod creates with tally's failurePolicy, timeout,
sideEffects, matchPolicy and namespaceSelector, over TLS with mutual TLS as tally runs: what a
webhook costs when it does no admission work. Its namespace has no quota (nothing there would
read one). The floor offers HTTP/2, which the API server's webhook client takes; tally's aiohttp
server speaks HTTP/1.1 only, and ``--floor-http1`` makes the floor do the same.

Modes (``--mode``, repeatable; default ``closed``):

* ``closed``: ``--creates`` pod creates per side (default 1 000) from ``--clients`` concurrent
  clients (default 20), each sending its next create as soon as the previous one is answered,
  upstream and tally. Throughput is creates per second of block wall time.
* ``floor``: the same closed loop with the floor side as well; prints tally / floor.
* ``open``: ``--open-creates`` creates per side (default 2 000) sent at Poisson arrival times at
  ``--rate`` per second (default: ``--rate-fraction``, 50 %, of upstream's closed-loop throughput
  measured in the same run, by a closed loop of its own if no closed mode ran), each at its own
  time whatever the answers do; latency from each create's *scheduled* send time (no coordinated
  omission, ``bench/_open_loop.py``). Upstream, floor and tally; p50 / p99 / p99.9.

Every mode runs in ``--blocks`` blocks per side, rotating which side goes first, so that the
background load of this shared machine hits every side alike, after an uncounted warm-up of
``2 * clients`` creates per side. CPU per admitted create per process (kube-apiserver, etcd,
kube-controller-manager, and tally or the floor webhook) is read from ``/proc`` around the
measured blocks. After the run, tally's and upstream's quota ``status.used.pods`` must equal the
pods admitted (every create charged exactly once), and the floor must have answered a review for
every create admitted after its registration took effect.

``--kopf-watch`` also runs, on tally's plane, a Kopf operator that only watches pods, with
tally's Kopf settings and a handler that does nothing (``bench/_kopf_watch.py``): its CPU per
create is what tally's pod watch costs before tally does anything with the event, the floor that
watching through Kopf sets under tally's own CPU per create. It is measured beside tally's side
(not counted in the side's total) and takes CPU from it, so that run's tally figures are a little
slower than without it. With the floor side too, tally's CPU per create is judged against the
floor's and the watch's together: the least a Kopf operator that answers the review and watches
the pod must spend (target: at most 1.5x).

Writes ``bench/results/admission.json`` and its picture (or ``--results``) with the figures of
the modes that ran. Cleans up every control plane, tally and the floor whatever happens.

Run: ``.venv/bin/python bench/admission.py [--mode closed|floor|open ...] [--creates 1000]
[--clients 20] [--open-creates 2000] [--rate R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from _common import (
    REPO,
    Figure,
    Raw,
    api_client,
    cluster,
    control_plane,
    cpu_seconds,
    machine,
    operator_process,
    percentile,
    write_results,
)
from _open_loop import open_loop, poisson_offsets, split
from tally.webhook.certs import new_material
from tally.webhook.configuration import validating_webhook_configuration

NAMESPACE = "bench-admission"
QUOTA = "q"
HARD = {"pods": "100000", "requests.cpu": "100k", "requests.memory": "100Ti"}
IMAGE = "registry.example/app:1"
WAIT_S = 60.0
MODES = ("closed", "floor", "open")

FLOOR_CONFIGURATION = "floor.tally.dev"
POD_CREATE_RULE = {
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods"],
    "operations": ["CREATE"],
    "scope": "Namespaced",
}

# Targets of issue 16: against the floor in a closed loop, against upstream in the open loop.
TARGET_THROUGHPUT_VS_FLOOR = 0.7
TARGET_P99_VS_FLOOR = 1.5
TARGET_OPEN_P99_VS_UPSTREAM = 1.5
TARGET_TALLY_CPU_MS = 0.6
# Target of issue 28: what a Kopf operator must spend per create at least is a webhook's answer
# (the floor's) plus watching the pod through Kopf (the do-nothing Kopf watch's).
TARGET_CPU_VS_FLOOR_AND_KOPF_WATCH = 1.5

KOPF_WATCH = "kopf-watch"
"""The process ``--kopf-watch`` measures beside tally's side; not part of any side's total."""

OPEN_POOL = 64
"""Connections per side's client: enough that an open loop at half of upstream's capacity never
waits for one unless the side stalls (a wait for a connection then counts in the latency, as
the scheduled time is the start)."""


def pod_body(index: int) -> dict[str, Any]:
    return {
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


@dataclass
class Measured:
    """The recorded blocks of one mode on one side."""

    latencies: list[float] = field(default_factory=list)
    busy_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    send_lags: list[float] = field(default_factory=list)
    """Open loop only: how late each create was sent against its schedule."""

    def add_cpu(self, before: dict[str, float], after: dict[str, float]) -> None:
        for name, value in after.items():
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + value - before[name]

    def summary(self) -> dict[str, Any]:
        values = self.latencies
        admitted = len(values)
        per_create = {name: s / admitted * 1000 for name, s in self.cpu_s.items()}
        beside = per_create.get(KOPF_WATCH, 0.0)
        summary: dict[str, Any] = {
            "creates": admitted,
            "throughput_per_s": admitted / self.busy_s,
            "p50_ms": percentile(values, 0.50) * 1000,
            "p95_ms": percentile(values, 0.95) * 1000,
            "p99_ms": percentile(values, 0.99) * 1000,
            "p99_9_ms": percentile(values, 0.999) * 1000,
            "max_ms": max(values) * 1000,
            "cpu_ms_per_create": per_create,
            "cpu_ms_per_create_total": sum(per_create.values()) - beside,
        }
        if self.send_lags:
            summary["send_lag_p99_ms"] = percentile(self.send_lags, 0.99) * 1000
            summary["send_lag_max_ms"] = max(self.send_lags) * 1000
        return summary


class Side:
    def __init__(
        self, label: str, api: client.ApiClient, pids: dict[str, int], *, quota: bool
    ) -> None:
        self.label = label
        self.api = api
        self.pids = pids
        """The processes that serve this side, whose CPU time the measured blocks count."""
        self.quota = quota
        self.raw = Raw(api)
        self.created = 0
        """Creates sent (also the next pod's number)."""
        self.failures: list[str] = []
        self.charged = -1
        """The quota's ``status.used.pods`` after the run."""
        self.measured: dict[str, Measured] = {}
        """Per mode: ``closed`` (also the floor mode's closed loop) and ``open``."""

    async def prepare(self) -> None:
        await self.raw.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        await self._until(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
            lambda page: any(a["metadata"]["name"] == "default" for a in page["items"]),
            "the default service account",
        )
        if not self.quota:
            return
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

    async def create(self, _: int = 0) -> bool:
        """One pod create; whether it was admitted (a refusal is recorded)."""
        index = self.created
        self.created += 1
        try:
            await self.raw.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(index))
        except client.ApiException as error:
            self.failures.append(f"{error.status}: {error.body!r}"[:300])
            return False
        return True

    def _cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    async def closed_block(self, creates: int, clients: int, record: Measured | None) -> float:
        """``creates`` pod creates from ``clients`` concurrent clients; the block's creates/s."""
        remaining = creates
        latencies: list[float] = []

        async def one_client() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                if await self.create():
                    latencies.append(time.perf_counter() - started)

        cpu_before = self._cpu()
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(clients):
                group.create_task(one_client())
        elapsed = time.perf_counter() - started
        if record is not None:
            record.busy_s += elapsed
            record.latencies += latencies
            record.add_cpu(cpu_before, self._cpu())
        return len(latencies) / elapsed

    async def open_block(self, offsets: list[float], record: Measured) -> None:
        cpu_before = self._cpu()
        loop = await open_loop(offsets, self.create)
        record.add_cpu(cpu_before, self._cpu())
        record.busy_s += loop.wall_s
        record.latencies += loop.latencies
        record.send_lags += loop.send_lags

    async def charged_pods(self) -> int:
        """The quota's ``status.used.pods`` as it stands."""
        path = f"/api/v1/namespaces/{NAMESPACE}/resourcequotas/{QUOTA}"
        quota = await self.raw.call("GET", path)
        return int(quota["status"]["used"]["pods"])


def ensure_floor() -> Path:
    """The floor webhook's binary, built into the cache first if needed."""
    # hack/floor.py: on sys.path once _common is imported, which isort would put after it.
    import floor

    return floor.ensure_floor()


class FloorWebhook:
    """The floor webhook as a subprocess, serving a fresh certificate for 127.0.0.1 and
    requiring the API server's client certificate (``client_ca``)."""

    def __init__(self, directory: Path, client_ca: Path, *, http1: bool = False) -> None:
        self.directory = directory
        self.client_ca = client_ca
        self.http1 = http1
        material = new_material(["127.0.0.1"], datetime.datetime.now(datetime.UTC))
        (directory / "tls.crt").write_bytes(material.cert_pem)
        (directory / "tls.key").write_bytes(material.key_pem)
        self.ca_bundle = base64.b64encode(material.ca_bundle).decode()
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self.first_review = threading.Event()
        self._lines: queue.Queue[str] = queue.Queue()
        self.stats = ""
        """The floor's last words: reviews answered, by protocol."""

    def start(self) -> None:
        binary = ensure_floor()
        self.process = subprocess.Popen(
            [str(binary), "-listen", "127.0.0.1:0", "-cert", str(self.directory / "tls.crt"),
             "-key", str(self.directory / "tls.key"), "-client-ca", str(self.client_ca),
             *(["-http1"] if self.http1 else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        try:
            line = self._lines.get(timeout=30)
        except queue.Empty:
            raise RuntimeError("the floor webhook did not start within 30 s") from None
        if not line.startswith("serving on "):
            _, stderr = self.process.communicate(timeout=10)
            raise RuntimeError(f"the floor webhook did not start: {line}{stderr}")
        self.url = line.removeprefix("serving on ").strip()

    def _read(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("first review"):
                self.first_review.set()
            else:
                self._lines.put(line)
        self._lines.put("")  # end of output: the floor exited

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            _, stderr = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate()
        self.stats = stderr.strip()

    @property
    def allowed(self) -> int:
        """Reviews the floor answered, from its last words; -1 if it said nothing."""
        for line in self.stats.splitlines():
            if line.startswith("floor: ") and "reviews allowed" in line:
                return int(line.split()[1])
        return -1

    async def until_reviewed(
        self, create: Callable[[], Awaitable[bool]], refusal: Callable[[], str]
    ) -> None:
        """Create (``create``: one create, whether it was admitted) until the floor has answered
        a review: its configuration takes effect a moment after it is written."""
        deadline = time.monotonic() + WAIT_S
        while True:
            if not await create():
                raise RuntimeError(f"floor: a create was refused: {refusal()}")
            # The floor prints before it answers; its reader thread may be a moment behind.
            if await asyncio.to_thread(self.first_review.wait, 1.0):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the API server never called the floor webhook")

    def configuration(self) -> dict[str, Any]:
        """tally's registration (fixed fields and namespaceSelector), for pod creates only and
        pointing at the floor."""
        configuration = validating_webhook_configuration(
            name=FLOOR_CONFIGURATION, url=self.url, ca_bundle=self.ca_bundle,
            rules=[POD_CREATE_RULE], labels={"app.kubernetes.io/name": "floor"},
        )  # fmt: skip
        quota_webhook = configuration["webhooks"][0]
        configuration["webhooks"] = [{**quota_webhook, "name": FLOOR_CONFIGURATION}]
        return configuration


async def register_floor(side: Side, floor: FloorWebhook) -> int:
    """Register the floor on ``side``'s API server and create pods one at a time until the floor
    answers one; the creates sent before that one (never reviewed)."""
    await side.raw.call(
        "POST",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        floor.configuration(),
    )
    await floor.until_reviewed(side.create, lambda: side.failures[-1])
    return side.created - 1


@dataclass
class Run:
    modes: list[str]
    creates: int
    clients: int
    blocks: int
    open_creates: int
    rate: float | None
    rate_fraction: float
    seed: int
    floor_http1: bool
    kopf_watch: bool
    capacity: float = 0.0
    """Upstream's closed-loop creates/s, which the open loop's default rate is a fraction of."""
    rate_used: float = 0.0
    floor_unreviewed: int = 0


async def measure(
    run: Run,
    reference: cluster.State,
    operator: cluster.State,
    tally_pid: int,
    floor_plane: cluster.State | None,
    floor: FloorWebhook | None,
    kopf_watch_pid: int | None = None,
) -> list[Side]:
    pool = max(run.clients + 10, OPEN_POOL)
    sides = [
        Side("upstream", await api_client(reference.kubeconfig, pool=pool), reference.pids,
             quota=True),
    ]  # fmt: skip
    if floor_plane is not None and floor is not None:
        sides.append(
            Side("floor", await api_client(floor_plane.kubeconfig, pool=pool),
                 {**floor_plane.pids, "floor": floor.process.pid if floor.process else 0},
                 quota=False)
        )  # fmt: skip
    beside = {KOPF_WATCH: kopf_watch_pid} if kopf_watch_pid is not None else {}
    sides.append(
        Side("tally", await api_client(operator.kubeconfig, pool=pool),
             {**operator.pids, "tally": tally_pid, **beside}, quota=True)
    )  # fmt: skip
    by_label = {side.label: side for side in sides}
    try:
        await asyncio.gather(*(side.prepare() for side in sides))
        if floor is not None:
            run.floor_unreviewed = await register_floor(by_label["floor"], floor)
        for side in sides:
            await side.closed_block(run.clients * 2, run.clients, None)

        def rotated(index: int) -> list[Side]:
            shift = index % len(sides)
            return sides[shift:] + sides[:shift]

        if "closed" in run.modes or "floor" in run.modes:
            for side in sides:
                side.measured["closed"] = Measured()
            for index, count in enumerate(split(run.creates, run.blocks)):
                for side in rotated(index):
                    await side.closed_block(count, run.clients, side.measured["closed"])
                print(f"  closed loop: block {index + 1}/{run.blocks} done", file=sys.stderr,
                      flush=True)  # fmt: skip
            run.capacity = by_label["upstream"].measured["closed"].summary()["throughput_per_s"]

        if "open" in run.modes:
            if run.rate is None and not run.capacity:
                # No closed loop ran: measure upstream's capacity the same way, unrecorded.
                run.capacity = await by_label["upstream"].closed_block(
                    run.creates, run.clients, None
                )
            run.rate_used = run.rate or run.capacity * run.rate_fraction
            source = f"upstream's closed-loop capacity {run.capacity:.1f}/s" if run.capacity else (
                "as given"
            )  # fmt: skip
            print(f"  open loop at {run.rate_used:.1f} creates/s ({source})", file=sys.stderr,
                  flush=True)  # fmt: skip
            for side in sides:
                side.measured["open"] = Measured()
            for index, count in enumerate(split(run.open_creates, run.blocks)):
                # Every side gets the same schedule within a block.
                offsets = poisson_offsets(run.rate_used, count, random.Random(run.seed + index))
                for side in rotated(index):
                    await side.open_block(offsets, side.measured["open"])
                print(f"  open loop: block {index + 1}/{run.blocks} done", file=sys.stderr,
                      flush=True)  # fmt: skip
        for side in sides:
            if side.quota:
                side.charged = await side.charged_pods()
    finally:
        for side in sides:
            await side.api.close()
    return sides


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


def source_revision() -> str:
    """The commit measured, with ``+changes`` when ``operator/`` differs from it: tally runs
    from the working tree, which other work may be changing."""
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", "operator"], capture_output=True, text=True,
        check=False,
    ).stdout.strip()  # fmt: skip
    return commit + ("+changes" if changed else "") if commit else "unknown"


def verdict(ok: bool) -> str:
    return "meets" if ok else "misses"


def ms(value: float) -> str:
    return f"{value:7.1f} ms"


def report_closed(summaries: dict[str, dict[str, Any]]) -> list[Figure]:
    print(f"{'closed':10}{'p50':>11}{'p95':>11}{'p99':>11}{'max':>11}{'throughput':>14}")
    for label, s in summaries.items():
        print(f"{label:10}{ms(s['p50_ms']):>11}{ms(s['p95_ms']):>11}{ms(s['p99_ms']):>11}"
              f"{ms(s['max_ms']):>11}{s['throughput_per_s']:>10.1f} /s")  # fmt: skip
    tally, upstream = summaries["tally"], summaries["upstream"]
    print(f"ratio tally/upstream: p50 {tally['p50_ms'] / upstream['p50_ms']:.2f}x, p99 "
          f"{tally['p99_ms'] / upstream['p99_ms']:.2f}x, throughput "
          f"{tally['throughput_per_s'] / upstream['throughput_per_s']:.2f}x")  # fmt: skip
    figures = [
        Figure("closed loop: throughput", "creates/s", tally["throughput_per_s"],
               upstream["throughput_per_s"], better="higher"),
        Figure("closed loop: p99", "ms", tally["p99_ms"], upstream["p99_ms"]),
        Figure("closed loop: CPU per create, whole side", "ms",
               tally["cpu_ms_per_create_total"], upstream["cpu_ms_per_create_total"]),
    ]  # fmt: skip
    floor = summaries.get("floor")
    if floor is None:
        return figures + report_kopf_watch(tally["cpu_ms_per_create"])
    throughput = tally["throughput_per_s"] / floor["throughput_per_s"]
    p99 = tally["p99_ms"] / floor["p99_ms"]
    print(f"ratio tally/floor: p50 {tally['p50_ms'] / floor['p50_ms']:.2f}x, p99 {p99:.2f}x "
          f"({verdict(p99 <= TARGET_P99_VS_FLOOR)} <= {TARGET_P99_VS_FLOOR}x), throughput "
          f"{throughput:.2f}x ({verdict(throughput >= TARGET_THROUGHPUT_VS_FLOOR)} >= "
          f"{TARGET_THROUGHPUT_VS_FLOOR}x); floor/upstream: throughput "
          f"{floor['throughput_per_s'] / upstream['throughput_per_s']:.2f}x, p99 "
          f"{floor['p99_ms'] / upstream['p99_ms']:.2f}x")  # fmt: skip
    tally_cpu, floor_cpu = tally["cpu_ms_per_create"], floor["cpu_ms_per_create"]
    figures += report_kopf_watch(tally_cpu)
    webhook = tally_cpu["tally"]
    print(f"webhook CPU per create: tally {webhook:.2f} ms "
          f"({verdict(webhook <= TARGET_TALLY_CPU_MS)} <= {TARGET_TALLY_CPU_MS} ms), floor "
          f"{floor_cpu['floor']:.2f} ms")  # fmt: skip
    figures += report_floor_and_kopf_watch(tally_cpu, floor_cpu)
    figures += [
        Figure("closed loop: throughput vs floor", "creates/s", tally["throughput_per_s"],
               floor["throughput_per_s"], reference_name="floor", better="higher",
               target=f">= {TARGET_THROUGHPUT_VS_FLOOR}x"),
        Figure("closed loop: p99 vs floor", "ms", tally["p99_ms"], floor["p99_ms"],
               reference_name="floor", target=f"<= {TARGET_P99_VS_FLOOR}x"),
        Figure("closed loop: webhook CPU per create", "ms", webhook, floor_cpu["floor"],
               reference_name="floor", target=f"tally <= {TARGET_TALLY_CPU_MS} ms"),
        Figure("closed loop: kube-apiserver CPU per create", "ms",
               tally_cpu["kube-apiserver"], floor_cpu["kube-apiserver"], reference_name="floor"),
        Figure("closed loop: etcd CPU per create", "ms", tally_cpu["etcd"], floor_cpu["etcd"],
               reference_name="floor"),
    ]  # fmt: skip
    return figures


def report_kopf_watch(tally_cpu: dict[str, float]) -> list[Figure]:
    """With ``--kopf-watch``: tally's CPU per create against a Kopf pod watch's alone."""
    kopf_watch = tally_cpu.get(KOPF_WATCH)
    if kopf_watch is None:
        return []
    webhook = tally_cpu["tally"]
    print(f"a Kopf pod watch alone (tally's Kopf settings, a handler doing nothing): "
          f"{kopf_watch:.2f} ms per create; tally {webhook:.2f} ms, {webhook - kopf_watch:.2f} "
          f"ms above it (target for all of tally: {TARGET_TALLY_CPU_MS} ms)")  # fmt: skip
    return [
        Figure("closed loop: CPU per create, tally vs a Kopf pod watch alone", "ms", webhook,
               kopf_watch, reference_name="Kopf pod watch"),
    ]  # fmt: skip


def report_floor_and_kopf_watch(
    tally_cpu: dict[str, float], floor_cpu: dict[str, float]
) -> list[Figure]:
    """With the floor and ``--kopf-watch``: tally's CPU per create against the least a Kopf
    operator answering the review and watching the pod must spend."""
    kopf_watch = tally_cpu.get(KOPF_WATCH)
    if kopf_watch is None:
        return []
    least = floor_cpu["floor"] + kopf_watch
    ratio = tally_cpu["tally"] / least
    print(f"tally CPU per create {tally_cpu['tally']:.2f} ms against the floor's and the Kopf "
          f"watch's together {least:.2f} ms: {ratio:.2f}x "
          f"({verdict(ratio <= TARGET_CPU_VS_FLOOR_AND_KOPF_WATCH)} <= "
          f"{TARGET_CPU_VS_FLOOR_AND_KOPF_WATCH}x)")  # fmt: skip
    return [
        Figure("closed loop: CPU per create, tally vs floor + Kopf pod watch", "ms",
               tally_cpu["tally"], least, reference_name="floor + Kopf pod watch",
               target=f"<= {TARGET_CPU_VS_FLOOR_AND_KOPF_WATCH}x"),
    ]  # fmt: skip


def report_open(summaries: dict[str, dict[str, Any]], rate: float) -> list[Figure]:
    print(f"{'open':10}{'p50':>11}{'p99':>11}{'p99.9':>11}{'max':>11}{'achieved':>14}"
          f"{'send lag p99':>14}")  # fmt: skip
    for label, s in summaries.items():
        print(f"{label:10}{ms(s['p50_ms']):>11}{ms(s['p99_ms']):>11}{ms(s['p99_9_ms']):>11}"
              f"{ms(s['max_ms']):>11}{s['throughput_per_s']:>10.1f} /s"
              f"{ms(s['send_lag_p99_ms']):>14}")  # fmt: skip
    tally, upstream = summaries["tally"], summaries["upstream"]
    keys = (("p50", "p50_ms"), ("p99", "p99_ms"), ("p99.9", "p99_9_ms"))
    for name, reference in (("upstream", upstream), ("floor", summaries.get("floor"))):
        if reference is None:
            continue
        ratios = ", ".join(
            f"{key} {tally[field_] / reference[field_]:.2f}x" for key, field_ in keys
        )
        print(f"open loop at {rate:.1f}/s, ratio tally/{name}: {ratios}")
    p99 = tally["p99_ms"] / upstream["p99_ms"]
    print(f"open loop p99 tally/upstream {p99:.2f}x ({verdict(p99 <= TARGET_OPEN_P99_VS_UPSTREAM)}"
          f" <= {TARGET_OPEN_P99_VS_UPSTREAM}x)")  # fmt: skip
    figures = [
        Figure(f"open loop: {key}", "ms", tally[field_], upstream[field_],
               target=f"<= {TARGET_OPEN_P99_VS_UPSTREAM}x" if key == "p99" else None)
        for key, field_ in keys
    ]  # fmt: skip
    floor = summaries.get("floor")
    if floor is not None:
        figures += [
            Figure(f"open loop: {key} vs floor", "ms", tally[field_], floor[field_],
                   reference_name="floor")
            for key, field_ in keys[1:]
        ]  # fmt: skip
    return figures


def report(run: Run, sides: list[Side], metrics: dict[str, float], floor: FloorWebhook | None,
           results: Path | None) -> bool:  # fmt: skip
    loops = []
    if "closed" in run.modes or "floor" in run.modes:
        loops.append(f"closed loop {run.creates} pod creates per side from {run.clients} clients")
    if "open" in run.modes:
        loops.append(f"open loop {run.open_creates} per side")
    print(f"admission: modes {', '.join(run.modes)}; {', '.join(loops)}, in {run.blocks} "
          f"rotating blocks (+{run.clients * 2} warm-up); one namespace, one quota "
          f"({', '.join(f'{k}: {v}' for k, v in HARD.items())}) on upstream's and tally's "
          f"sides")  # fmt: skip
    print(f"machine: {machine()}")
    revision = source_revision()
    print(f"tally at {revision}")
    figures: list[Figure] = []
    result: dict[str, Any] = {
        "modes": run.modes, "clients": run.clients, "creates": run.creates,
        "open_creates": run.open_creates, "blocks": run.blocks, "floor_http1": run.floor_http1,
        "kopf_watch": run.kopf_watch,
        "tally_revision": revision,
    }  # fmt: skip
    for mode in ("closed", "open"):
        summaries = {s.label: s.measured[mode].summary() for s in sides if mode in s.measured}
        if not summaries:
            continue
        result[mode] = summaries
        if mode == "closed":
            figures += report_closed(summaries)
        else:
            result["open_rate_per_s"] = run.rate_used
            if run.capacity:
                result["upstream_capacity_per_s"] = run.capacity
            figures += report_open(summaries, run.rate_used)
        # On a shared 2-core machine a side is as fast as the CPU its processes need per create.
        for label, s in summaries.items():
            parts = ", ".join(f"{name} {v:.2f}" for name, v in s["cpu_ms_per_create"].items())
            print(f"{mode} loop, {label} CPU per create: {s['cpu_ms_per_create_total']:.2f} ms "
                  f"({parts})")  # fmt: skip
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
    ok = True
    checks: dict[str, Any] = {}
    for side in sides:
        admitted = side.created - len(side.failures)
        checks[side.label] = {"admitted": admitted, "refused": len(side.failures)}
        if side.quota:
            checks[side.label]["charged"] = side.charged
            print(f"{side.label}: {admitted} pods admitted, {len(side.failures)} refused, quota "
                  f"status.used.pods {side.charged}")  # fmt: skip
            ok = ok and side.charged == admitted
        else:
            print(f"{side.label}: {admitted} pods admitted, {len(side.failures)} refused")
        for failure in side.failures[:5]:
            print(f"  refused: {failure}")
        ok = ok and not side.failures
    if floor is not None:
        floor_side = next(side for side in sides if side.label == "floor")
        reviewed = floor_side.created - run.floor_unreviewed
        checks["floor"]["reviewed_by_floor"] = floor.allowed
        print(f"floor webhook: {floor.stats or 'no report'}; {reviewed} creates sent after its "
              f"registration took effect")  # fmt: skip
        # Each of those creates passed the floor (the API server does not retry a webhook call
        # that was answered, so the counts are equal).
        ok = ok and floor.allowed == reviewed
    result["checks"] = checks
    if floor is not None:
        result["floor_webhook"] = floor.stats
    if not ok:
        print("ERROR: a create was refused, the quota's usage does not match what was admitted, "
              "or the floor did not review every create")  # fmt: skip
    result["ok"] = ok
    write_results("admission", result, figures, path=results)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--mode", action="append", choices=MODES, help="closed (default), floor, open; repeatable"
    )
    parser.add_argument("--creates", type=int, default=1000, help="closed-loop creates per side")
    parser.add_argument("--clients", type=int, default=20, help="closed-loop concurrent clients")
    parser.add_argument("--blocks", type=int, default=4, help="rotating blocks per side")
    parser.add_argument("--open-creates", type=int, default=2000, help="open-loop creates/side")
    parser.add_argument("--rate", type=float, help="open-loop creates/s (default: a fraction of "
                        "upstream's closed-loop capacity)")  # fmt: skip
    parser.add_argument("--rate-fraction", type=float, default=0.5,
                        help="open-loop rate: this of upstream's closed-loop capacity")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="of the open loop's schedule")
    parser.add_argument(
        "--floor-http1", action="store_true", help="the floor offers HTTP/1.1 only, as tally"
    )
    parser.add_argument(
        "--kopf-watch", action="store_true",
        help="also measure a Kopf pod watch alone on tally's plane (bench/_kopf_watch.py)",
    )  # fmt: skip
    parser.add_argument(
        "--results", type=Path, default=None, help="JSON to write (bench/results/admission.json)"
    )
    parser.add_argument(
        "--profile", type=Path, help="run tally under cProfile and write its profile here"
    )
    args = parser.parse_args(argv)
    modes = [mode for mode in MODES if mode in (args.mode or ["closed"])]
    run = Run(modes, args.creates, args.clients, args.blocks, args.open_creates, args.rate,
              args.rate_fraction, args.seed, args.floor_http1, args.kopf_watch)  # fmt: skip
    with contextlib.ExitStack() as stack:
        with_floor = "floor" in modes or "open" in modes
        if with_floor:
            ensure_floor()
        print("starting the control planes ...", file=sys.stderr)
        reference = stack.enter_context(control_plane("reference"))
        operator = stack.enter_context(control_plane("operator"))
        floor_plane: cluster.State | None = None
        floor: FloorWebhook | None = None
        if with_floor:
            floor_plane = stack.enter_context(control_plane("operator"))
            pki = cluster.webhook_client_pki(Path(floor_plane.dir))
            assert pki is not None, "an operator-mode control plane presents a client certificate"
            floor = FloorWebhook(
                Path(stack.enter_context(tempfile.TemporaryDirectory())), pki.ca,
                http1=args.floor_http1,
            )  # fmt: skip
            stack.callback(floor.stop)
            floor.start()
        log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tally.log"
        profile = ("-m", "cProfile", "-o", str(args.profile.resolve())) if args.profile else ()
        tally_process = operator_process.TallyProcess(
            Path(operator.kubeconfig), log, bin_dir=Path(operator.bin_dir), interpreter_args=profile
        )
        stack.callback(tally_process.kill)
        tally_process.start()
        assert tally_process.process is not None
        tally_pid = tally_process.process.pid
        kopf_watch_pid: int | None = None
        if args.kopf_watch:
            watcher = operator_process.TallyProcess(
                Path(operator.kubeconfig), log.with_name("kopf-watch.log"),
                bin_dir=Path(operator.bin_dir), entry_point=REPO / "bench" / "_kopf_watch.py",
                env={"TALLY_WEBHOOK_ENABLED": "false"},  # start() then waits for liveness only
            )  # fmt: skip
            stack.callback(watcher.kill)
            watcher.start()
            assert watcher.process is not None
            kopf_watch_pid = watcher.process.pid
        print("measuring ...", file=sys.stderr)
        sides = asyncio.run(
            measure(run, reference, operator, tally_pid, floor_plane, floor, kopf_watch_pid)
        )
        metrics = tally_metrics(tally_process.metrics_url)
        if floor is not None:
            floor.stop()
        ok = report(run, sides, metrics, floor, args.results)
        if args.profile:
            tally_process.stop()  # graceful: cProfile writes the profile on exit
            print(f"tally's profile: {args.profile}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
