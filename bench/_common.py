"""Pieces shared by the benchmarks: control planes in temporary directories (one with the
ClusterQuota CRD and tally running), API clients, raw JSON requests, bounded concurrency, closed
loops of clients, polling, percentiles, process memory, the machine line, and the writer of each
benchmark's figures (``bench/results/<name>.json`` and the picture ``bench/plot.py`` draws).

Importing this module puts ``hack/`` (``cluster``) and ``tests/e2e/`` (``operator_process``) on
``sys.path`` and re-exports both modules: the benchmarks run as plain scripts
(``.venv/bin/python bench/<name>.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

REPO = Path(__file__).resolve().parents[1]
for _extra in (REPO / "hack", REPO / "tests" / "e2e"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

import operator_process as operator_process  # noqa: E402 (re-exported for the benchmarks)

import cluster as cluster  # noqa: E402 (re-exported too)

RETRYABLE_STATUSES = frozenset({0, 429, 500, 502, 503, 504})
"""Statuses a bulk create retries (0: the connection failed): the API server sheds load with
429 and its storage layer answers 5xx under a burst; the benchmark wants the objects, not a
test of the API server's overload behaviour."""


@contextlib.contextmanager
def control_plane(
    mode: str,
    *,
    nodes: int = cluster.DEFAULT_NODES,
    kwok_pod_parallelism: int | None = None,
    extra_controller_manager_args: Sequence[str] = (),
) -> Iterator[cluster.State]:
    """A control plane in ``mode`` in a fresh temporary directory, stopped and removed after;
    with ``nodes`` simulated nodes, so the pods a benchmark creates are scheduled and run and
    every figure includes the pod events a cluster's kubelets make (``kwok_pod_parallelism``,
    ``extra_controller_manager_args``: :func:`cluster.up`'s)."""
    directory = Path(tempfile.mkdtemp(prefix=f"tally-bench-{mode}-"))
    try:
        with cluster.running(
            directory,
            mode,
            nodes=nodes,
            kwok_pod_parallelism=kwok_pod_parallelism,
            extra_controller_manager_args=extra_controller_manager_args,
        ) as state:
            yield state
    finally:
        cluster.down(directory, clean=True, quiet=True)


def kubectl(state: cluster.State, *args: str, input: str | None = None) -> str:
    """Run the control plane's own kubectl against it; its output. Raises on failure."""
    return subprocess.run(
        [str(Path(state.bin_dir) / "kubectl"), f"--kubeconfig={state.kubeconfig}", *args],
        input=input, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip


@contextlib.contextmanager
def cluster_quota_plane() -> Iterator[tuple[cluster.State, operator_process.TallyProcess]]:
    """An operator-mode control plane with the ClusterQuota CRD applied and tally running as a
    subprocess (as the e2e tests run it, its webhook registered), all stopped and removed after.

    If the block fails, the tail of tally's log goes to stderr first: the log lives in a
    temporary directory that is removed with it.
    """
    with contextlib.ExitStack() as stack:
        print("starting an operator-mode control plane ...", file=sys.stderr, flush=True)
        state = stack.enter_context(control_plane("operator"))
        for crd in ("clusterquotas.tally.dev.yaml", "appliedclusterquotas.tally.dev.yaml"):
            kubectl(state, "apply", "-f", str(REPO / "crds" / crd))
        log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tally.log"
        tally = operator_process.TallyProcess(
            Path(state.kubeconfig), log, bin_dir=Path(state.bin_dir)
        )
        stack.callback(tally.kill)
        tally.start()
        try:
            yield state, tally
        except BaseException:
            print(f"--- tally's log (tail) ---\n{tally.log_text()}", file=sys.stderr)
            raise


async def api_client(kubeconfig: str, *, pool: int = 100) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


class Raw:
    """JSON requests through kubernetes-asyncio's aiohttp session, without its models.

    Building and parsing ``V1Pod`` models costs the client more CPU than the API server spends
    on a create; on a 2-core machine shared with the API server that would measure the client.
    Non-2xx answers raise ``client.ApiException`` as the generated API does.
    """

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.host = api.configuration.host

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        request_timeout: float = 60.0,
    ) -> dict[str, Any]:
        response = await self.api.rest_client.request(
            method,
            self.host + path,
            query_params=query,
            headers={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            _request_timeout=request_timeout,
        )
        return dict(json.loads(response.data))

    async def list_all(
        self, path: str, *, page: int = 500, query: list[tuple[str, str]] | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a collection, read in pages of ``page``."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = [*(query or []), ("limit", str(page))]
            if token:
                params.append(("continue", token))
            answer = await self.call("GET", path, query=params)
            items.extend(answer.get("items") or [])
            token = (answer.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    async def create(self, path: str, body: dict[str, Any], *, attempts: int = 8) -> None:
        """POST ``body``; retries overload answers; an object already there (from an attempt
        whose answer was lost) counts as created."""
        await self._retrying("POST", path, body, "application/json", attempts, ok={409})

    async def merge_patch(self, path: str, body: dict[str, Any], *, attempts: int = 8) -> None:
        await self._retrying("PATCH", path, body, "application/merge-patch+json", attempts)

    async def _retrying(
        self,
        method: str,
        path: str,
        body: dict[str, Any],
        content_type: str,
        attempts: int,
        ok: frozenset[int] | set[int] = frozenset(),
    ) -> None:
        for attempt in range(attempts):
            try:
                await self.call(method, path, body, content_type=content_type)
                return
            except client.ApiException as error:
                if error.status in ok and attempt > 0:
                    return
                if error.status not in RETRYABLE_STATUSES or attempt == attempts - 1:
                    raise
            except (OSError, TimeoutError):
                if attempt == attempts - 1:
                    raise
            await asyncio.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))


async def bounded(
    jobs: Iterable[Callable[[], Awaitable[None]]],
    concurrency: int,
    *,
    label: str = "",
    total: int | None = None,
) -> float:
    """Run every job with at most ``concurrency`` in flight; returns the seconds it took.

    Progress goes to stderr every ~5 s when ``label`` is given. The first failure cancels the
    rest and is raised.
    """
    iterator = iter(jobs)
    done = 0
    started = time.perf_counter()
    last_report = started

    async def worker() -> None:
        nonlocal done, last_report
        for job in iterator:
            await job()
            done += 1
            now = time.perf_counter()
            if label and now - last_report > 5.0:
                last_report = now
                of = f"/{total}" if total else ""
                rate = done / (now - started)
                print(f"  {label}: {done}{of} ({rate:.0f}/s)", file=sys.stderr, flush=True)

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    elapsed = time.perf_counter() - started
    if label:
        print(f"  {label}: {done} in {elapsed:.1f} s ({done / elapsed:.0f}/s)", file=sys.stderr,
              flush=True)  # fmt: skip
    return elapsed


class Background:
    """A coroutine (``_run``) kept running as a task from :meth:`start` until :meth:`stop`: the
    watches a benchmark keeps open beside its load."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@dataclass
class Loop:
    """What :func:`closed_loop` saw."""

    latencies: list[float]
    """Seconds from sending each admitted request to its answer."""
    wall_s: float
    refusals: list[str]
    """``<status>: <message>`` of each request answered with an error."""

    def summary(self) -> dict[str, float]:
        """Admitted requests, their rate over the loop's wall time, p50 and p99."""
        return {
            "creates": len(self.latencies),
            "throughput_per_s": len(self.latencies) / self.wall_s,
            "p50_ms": statistics.median(self.latencies) * 1000,
            "p99_ms": percentile(self.latencies, 0.99) * 1000,
        }


async def closed_loop(count: int, clients: int, send: Callable[[int], Awaitable[object]]) -> Loop:
    """``send(0)`` … ``send(count - 1)`` from ``clients`` clients, each sending its next request
    as soon as the previous one is answered (a closed loop: the rate is what the server
    sustains, not what the clients offer). An ``ApiException`` is recorded as a refusal."""
    latencies: list[float] = []
    refusals: list[str] = []
    issued = 0

    async def one_client() -> None:
        nonlocal issued
        while issued < count:
            index = issued
            issued += 1
            started = time.perf_counter()
            try:
                await send(index)
            except client.ApiException as error:
                try:
                    message = json.loads(error.body or "{}").get("message", error.body)
                except ValueError:
                    message = error.body
                refusals.append(f"{error.status}: {message}")
                continue
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(clients):
            group.create_task(one_client())
    return Loop(latencies, time.perf_counter() - started, refusals)


async def until(
    raw: Raw, path: str, done: Callable[[dict[str, Any]], bool], what: str, *,
    within: float = 120.0, interval: float = 0.05,
) -> float:  # fmt: skip
    """Poll ``GET path`` until ``done(answer)`` (an error answer counts as not done); the
    seconds it took. Raises ``RuntimeError`` naming ``what`` after ``within`` seconds."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(client.ApiException):
            if done(await raw.call("GET", path)):
                return time.monotonic() - started
        if time.monotonic() - started > within:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def memory_of(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes: resident memory now and its peak."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    after_name = stat[stat.rindex(")") + 2 :].split()
    # Fields 14 and 15 (utime, stime) of proc(5), counted from 1 with pid and comm first.
    return (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK")


def mib(value: float) -> str:
    return f"{value / 2**20:.0f} MiB"


def machine() -> str:
    """One line about where the numbers were taken."""
    total = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"nproc={os.cpu_count()}, memory {total / 2**30:.1f} GiB, load average {load} "
        f"(shared machine), python {platform.python_version()}, "
        f"Kubernetes {cluster.kubernetes_version()}, {platform.machine()}"
    )


RESULTS = REPO / "bench" / "results"


@dataclass(frozen=True)
class Figure:
    """One number a benchmark reports, beside the number it is judged against."""

    name: str
    """What is measured, e.g. "throughput", "p99 latency", "CPU per create"."""
    unit: str
    """e.g. "creates/s", "ms"."""
    tally: float
    reference: float | None
    """The figure tally is compared with (upstream, or the floor); None when there is none."""
    reference_name: str = "upstream"
    better: str = "lower"
    """"lower" or "higher": which way is better, for the picture."""
    target: str | None = None
    """The target as docs/performance.md states it, e.g. "<= 1.2x"."""


def write_results(
    name: str, result: dict[str, Any], figures: Sequence[Figure], *, path: Path | None = None
) -> Path:
    """Write ``bench/results/<name>.json`` (or ``path``): the benchmark's name, the time, the
    machine line, its figures and every key of ``result`` (which may override ``machine``: a
    benchmark that records the machine line as it starts keeps that one); then draw the
    picture beside it (``.png``, ``bench/plot.py``). Returns the JSON's path."""
    import plot  # bench/plot.py: matplotlib is imported only when a benchmark writes

    target = path or RESULTS / f"{name}.json"
    document: dict[str, Any] = {
        "benchmark": name,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "figures": [asdict(figure) for figure in figures],
        **result,
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    plot.draw(document, target.with_suffix(".png"))
    print(f"figures: {target}, {target.with_suffix('.png')}", file=sys.stderr)
    return target
