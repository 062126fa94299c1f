"""The registry and ``calculate_usage`` (spec 1.0 and 1.5, apiserver ``CalculateUsage``)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import builders
from tally.evaluators import (
    GroupResource,
    ObjectCountEvaluator,
    PodEvaluator,
    ScopeError,
    UsageError,
    calculate_quota_usage,
    calculate_usage,
    new_registry,
    project_pod,
    quota_scopes,
)
from tally.evaluators.registry import group_resource_for_count_name
from tally.quota import resources as quota

pytestmark = pytest.mark.unit

PODS = GroupResource("", "pods")
SERVICES = GroupResource("", "services")
SECRETS = GroupResource("", "secrets")
DEPLOYMENTS = GroupResource("apps", "deployments")


def test_core_registry() -> None:
    registry = new_registry()
    assert [str(e.group_resource) for e in registry.list()] == [
        "configmaps",
        "persistentvolumeclaims",
        "pods",
        "replicationcontrollers",
        "resourcequotas",
        "secrets",
        "services",
        # upstream core.NewEvaluators: with DynamicResourceAllocation on (GA)
        "resourceclaims.resource.k8s.io",
    ]
    assert isinstance(registry.get(PODS), PodEvaluator)
    # legacy aliases (spec 1.0): both "secrets" and "count/secrets"
    secrets = registry.get(SECRETS)
    assert secrets is not None
    assert secrets.matching_resources(["secrets", "count/secrets"]) == ["count/secrets", "secrets"]


@pytest.mark.parametrize(
    "group_resource",
    [
        pytest.param(GroupResource("", "bindings"), id="bindings"),
        pytest.param(GroupResource("", "componentstatuses"), id="componentstatuses"),
        pytest.param(GroupResource("authentication.k8s.io", "tokenreviews"), id="tokenreviews"),
        pytest.param(
            GroupResource("authentication.k8s.io", "selfsubjectreviews"), id="selfsubjectreviews"
        ),
        pytest.param(GroupResource("authorization.k8s.io", "subjectaccessreviews"), id="sar"),
        pytest.param(GroupResource("authorization.k8s.io", "selfsubjectaccessreviews"), id="ssar"),
        pytest.param(GroupResource("authorization.k8s.io", "localsubjectaccessreviews"), id="lsar"),
        pytest.param(GroupResource("authorization.k8s.io", "selfsubjectrulesreviews"), id="ssrr"),
        pytest.param(GroupResource("", "events"), id="events"),
        pytest.param(GroupResource("events.k8s.io", "events"), id="events.k8s.io"),
    ],
)
def test_ignored(group_resource: GroupResource) -> None:
    # spec 1.0: never quota-tracked
    registry = new_registry()
    assert registry.is_ignored(group_resource)
    assert registry.get_or_count(group_resource) is None


def test_fallback_and_register() -> None:
    registry = new_registry()
    fallback = registry.get_or_count(DEPLOYMENTS)
    assert isinstance(fallback, ObjectCountEvaluator)
    assert fallback.matching_resources(["count/deployments.apps"]) == ["count/deployments.apps"]
    podsets = GroupResource("tally.example.com", "podsets")
    custom = ObjectCountEvaluator(podsets)
    registry.register(custom)
    assert registry.get_or_count(podsets) is custom
    registry.remove(podsets)
    assert registry.get(podsets) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("count/pods", PODS, id="core"),
        pytest.param("count/deployments.apps", DEPLOYMENTS, id="apps"),
        pytest.param(
            "count/podsets.tally.example.com",
            GroupResource("tally.example.com", "podsets"),
            id="crd",
        ),
        pytest.param("pods", None, id="not-a-count"),
        pytest.param("count/", None, id="empty"),
    ],
)
def test_group_resource_for_count_name(name: str, expected: GroupResource | None) -> None:
    assert group_resource_for_count_name(name) == expected


# The Running pod ns/p (its requests given) and the quota q (its spec.hard given).
pod = functools.partial(
    builders.pod, "p", namespace="ns", container_name="c", image=None, phase="Running"
)
resource_quota = functools.partial(builders.resource_quota, "q")


OBJECTS: dict[GroupResource, list[dict[str, Any]]] = {
    PODS: [
        pod({"cpu": "1"}),
        pod({"cpu": "500m"}, active_deadline_seconds=10),
        pod({"cpu": "2"}, phase="Succeeded"),
    ],
    SERVICES: [{"spec": {"type": "NodePort", "ports": [{"port": 80}]}}],
    SECRETS: [{}, {}],
    DEPLOYMENTS: [{}, {}, {}],
}


@pytest.mark.parametrize(
    ("quota_obj", "expected"),
    [
        # spec 1.5: every requested name starts at 0, then matching objects add up
        pytest.param(
            resource_quota({"pods": "10", "requests.cpu": "4", "count/pods": "10"}),
            {"pods": "2", "requests.cpu": "1500m", "count/pods": "3"},
            id="pods",
        ),
        pytest.param(
            resource_quota({"pods": "10", "requests.cpu": "4"}, scopes=["Terminating"]),
            {"pods": "1", "requests.cpu": "500m"},
            id="terminating-scope",
        ),
        pytest.param(
            resource_quota({"pods": "10", "services": "3"}, scopes=["NotTerminating"]),
            {"pods": "1", "services": "0"},
            id="scoped-quota-never-counts-services",
        ),
        pytest.param(
            resource_quota({"services.nodeports": "2", "secrets": "5", "count/secrets": "5"}),
            {"services.nodeports": "1", "secrets": "2", "count/secrets": "2"},
            id="services-and-secret-aliases",
        ),
        pytest.param(
            resource_quota({"count/deployments.apps": "5", "count/widgets.example.com": "1"}),
            {"count/deployments.apps": "3"},
            id="discovered-count-and-unknown-name",
        ),
        pytest.param(
            resource_quota({"requests.nvidia.com/gpu": "2", "foo": "1"}),
            {"requests.nvidia.com/gpu": "0"},
            id="extended-zero-and-unmatched-name",
        ),
        pytest.param(resource_quota({}), {}, id="no-hard"),
    ],
)
def test_calculate_quota_usage(quota_obj: dict[str, Any], expected: dict[str, str]) -> None:
    got = calculate_quota_usage(quota_obj, OBJECTS, new_registry(clock=lambda: 0.0))
    assert quota.to_strings(got) == expected


def test_calculate_usage_accepts_projections() -> None:
    objects = {PODS: [project_pod(p) for p in OBJECTS[PODS]]}
    hard = {"pods": "10", "requests.cpu": "4"}
    scopes = quota_scopes(resource_quota(hard, scopes=["Terminating"]))
    got = calculate_usage(objects, hard, scopes)
    assert quota.to_strings(got) == {"pods": "1", "requests.cpu": "500m"}


def test_calculate_usage_keeps_what_it_could_compute() -> None:
    # CalculateUsage: a failing evaluator's names are dropped, the others are kept
    objects: dict[GroupResource, list[dict[str, Any]]] = {
        PODS: [pod({"cpu": "lots"})],
        SECRETS: [{}],
    }
    with pytest.raises(UsageError) as info:
        calculate_usage(objects, ["pods", "secrets"])
    assert quota.to_strings(info.value.usage) == {"secrets": "1"}
    assert "spec.containers[0].resources.requests[cpu]" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"scopes": ["Forever"]}, "unsupported scope", id="unknown-scope-name"),
        pytest.param(
            {
                "scopeSelector": {
                    "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In"}]
                }
            },
            "must be at least one value",
            id="in-without-values",
        ),
        pytest.param(
            {
                "scopeSelector": {
                    "matchExpressions": [
                        {"scopeName": "PriorityClass", "operator": "Exists", "values": ["a"]}
                    ]
                }
            },
            "must be no value",
            id="exists-with-values",
        ),
        pytest.param(
            {
                "scopeSelector": {
                    "matchExpressions": [
                        {"scopeName": "BestEffort", "operator": "In", "values": ["a"]}
                    ]
                }
            },
            "must be 'Exist' when scope is any of",
            id="besteffort-needs-exists",
        ),
        pytest.param(
            {
                "scopeSelector": {
                    "matchExpressions": [
                        {"scopeName": "PriorityClass", "operator": "Equals", "values": ["a"]}
                    ]
                }
            },
            "not a valid selector operator",
            id="unknown-operator",
        ),
        pytest.param({"scopes": "BestEffort"}, "expected a list", id="scopes-not-list"),
    ],
)
def test_bad_scopes(spec: dict[str, Any], message: str) -> None:
    with pytest.raises((ScopeError, ValueError)) as info:
        quota_scopes({"spec": spec})
    assert message in str(info.value)


def test_scope_requirement_prints_like_go() -> None:
    # admission: "insufficient quota to match these scopes: [{PriorityClass In [a b]}]"
    scopes = quota_scopes(
        {
            "spec": {
                "scopeSelector": {
                    "matchExpressions": [
                        {"scopeName": "PriorityClass", "operator": "In", "values": ["a", "b"]}
                    ]
                }
            }
        }
    )
    assert [str(s) for s in scopes] == ["{PriorityClass In [a b]}"]


@pytest.mark.parametrize(
    "obj",
    [pytest.param(None, id="none"), pytest.param("pod", id="string"), pytest.param(7, id="int")],
)
def test_non_objects_are_object_errors(obj: Any) -> None:
    # bad input is a clear ValueError, never an AttributeError from deep inside
    registry = new_registry()
    cases = [
        (PODS, "Terminating"),
        (SERVICES, None),  # services match no scope without looking at the object
        (GroupResource("", "persistentvolumeclaims"), "VolumeAttributesClass"),
    ]
    for group_resource, scope_name in cases:
        evaluator = registry.get(group_resource)
        assert evaluator is not None
        with pytest.raises(ValueError, match="expected an object"):
            evaluator.usage(obj)
        if scope_name:
            scope = quota_scopes({"spec": {"scopes": [scope_name]}})[0]
            with pytest.raises(ValueError, match="expected an object"):
                evaluator.matches_scope(scope, obj)
    with pytest.raises(UsageError):
        calculate_quota_usage({"spec": "nope"}, {})
    with pytest.raises(ValueError, match="expected an object"):
        quota_scopes(obj)
