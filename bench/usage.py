"""Benchmark: quota usage of 10 000 varied pods in one namespace under 3 quotas, on one core.

Measures what the ResourceQuota controller does on every sync of a busy namespace: for each of
three quotas (no scope; NotTerminating+NotBestEffort; a PriorityClass selector) compute
``calculate_usage`` over every pod. Two inputs are compared:

- ``projection``: the pods as the controller's cache holds them (``PodProjection``), the design
  the target applies to (< 100 ms for the three quotas);
- ``dict``: the raw API JSON, re-parsed on every call (the baseline without a projection).

It also prints the one-off cost of projecting the pods and the memory both forms take
(``tracemalloc``), so the projection decision in ``tally/evaluators/pods.py`` stays checked,
and writes the figures as JSON and a picture beside it (``bench/results/usage.json``, ``.png``).

Run: ``.venv/bin/python bench/usage.py [--pods N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from _common import Figure, write_results
from tally.evaluators import GroupResource, calculate_quota_usage, new_registry, project_pod

PODS = GroupResource("", "pods")
TARGET_MS = 100.0

QUOTAS: list[dict[str, Any]] = [
    {
        "metadata": {"name": "compute"},
        "spec": {
            "hard": {
                "pods": "100k",
                "count/pods": "100k",
                "requests.cpu": "10k",
                "requests.memory": "100Ti",
                "limits.cpu": "20k",
                "limits.memory": "200Ti",
                "requests.ephemeral-storage": "1Pi",
                "hugepages-2Mi": "1Ti",
                "requests.example.com/gpu": "1k",
            }
        },
    },
    {
        "metadata": {"name": "long-running"},
        "spec": {
            "hard": {"pods": "100k", "requests.cpu": "10k", "limits.memory": "200Ti"},
            "scopes": ["NotTerminating", "NotBestEffort"],
        },
    },
    {
        "metadata": {"name": "priority"},
        "spec": {
            "hard": {"pods": "100k", "cpu": "10k", "memory": "100Ti"},
            "scopeSelector": {
                "matchExpressions": [
                    {"scopeName": "PriorityClass", "operator": "In", "values": ["high", "medium"]}
                ]
            },
        },
    },
]

CPU = ["100m", "250m", "500m", "1", "1500m", "2", "0.5", "750m"]
MEMORY = ["64Mi", "128Mi", "256Mi", "512Mi", "1Gi", "1.5Gi", "500M", "2G"]


def make_pod(rng: random.Random, index: int) -> dict[str, Any]:
    """A pod from a varied mix: sizes, sidecars, init containers, overhead, hugepages,
    extended resources, best-effort pods, terminal phases, deadlines and deletions."""

    def resources() -> dict[str, Any]:
        if rng.random() < 0.08:
            return {}  # best-effort container
        cpu, memory = rng.choice(CPU), rng.choice(MEMORY)
        result: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
        if rng.random() < 0.7:
            result["limits"] = {"cpu": rng.choice(CPU), "memory": memory}
        if rng.random() < 0.2:
            result["requests"]["ephemeral-storage"] = "1Gi"
        if rng.random() < 0.05:
            result["requests"]["hugepages-2Mi"] = "128Mi"
            result.setdefault("limits", {})["hugepages-2Mi"] = "128Mi"
        if rng.random() < 0.05:
            result["requests"]["example.com/gpu"] = "1"
            result.setdefault("limits", {})["example.com/gpu"] = "1"
        return result

    containers = [
        {"name": f"c{i}", "image": "app:1", "resources": resources()}
        for i in range(rng.randint(1, 3))
    ]
    spec: dict[str, Any] = {"containers": containers}
    if rng.random() < 0.3:
        init = [{"name": "setup", "image": "init:1", "resources": resources()}]
        if rng.random() < 0.5:
            init.insert(
                0,
                {
                    "name": "proxy",
                    "image": "proxy:1",
                    "restartPolicy": "Always",
                    "resources": resources(),
                },
            )
        spec["initContainers"] = init
    if rng.random() < 0.1:
        spec["overhead"] = {"cpu": "100m", "memory": "64Mi"}
    if rng.random() < 0.2:
        spec["activeDeadlineSeconds"] = 600
    if rng.random() < 0.5:
        spec["priorityClassName"] = rng.choice(["high", "medium", "low"])
    metadata: dict[str, Any] = {
        "name": f"pod-{index}",
        "namespace": "bench",
        "uid": f"00000000-0000-0000-0000-{index:012d}",
        "labels": {"app": f"app-{index % 50}", "tier": rng.choice(["web", "db", "cache"])},
        "resourceVersion": str(1000 + index),
        "creationTimestamp": "2025-01-01T00:00:00Z",
    }
    if rng.random() < 0.02:
        metadata["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        metadata["deletionGracePeriodSeconds"] = 30
    phase = rng.choices(["Running", "Pending", "Succeeded", "Failed"], [85, 8, 5, 2])[0]
    status: dict[str, Any] = {
        "phase": phase,
        "podIP": f"10.0.{index // 256 % 256}.{index % 256}",
        "containerStatuses": [
            {
                "name": c["name"],
                "ready": True,
                "restartCount": 0,
                "image": "app:1",
                "imageID": "sha256:" + "0" * 64,
                "containerID": "containerd://" + "a" * 64,
                "started": True,
                "state": {"running": {"startedAt": "2025-01-01T00:00:10Z"}},
            }
            for c in containers
        ],
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2025-01-01T00:00:10Z"}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    """Wall times in ms of ``rounds`` calls, after one warm-up call."""
    fn()
    samples = []
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def traced_size(build: Callable[[], object]) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    result = build()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as specified
    rng = random.Random(42)
    registry = new_registry(clock=lambda: 1_800_000_000.0)

    dicts, dict_bytes = traced_size(lambda: [make_pod(rng, i) for i in range(args.pods)])
    assert isinstance(dicts, list)

    # Time the projection without tracemalloc (which slows allocation down several times),
    # then measure its memory on a second pass.
    project_ms = min(timed(lambda: [project_pod(p) for p in dicts], 2))
    projections, projection_bytes = traced_size(lambda: [project_pod(p) for p in dicts])
    assert isinstance(projections, list)

    def run(objects: list[Any]) -> list[dict[str, Any]]:
        return [calculate_quota_usage(q, {PODS: objects}, registry) for q in QUOTAS]

    assert run(projections) == run(dicts), "projection and dict usage must agree"
    projection_ms = timed(lambda: run(projections), args.rounds)
    dict_ms = timed(lambda: run(dicts), max(1, args.rounds // 3))

    p50 = statistics.median(projection_ms)
    d50 = statistics.median(dict_ms)
    print(
        f"machine: nproc={os.cpu_count()} pinned=1 python={platform.python_version()} "
        f"({platform.python_implementation()}) {platform.machine()}"
    )
    print(
        f"input: {args.pods} pods in one namespace, {len(QUOTAS)} quotas "
        f"({', '.join(q['metadata']['name'] for q in QUOTAS)}), {args.rounds} rounds"
    )
    print(
        f"projection: p50 {p50:.1f} ms, min {min(projection_ms):.1f} ms, "
        f"max {max(projection_ms):.1f} ms for 3 quotas -> "
        f"{args.pods * len(QUOTAS) / (p50 / 1000):,.0f} pod-evaluations/s, "
        f"{args.pods / (p50 / 1000):,.0f} pods/s (all 3 quotas)"
    )
    print(
        f"dict:       p50 {d50:.1f} ms for 3 quotas -> {args.pods / (d50 / 1000):,.0f} pods/s "
        f"(projection is {d50 / p50:.1f}x faster)"
    )
    print(
        f"projecting {args.pods} pods once: {project_ms:.0f} ms "
        f"({args.pods / (project_ms / 1000):,.0f} pods/s)"
    )
    print(
        f"memory: dicts {dict_bytes / 2**20:.1f} MiB ({dict_bytes / args.pods:,.0f} B/pod), "
        f"projections {projection_bytes / 2**20:.1f} MiB "
        f"({projection_bytes / args.pods:,.0f} B/pod, "
        f"{dict_bytes / max(projection_bytes, 1):.1f}x smaller)"
    )
    verdict = "OK" if p50 < TARGET_MS else "OVER"
    print(f"target: < {TARGET_MS:.0f} ms for 3 quotas on projections: {verdict}")
    write_results(
        "usage",
        {
            "pods": args.pods,
            "quotas": [q["metadata"]["name"] for q in QUOTAS],
            "rounds": args.rounds,
            "projection_ms": projection_ms,
            "dict_ms": dict_ms,
            "project_once_ms": project_ms,
            "dict_bytes": dict_bytes,
            "projection_bytes": projection_bytes,
        },
        [
            Figure(f"usage of {args.pods} pods, 3 quotas (p50)", "ms", p50, d50,
                   reference_name="raw JSON", target=f"< {TARGET_MS:.0f} ms"),
            Figure(f"projecting {args.pods} pods once", "ms", project_ms, None),
            Figure("memory of the pods", "MiB", projection_bytes / 2**20, dict_bytes / 2**20,
                   reference_name="raw JSON"),
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
