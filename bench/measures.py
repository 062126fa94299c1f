"""Benchmark: what one ClusterQuota measure costs per object (``tally.measures.evaluate``).

Five typical measures over varied pods (``bench/usage.py``'s mix, plus annotations: a small
one some measures read and a 6 KiB ``last-applied-configuration`` none does) and PVCs. For
each, the median and p99 of single evaluations, against two baselines on the same objects:

- ``whole object``: the same compiled programs given the whole object, as a plain CEL binding
  would (no projection of the fields the expressions read, no cost estimate);
- ``plain Python``: a hand-written function computing the same value, the floor.

Then the slowest evaluation the cost bound admits (one ``map`` over 1 000 items, exactly
``MAX_COST`` estimated steps) and the first one it refuses. Prints ratios (and the ratio to
the previous run's medians when ``--json`` already holds one), writes the figures as JSON and
a bar chart beside it (default ``bench/results/measures.json`` and ``.png``).

Run: ``.venv/bin/python bench/measures.py [--evaluations 2000]`` (a few seconds).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import REPO, Figure, machine, percentile, write_results
from tally.measures import (
    MAX_COST,
    Measure,
    MeasureCostError,
    compile_measure,
    environment,
    evaluate,
)
from tally.quota.quantity import Quantity, parse_quantity
from usage import make_pod

MI_64 = parse_quantity("64Mi")


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    """``pods`` or ``pvcs``: which objects it measures."""
    expression: str
    when: str | None
    python: Callable[[dict[str, Any]], Quantity | None]
    """The same value, computed by hand."""


def _py_pvc_storage(o: dict[str, Any]) -> Quantity | None:
    if o["spec"].get("storageClassName") != "gold":
        return None
    return parse_quantity(o["spec"]["resources"]["requests"]["storage"])


def _py_annotation(o: dict[str, Any]) -> Quantity | None:
    value = (o["metadata"].get("annotations") or {}).get("example.com/gb")
    return Quantity.from_int(int(value) if value is not None else 0)


def _py_memory_plus(o: dict[str, Any]) -> Quantity | None:
    requests = o["spec"]["containers"][0]["resources"].get("requests")
    return MI_64 + parse_quantity(requests["memory"]) if requests else MI_64


def _py_cpu_containers(o: dict[str, Any]) -> Quantity | None:
    containers = o["spec"]["containers"]
    return Quantity.from_int(
        sum(1 for c in containers if "cpu" in (c["resources"].get("requests") or {}))
    )


def _py_web_running(o: dict[str, Any]) -> Quantity | None:
    if o["metadata"]["labels"]["tier"] == "web" and o["status"]["phase"] == "Running":
        return Quantity.from_int(1)
    return None


CASES = [
    Case(
        "pvc-storage-gold",
        "pvcs",
        "object.spec.resources.requests.storage",
        "has(object.spec.storageClassName) && object.spec.storageClassName == 'gold'",
        _py_pvc_storage,
    ),
    Case(
        "annotation-int",
        "pods",
        "has(object.metadata.annotations) && 'example.com/gb' in object.metadata.annotations"
        " ? int(object.metadata.annotations['example.com/gb']) : 0",
        None,
        _py_annotation,
    ),
    Case(
        "quantity-add",
        "pods",
        "has(object.spec.containers[0].resources.requests)"
        " ? quantity(object.spec.containers[0].resources.requests.memory).add(quantity('64Mi'))"
        " : quantity('64Mi')",
        None,
        _py_memory_plus,
    ),
    Case(
        "containers-filter",
        "pods",
        "object.spec.containers.filter(c, has(c.resources.requests)"
        " && 'cpu' in c.resources.requests).size()",
        None,
        _py_cpu_containers,
    ),
    Case(
        "label-and-phase-count",
        "pods",
        "1",
        "object.metadata.labels.tier == 'web' && object.status.phase == 'Running'",
        _py_web_running,
    ),
]


def make_objects(count: int, rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    last_applied = json.dumps({"spec": {"containers": [{"env": ["x" * 60] * 100}]}})
    pods = []
    for index in range(count):
        pod = make_pod(rng, index)
        annotations = {"kubectl.kubernetes.io/last-applied-configuration": last_applied}
        if rng.random() < 0.5:
            annotations["example.com/gb"] = str(rng.randint(1, 500))
        pod["metadata"]["annotations"] = annotations
        pods.append(pod)
    pvcs = []
    for index in range(count):
        spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": rng.choice(["1Gi", "10Gi", "512Mi", "2T"])}},
            "volumeMode": "Filesystem",
        }
        if rng.random() < 0.8:
            spec["storageClassName"] = rng.choice(["gold", "silver"])
        pvcs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"data-{index}", "namespace": "bench", "uid": str(index)},
                "spec": spec,
                "status": {"phase": "Bound", "capacity": spec["resources"]["requests"]},
            }
        )
    return {"pods": pods, "pvcs": pvcs}


def whole_object(m: Measure, obj: dict[str, Any]) -> Any:
    """The programs on the whole object (no projection, no cost estimate, no conversion of
    the result): what a plain CEL binding would do."""
    if m.when_program is None:
        return environment.evaluate(m.program, obj)
    context = environment.activation(obj)
    if not environment.evaluate(m.when_program, context):
        return None
    return environment.evaluate(m.program, context)


def time_each(
    fn: Callable[[dict[str, Any]], object], objects: list[dict[str, Any]], n: int
) -> list[float]:
    """Microseconds of ``n`` single calls, cycling through ``objects``, after a warm-up."""
    for obj in objects[:200]:
        fn(obj)
    samples = []
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for index in range(n):
            obj = objects[index % len(objects)]
            start = clock()
            fn(obj)
            samples.append((clock() - start) / 1000)
    finally:
        gc.enable()
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median_us": round(statistics.median(samples), 2),
        "p99_us": round(percentile(samples, 0.99), 2),
    }


def bound_case() -> dict[str, Any]:
    m = compile_measure(
        {
            "name": "example.com/bound",
            "resource": {"resource": "widgets"},
            "expression": "object.spec.items.map(i, i * 2).size()",
        }
    )
    admitted = {"spec": {"items": list(range(1000))}}
    refused = {"spec": {"items": list(range(1001))}}
    assert evaluate(m, admitted) == Quantity.from_int(1000)
    runs = []
    for _ in range(15):
        start = time.perf_counter()
        evaluate(m, admitted)
        runs.append((time.perf_counter() - start) * 1000)
    start = time.perf_counter()
    try:
        evaluate(m, refused)
        raise AssertionError("1001 items must be refused")
    except MeasureCostError:
        refused_us = (time.perf_counter() - start) * 1e6
    return {
        "expression": m.expression,
        "items": 1000,
        "estimated_steps": MAX_COST,
        "median_ms": round(statistics.median(runs), 2),
        "max_ms": round(max(runs), 2),
        "refusal_of_1001_items_us": round(refused_us, 1),
    }


def figures_of(result: dict[str, Any]) -> list[Figure]:
    """Each case's median against the same programs given the whole object, and the slowest
    evaluation the cost bound admits."""
    bound = result["bound"]
    return [
        *(
            Figure(case["name"], "µs per object", case["tally"]["median_us"],
                   case["whole_object"]["median_us"], reference_name="whole object")
            for case in result["cases"]
        ),
        Figure(f"bound: {bound['items']} items, one map", "ms", bound["median_ms"], None),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--evaluations", type=int, default=2000)
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "measures.json")
    args = parser.parse_args(argv)

    previous: dict[str, float] = {}
    if args.json.exists():
        old = json.loads(args.json.read_text())
        previous = {c["name"]: c["tally"]["median_us"] for c in old.get("cases", [])}

    objects = make_objects(args.objects, random.Random(42))
    result: dict[str, Any] = {
        "machine": machine(),
        "objects": {kind: len(items) for kind, items in objects.items()},
        "evaluations": args.evaluations,
        "cases": [],
    }
    print(f"machine: {result['machine']}")
    print(
        f"input: {args.objects} pods and {args.objects} PVCs, {args.evaluations} single "
        "evaluations per case and variant"
    )
    for case in CASES:
        m = compile_measure(
            {
                "name": f"example.com/{case.name}",
                "resource": {"resource": case.kind},
                "expression": case.expression,
                **({"when": case.when} if case.when else {}),
            }
        )
        items = objects[case.kind]
        for obj in items:
            expected = case.python(obj)
            assert evaluate(m, obj) == expected, (case.name, obj["metadata"]["name"])
        figures = {
            "name": case.name,
            "expression": case.expression,
            "when": case.when,
            "tally": summary(time_each(lambda o, m=m: evaluate(m, o), items, args.evaluations)),
            "whole_object": summary(
                time_each(lambda o, m=m: whole_object(m, o), items, args.evaluations)
            ),
            "python": summary(time_each(case.python, items, args.evaluations)),
        }
        result["cases"].append(figures)
        tally_us = figures["tally"]["median_us"]
        line = (
            f"{case.name:22} tally {tally_us:7.1f} µs (p99 {figures['tally']['p99_us']:.0f})"
            f" | whole object {figures['whole_object']['median_us']:7.1f} µs"
            f" = {figures['whole_object']['median_us'] / tally_us:.1f}x tally"
            f" | plain Python {figures['python']['median_us']:5.1f} µs"
            f" = tally is {tally_us / figures['python']['median_us']:.0f}x"
        )
        if case.name in previous:
            line += f" | vs previous run {tally_us / previous[case.name]:.2f}x"
        print(line)
    result["bound"] = bound_case()
    bound = result["bound"]
    print(
        f"cost bound: '{bound['expression']}' over {bound['items']} items "
        f"({bound['estimated_steps']:,} estimated steps, admitted) median {bound['median_ms']} ms, "
        f"max {bound['max_ms']} ms; 1001 items refused in {bound['refusal_of_1001_items_us']} µs",
        flush=True,
    )
    write_results("measures", result, figures_of(result), path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
