"""Benchmark: tally's start-up at scale — 1 000 namespaces, 10 000 pods, 1 000 quotas.

Two control planes, one after the other (each in a temporary directory, stopped afterwards):

* **reference** (upstream quota): namespaces, pods (cpu/memory requests; the plane's simulated
  kubelets run them all, then a fifth are made Succeeded or Failed), configmaps, then one quota
  per namespace (what each must show: from a LIST of the pods, checked against the input) —
  created after the pods, so kube-controller-manager's resourcequota controller computes every
  usage from its caches. Measured: time from the first quota create until every quota is
  correct, and kube-controller-manager's RSS once they are (pid from the control plane's
  ``state.json``). Both planes have enough simulated nodes to run every pod.
* **operator** (tally is the quota system): the same objects, created while tally is *not*
  running (no webhook, so nothing is charged and no status is written). Then tally starts
  (``kopf run operator/main.py``, the command the e2e tests use) and the benchmark measures,
  from the moment the process is spawned: its liveness answering, its "caches synced" log
  line, every quota correct (``status.used`` numerically equal, for every name in
  ``spec.hard``, to what was created — checked by paged LISTs of resourcequotas), its webhook
  configuration registered, and when its CPU use first went quiet (Kopf's initial listing done).
  tally's RSS is read from ``/proc`` at convergence and ``--settle`` seconds after its start
  (default 60 s: after the one re-list of every kind that tally's informers make ~30 s in),
  with its peak.

Also measured, on the operator plane (as the Deployment runs tally: leader election on, the
ClusterQuota and AppliedClusterQuota kinds installed):

* **ready**: when ``/readyz`` first answered 200 (``tally.app.readiness``);
* **one ClusterQuota over every namespace** (created, with the per-namespace quota's names,
  before tally starts): when its ``status.total.used`` equals the sums over every namespace;
* **creates while starting** (``bench/scale_startup.py``): configmap creates at 10/s, open
  loop, into a namespace of their own whose quota counts them (its status written before
  tally starts, as a quota system that ran before would have left it), from the spawn until
  the memory is read; p50/p99 of those sent between the webhook's registration and ready, and
  of those sent once ready (what reviews see when a Service sends them only to ready
  replicas; the local planes' webhook is a URL, so the API server calls the replica before it
  is ready too). Upstream's, at the same rate, from its first quota create until
  ``PROBE_TAIL_S`` after its quotas are correct;
* **takeover** (``--takeover``, the default): a follower is started once the memory is read
  and is waited for until ready; then the leader is killed (SIGKILL: no Lease released, as a
  lost node), a pod is deleted at once, and the benchmark times the follower's "acquired
  lease" and its first status of that pod's quota that shows the deletion.

Every run adds its row to ``bench/results/scale-series.json`` and redraws the series' picture
(``bench/scale_series.py``).

"Correct" is computed from what the benchmark created: ``pods`` counts the non-terminal pods,
``count/pods`` every pod, ``requests.cpu``/``requests.memory`` sum the non-terminal pods'
requests, ``count/configmaps`` the configmaps created plus the ``kube-root-ca.crt`` one that
kube-controller-manager publishes into every namespace (its presence is checked first).

Prints the times, the memory, the ratios to the targets (convergence <= 30 s up to 30 000 pods,
<= 60 s above, up to upstream's envelope of 150 000; RSS <= kube-controller-manager's), the
input sizes and the machine, and writes the figures as JSON and a picture beside it
(``bench/results/scale.json``, ``.png``). Creates run with ``--concurrency`` requests in flight
(retrying the API server's overload answers).

Run: ``.venv/bin/python bench/scale.py [--namespaces 1000] [--pods 10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

import scale_series
import scale_startup
from _common import (
    REPO,
    Figure,
    Raw,
    api_client,
    bounded,
    cluster,
    control_plane,
    cpu_seconds,
    kubectl,
    machine,
    memory_of,
    mib,
    operator_process,
    write_results,
)
from scale_startup import CLUSTER_QUOTAS_PATH, CreateProbe, Window, window
from tally.app.settings import Settings
from tally.quota.quantity import Quantity, parse_quantity

TARGET_CONVERGENCE_S = 30.0
"""Every quota correct after tally's spawn, up to :data:`TARGET_CONVERGENCE_UP_TO_PODS` pods."""
TARGET_CONVERGENCE_UP_TO_PODS = 30_000
TARGET_CONVERGENCE_ENVELOPE_S = 60.0
"""The bound above that many pods, up to upstream's envelope (150 000 pods, 10 000 namespaces)."""
TIMEOUT_S = 300.0
POLL_S = 0.5
QUIET_CPU_FRACTION = 0.10
"""tally counts as quiet once a 2 s window used less than this share of one core."""
QUIET_WINDOW_S = 2.0
QUIET_LIMIT_S = 90.0
PROBE_TAIL_S = 10.0
"""Upstream's creates are probed until this long after its quotas are all correct."""
PROBE_AFTER_READY_S = 30.0
"""tally's creates are probed at least this long after it reported ready (300 creates)."""
TARGET_PROBE_RATIO = 2.0
"""tally's create p99 once ready, during its start-up, against upstream's during its own."""
TARGET_TAKEOVER_S = 10.0
"""From the new leader's lease to its first correct quota status."""
READY_LIMIT_S = 900.0
CLUSTER_HARD = {
    "pods": "10M",
    "count/pods": "10M",
    "requests.cpu": "1M",
    "requests.memory": "1Pi",
    "count/configmaps": "10M",
}
CRDS = ("clusterquotas.tally.dev.yaml", "appliedclusterquotas.tally.dev.yaml")
LEADER_ELECTION = {"TALLY_LEADER_ELECTION": "true"}
"""As the Deployment runs tally: the takeover needs a Lease, and the first replica takes it at
once (there is no holder)."""
CONFIGMAPS_PER_NAMESPACE = 2
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
QUOTA = "q"
IMAGE = "registry.example/app:1"
CPU_MILLI = (100, 250, 500, 1000)
MEMORY_MI = (64, 128, 256)
SIDECAR = {"cpu_milli": 50, "memory_mi": 32}
NODE_CPU_CORES = 1000
"""A simulated node's cpu capacity (kwok's default, ``hack/cluster.py``); its memory (1Ti) and
pods (1M) are never what runs out first here."""
HARD = {
    "pods": "1k",
    "count/pods": "1k",
    "requests.cpu": "1k",
    "requests.memory": "1Ti",
    "count/configmaps": "1k",
}
RESULTS_JSON = scale_series.RESULTS / "scale.json"
WEBHOOK_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/tally.dev"


# --------------------------------------------------------------------------------------------
# The input and what every quota must show for it


@dataclasses.dataclass(frozen=True)
class PodShape:
    namespace: str
    name: str
    cpu_milli: int
    memory_mi: int
    sidecar: bool
    phase: str
    """"Succeeded" or "Failed" (set once the plane's kubelets run it), else "Pending" or
    "Running": either way the simulated kubelets run it."""

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def body(self) -> dict[str, Any]:
        containers = [_container("app", self.cpu_milli, self.memory_mi)]
        if self.sidecar:
            containers.append(_container("sidecar", SIDECAR["cpu_milli"], SIDECAR["memory_mi"]))
        return {
            "metadata": {"name": self.name, "labels": {"app": "scale", "tier": self.name[-1]}},
            "spec": {"containers": containers},
        }


def _container(name: str, cpu_milli: int, memory_mi: int) -> dict[str, Any]:
    requests = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mi}Mi"}
    return {"name": name, "image": IMAGE, "resources": {"requests": requests}}


@dataclasses.dataclass(frozen=True)
class Input:
    namespaces: list[str]
    pods: list[PodShape]

    @classmethod
    def build(cls, namespaces: int, pods: int) -> Input:
        names = [f"scale-{index:04d}" for index in range(namespaces)]
        shapes = []
        for index in range(pods):
            # Round-robin over the namespaces; ``slot`` is the pod's place within its namespace.
            ns, slot = index % namespaces, index // namespaces
            phase = {7: "Running", 8: "Succeeded", 9: "Failed"}.get((slot + ns) % 10, "Pending")
            shapes.append(
                PodShape(
                    namespace=names[ns],
                    name=f"p-{index:05d}",
                    cpu_milli=CPU_MILLI[index % len(CPU_MILLI)],
                    memory_mi=MEMORY_MI[(index // 3) % len(MEMORY_MI)],
                    sidecar=index % 5 == 0,
                    phase=phase,
                )
            )
        return cls(names, shapes)

    def nodes(self) -> int:
        """Simulated nodes enough to run every pod: each has kwok's default capacity
        (``NODE_CPU_CORES``), with a fifth to spare; the scheduler leaves pods Pending past
        it."""
        milli = sum(
            pod.cpu_milli + (SIDECAR["cpu_milli"] if pod.sidecar else 0) for pod in self.pods
        )
        return max(cluster.DEFAULT_NODES, math.ceil(milli * 1.2 / (NODE_CPU_CORES * 1000)))

    def expected(self) -> dict[str, dict[str, Quantity]]:
        """namespace -> the ``status.used`` its quota must show, by hand from the input."""
        counts = {ns: {"pods": 0, "count": 0, "cpu": 0, "memory": 0} for ns in self.namespaces}
        for pod in self.pods:
            tally = counts[pod.namespace]
            tally["count"] += 1
            if pod.terminal:
                continue
            tally["pods"] += 1
            tally["cpu"] += pod.cpu_milli + (SIDECAR["cpu_milli"] if pod.sidecar else 0)
            tally["memory"] += pod.memory_mi + (SIDECAR["memory_mi"] if pod.sidecar else 0)
        return _expected_from(counts)


def _expected_from(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, Quantity]]:
    return {
        ns: {
            "pods": Quantity.from_int(c["pods"]),
            "count/pods": Quantity.from_int(c["count"]),
            "requests.cpu": Quantity.from_milli(c["cpu"]),
            "requests.memory": Quantity.from_int(c["memory"] * 2**20),
            "count/configmaps": Quantity.from_int(CONFIGMAPS_PER_NAMESPACE + 1),
        }
        for ns, c in counts.items()
    }


def quota_correct(quota: dict[str, Any], expected: dict[str, dict[str, Quantity]]) -> bool:
    namespace = quota["metadata"]["namespace"]
    want = expected.get(namespace)
    if want is None or quota["metadata"]["name"] != QUOTA:
        return False
    used = (quota.get("status") or {}).get("used") or {}
    for name, value in want.items():
        text = used.get(name)
        if text is None:
            return False
        try:
            if parse_quantity(text) != value:
                return False
        except ValueError:
            return False
    return True


# --------------------------------------------------------------------------------------------
# Creating it


async def populate(raw: Raw, data: Input, concurrency: int) -> dict[str, float]:
    """Namespaces, pods (and their phases), configmaps. Returns seconds per step."""
    steps: dict[str, float] = {}

    def create(path: str, body: dict[str, Any]) -> Callable[[], Awaitable[None]]:
        return lambda: raw.create(path, body)

    steps["namespaces"] = await bounded(
        (
            create(
                "/api/v1/namespaces",
                {"metadata": {"name": ns, "labels": {scale_startup.MEMBER_LABEL: "true"}}},
            )
            for ns in data.namespaces
        ),
        concurrency,
        label="namespaces",
        total=len(data.namespaces),
    )
    # Pods are refused until the namespace's default service account exists.
    started = time.perf_counter()
    await _wait_for_each_namespace(raw, data, "/api/v1/serviceaccounts", "default", "accounts")
    steps["service accounts"] = time.perf_counter() - started

    pod_jobs = (create(f"/api/v1/namespaces/{p.namespace}/pods", p.body()) for p in data.pods)
    configmap_jobs = (
        create(
            f"/api/v1/namespaces/{ns}/configmaps",
            {"metadata": {"name": f"cm-{index}"}, "data": {"key": "value" * 20}},
        )
        for ns in data.namespaces
        for index in range(CONFIGMAPS_PER_NAMESPACE)
    )
    steps["pods"] = await bounded(pod_jobs, concurrency, label="pods", total=len(data.pods))
    steps["configmaps"] = await bounded(
        configmap_jobs,
        concurrency,
        label="configmaps",
        total=len(data.namespaces) * CONFIGMAPS_PER_NAMESPACE,
    )
    # The plane's simulated kubelets run every pod (kwok's pod-ready, from Pending only): a
    # terminal phase is set once they have, or their Running would overwrite it.
    started = time.perf_counter()
    await _wait_until_none_pending(raw, limit_s=max(1800.0, len(data.pods) / KWOK_FLOOR_PER_S))
    steps["pods running"] = time.perf_counter() - started
    phased = [pod for pod in data.pods if pod.terminal]
    steps["pod phases"] = await bounded(
        (
            (
                lambda pod=pod: raw.merge_patch(
                    f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
                    {"status": {"phase": pod.phase}},
                )
            )
            for pod in phased
        ),
        concurrency,
        label="pod phases",
        total=len(phased),
    )
    started = time.perf_counter()
    await _wait_for_each_namespace(
        raw, data, "/api/v1/configmaps", ROOT_CA_CONFIGMAP, "root CA configmaps"
    )
    steps["root CA configmaps"] = time.perf_counter() - started
    return steps


KWOK_POD_PARALLELISM = 32
"""Pods kwok moves through a stage at once on the benchmark's planes (kwok's default is 4). A
pod's start is one request to the API server, whose latency grows with the cluster: with 4, kwok
ran about 50 pods a second with 100 000 of 150 000 still Pending. 6 000 pods bound to one new
node ran in 17.4 s with 4 and 12.3 s with 32 on a small plane (2026-11-28)."""

KEEP_TERMINATED_PODS = ("--terminated-pod-gc-threshold=0",)
"""Both planes' kube-controller-manager keeps every terminated pod. Its pod garbage collector
deletes the oldest once there are more than 12 500 (its default threshold), and the input's
terminal fifth is 30 000 at 150 000 pods: a run there found the planes' pods differing from
the input in 8 771 of 10 000 namespaces before any quota was created."""

KWOK_FLOOR_PER_S = 25.0
"""The slowest pace at which kwok is waited for to run the pods (it ran about 50/s with 100 000
of 150 000 still Pending on this machine), before the benchmark gives up."""
PENDING_PROGRESS_S = 30.0


async def _wait_until_none_pending(raw: Raw, limit_s: float) -> None:
    """Until kwok has run every pod. Each poll asks for one Pending pod: listing all of them
    every time (100 000 at 150 000 pods, hundreds of megabytes of JSON) kept the API server and
    this process busy, slowing the kwok it waits for. Progress is a Pending pod's name now and
    then."""
    started = time.monotonic()
    said = started
    query = [("fieldSelector", "status.phase=Pending"), ("limit", "1")]
    while True:
        items = (await raw.call("GET", "/api/v1/pods", query=query)).get("items") or []
        if not items:
            return
        now = time.monotonic()
        if now - started > limit_s:
            raise RuntimeError(f"pods still Pending after {limit_s:.0f} s")
        if now - said >= PENDING_PROGRESS_S:
            said = now
            meta = items[0]["metadata"]
            print(f"  pods running: {meta['namespace']}/{meta['name']} still Pending after "
                  f"{now - started:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
        await asyncio.sleep(2.0)


async def truth(raw: Raw, data: Input) -> dict[str, dict[str, Quantity]]:
    """namespace -> the ``status.used`` its quota must show, from a LIST of the pods as they
    are (their phase as the plane has it); it must equal what the input meant, or the plane
    changed a phase under the benchmark."""
    counts = {ns: {"pods": 0, "count": 0, "cpu": 0, "memory": 0} for ns in data.namespaces}
    for pod in await raw.list_all("/api/v1/pods"):
        namespace = pod["metadata"]["namespace"]
        if namespace not in counts:
            continue
        tally = counts[namespace]
        tally["count"] += 1
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        tally["pods"] += 1
        for container in pod["spec"]["containers"]:
            requests = (container.get("resources") or {}).get("requests") or {}
            tally["cpu"] += parse_quantity(requests.get("cpu", "0")).milli_value()
            tally["memory"] += parse_quantity(requests.get("memory", "0")).value() // 2**20
    listed = _expected_from(counts)
    intended = data.expected()
    if listed != intended:
        differing = sorted(ns for ns in intended if listed.get(ns) != intended[ns])
        raise RuntimeError(f"the pods as listed differ from the input in {len(differing)} "
                           f"namespaces (first: {differing[:3]})")  # fmt: skip
    return listed


async def _wait_for_each_namespace(
    raw: Raw, data: Input, path: str, name: str, what: str, limit_s: float = 180.0
) -> None:
    wanted = set(data.namespaces)
    deadline = time.monotonic() + limit_s
    while True:
        items = await raw.list_all(path, query=[("fieldSelector", f"metadata.name={name}")])
        missing = wanted - {item["metadata"]["namespace"] for item in items}
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} namespaces still lack their {what}")
        await asyncio.sleep(1.0)


async def create_quotas(raw: Raw, data: Input, concurrency: int) -> float:
    body = {"metadata": {"name": QUOTA}, "spec": {"hard": HARD}}
    return await bounded(
        (
            (lambda ns=ns: raw.create(f"/api/v1/namespaces/{ns}/resourcequotas", body))
            for ns in data.namespaces
        ),
        concurrency,
        label="quotas",
        total=len(data.namespaces),
    )


async def correct_quotas(raw: Raw, expected: dict[str, dict[str, Quantity]]) -> int:
    quotas = await raw.list_all("/api/v1/resourcequotas")
    return sum(1 for quota in quotas if quota_correct(quota, expected))


async def wait_converged(
    raw: Raw, expected: dict[str, dict[str, Quantity]], started: float, what: str
) -> float:
    """Poll until every quota is correct; seconds since ``started`` (perf_counter)."""
    last_report = 0.0
    while True:
        correct = await correct_quotas(raw, expected)
        now = time.perf_counter()
        if correct == len(expected):
            return now - started
        if now - started > TIMEOUT_S:
            raise RuntimeError(f"{what}: only {correct}/{len(expected)} quotas correct after "
                               f"{TIMEOUT_S:.0f} s")  # fmt: skip
        if now - last_report > 5.0:
            last_report = now
            print(f"  {what}: {correct}/{len(expected)} quotas correct at "
                  f"{now - started:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
        await asyncio.sleep(POLL_S)


# --------------------------------------------------------------------------------------------
# The two sides


@dataclasses.dataclass
class ReferenceResult:
    populate: dict[str, float]
    quota_creates_s: float
    convergence_s: float
    kcm_rss: int
    kcm_peak: int
    probe: Window
    """Creates sent from the first quota create until PROBE_TAIL_S after convergence."""


@dataclasses.dataclass
class Takeover:
    """A follower started once the leader's start-up was over; then the leader killed
    (SIGKILL, as a lost node: no Lease released), one pod deleted at once, and the follower's
    first status of that pod's quota that shows the deletion."""

    follower_ready_s: float | None
    """From the follower's spawn to its ``/readyz`` 200."""
    lease_s: float | None
    """From the kill to the follower's "acquired lease" (the Lease's duration must pass)."""
    correct_s: float | None
    """From the kill to the quota's correct status."""

    @property
    def after_lease_s(self) -> float | None:
        if self.lease_s is None or self.correct_s is None:
            return None
        return self.correct_s - self.lease_s


@dataclasses.dataclass
class OperatorResult:
    populate: dict[str, float]
    liveness_s: float | None = None
    caches_synced_s: float | None = None
    convergence_s: float | None = None
    webhook_s: float | None = None
    quiet_s: float | None = None
    rss_at_convergence: int = 0
    rss: int = 0
    peak: int = 0
    cpu_to_convergence_s: float = 0.0
    cpu_to_quiet_s: float = 0.0
    cpu_total_s: float = 0.0
    settled_s: float = 0.0
    relists: int = 0
    """Informer re-lists that reconciled changes (logged by tally)."""
    ready_s: float | None = None
    """``/readyz`` first answered 200."""
    readiness_reasons: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    """(seconds since start, ``/readyz``'s answer) each time the answer's words changed (its
    figures left out), until ready: what held readiness, and for how long."""
    ready_how: str = ""
    """How tally's log says it became ready (prompt loop, or the timeout's warning)."""
    lease_s: float | None = None
    cluster_quota_s: float | None = None
    """The ClusterQuota over every namespace showed every namespace's sums."""
    probe_before_ready: Window | None = None
    """Creates sent after the webhook was registered and before tally reported ready: what a
    replica would answer were reviews sent to it before it is ready."""
    probe_after_ready: Window | None = None
    """Creates sent once tally reported ready, until the memory was read."""
    probe_unjudged: int = 0
    """Creates sent before the webhook was registered (nothing judged them)."""
    takeover: Takeover | None = None
    samples: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    """(seconds since start, CPU seconds used, RSS) every ~0.5 s."""
    syncs: str = ""
    """The quota syncs counted when the run ended (the metric's count and sum)."""
    syncs_in_startup: str = ""
    """The same, read last before the first periodic resync could begin (``startup_syncs``)."""


RESYNC_PERIOD_S: float = Settings.model_fields["resync_period"].default
"""tally's ``TALLY_RESYNC_PERIOD`` at its default (the benchmark's tally keeps it): every quota
is synced again this long after the controllers start, and that pass is not the start-up's."""
RESYNC_MARGIN_S = 10.0
"""The start-up's sync count is read until this long before the first resync is due."""
SYNCS_READ_S = 5.0


def startup_syncs(
    final: str, sampled: str, lease_s: float | None, end_s: float, period: float = RESYNC_PERIOD_S
) -> str:
    """The start-up's sync count: the final one if the run ended before the first periodic
    resync could begin (the controllers start at the lease), else the last one read before."""
    if lease_s is None or end_s < lease_s + period - RESYNC_MARGIN_S:
        return final
    return sampled


async def run_reference(state: cluster.State, data: Input, concurrency: int) -> ReferenceResult:
    api = await api_client(state.kubeconfig)
    raw = Raw(api)
    try:
        probe = CreateProbe(raw)
        await probe.prepare(write_status=False)  # upstream's controller computes its status
        steps = await populate(raw, data, concurrency)
        expected = await truth(raw, data)
        started = time.perf_counter()
        stop = asyncio.Event()
        probing = asyncio.create_task(probe.run(started, stop))
        creates = await create_quotas(raw, data, concurrency)
        convergence = await wait_converged(raw, expected, started, "upstream")
        await asyncio.sleep(PROBE_TAIL_S)  # also lets the controller settle before the memory
        stop.set()
        await probing
        rss, peak = memory_of(state.pids["kube-controller-manager"])
        return ReferenceResult(
            steps, creates, convergence, rss, peak, window(probe.creates, 0.0, math.inf)
        )
    finally:
        await api.close()


class Tally(operator_process.TallyProcess):
    """tally as the e2e tests start it (``TallyProcess``: under its ServiceAccount's token and
    the manifests' RBAC, as deployed), observed from asyncio: the benchmark needs the moments
    of each start-up step, timed from the spawn (:meth:`spawn`, once :meth:`prepare` has
    granted the roles and made the token)."""

    def log_has(self, pattern: str) -> bool:
        try:
            return re.search(pattern, self.log.read_text(errors="replace")) is not None
        except OSError:
            return False

    def metrics(self, *prefixes: str) -> list[str]:
        """The values of the samples whose names start with each prefix, from one read of
        ``/metrics`` (a busy start-up's loop answers slowly: one read, not one per prefix);
        ``?`` for each when it did not answer."""
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(self.metrics_url, timeout=5) as response,
        ):
            lines = response.read().decode().splitlines()
            return [
                " ".join(line.split()[-1] for line in lines if line.startswith(prefix))
                for prefix in prefixes
            ]
        return ["?" for _ in prefixes]

    def readiness(self) -> str | None:
        """What ``/readyz`` answers (``ok``, or why not yet); None when it did not answer."""
        if not self.readiness_url:
            return None
        try:
            with urllib.request.urlopen(self.readiness_url, timeout=2) as response:
                return response.read().decode(errors="replace").strip()
        except urllib.error.HTTPError as error:  # 503: not ready, and why
            return error.read().decode(errors="replace").strip()
        except OSError:
            return None

    def ready_how(self) -> str:
        """The log's line saying how the replica became ready, from ``ready``."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        found = re.search(r"\b(ready(: the| with| without)[^\n]*)", text)
        return found.group(1) if found is not None else ""


async def run_operator(
    state: cluster.State,
    data: Input,
    concurrency: int,
    tally: Tally,
    settle_s: float,
    *,
    takeover: bool,
) -> OperatorResult:
    api = await api_client(state.kubeconfig)
    raw = Raw(api)
    try:
        steps = await populate(raw, data, concurrency)
        await create_quotas(raw, data, concurrency)
        for crd in CRDS:
            kubectl(state, "apply", "-f", str(REPO / "crds" / crd))
        kubectl(state, "wait", "--for=condition=Established", "--timeout=60s",
                *(f"crd/{crd.removesuffix('.yaml')}" for crd in CRDS))  # fmt: skip
        await raw.create(CLUSTER_QUOTAS_PATH, scale_startup.cluster_quota_body(CLUSTER_HARD))
        expected = await truth(raw, data)
        if await correct_quotas(raw, expected):
            raise RuntimeError("quotas are correct before tally started: nothing to measure")
        probe = CreateProbe(raw)
        await probe.prepare(write_status=True)
        result = OperatorResult(steps)
        print("starting tally ...", file=sys.stderr, flush=True)
        await asyncio.to_thread(tally.prepare)  # the roles and the token: before the clock
        started = time.perf_counter()
        pid = tally.spawn().pid
        stop = asyncio.Event()
        probing = asyncio.create_task(probe.run(started, stop))
        totals = scale_startup.cluster_totals(expected)
        watcher = asyncio.create_task(_observe_startup(tally, raw, pid, started, result, totals))
        try:
            result.convergence_s = await wait_converged(raw, expected, started, "tally")
            result.rss_at_convergence = memory_of(pid)[0]
            result.cpu_to_convergence_s = cpu_seconds(pid)
            await _wait_quiet(tally, pid, started, result)
            result.cpu_to_quiet_s = cpu_seconds(pid)
            # tally's informers re-list each kind once, ~30 s after start-up (see the report):
            # memory is read after that, not at the first quiet moment.
            await asyncio.sleep(max(0.0, started + settle_s - time.perf_counter()))
            while result.ready_s is None or result.cluster_quota_s is None:
                if time.perf_counter() - started > READY_LIMIT_S or not tally.running:
                    break
                await asyncio.sleep(0.5)
            if result.ready_s is not None:
                # Creates once ready, enough of them for a p99.
                await asyncio.sleep(
                    max(0.0, started + result.ready_s + PROBE_AFTER_READY_S - time.perf_counter())
                )
        finally:
            stop.set()
            await probing
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        end = time.perf_counter() - started
        registered = result.webhook_s if result.webhook_s is not None else math.inf
        ready = result.ready_s if result.ready_s is not None else math.inf
        result.probe_unjudged = window(probe.creates, 0.0, registered).creates
        result.probe_before_ready = window(probe.creates, registered, ready)
        result.probe_after_ready = window(probe.creates, ready, end)
        if not tally.running:
            raise RuntimeError(f"tally exited during the run; log: {tally.log}")
        result.rss, result.peak = memory_of(pid)
        result.cpu_total_s = cpu_seconds(pid)
        result.settled_s = time.perf_counter() - started
        result.relists = len(
            re.findall(
                r"re-list reconciled|the start-up re-list applied",
                tally.log.read_text(errors="replace"),
            )
        )
        result.syncs = _syncs(tally) or "? (/metrics did not answer)"
        result.syncs_in_startup = startup_syncs(
            result.syncs, result.syncs_in_startup, result.lease_s, result.settled_s
        )
        if takeover:
            result.takeover = await measure_takeover(raw, tally, data)
        return result
    finally:
        await api.close()


def _syncs(tally: Tally) -> str | None:
    return syncs_reading(
        *tally.metrics(
            "tally_resourcequota_sync_duration_seconds_count",
            "tally_resourcequota_sync_duration_seconds_sum",
        )
    )


def syncs_reading(count: str, total: str) -> str | None:
    """The quota syncs as read from tally's metrics; None when they could not be read (``?``:
    ``/metrics`` did not answer, as a busy start-up's loop may not within the read's time)."""
    try:
        return f"{float(count):.0f} syncs, {float(total):.2f} s in total"
    except ValueError:
        return None


async def measure_takeover(raw: Raw, leader: Tally, data: Input) -> Takeover:
    follower = Tally(
        leader.kubeconfig,
        leader.log.with_name("follower.log"),
        bin_dir=leader.bin_dir,
        env=LEADER_ELECTION,
    )
    try:
        print("takeover: starting a follower ...", file=sys.stderr, flush=True)
        spawned = time.perf_counter()
        follower.spawn()
        ready_s: float | None = None
        while time.perf_counter() - spawned < READY_LIMIT_S and follower.running:
            if await asyncio.to_thread(follower.ready):
                ready_s = time.perf_counter() - spawned
                break
            await asyncio.sleep(0.5)
        if ready_s is None:
            return Takeover(None, None, None)
        pod = next(p for p in data.pods if not p.terminal)
        after = Input(data.namespaces, [p for p in data.pods if p is not pod]).expected()
        want = {pod.namespace: after[pod.namespace]}
        if not leader.running:
            # It exited by itself (its log says why): no takeover to time.
            print(f"takeover: the leader exited before the kill; log: {leader.log}",
                  file=sys.stderr, flush=True)  # fmt: skip
            return Takeover(ready_s, None, None)
        print("takeover: killing the leader ...", file=sys.stderr, flush=True)
        assert leader.process is not None
        leader.process.kill()
        killed = time.perf_counter()
        await raw.call(
            "DELETE",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            {"gracePeriodSeconds": 0},
        )
        lease_s = correct_s = None
        quota_path = f"/api/v1/namespaces/{pod.namespace}/resourcequotas/{QUOTA}"
        while time.perf_counter() - killed < TIMEOUT_S and correct_s is None:
            now = time.perf_counter() - killed
            if lease_s is None and follower.log_has(r"acquired lease"):
                lease_s = now
            if quota_correct(await raw.call("GET", quota_path), want):
                correct_s = now
            await asyncio.sleep(0.1)
        return Takeover(ready_s, lease_s, correct_s)
    finally:
        follower.kill()


async def _observe_startup(
    tally: Tally,
    raw: Raw,
    pid: int,
    started: float,
    result: OperatorResult,
    totals: dict[str, Quantity],
) -> None:
    """Record when each start-up step became visible, and sample CPU and memory (and the
    quota syncs until the first periodic resync is near)."""
    syncs_read_at = -math.inf
    while True:
        now = time.perf_counter() - started
        if not tally.running:
            return
        with contextlib.suppress(OSError, KeyError):
            result.samples.append((now, cpu_seconds(pid), memory_of(pid)[0]))
        if result.liveness_s is None and await asyncio.to_thread(tally.live):
            result.liveness_s = time.perf_counter() - started
        if result.ready_s is None:
            answer = await asyncio.to_thread(tally.readiness)
            if answer == "ok":
                result.ready_s = time.perf_counter() - started
                result.ready_how = tally.ready_how()
            elif answer is not None:
                note_reason(result.readiness_reasons, now, answer)
        if result.caches_synced_s is None and tally.log_has(r"caches synced"):
            result.caches_synced_s = now
        if result.lease_s is None and tally.log_has(r"acquired lease"):
            result.lease_s = now
        if (
            result.lease_s is not None
            and now < result.lease_s + RESYNC_PERIOD_S - RESYNC_MARGIN_S
            and now - syncs_read_at >= SYNCS_READ_S
        ):
            syncs_read_at = now
            reading = await asyncio.to_thread(_syncs, tally)
            if reading is not None:
                result.syncs_in_startup = reading
        if result.cluster_quota_s is None:
            with contextlib.suppress(client.ApiException):
                path = f"{CLUSTER_QUOTAS_PATH}/{scale_startup.CLUSTER_QUOTA}"
                if scale_startup.cluster_quota_correct(await raw.call("GET", path), totals):
                    result.cluster_quota_s = time.perf_counter() - started
        if result.webhook_s is None:
            with contextlib.suppress(client.ApiException):
                await raw.call("GET", WEBHOOK_PATH)
                result.webhook_s = time.perf_counter() - started
        await asyncio.sleep(0.1 if result.webhook_s is None else 0.5)


def note_reason(reasons: list[tuple[float, str]], at: float, answer: str) -> None:
    """Append ``(at, answer)`` when its words differ from the last one's: figures (counts,
    seconds) change on every read and are not a new reason."""

    def words(text: str) -> str:
        return re.sub(r"[0-9][0-9.]*", "#", text)

    if not reasons or words(reasons[-1][1]) != words(answer):
        reasons.append((at, answer))


async def _wait_quiet(tally: Tally, pid: int, started: float, result: OperatorResult) -> None:
    """Until tally used < QUIET_CPU_FRACTION of a core over QUIET_WINDOW_S (at most
    QUIET_LIMIT_S more) and its webhook is registered."""
    limit = time.perf_counter() + QUIET_LIMIT_S
    while time.perf_counter() < limit and tally.running:
        before = cpu_seconds(pid)
        await asyncio.sleep(QUIET_WINDOW_S)
        used = cpu_seconds(pid) - before
        if used < QUIET_CPU_FRACTION * QUIET_WINDOW_S and result.webhook_s is not None:
            result.quiet_s = time.perf_counter() - started - QUIET_WINDOW_S
            return


# --------------------------------------------------------------------------------------------
# Report


def target_convergence_s(pods: int) -> float:
    """The bound on every quota correct after spawn for a run of ``pods`` pods."""
    return (
        TARGET_CONVERGENCE_S
        if pods <= TARGET_CONVERGENCE_UP_TO_PODS
        else TARGET_CONVERGENCE_ENVELOPE_S
    )


def report(data: Input, concurrency: int, upstream: ReferenceResult, tally: OperatorResult) -> None:
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:6.1f} s"

    terminal = sum(1 for pod in data.pods if pod.terminal)
    print(f"scale: {len(data.namespaces)} namespaces, {len(data.pods)} pods ({terminal} "
          f"Succeeded/Failed, the rest Pending/Running; cpu+memory requests, 1 in 5 with a "
          f"sidecar), {len(data.namespaces) * CONFIGMAPS_PER_NAMESPACE} configmaps (+1 root CA "
          f"each), {len(data.namespaces)} quotas ({', '.join(HARD)}); creates {concurrency} "
          f"in flight")  # fmt: skip
    print(f"machine: {machine()}")
    for label, steps in (("upstream", upstream.populate), ("operator", tally.populate)):
        print(f"populate ({label}): " + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()))
    print()
    print("tally (operator mode; objects created while tally was down; times since spawn):")
    print(f"  liveness answered        {seconds(tally.liveness_s)}")
    print(f"  caches synced (log)      {seconds(tally.caches_synced_s)}")
    print(f"  every quota correct      {seconds(tally.convergence_s)}"
          f"   (CPU used by then {tally.cpu_to_convergence_s:.1f} s)")  # fmt: skip
    print(f"  webhook registered       {seconds(tally.webhook_s)}")
    print(f"  ready (/readyz 200)      {seconds(tally.ready_s)}")
    for at, reason in tally.readiness_reasons:
        print(f"    from {at:6.1f} s: {reason}")
    if tally.ready_how:
        print(f"    log: {tally.ready_how}")
    print(f"  ClusterQuota correct     {seconds(tally.cluster_quota_s)}"
          f"   (one, over all {len(data.namespaces)} namespaces)")  # fmt: skip
    print(f"  first quiet 2 s window   {seconds(tally.quiet_s)}"
          f"   (CPU used by then {tally.cpu_to_quiet_s:.1f} s)")  # fmt: skip
    print(f"  quota syncs              {tally.syncs_in_startup} before the first periodic resync; "
          f"{tally.syncs} by the end")  # fmt: skip
    print(f"  RSS at convergence {mib(tally.rss_at_convergence)}, at {tally.settled_s:.0f} s "
          f"{mib(tally.rss)} (CPU used {tally.cpu_total_s:.1f} s), peak {mib(tally.peak)}; "
          f"{tally.relists} informer re-list(s) logged")  # fmt: skip
    print(f"  creates ({scale_startup.PROBE_RATE:g}/s, open loop): {tally.probe_unjudged} "
          f"before the webhook was registered (unjudged);")  # fmt: skip
    print(f"    registered, not ready   {_window(tally.probe_before_ready)}")
    print(f"    ready, until {tally.settled_s:.0f} s       {_window(tally.probe_after_ready)}")
    takeover = tally.takeover
    if takeover is not None:
        print(f"  takeover: follower ready {seconds(takeover.follower_ready_s)} after its spawn; "
              f"leader killed (SIGKILL) -> lease {seconds(takeover.lease_s)} -> a deletion's "
              f"quota correct {seconds(takeover.correct_s)} "
              f"({seconds(takeover.after_lease_s)} after the lease)")  # fmt: skip
    print("upstream (reference mode; quotas created after the pods, KCM already running):")
    print(f"  quota creates            {seconds(upstream.quota_creates_s)}")
    print(f"  every quota correct      {seconds(upstream.convergence_s)} (from the first create)")
    print(f"  kube-controller-manager RSS {mib(upstream.kcm_rss)}, peak {mib(upstream.kcm_peak)}")
    print(f"  creates ({scale_startup.PROBE_RATE:g}/s, open loop, until {PROBE_TAIL_S:g} s after "
          f"convergence) {_window(upstream.probe)}")  # fmt: skip
    print()
    convergence = tally.convergence_s or float("inf")
    target = target_convergence_s(len(data.pods))
    ratio = convergence / target
    print(f"convergence: {convergence:.1f} s = {ratio:.2f}x the target {target:.0f}"
          f" s ({'meets' if ratio <= 1.0 else 'misses'})")  # fmt: skip
    rss_ratio = tally.rss / upstream.kcm_rss
    peak_ratio = tally.peak / upstream.kcm_peak
    print(f"RSS tally/KCM: {rss_ratio:.2f}x at {tally.settled_s:.0f} s "
          f"({'meets' if rss_ratio <= 1.0 else 'misses'} the target <= 1.0x); "
          f"peak {peak_ratio:.2f}x")  # fmt: skip
    after, reference = tally.probe_after_ready, upstream.probe
    probe_ratio = (
        after.p99_ms / reference.p99_ms
        if after is not None and after.p99_ms is not None and reference.p99_ms
        else math.inf
    )
    print(f"create p99 once ready / upstream's during its start-up: {probe_ratio:.2f}x "
          f"({'meets' if probe_ratio <= TARGET_PROBE_RATIO else 'misses'} the target <= "
          f"{TARGET_PROBE_RATIO:g}x)")  # fmt: skip
    print("tally samples (s since spawn: CPU s, RSS):", " ".join(
        f"{t:.0f}:{cpu:.1f}/{mib(rss)}" for t, cpu, rss in tally.samples[:: max(1, len(
            tally.samples) // 25)]))  # fmt: skip
    write_results(
        "scale",
        {
            "namespaces": len(data.namespaces),
            "pods": len(data.pods),
            "quotas": len(data.namespaces),
            "concurrency": concurrency,
            "upstream": dataclasses.asdict(upstream),
            "tally": dataclasses.asdict(tally),
        },
        [
            # Upstream's quotas are created after its pods, tally's pods before tally starts:
            # the two convergence times start from different moments, so only the target
            # judges tally's.
            Figure("every quota correct after start", "s", convergence, None,
                   target=f"<= {target:.0f} s"),
            Figure(f"resident memory at {tally.settled_s:.0f} s", "MiB", tally.rss / 2**20,
                   upstream.kcm_rss / 2**20, reference_name="kube-controller-manager",
                   target="<= 1.0x"),
            Figure("peak resident memory", "MiB", tally.peak / 2**20, upstream.kcm_peak / 2**20,
                   reference_name="kube-controller-manager"),
            *(
                [Figure("create p99 during start-up, once ready", "ms", after.p99_ms,
                        reference.p99_ms, target=f"<= {TARGET_PROBE_RATIO:g}x")]
                if after is not None and after.p99_ms is not None
                else []  # never ready within the run: the report says so; no bar to draw
            ),
            *(
                [Figure("takeover: lease to first correct status", "s",
                        takeover.after_lease_s, None, target=f"<= {TARGET_TAKEOVER_S:g} s")]
                if takeover is not None and takeover.after_lease_s is not None
                else []
            ),
        ],
    )  # fmt: skip


def _window(span: Window | None) -> str:
    if span is None or not span.creates:
        return "no creates"
    return (f"{span.creates} creates, {span.failed} failed; p50 {span.p50_ms:.0f} ms, p99 "
            f"{span.p99_ms:.0f} ms, max {span.max_ms:.0f} ms")  # fmt: skip


@contextlib.contextmanager
def tally_in(directory: Path, state: cluster.State) -> Iterator[Tally]:
    tally = Tally(
        Path(state.kubeconfig),
        directory / "tally.log",
        bin_dir=Path(state.bin_dir),
        env=LEADER_ELECTION,
    )
    try:
        yield tally
    finally:
        tally.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=64, help="creates in flight")
    parser.add_argument("--keep-log", type=Path, default=None, help="copy tally's log here")
    parser.add_argument(
        "--kwok-parallelism",
        type=int,
        default=KWOK_POD_PARALLELISM,
        help="pods kwok starts at once on each plane",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=60.0,
        help="read tally's memory this many seconds after its start (or at convergence if later)",
    )
    parser.add_argument(
        "--takeover",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="then start a follower, kill the leader, and time the new leader's first status",
    )
    args = parser.parse_args(argv)
    data = Input.build(args.namespaces, args.pods)
    began = time.perf_counter()
    print("reference control plane ...", file=sys.stderr, flush=True)
    nodes = data.nodes()
    print(f"{nodes} simulated nodes per plane", file=sys.stderr, flush=True)
    with control_plane(
        "reference",
        nodes=nodes,
        kwok_pod_parallelism=args.kwok_parallelism,
        extra_controller_manager_args=KEEP_TERMINATED_PODS,
    ) as reference:
        upstream = asyncio.run(run_reference(reference, data, args.concurrency))
    print("operator control plane ...", file=sys.stderr, flush=True)
    with (
        tempfile.TemporaryDirectory() as scratch,
        control_plane(
            "operator",
            nodes=nodes,
            kwok_pod_parallelism=args.kwok_parallelism,
            extra_controller_manager_args=KEEP_TERMINATED_PODS,
        ) as operator,
        tally_in(Path(scratch), operator) as tally,
    ):
        try:
            result = asyncio.run(
                run_operator(
                    operator, data, args.concurrency, tally, args.settle, takeover=args.takeover
                )
            )
        finally:
            if args.keep_log is not None:
                args.keep_log.write_bytes(tally.log.read_bytes())
                follower = tally.log.with_name("follower.log")
                if follower.exists():
                    args.keep_log.with_suffix(".follower.log").write_bytes(follower.read_bytes())
    report(data, args.concurrency, upstream, result)
    print(f"series: {scale_series.record(json.loads(RESULTS_JSON.read_text()))}", file=sys.stderr)
    print(f"total run {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
