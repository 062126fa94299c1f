"""The ResourceClaim evaluator, ported from ``pkg/quota/v1/evaluator/core/resource_claims_test.go``
(v1.37).

Upstream's expected usage also holds ``requests.deviceclass.resource.kubernetes.io/<class>``
(the DRAExtendedResource part, which tally does not port: see the evaluator's module doc). Those
names are left out of the expectations below; every other value is upstream's. The cases that
only exercise the extended-resource part (``*-extended-resource-claim``) are not ported.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tally.evaluators import ObjectError
from tally.evaluators.base import parse_scope_requirement
from tally.evaluators.registry import calculate_usage, new_registry
from tally.evaluators.resourceclaims import (
    ALLOCATION_RESULTS_MAX_SIZE,
    RESOURCE_CLAIMS,
    ResourceClaimEvaluator,
)
from tally.quota import resources as quota
from tally.quota.quantity import parse_quantity

pytestmark = pytest.mark.unit

COUNT = "count/resourceclaims.resource.k8s.io"
GPU = "gpu.deviceclass.resource.k8s.io/devices"
TPU = "tpu.deviceclass.resource.k8s.io/devices"


def claim(*requests: dict[str, Any], name: str = "foo") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": list(requests)}},
    }


def exactly(class_name: str = "gpu", mode: str = "ExactCount", count: int | None = 1) -> dict:
    body: dict[str, Any] = {"deviceClassName": class_name, "allocationMode": mode}
    if count is not None:
        body["count"] = count
    return body


def subrequest(name: str, class_name: str, mode: str, count: int | None = None) -> dict:
    return {"name": name, **exactly(class_name, mode, count)}


VALID = claim({"name": "req-0", "exactly": exactly()})
PRIORITIZED = claim(
    {"name": "req-0", "firstAvailable": [subrequest("subreq-0", "gpu", "ExactCount", 1)]}
)


def modified(base: dict[str, Any], change: Any) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    change(obj["spec"]["devices"]["requests"])
    return obj


def _many(requests: list[dict[str, Any]]) -> None:
    requests.extend(copy.deepcopy(requests[0]) for _ in range(4))


def _admin(requests: list[dict[str, Any]]) -> None:
    requests[0]["exactly"]["adminAccess"] = True


# TestResourceClaimEvaluatorUsage
@pytest.mark.parametrize(
    ("obj", "usage"),
    [
        pytest.param(VALID, {COUNT: "1", GPU: "1"}, id="simple"),
        pytest.param(modified(VALID, _many), {COUNT: "1", GPU: "5"}, id="many-requests"),
        pytest.param(
            modified(VALID, lambda r: r[0]["exactly"].update(count=5)),
            {COUNT: "1", GPU: "5"},
            id="count",
        ),
        pytest.param(
            modified(VALID, lambda r: r[0]["exactly"].update(allocationMode="All")),
            {COUNT: "1", GPU: str(ALLOCATION_RESULTS_MAX_SIZE)},
            id="all",
        ),
        pytest.param(
            modified(VALID, lambda r: r[0]["exactly"].update(allocationMode="future-mode")),
            {COUNT: "1", GPU: "0"},
            id="unknown-count-mode",
        ),
        # Admins are *not* exempt from quota.
        pytest.param(modified(VALID, _admin), {COUNT: "1", GPU: "1"}, id="admin"),
        pytest.param(PRIORITIZED, {COUNT: "1", GPU: "1"}, id="prioritized-list"),
        pytest.param(
            modified(
                PRIORITIZED,
                lambda r: (
                    r[0]["firstAvailable"][0].update(count=2),
                    r[0]["firstAvailable"].append(subrequest("subreq-1", "gpu", "ExactCount", 1)),
                ),
            ),
            {COUNT: "1", GPU: "2"},
            id="prioritized-list-multiple-subrequests",
        ),
        pytest.param(
            modified(
                PRIORITIZED,
                lambda r: r[0]["firstAvailable"].append(subrequest("subreq-1", "gpu", "All")),
            ),
            {COUNT: "1", GPU: "32"},
            id="prioritized-list-multiple-subrequests-allocation-mode-all",
        ),
        pytest.param(
            modified(
                PRIORITIZED,
                lambda r: r[0]["firstAvailable"].append(subrequest("subreq-1", "tpu", "All")),
            ),
            {COUNT: "1", GPU: "1", TPU: "32"},
            id="prioritized-list-multiple-subrequests-different-device-classes",
        ),
        # tally: the e2e spec's claim as the API server stores it (defaults filled in), a
        # request of no known type, a claim without requests, and the v1beta1 request shape.
        pytest.param(
            claim({"name": "req-0", "exactly": {"deviceClassName": "gold"}}),
            {COUNT: "1", "gold.deviceclass.resource.k8s.io/devices": "0"},
            id="tally: no allocation mode is an unknown mode",
        ),
        pytest.param(claim({"name": "future"}), {COUNT: "1"}, id="tally: unknown request type"),
        pytest.param(claim(), {COUNT: "1"}, id="tally: no requests"),
        pytest.param(
            claim({"name": "req-0", **exactly(count=3)}),
            {COUNT: "1", GPU: "3"},
            id="tally: v1beta1 request shape",
        ),
    ],
)
def test_usage(obj: dict[str, Any], usage: dict[str, str]) -> None:
    got = ResourceClaimEvaluator().usage(obj)
    assert quota.equals(got, {k: parse_quantity(v) for k, v in usage.items()})


# TestResourceClaimEvaluatorMatchingResources (without the DRAExtendedResource names)
@pytest.mark.parametrize(
    ("items", "want"),
    [
        pytest.param([COUNT, GPU], [COUNT, GPU], id="supported-resources"),
        pytest.param(
            [
                "resourceclaims",  # no such alias
                "storage",
                "ephemeral-storage",
                "bronze.deviceclass.resource.k8s.io/storage",
                "gpu.storage.k8s.io/requests.storage",
            ],
            [],
            id="unsupported-resources",
        ),
        pytest.param(
            ["requests.deviceclass.resource.kubernetes.io/gpu", "requests.example.com/gpu"],
            [],
            id="tally: extended-resource names not ported",
        ),
    ],
)
def test_matching_resources(items: list[str], want: list[str]) -> None:
    assert ResourceClaimEvaluator().matching_resources(items) == want


# TestResourceClaimEvaluatorHandles
@pytest.mark.parametrize(
    ("operation", "subresource", "want"),
    [
        pytest.param("CREATE", "", True, id="create"),
        pytest.param("UPDATE", "", True, id="update"),
        pytest.param("DELETE", "", False, id="delete"),
        pytest.param("CONNECT", "", False, id="connect"),
        pytest.param("CREATE", "subresource", False, id="create-subresource"),
        pytest.param("UPDATE", "subresource", False, id="update-subresource"),
    ],
)
def test_handles(operation: str, subresource: str, want: bool) -> None:
    assert ResourceClaimEvaluator().handles(operation, subresource, None, None) is want


def test_no_scopes_constraints_or_update_replenishment() -> None:
    # resource_claims.go: MatchesNoScopeFunc, no-op Constraints; spec is immutable.
    ev = ResourceClaimEvaluator()
    assert ev.group_resource == RESOURCE_CLAIMS
    terminating = parse_scope_requirement({"scopeName": "Terminating", "operator": "Exists"})
    scoped = {"spec": {"scopes": ["Terminating"]}, "status": {"hard": {COUNT: "5"}}}
    assert not ev.matches(scoped, VALID)
    assert ev.matches({"status": {"hard": {GPU: "5"}}}, VALID)
    assert not ev.matches({"status": {"hard": {"pods": "5"}}}, VALID)
    ev.constraints([COUNT, GPU], VALID)
    assert not ev.requires_replenishment(VALID, modified(VALID, _many))
    objs = [VALID, modified(VALID, _many)]
    assert quota.to_strings(ev.usage_stats(objs, [COUNT, GPU, TPU], [])) == {
        COUNT: "2",
        GPU: "6",
        TPU: "0",
    }
    assert quota.to_strings(ev.usage_stats(objs, [COUNT], [terminating])) == {COUNT: "0"}


def test_calculate_usage_of_the_e2e_quota() -> None:
    # test/e2e/apimachinery/resource_quota.go "capture the life of a ResourceClaim": the quota
    # names count/resourceclaims.resource.k8s.io and gold.deviceclass.resource.k8s.io/devices;
    # the claim (defaulted by the API server: ExactCount, count 1) charges 1 of each.
    gold = "gold.deviceclass.resource.k8s.io/devices"
    hard = {COUNT: "1", gold: "1"}
    stored = claim({"name": "req-0", "exactly": exactly("gold")})
    registry = new_registry()
    assert quota.to_strings(calculate_usage({RESOURCE_CLAIMS: []}, hard, (), registry)) == {
        COUNT: "0",
        gold: "0",
    }
    assert quota.to_strings(calculate_usage({RESOURCE_CLAIMS: [stored]}, hard, (), registry)) == {
        COUNT: "1",
        gold: "1",
    }


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        pytest.param({"spec": {"devices": {"requests": {}}}}, "spec.devices.requests", id="list"),
        pytest.param(
            {"spec": {"devices": {"requests": ["x"]}}}, "spec.devices.requests[0]", id="req"
        ),
        pytest.param(
            claim({"name": "r", "exactly": exactly(count="2")}),  # type: ignore[arg-type]
            "spec.devices.requests[0].exactly.count",
            id="count",
        ),
        pytest.param(
            claim({"name": "r", "exactly": "gpu"}), "spec.devices.requests[0].exactly", id="exactly"
        ),
        pytest.param(
            claim({"name": "r", "firstAvailable": [{"deviceClassName": 1}]}),
            "spec.devices.requests[0].firstAvailable[0].deviceClassName",
            id="subrequest class",
        ),
    ],
)
def test_malformed(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError) as info:
        ResourceClaimEvaluator().usage(obj)
    assert info.value.field == field
