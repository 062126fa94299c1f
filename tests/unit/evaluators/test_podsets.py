"""PodSet measures: the template's pod usage times the replicas, under ``podsets.tally.dev/``.

Expected values are worked out by hand from the pod formula (``pods`` = 1 per pod, requests
counted under both ``cpu`` and ``requests.cpu``, limits under ``limits.*``) times the replicas.
"""

from __future__ import annotations

from typing import Any

import pytest

import builders
from tally.evaluators.base import ObjectError, Operation, parse_scope_requirement
from tally.evaluators.podsets import PODSETS, PodSetEvaluator, scaled
from tally.evaluators.registry import calculate_usage, new_registry
from tally.quota import resources as quota

pytestmark = pytest.mark.unit

P = "podsets.tally.dev/"


def podset(
    replicas: int | None,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    *,
    name: str = "web",
    resource_version: str = "7",
) -> dict[str, Any]:
    return builders.podset(
        name,
        replicas,
        namespace="ns",
        resource_version=resource_version,
        containers=[builders.container("a", requests, limits, resources="both")],
        with_kind=False,
    )


def test_usage_is_the_template_times_the_replicas() -> None:
    usage = PodSetEvaluator().usage(podset(3, {"cpu": "250m", "memory": "64Mi"}, {"cpu": "500m"}))
    assert {
        "count/podsets.tally.dev": "1",
        P + "pods": "3",
        P + "cpu": "750m",
        P + "requests.cpu": "750m",
        P + "memory": "192Mi",
        P + "requests.memory": "192Mi",
        P + "limits.cpu": "1500m",
    } == quota.to_strings(usage)


def test_unset_replicas_are_one_and_zero_replicas_use_nothing_but_the_count() -> None:
    evaluator = PodSetEvaluator()
    assert (
        "100m"
        == quota.to_strings(evaluator.usage(podset(None, {"cpu": "100m"})))[P + "requests.cpu"]
    )
    assert {"count/podsets.tally.dev": "1", P + "pods": "0", P + "cpu": "0",
            P + "requests.cpu": "0"} == quota.to_strings(
        evaluator.usage(podset(0, {"cpu": "100m"}))
    )  # fmt: skip


def test_extended_resources_and_hugepages() -> None:
    usage = PodSetEvaluator().usage(
        podset(
            2,
            {"cpu": "1", "example.com/dongle": "1", "hugepages-2Mi": "4Mi"},
            {"example.com/dongle": "1", "hugepages-2Mi": "4Mi"},
        )
    )
    strings = quota.to_strings(usage)
    assert "2" == strings[P + "requests.example.com/dongle"]
    assert "8Mi" == strings[P + "hugepages-2Mi"]
    assert "8Mi" == strings[P + "requests.hugepages-2Mi"]


def test_matching_resources() -> None:
    names = [
        "count/podsets.tally.dev", P + "pods", P + "requests.cpu", P + "limits.memory",
        P + "hugepages-2Mi", P + "requests.example.com/dongle",
        # not PodSet measures:
        P + "count/pods", P + "widgets", "requests.cpu", "pods", "count/podsets.example.com",
    ]  # fmt: skip
    assert names[:6] == PodSetEvaluator().matching_resources(names)


@pytest.mark.parametrize(
    ("operation", "subresource", "handled"),
    [
        (Operation.CREATE, "", True),
        (Operation.UPDATE, "", True),
        (Operation.UPDATE, "scale", True),
        (Operation.UPDATE, "status", False),
        (Operation.CREATE, "scale", False),
        (Operation.DELETE, "", False),
    ],
)
def test_handles(operation: str, subresource: str, handled: bool) -> None:
    assert handled is PodSetEvaluator().handles(operation, subresource, None, None)


@pytest.mark.parametrize("replicas", [-1, "3", 1.5, True])
def test_malformed_replicas_are_named(replicas: Any) -> None:
    with pytest.raises(ObjectError, match=r"spec\.replicas"):
        PodSetEvaluator().usage(podset(replicas))


def test_a_malformed_template_is_named_under_the_template() -> None:
    broken = podset(1)
    broken["spec"]["template"]["spec"]["containers"] = "nope"
    with pytest.raises(ObjectError, match=r"spec\.template\."):
        PodSetEvaluator().usage(broken)


def test_scaled_takes_the_scale_replicas_and_resource_version() -> None:
    stored = podset(2, {"cpu": "100m"})
    scale = {"metadata": {"name": "web", "resourceVersion": "9"}, "spec": {"replicas": 5}}
    after = scaled(stored, scale)
    assert (5, "9") == (after["spec"]["replicas"], after["metadata"]["resourceVersion"])
    assert after["spec"]["template"] == stored["spec"]["template"]
    assert 2 == stored["spec"]["replicas"]  # not mutated


def test_a_scale_without_replicas_is_zero_replicas() -> None:
    # The API server sends autoscaling/v1 Scale with omitempty: 0 replicas is {"spec": {}}.
    after = scaled(podset(3, {"cpu": "100m"}), {"metadata": {"resourceVersion": "9"}, "spec": {}})
    assert 0 == after["spec"]["replicas"]
    assert "0" == quota.to_strings(PodSetEvaluator().usage(after))[P + "requests.cpu"]


def test_replenishment_when_usage_goes_down() -> None:
    evaluator = PodSetEvaluator()
    three, five = podset(3, {"cpu": "1"}), podset(5, {"cpu": "1"})
    assert evaluator.requires_replenishment(five, three)
    assert not evaluator.requires_replenishment(three, five)
    assert evaluator.requires_replenishment(podset(3, {"cpu": "2"}), podset(3, {"cpu": "1"}))


def test_scoped_quotas_do_not_measure_podsets() -> None:
    registry = new_registry()
    registry.register(PodSetEvaluator())
    objects = {PODSETS: [podset(4, {"cpu": "500m"}), podset(1, {"cpu": "1"}, name="db")]}
    assert {P + "requests.cpu": "3", "count/podsets.tally.dev": "2"} == quota.to_strings(
        calculate_usage(objects, [P + "requests.cpu", "count/podsets.tally.dev"], (), registry)
    )
    best_effort = (parse_scope_requirement({"scopeName": "BestEffort", "operator": "Exists"}),)
    assert {P + "pods": "0"} == quota.to_strings(
        calculate_usage(objects, [P + "pods"], best_effort, registry)
    )
