"""The kubelets of ``bench/churn.py``: a process of its own that patches pod status (the status
subresource) as kubelets report the pods they run, at a target rate, in an open loop.

The pods it plays are unbound (``builders.NO_SCHEDULER``): no simulated kubelet writes their
status, so each of its updates is the only writer's. Each update is a JSON merge patch of
``pods/<name>/status``: phase ``Running``, the Ready and ContainersReady conditions toggled
(with a new ``lastTransitionTime``), the container's ``ready`` toggled and its ``restartCount``
bumped each time it goes unready (a crash and a restart). Every update changes the pod (the
API server writes it and every pod watch sees one MODIFIED event) and changes nothing any quota
counts: a Running pod is charged as a Pending one.

Open loop: update ``i`` is due at ``i / rate`` seconds after the start, whatever the answers do,
and ``--clients`` concurrent clients (one request in flight each) take the updates in turn. A
client that is behind sends at once; an update more than :data:`STALE_S` late is skipped and
counted, so that a stall is not followed by a burst. The pods are updated round robin.

A separate process, so that its CPU never delays the benchmark's own loop, whose latencies are
measured from scheduled times. Started by ``bench/churn.py``:
``python bench/_kubelet_patcher.py KUBECONFIG NAMESPACE... [--clients 16]``. It lists the pods of
those namespaces and opens its connections, prints ``{"ready": <pods>}``, then for each line
``run <seconds> <rate>`` on its input updates for that long and prints one JSON line of what it
did (:meth:`Kubelets.run`); it exits at the end of its input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from _common import Raw, api_client
from tally.kube.rest import read_environment_once

STALE_S = 1.0
"""An update due longer ago than this is skipped (counted), not sent late."""
REQUEST_TIMEOUT_S = 10.0
MERGE_PATCH = "application/merge-patch+json"


@dataclass
class PodState:
    """What this process last reported for one pod (read from its LIST, then its own)."""

    namespace: str
    name: str
    containers: list[tuple[str, str]]
    """(name, image) of each container."""
    ready: bool = False
    restarts: int = 0

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodState:
        metadata, status = pod["metadata"], pod.get("status") or {}
        containers = [(c["name"], c["image"]) for c in pod["spec"]["containers"]]
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        restarts = max((s.get("restartCount", 0) for s in status.get("containerStatuses") or []),
                       default=0)  # fmt: skip
        return cls(metadata["namespace"], metadata["name"], containers,
                   conditions.get("Ready") == "True", restarts)  # fmt: skip

    def advance(self) -> None:
        """The next report: Ready toggled; a container that goes unready has restarted."""
        if self.ready:
            self.restarts += 1
        self.ready = not self.ready


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(pod: PodState, now: str, started: str) -> dict[str, Any]:
    """The merge patch of ``pod``'s status that reports its current state (``pod.ready``,
    ``pod.restarts``) at ``now``; ``started`` is the pod's (fixed) ``startTime``."""
    condition = "True" if pod.ready else "False"
    return {
        "status": {
            "phase": "Running",
            "startTime": started,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": started},
                {"type": "ContainersReady", "status": condition, "lastTransitionTime": now},
                {"type": "Ready", "status": condition, "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {
                    "name": name,
                    "image": image,
                    "imageID": "",
                    "ready": pod.ready,
                    "started": True,
                    "restartCount": pod.restarts,
                    "state": {"running": {"startedAt": started}},
                }
                for name, image in pod.containers
            ],
        }
    }


def due(slot: int, rate: float) -> float:
    """When update ``slot`` is due, in seconds from the start of a run."""
    return slot / rate


class Kubelets:
    """``clients`` concurrent clients updating ``pods`` round robin through ``raw``; ``clock``
    and ``sleep`` are injectable for tests (virtual time)."""

    def __init__(
        self,
        raw: Raw,
        pods: list[PodState],
        clients: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.raw = raw
        self.pods = pods
        self.clients = clients
        self.clock = clock
        self.sleep = sleep
        self.cursor = 0
        """The next pod to update (round robin, across runs)."""
        self.started = timestamp(datetime.now(UTC))

    async def run(self, seconds: float, rate: float) -> dict[str, Any]:
        """Update pods for ``seconds`` at ``rate`` per second; what was done: ``updates``
        (answered 2xx), ``skipped`` (due too long ago), ``errors`` by status (``connection``
        when there was no answer), ``seconds`` (wall) and ``latencies_ms`` (each update's
        answer time, from when it was sent)."""
        slots = itertools.count()
        latencies: list[float] = []
        errors: Counter[str] = Counter()
        skipped = 0
        start = self.clock()
        end = start + seconds

        async def one_client() -> None:
            nonlocal skipped
            for slot in slots:
                at = start + due(slot, rate)
                if at >= end:
                    return
                delay = at - self.clock()
                if delay > 0:
                    await self.sleep(delay)
                elif -delay > STALE_S:
                    skipped += 1
                    continue
                pod = self.pods[self.cursor % len(self.pods)]
                self.cursor += 1
                pod.advance()
                body = status_patch(pod, timestamp(datetime.now(UTC)), self.started)
                path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
                sent = self.clock()
                try:
                    await self.raw.call("PATCH", path, body, content_type=MERGE_PATCH,
                                        request_timeout=REQUEST_TIMEOUT_S)  # fmt: skip
                except client.ApiException as error:
                    errors[str(error.status)] += 1
                    continue
                except (OSError, TimeoutError, aiohttp.ClientError):
                    errors["connection"] += 1
                    continue
                latencies.append(self.clock() - sent)

        async with asyncio.TaskGroup() as group:
            for _ in range(self.clients):
                group.create_task(one_client())
        return {
            "updates": len(latencies),
            "skipped": skipped,
            "errors": dict(errors),
            "seconds": self.clock() - start,
            "latencies_ms": [round(value * 1000, 2) for value in latencies],
        }


async def serve(kubeconfig: str, namespaces: list[str], clients: int) -> None:
    api = await api_client(kubeconfig, pool=clients)
    # Not two thread-pool hops per request for the proxy variables and ~/.netrc (as tally):
    # the kubelets are the benchmark's load, and their CPU is taken from the planes'.
    read_environment_once(api, str(api.configuration.host))
    try:
        raw = Raw(api)
        pods: list[PodState] = []
        for namespace in namespaces:
            listed = await raw.list_all(f"/api/v1/namespaces/{namespace}/pods")
            pods += [PodState.of(pod) for pod in listed]
        if not pods:
            raise SystemExit(f"no pods in {', '.join(namespaces)}")
        # Open every client's connection before the first run is timed.
        probe = f"/api/v1/namespaces/{namespaces[0]}/pods"
        await asyncio.gather(
            *(raw.call("GET", probe, query=[("limit", "1")]) for _ in range(clients))
        )
        kubelets = Kubelets(raw, pods, clients)
        print(json.dumps({"ready": len(pods)}), flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            command, *words = line.split()
            if command != "run" or len(words) != 2:
                raise SystemExit(f"expected `run <seconds> <rate>`, not {line!r}")
            result = await kubelets.run(float(words[0]), float(words[1]))
            print(json.dumps(result), flush=True)
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kubeconfig")
    parser.add_argument("namespaces", nargs="+")
    parser.add_argument("--clients", type=int, default=16, help="requests in flight at most")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.kubeconfig, args.namespaces, args.clients))
    return 0


if __name__ == "__main__":
    sys.exit(main())
