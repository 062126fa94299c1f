"""The pod evaluator, ported from kubernetes ``pkg/quota/v1/evaluator/core/pods_test.go``.

Upstream builds ``api.Pod`` structs; :func:`pod` builds the same pods as API JSON. Each table
case names its upstream test and case; cases marked "spec" come from the spec section 1.1
(sidecars, which pods count, scopes, replenishment) with values worked out from its rules.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pytest

import builders
from tally.evaluators import (
    ConstraintError,
    ObjectError,
    PodEvaluator,
    PodProjection,
    ScopeName,
    ScopeRequirement,
    project_pod,
)
from tally.evaluators.base import parse_scope_requirement
from tally.machinery.selectors import Operator
from tally.quota import resources as quota
from tally.quota.quantity import parse_quantity

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.0
"""The fake clock: every evaluator here reads this time."""


def evaluator(now: float = NOW) -> PodEvaluator:
    return PodEvaluator(clock=lambda: now)


# Containers always carry resources ({} when empty); the pod ns/p has the containers given (none
# by default) and a status ({} when empty), as upstream's test literals.
container = functools.partial(builders.container, image="x", resources="always")
pod = functools.partial(builders.pod, "p", namespace="ns", containers=[], status={}, with_kind=True)


def rl(values: Mapping[str, str]) -> dict[str, Any]:
    return {name: parse_quantity(value) for name, value in values.items()}


def usage_strings(usage: quota.ResourceList) -> dict[str, str]:
    return quota.to_strings(usage)


def assert_usage(actual: quota.ResourceList, expected: Mapping[str, str]) -> None:
    assert quota.equals(actual, rl(expected)), (usage_strings(actual), dict(expected))


CPU_1M_2M = {"requests": {"cpu": "1m"}, "limits": {"cpu": "2m"}}

# TestPodConstraintsFunc
CONSTRAINT_CASES = [
    pytest.param(
        pod(init=[container("dummy", {"cpu": "1m"}, {"cpu": "2m"})]),
        ["memory"],
        "must specify memory for: dummy",
        id="init container resource missing",
    ),
    pytest.param(
        pod(
            init=[
                container("foo", {"cpu": "1m"}, {"cpu": "2m"}),
                container("bar", {"cpu": "1m"}, {"cpu": "2m"}),
            ]
        ),
        ["memory"],
        "must specify memory for: bar,foo",
        id="multiple init container resource missing",
    ),
    pytest.param(
        pod(containers=[container("dummy", {"cpu": "1m"}, {"cpu": "2m"})]),
        ["memory"],
        "must specify memory for: dummy",
        id="container resource missing",
    ),
    pytest.param(
        pod(
            containers=[
                container("foo", {"cpu": "1m"}, {"cpu": "2m"}),
                container("bar", {"cpu": "1m"}, {"cpu": "2m"}),
            ]
        ),
        ["memory"],
        "must specify memory for: bar,foo",
        id="multiple container resource missing",
    ),
    pytest.param(
        pod(containers=[container("foo"), container("bar")]),
        ["memory", "cpu"],
        "must specify cpu for: bar,foo; memory for: bar,foo",
        id="container resource missing multiple",
    ),
    pytest.param(
        pod(
            containers=[container("foo"), container("bar")],
            spec={"resources": {"requests": {"cpu": "1m"}}},
        ),
        ["memory", "cpu"],
        None,
        id="pod-level resource set, container-level required resources missing",
    ),
    # spec 1.1: only cpu/memory names constrain; a limits.* name needs the limit
    pytest.param(
        pod(containers=[container("foo", {"cpu": "1"})]),
        ["limits.cpu", "pods", "requests.storage"],
        "must specify limits.cpu for: foo",
        id="spec: limits.cpu needs a limit",
    ),
    pytest.param(
        pod(containers=[container("foo", {"cpu": "1"})]),
        ["ephemeral-storage", "pods", "count/pods"],
        None,
        id="spec: other names never constrain",
    ),
]


@pytest.mark.parametrize(("obj", "required", "error"), CONSTRAINT_CASES)
def test_constraints(obj: dict[str, Any], required: list[str], error: str | None) -> None:
    if error is None:
        evaluator().constraints(required, obj)
    else:
        with pytest.raises(ConstraintError) as info:
            evaluator().constraints(required, obj)
        assert str(info.value) == error


DELETION_PAST_GRACE = "2023-11-14T22:12:20Z"  # NOW - 60 s, grace 30 s
DELETION_NOW = "2023-11-14T22:13:20Z"  # NOW exactly


# TestPodEvaluatorUsage
USAGE_CASES = [
    pytest.param(
        pod(init=[container("", requests={"cpu": "1m"}, limits={"cpu": "2m"})]),
        {"requests.cpu": "1m", "limits.cpu": "2m", "pods": "1", "cpu": "1m", "count/pods": "1"},
        id="init container CPU",
    ),
    pytest.param(
        pod(init=[container("", requests={"memory": "1m"}, limits={"memory": "2m"})]),
        {
            "requests.memory": "1m",
            "limits.memory": "2m",
            "pods": "1",
            "memory": "1m",
            "count/pods": "1",
        },
        id="init container MEM",
    ),
    pytest.param(
        pod(
            init=[
                container(
                    "", requests={"ephemeral-storage": "32Mi"}, limits={"ephemeral-storage": "64Mi"}
                )
            ]
        ),
        {
            "ephemeral-storage": "32Mi",
            "requests.ephemeral-storage": "32Mi",
            "limits.ephemeral-storage": "64Mi",
            "pods": "1",
            "count/pods": "1",
        },
        id="init container local ephemeral storage",
    ),
    pytest.param(
        pod(init=[container("", requests={"hugepages-2Mi": "100Mi"})]),
        {
            "hugepages-2Mi": "100Mi",
            "requests.hugepages-2Mi": "100Mi",
            "pods": "1",
            "count/pods": "1",
        },
        id="init container hugepages",
    ),
    pytest.param(
        pod(
            init=[
                container(
                    "", requests={"example.com/dongle": "3"}, limits={"example.com/dongle": "3"}
                )
            ]
        ),
        {"requests.example.com/dongle": "3", "pods": "1", "count/pods": "1"},
        id="init container extended resources",
    ),
    pytest.param(
        pod(
            init=[
                container(
                    "",
                    requests={"deviceclass.resource.kubernetes.io/dongle": "3"},
                    limits={"deviceclass.resource.kubernetes.io/dongle": "3"},
                )
            ]
        ),
        {"requests.deviceclass.resource.kubernetes.io/dongle": "3", "pods": "1", "count/pods": "1"},
        id="init container implicit extended resources",
    ),
    pytest.param(
        pod(containers=[container("", requests={"cpu": "1m"}, limits={"cpu": "2m"})]),
        {"requests.cpu": "1m", "limits.cpu": "2m", "pods": "1", "cpu": "1m", "count/pods": "1"},
        id="container CPU",
    ),
    pytest.param(
        pod(containers=[container("", requests={"memory": "1m"}, limits={"memory": "2m"})]),
        {
            "requests.memory": "1m",
            "limits.memory": "2m",
            "pods": "1",
            "memory": "1m",
            "count/pods": "1",
        },
        id="container MEM",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "", requests={"ephemeral-storage": "32Mi"}, limits={"ephemeral-storage": "64Mi"}
                )
            ]
        ),
        {
            "ephemeral-storage": "32Mi",
            "requests.ephemeral-storage": "32Mi",
            "limits.ephemeral-storage": "64Mi",
            "pods": "1",
            "count/pods": "1",
        },
        id="container local ephemeral storage",
    ),
    pytest.param(
        pod(containers=[container("", requests={"hugepages-2Mi": "100Mi"})]),
        {
            "hugepages-2Mi": "100Mi",
            "requests.hugepages-2Mi": "100Mi",
            "pods": "1",
            "count/pods": "1",
        },
        id="container hugepages",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "", requests={"example.com/dongle": "3"}, limits={"example.com/dongle": "3"}
                )
            ]
        ),
        {"requests.example.com/dongle": "3", "pods": "1", "count/pods": "1"},
        id="container extended resources",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "",
                    requests={"deviceclass.resource.kubernetes.io/dongle": "3"},
                    limits={"deviceclass.resource.kubernetes.io/dongle": "3"},
                )
            ]
        ),
        {"requests.deviceclass.resource.kubernetes.io/dongle": "3", "pods": "1", "count/pods": "1"},
        id="container implicit extended resources",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "", requests={"example.com/dongle": "3"}, limits={"example.com/dongle": "3"}
                )
            ],
            phase="Succeeded",
        ),
        {"count/pods": "1"},
        id="terminated generic count still appears",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "",
                    requests={"cpu": "1", "memory": "50M", "example.com/dongle": "1"},
                    limits={"cpu": "2", "memory": "100M", "example.com/dongle": "1"},
                ),
                container(
                    "",
                    requests={"cpu": "2", "memory": "25M", "example.com/dongle": "2"},
                    limits={"cpu": "5", "memory": "50M", "example.com/dongle": "2"},
                ),
            ],
            init=[
                container(
                    "",
                    requests={"cpu": "4", "memory": "100M", "example.com/dongle": "4"},
                    limits={"cpu": "8", "memory": "200M", "example.com/dongle": "4"},
                ),
                container(
                    "",
                    requests={"cpu": "1", "memory": "50M", "example.com/dongle": "2"},
                    limits={"cpu": "2", "memory": "100M", "example.com/dongle": "2"},
                ),
            ],
        ),
        {
            "requests.cpu": "4",
            "requests.memory": "100M",
            "limits.cpu": "8",
            "limits.memory": "200M",
            "pods": "1",
            "cpu": "4",
            "memory": "100M",
            "requests.example.com/dongle": "4",
            "count/pods": "1",
        },
        id="init container maximums override sum of containers",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "",
                    requests={"cpu": "1", "memory": "50M"},
                    limits={"cpu": "2", "memory": "100M"},
                )
            ],
            metadata={
                "deletionTimestamp": DELETION_PAST_GRACE,
                "deletionGracePeriodSeconds": 30,
            },
            spec={"terminationGracePeriodSeconds": 30},
            status={"reason": "NodeLost"},
        ),
        {"count/pods": "1"},
        id="pod deletion timestamp exceeded",
    ),
    pytest.param(
        pod(
            containers=[container("", requests={"cpu": "1"}, limits={"cpu": "2"})],
            metadata={"deletionTimestamp": DELETION_NOW, "deletionGracePeriodSeconds": 30},
            status={"reason": "NodeLost"},
        ),
        {"requests.cpu": "1", "limits.cpu": "2", "pods": "1", "cpu": "1", "count/pods": "1"},
        id="pod deletion timestamp not exceeded",
    ),
    pytest.param(
        pod(
            containers=[container("", requests={"cpu": "1"}, limits={"cpu": "2"})],
            spec={"overhead": {"cpu": "1"}},
        ),
        {"requests.cpu": "2", "limits.cpu": "3", "pods": "1", "cpu": "2", "count/pods": "1"},
        id="count pod overhead as usage",
    ),
    pytest.param(
        pod(spec={"resources": {"requests": {"cpu": "1m"}, "limits": {"cpu": "2m"}}}),
        {"requests.cpu": "1m", "limits.cpu": "2m", "pods": "1", "cpu": "1m", "count/pods": "1"},
        id="pod-level CPU",
    ),
    pytest.param(
        pod(spec={"resources": {"requests": {"memory": "1Mi"}, "limits": {"memory": "2Mi"}}}),
        {
            "requests.memory": "1Mi",
            "limits.memory": "2Mi",
            "pods": "1",
            "memory": "1Mi",
            "count/pods": "1",
        },
        id="pod-level Memory",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "", requests={"ephemeral-storage": "32Mi"}, limits={"ephemeral-storage": "64Mi"}
                )
            ],
            spec={"resources": {"requests": {"memory": "1Mi"}, "limits": {"memory": "2Mi"}}},
        ),
        {
            "ephemeral-storage": "32Mi",
            "requests.ephemeral-storage": "32Mi",
            "limits.ephemeral-storage": "64Mi",
            "pods": "1",
            "requests.memory": "1Mi",
            "limits.memory": "2Mi",
            "memory": "1Mi",
            "count/pods": "1",
        },
        id="pod-level memory with container-level ephemeral storage",
    ),
    # TestPodEvaluatorUsageResourceResize
    pytest.param(
        pod(
            containers=[container("", requests={"memory": "200Mi"}, limits={"memory": "400Mi"})],
            status={
                "containerStatuses": [{"name": "", "resources": {"requests": {"memory": "150Mi"}}}]
            },
        ),
        {
            "requests.memory": "200Mi",
            "limits.memory": "400Mi",
            "pods": "1",
            "memory": "200Mi",
            "count/pods": "1",
        },
        id="resize: max(spec, status) for memory",
    ),
    pytest.param(
        pod(
            containers=[container("", requests={"cpu": "100m"}, limits={"cpu": "200m"})],
            status={
                "containerStatuses": [{"name": "", "resources": {"requests": {"cpu": "150m"}}}]
            },
        ),
        {
            "requests.cpu": "150m",
            "limits.cpu": "200m",
            "pods": "1",
            "cpu": "150m",
            "count/pods": "1",
        },
        id="resize: max(spec, status) for CPU",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "",
                    requests={"cpu": "100m", "memory": "200Mi"},
                    limits={"cpu": "200m", "memory": "400Mi"},
                )
            ],
            status={
                "containerStatuses": [
                    {"name": "", "resources": {"requests": {"cpu": "150m", "memory": "250Mi"}}}
                ]
            },
        ),
        {
            "requests.cpu": "150m",
            "limits.cpu": "200m",
            "requests.memory": "250Mi",
            "limits.memory": "400Mi",
            "pods": "1",
            "cpu": "150m",
            "memory": "250Mi",
            "count/pods": "1",
        },
        id="resize: max(spec, status) for CPU and memory",
    ),
    pytest.param(
        pod(
            containers=[
                container(
                    "",
                    requests={"cpu": "100m", "memory": "200Mi"},
                    limits={"cpu": "200m", "memory": "400Mi"},
                )
            ],
            status={"containerStatuses": [{}]},
        ),
        {
            "requests.cpu": "100m",
            "limits.cpu": "200m",
            "requests.memory": "200Mi",
            "limits.memory": "400Mi",
            "pods": "1",
            "cpu": "100m",
            "memory": "200Mi",
            "count/pods": "1",
        },
        id="resize: max(spec, status==nil) for CPU and memory",
    ),
    # spec 1.1: allocated resources count too (max of spec, allocated, status)
    pytest.param(
        pod(
            containers=[container("c", requests={"cpu": "100m"}, limits={"cpu": "1"})],
            status={"containerStatuses": [{"name": "c", "allocatedResources": {"cpu": "300m"}}]},
        ),
        {"requests.cpu": "300m", "limits.cpu": "1", "pods": "1", "cpu": "300m", "count/pods": "1"},
        id="spec: resize allocated wins when larger",
    ),
    # spec 1.1: sidecars (restartable init containers) run alongside the containers
    pytest.param(
        pod(
            containers=[container("app", {"cpu": "1"})],
            init=[
                container("sidecar", {"cpu": "1"}, restart_policy="Always"),
                container("setup", {"cpu": "2"}),
            ],
        ),
        # containers + sidecars = 2; setup's footprint = 2 + sidecar 1 = 3; max = 3
        {"requests.cpu": "3", "cpu": "3", "pods": "1", "count/pods": "1"},
        id="spec: init container after a sidecar carries the sidecar",
    ),
    pytest.param(
        pod(
            containers=[container("app", {"cpu": "2", "memory": "1Gi"})],
            init=[
                container("setup", {"cpu": "1", "memory": "2Gi"}),
                container("sidecar", {"cpu": "500m", "memory": "100Mi"}, restart_policy="Always"),
            ],
        ),
        # containers + sidecar = 2500m / 1Gi+100Mi; setup (before the sidecar) = 1 / 2Gi
        {
            "requests.cpu": "2500m",
            "cpu": "2500m",
            "requests.memory": "2Gi",
            "memory": "2Gi",
            "pods": "1",
            "count/pods": "1",
        },
        id="spec: sidecar started after an init container",
    ),
    # spec 1.1: pod-level values replace computed ones, overhead adds to set limits only
    pytest.param(
        pod(
            containers=[
                container("", requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "2Gi"})
            ],
            spec={
                "resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "4"}},
                "overhead": {"cpu": "100m", "memory": "10Mi"},
            },
        ),
        {
            "requests.cpu": "3100m",
            "cpu": "3100m",
            "limits.cpu": "4100m",
            "requests.memory": "1034Mi",
            "memory": "1034Mi",
            "limits.memory": "2058Mi",
            "pods": "1",
            "count/pods": "1",
        },
        id="spec: pod-level cpu replaces, overhead on requests and set limits",
    ),
    pytest.param(
        pod(containers=[container("", requests={"cpu": "1"})], spec={"overhead": {"cpu": "250m"}}),
        {"requests.cpu": "1250m", "cpu": "1250m", "pods": "1", "count/pods": "1"},
        id="spec: overhead never creates a limit",
    ),
    pytest.param(
        pod(containers=[container("", requests={"cpu": "1"})], phase="Failed"),
        {"count/pods": "1"},
        id="spec: failed pods count only as objects",
    ),
]


@pytest.mark.parametrize(("obj", "expected"), USAGE_CASES)
def test_usage(obj: dict[str, Any], expected: dict[str, str]) -> None:
    assert_usage(evaluator().usage(obj), expected)
    # the projection charges exactly the same
    assert_usage(evaluator().usage(project_pod(obj)), expected)


@pytest.mark.parametrize(
    ("now", "counts"),
    [
        # spec 1.1: "not if ... now is strictly after timestamp + grace"
        pytest.param(NOW + 30, True, id="at-deadline-counts"),
        pytest.param(NOW + 30.5, False, id="after-deadline"),
        pytest.param(NOW - 1000, True, id="long-before"),
    ],
)
def test_deletion_grace_is_strict(now: float, counts: bool) -> None:
    obj = pod(
        containers=[container("", requests={"cpu": "1"})],
        metadata={"deletionTimestamp": DELETION_NOW, "deletionGracePeriodSeconds": 30},
    )
    assert ("pods" in evaluator(now).usage(obj)) is counts


def test_deletion_without_grace_period_counts() -> None:
    # QuotaV1Pod needs both fields; a timestamp alone keeps the pod charged.
    obj = pod(
        containers=[container("", requests={"cpu": "1"})],
        metadata={"deletionTimestamp": DELETION_NOW},
    )
    assert "pods" in evaluator(NOW + 10**6).usage(obj)


def upstream_make_pod(
    name: str, priority_class: str, cpu: str | None, phase: str
) -> dict[str, Any]:
    """Upstream ``makePod``: requests and limits set to the same list."""
    resources = {"cpu": cpu} if cpu else None
    return pod(
        containers=[container("", resources, resources)],
        phase=phase,
        priority_class_name=priority_class or None,
        metadata={"name": name},
    )


HIGH_SELECTOR = {"scopeName": "PriorityClass", "operator": "In", "values": ["high-priority"]}


# TestPodEvaluatorUsageStats
@pytest.mark.parametrize(
    ("objs", "scopes", "selector", "want"),
    [
        pytest.param([], [], [], {}, id="nil case"),
        pytest.param(
            [
                upstream_make_pod("p1", "", "1", "Running"),
                upstream_make_pod("p2", "", "1", "Running"),
            ],
            [],
            [],
            {"pods": "2", "count/pods": "2", "cpu": "2", "requests.cpu": "2", "limits.cpu": "2"},
            id="all pods in running state",
        ),
        pytest.param(
            [
                upstream_make_pod("p1", "", "1", "Running"),
                upstream_make_pod("p2", "", "1", "Succeeded"),
            ],
            [],
            [],
            {"pods": "1", "count/pods": "2", "cpu": "1", "requests.cpu": "1", "limits.cpu": "1"},
            id="one pods in terminal state",
        ),
        pytest.param(
            [
                upstream_make_pod("p1", "high-priority", "1", "Running"),
                upstream_make_pod("p2", "high-priority", "1", "Succeeded"),
                upstream_make_pod("p3", "low-priority", "1", "Running"),
            ],
            [],
            [HIGH_SELECTOR],
            {"pods": "1", "count/pods": "2", "cpu": "1", "requests.cpu": "1", "limits.cpu": "1"},
            id="partial pods matching quotaScopeSelector",
        ),
        pytest.param(
            [
                upstream_make_pod("p1", "high-priority", "1", "Running"),
                upstream_make_pod("p2", "high-priority", "1", "Succeeded"),
                upstream_make_pod("p3", "low-priority", "1", "Running"),
            ],
            ["PriorityClass"],
            [HIGH_SELECTOR],
            {"pods": "1", "count/pods": "2", "cpu": "1", "requests.cpu": "1", "limits.cpu": "1"},
            id="partial pods matching quotaScopeSelector - w/ scopeName specified",
        ),
        pytest.param(
            [
                upstream_make_pod("p1", "high-priority", "1", "Running"),
                upstream_make_pod("p2", "high-priority", "1", "Succeeded"),
                upstream_make_pod("p3", "low-priority", "1", "Running"),
                upstream_make_pod("p4", "high-priority", None, "Failed"),
            ],
            ["PriorityClass", "BestEffort"],
            [HIGH_SELECTOR],
            {"count/pods": "1"},
            id="partial pods matching quotaScopeSelector - w/ multiple scopeNames specified",
        ),
    ],
)
def test_usage_stats(
    objs: list[dict[str, Any]],
    scopes: list[str],
    selector: list[dict[str, Any]],
    want: dict[str, str],
) -> None:
    requirements = [parse_scope_requirement({"scopeName": s, "operator": "Exists"}) for s in scopes]
    requirements += [parse_scope_requirement(s) for s in selector]
    # upstream's stats hold every name the pods use; ask for all of them
    names = [*want, "requests.memory"]
    expected = {**want, "requests.memory": "0"}
    for objects in (objs, [project_pod(o) for o in objs]):
        got = evaluator().usage_stats(objects, names, requirements)
        assert_usage(got, expected)


def test_usage_stats_starts_every_name_at_zero_and_sums_in_left_format() -> None:
    # CalculateUsageStats: each requested name starts at a DecimalSI zero
    objs = [
        pod(containers=[container("", requests={"memory": "1Gi"})]),
        pod(containers=[container("", requests={"memory": "500M"})]),
    ]
    got = evaluator().usage_stats(objs, ["requests.memory", "requests.cpu"], [])
    assert quota.to_strings(got) == {"requests.cpu": "0", "requests.memory": "1573741824"}


def scope(name: str, operator: str = "Exists", values: tuple[str, ...] = ()) -> ScopeRequirement:
    return ScopeRequirement(ScopeName(name), Operator(operator), values)


ALL_SCOPES = [
    scope("Terminating"),
    scope("NotTerminating"),
    scope("BestEffort"),
    scope("NotBestEffort"),
    scope("PriorityClass", "In", ("class1",)),
    scope("CrossNamespacePodAffinity"),
]
TERMINATING = {"activeDeadlineSeconds": 30}


def affinity(kind: str, section: str, term: dict[str, Any]) -> dict[str, Any]:
    if section == "preferred":
        entry: dict[str, Any] = {"weight": 1, "podAffinityTerm": term}
        key = "preferredDuringSchedulingIgnoredDuringExecution"
    else:
        entry = term
        key = "requiredDuringSchedulingIgnoredDuringExecution"
    return {**TERMINATING, "affinity": {kind: {key: [entry]}}}


# TestPodEvaluatorMatchingScopes
@pytest.mark.parametrize(
    ("obj", "selectors", "want"),
    [
        pytest.param(
            pod(), ALL_SCOPES, [scope("NotTerminating"), scope("BestEffort")], id="EmptyPod"
        ),
        pytest.param(
            pod(spec={"priorityClassName": "class1"}),
            ALL_SCOPES,
            [
                scope("NotTerminating"),
                scope("BestEffort"),
                scope("PriorityClass", "In", ("class1",)),
            ],
            id="PriorityClass",
        ),
        pytest.param(
            pod(
                containers=[
                    container(
                        "",
                        requests={"cpu": "1", "memory": "50M", "example.com/dongle": "1"},
                        limits={"cpu": "2", "memory": "100M", "example.com/dongle": "1"},
                    )
                ]
            ),
            ALL_SCOPES,
            [scope("NotTerminating"), scope("NotBestEffort")],
            id="NotBestEffort",
        ),
        pytest.param(
            pod(spec=TERMINATING),
            ALL_SCOPES,
            [scope("Terminating"), scope("BestEffort")],
            id="Terminating",
        ),
        pytest.param(
            pod(spec=TERMINATING),
            [scope("Terminating")],
            [scope("Terminating")],
            id="OnlyTerminating",
        ),
        pytest.param(
            pod(
                spec=affinity(
                    "podAffinity",
                    "required",
                    {"labelSelector": {}, "namespaces": ["ns1"], "namespaceSelector": {}},
                )
            ),
            ALL_SCOPES,
            [scope("Terminating"), scope("BestEffort"), scope("CrossNamespacePodAffinity")],
            id="CrossNamespaceRequiredAffinity",
        ),
        pytest.param(
            pod(
                spec=affinity(
                    "podAffinity", "required", {"labelSelector": {}, "namespaces": ["ns1"]}
                )
            ),
            ALL_SCOPES,
            [scope("Terminating"), scope("BestEffort"), scope("CrossNamespacePodAffinity")],
            id="CrossNamespaceRequiredAffinityWithSlice",
        ),
        pytest.param(
            pod(
                spec=affinity(
                    "podAffinity",
                    "preferred",
                    {"labelSelector": {}, "namespaces": ["ns2"], "namespaceSelector": {}},
                )
            ),
            ALL_SCOPES,
            [scope("Terminating"), scope("BestEffort"), scope("CrossNamespacePodAffinity")],
            id="CrossNamespacePreferredAffinity",
        ),
        pytest.param(
            pod(
                spec=affinity(
                    "podAffinity", "preferred", {"labelSelector": {}, "namespaceSelector": {}}
                )
            ),
            ALL_SCOPES,
            [scope("Terminating"), scope("BestEffort"), scope("CrossNamespacePodAffinity")],
            id="CrossNamespacePreferredAffinityWithSelector",
        ),
        pytest.param(
            pod(
                spec=affinity(
                    "podAntiAffinity", "preferred", {"labelSelector": {}, "namespaceSelector": {}}
                )
            ),
            ALL_SCOPES,
            [scope("Terminating"), scope("BestEffort"), scope("CrossNamespacePodAffinity")],
            id="CrossNamespacePreferredAntiAffinity",
        ),
        pytest.param(
            pod(
                spec=affinity(
                    "podAntiAffinity", "required", {"labelSelector": {}, "namespaces": ["ns3"]}
                )
            ),
            ALL_SCOPES,
            [scope("Terminating"), scope("BestEffort"), scope("CrossNamespacePodAffinity")],
            id="CrossNamespaceRequiredAntiAffinity",
        ),
        # spec 1.1: a same-namespace term is not cross-namespace
        pytest.param(
            pod(spec=affinity("podAffinity", "required", {"labelSelector": {}, "namespaces": []})),
            [scope("CrossNamespacePodAffinity")],
            [],
            id="spec: empty namespaces and no selector",
        ),
    ],
)
def test_matching_scopes(
    obj: dict[str, Any], selectors: list[ScopeRequirement], want: list[ScopeRequirement]
) -> None:
    assert evaluator().matching_scopes(obj, selectors) == want
    assert evaluator().matching_scopes(project_pod(obj), selectors) == want


# spec 1.1 scope table: PriorityClass with every operator, and the other rows
@pytest.mark.parametrize(
    ("requirement", "priority_class", "expected"),
    [
        pytest.param(scope("PriorityClass"), "high", True, id="exists-with-class"),
        pytest.param(scope("PriorityClass"), "", False, id="exists-without-class"),
        pytest.param(scope("PriorityClass", "In", ("high",)), "high", True, id="in"),
        pytest.param(scope("PriorityClass", "In", ("high",)), "low", False, id="in-other"),
        pytest.param(scope("PriorityClass", "In", ("high",)), "", False, id="in-without-class"),
        pytest.param(scope("PriorityClass", "NotIn", ("high",)), "low", True, id="notin-other"),
        pytest.param(scope("PriorityClass", "NotIn", ("high",)), "high", False, id="notin-listed"),
        pytest.param(scope("PriorityClass", "NotIn", ("high",)), "", True, id="notin-no-class"),
        pytest.param(scope("PriorityClass", "DoesNotExist"), "", True, id="dne-no-class"),
        pytest.param(scope("PriorityClass", "DoesNotExist"), "high", False, id="dne-with-class"),
        pytest.param(scope("VolumeAttributesClass"), "high", False, id="vac-never-for-pods"),
    ],
)
def test_priority_class_scope(
    requirement: ScopeRequirement, priority_class: str, expected: bool
) -> None:
    obj = pod(spec={"priorityClassName": priority_class} if priority_class else None)
    assert evaluator().matches_scope(requirement, obj) is expected
    assert evaluator().matches_scope(requirement, project_pod(obj)) is expected


@pytest.mark.parametrize(
    ("obj", "terminating", "best_effort"),
    [
        pytest.param(pod(spec={"activeDeadlineSeconds": 0}), True, True, id="deadline-zero"),
        pytest.param(pod(spec={"activeDeadlineSeconds": -1}), False, True, id="deadline-negative"),
        pytest.param(
            pod(containers=[container("", requests={"ephemeral-storage": "1Gi"})]),
            False,
            True,
            id="only-cpu-and-memory-decide-qos",
        ),
        pytest.param(
            pod(containers=[container("", requests={"cpu": "0"}, limits={"cpu": "0"})]),
            False,
            True,
            id="zero-cpu-is-best-effort",
        ),
        pytest.param(pod(status={"qosClass": "Burstable"}), False, False, id="status-qos-wins"),
        pytest.param(
            pod(spec={"resources": {"requests": {"memory": "1Gi"}}}),
            False,
            False,
            id="pod-level-resources-decide",
        ),
    ],
)
def test_terminating_and_best_effort(
    obj: dict[str, Any], terminating: bool, best_effort: bool
) -> None:
    ev = evaluator()
    assert ev.matches_scope(scope("Terminating"), obj) is terminating
    assert ev.matches_scope(scope("NotTerminating"), obj) is not terminating
    assert ev.matches_scope(scope("BestEffort"), obj) is best_effort
    assert ev.matches_scope(scope("NotBestEffort"), obj) is not best_effort
    projection = project_pod(obj)
    assert (projection.terminating, projection.best_effort) == (terminating, best_effort)


def quota_obj(
    hard: Mapping[str, str], scopes: list[str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "q", "namespace": "ns"},
        "spec": {"hard": dict(hard), **({"scopes": scopes} if scopes else {}), **spec},
        "status": {"hard": dict(hard)},
    }


@pytest.mark.parametrize(
    ("resource_quota", "obj", "expected"),
    [
        pytest.param(quota_obj({"pods": "3"}), pod(), True, id="tracked-name"),
        pytest.param(quota_obj({"services": "3"}), pod(), False, id="no-pod-name"),
        pytest.param(quota_obj({"pods": "3"}, ["Terminating"]), pod(), False, id="scope-mismatch"),
        pytest.param(
            quota_obj({"pods": "3"}, ["BestEffort", "NotTerminating"]),
            pod(),
            True,
            id="all-scopes-match",
        ),
        pytest.param(
            quota_obj({"pods": "3"}, scopeSelector={"matchExpressions": [HIGH_SELECTOR]}),
            pod(spec={"priorityClassName": "high-priority"}),
            True,
            id="scope-selector",
        ),
        pytest.param(
            {"spec": {"hard": {"pods": "3"}}},
            pod(),
            False,
            id="status-hard-not-filled-yet",
        ),
    ],
)
def test_matches(resource_quota: dict[str, Any], obj: dict[str, Any], expected: bool) -> None:
    assert evaluator().matches(resource_quota, obj) is expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        # spec 1.1 matching resource names
        pytest.param(
            [
                "count/pods",
                "pods",
                "cpu",
                "memory",
                "ephemeral-storage",
                "requests.cpu",
                "requests.memory",
                "requests.ephemeral-storage",
                "limits.cpu",
                "limits.memory",
                "limits.ephemeral-storage",
            ],
            [
                "count/pods",
                "cpu",
                "ephemeral-storage",
                "limits.cpu",
                "limits.ephemeral-storage",
                "limits.memory",
                "memory",
                "pods",
                "requests.cpu",
                "requests.ephemeral-storage",
                "requests.memory",
            ],
            id="fixed-names",
        ),
        pytest.param(
            ["hugepages-2Mi", "requests.hugepages-1Gi", "requests.example.com/dongle"],
            ["hugepages-2Mi", "requests.hugepages-1Gi", "requests.example.com/dongle"],
            id="prefixes-and-extended",
        ),
        pytest.param(
            [
                "requests.foo",
                "limits.nvidia.com/gpu",
                "services",
                "requests.storage",
                "requests.kubernetes.io/x",
            ],
            [],
            id="not-matched",
        ),
        pytest.param(
            ["requests.deviceclass.resource.kubernetes.io/gpu"],
            ["requests.deviceclass.resource.kubernetes.io/gpu"],
            id="implicit-dra-extended",
        ),
    ],
)
def test_matching_resources(names: list[str], expected: list[str]) -> None:
    assert evaluator().matching_resources(names) == expected


WITH_DEADLINE = pod(spec={"activeDeadlineSeconds": 1})
WITH_OTHER_DEADLINE = pod(spec={"activeDeadlineSeconds": 2})


# TestPodEvaluatorHandles
@pytest.mark.parametrize(
    ("operation", "subresource", "old", "new", "want"),
    [
        pytest.param("CREATE", "", None, None, True, id="create"),
        pytest.param(
            "UPDATE", "", WITH_DEADLINE, pod(), True, id="update-activeDeadlineSeconds-to-nil"
        ),
        pytest.param(
            "UPDATE", "", pod(), WITH_DEADLINE, True, id="update-activeDeadlineSeconds-from-nil"
        ),
        pytest.param(
            "UPDATE",
            "",
            WITH_OTHER_DEADLINE,
            WITH_DEADLINE,
            False,
            id="update-activeDeadlineSeconds-with-different-values",
        ),
        pytest.param("UPDATE", "", None, None, False, id="update"),
        pytest.param("DELETE", "", None, None, False, id="delete"),
        pytest.param("CONNECT", "", None, None, False, id="connect"),
        pytest.param("CREATE", "subresource", None, None, False, id="create-subresource"),
        pytest.param("UPDATE", "subresource", None, None, False, id="update-subresource"),
        pytest.param("UPDATE", "resize", None, None, True, id="update-resize"),
        pytest.param("UPDATE", "status", pod(), pod(), False, id="spec: status updates"),
    ],
)
def test_handles(
    operation: str,
    subresource: str,
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    want: bool,
) -> None:
    assert evaluator().handles(operation, subresource, old, new) is want


def status_resources(cpu: str) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}


# spec 3 replenishment, pods: stops counting, Terminating-ness changes, resized resources change
@pytest.mark.parametrize(
    ("old", "new", "want"),
    [
        pytest.param(pod(phase="Running"), pod(phase="Succeeded"), True, id="became-terminal"),
        pytest.param(pod(phase="Pending"), pod(phase="Running"), False, id="still-counting"),
        pytest.param(pod(phase="Failed"), pod(phase="Failed"), False, id="already-terminal"),
        pytest.param(pod(), pod(spec={"activeDeadlineSeconds": 5}), True, id="became-terminating"),
        pytest.param(
            pod(),
            pod(
                metadata={
                    "deletionTimestamp": DELETION_PAST_GRACE,
                    "deletionGracePeriodSeconds": 30,
                }
            ),
            True,
            id="past-grace",
        ),
        pytest.param(
            pod(),
            pod(metadata={"deletionTimestamp": DELETION_NOW, "deletionGracePeriodSeconds": 30}),
            False,
            id="deleted-within-grace",
        ),
        pytest.param(
            pod(status=status_resources("1")), pod(status=status_resources("2")), True, id="resized"
        ),
        pytest.param(
            pod(status=status_resources("1")),
            pod(status=status_resources("1000m")),
            False,
            id="same-resources-other-spelling",
        ),
        pytest.param(pod(), pod(status=status_resources("1")), True, id="first-status-resources"),
        pytest.param(pod(status=status_resources("1")), pod(), False, id="status-dropped"),
        pytest.param(pod(metadata={"labels": {"a": "b"}}), pod(), False, id="label-change"),
    ],
)
def test_requires_replenishment(old: dict[str, Any], new: dict[str, Any], want: bool) -> None:
    ev = evaluator()
    assert ev.requires_replenishment(old, new) is want
    assert ev.requires_replenishment(project_pod(old), project_pod(new)) is want


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        pytest.param(
            pod(containers=[container("", requests={"cpu": "lots"})]),
            "spec.containers[0].resources.requests[cpu]",
            id="bad-quantity",
        ),
        pytest.param({"spec": {"containers": "web"}}, "spec.containers", id="containers-not-list"),
        pytest.param(
            {"spec": {"containers": [42]}}, "spec.containers[0]", id="container-not-object"
        ),
        pytest.param({"spec": []}, "spec", id="spec-not-object"),
        pytest.param(
            pod(spec={"activeDeadlineSeconds": "soon"}),
            "spec.activeDeadlineSeconds",
            id="deadline-type",
        ),
        pytest.param(
            pod(metadata={"deletionTimestamp": "yesterday", "deletionGracePeriodSeconds": 1}),
            "metadata.deletionTimestamp",
            id="bad-timestamp",
        ),
        pytest.param(pod(spec={"priorityClassName": 7}), "spec.priorityClassName", id="class-type"),
        pytest.param(pod(spec={"overhead": ["cpu"]}), "spec.overhead", id="overhead-type"),
    ],
)
def test_malformed_pods_name_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError) as info:
        project_pod(obj)
    assert info.value.field == field


def test_missing_fields_are_defaults() -> None:
    # a bare object is an empty pod: counted, best-effort, not terminating
    projection = project_pod({})
    assert isinstance(projection, PodProjection)
    assert_usage(evaluator().usage({}), {"pods": "1", "count/pods": "1"})
    assert projection.best_effort
    assert not projection.terminating


# -- reprojection: a kubelet's status write reuses the previous projection --

RUNNING = {"phase": "Running", "qosClass": "Burstable"}


def _running(
    generation: int | None = 1,
    *,
    cpu: str = "100m",
    ready: bool = True,
    restarts: int = 0,
    status: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod ``generation`` (as the API server keeps it) with what a kubelet reports: Ready
    toggling and restart counts, which no quota reads."""
    reported = {
        **RUNNING,
        "conditions": [{"type": "Ready", "status": str(ready)}],
        "containerStatuses": [{"name": "a", "ready": ready, "restartCount": restarts}],
        **(status or {}),
    }
    extra = {**({"generation": generation} if generation is not None else {}), **(metadata or {})}
    return pod(containers=[container("a", {"cpu": cpu})], status=reported, metadata=extra)


def test_a_status_write_that_changes_nothing_quota_reads_keeps_the_projection() -> None:
    first = project_pod(_running())
    later = PodEvaluator().reproject(first, _running(ready=False, restarts=3))
    assert later is first


def test_a_pod_starting_keeps_the_projection_it_was_admitted_with() -> None:
    # Pending (as created, then bound) to Running: the phase is not terminal either way, and
    # nothing else the projection reads changed.
    first = project_pod(_running(status={"phase": "Pending"}))
    later = PodEvaluator().reproject(first, _running())
    assert later is first
    assert usage_strings(evaluator().usage(later)) == {
        "pods": "1", "count/pods": "1", "requests.cpu": "100m", "cpu": "100m",
    }  # fmt: skip


def test_a_phase_that_is_not_a_string_is_refused_as_a_full_projection_refuses_it() -> None:
    first = project_pod(_running())
    with pytest.raises(ObjectError) as info:
        PodEvaluator().reproject(first, _running(status={"phase": 3}))
    assert info.value.field == "status.phase"


@pytest.mark.parametrize(
    ("update", "changed"),
    [
        # The API server bumps the generation with the spec (a resize included).
        pytest.param(_running(2, cpu="300m"), {"requests.cpu": "300m"}, id="spec-generation"),
        pytest.param(_running(status={"phase": "Succeeded"}), {"pods": None}, id="phase-terminal"),
        pytest.param(
            _running(
                status={
                    "containerStatuses": [
                        {
                            "name": "a",
                            "restartCount": 0,
                            "allocatedResources": {"cpu": "500m"},
                            "resources": {"requests": {"cpu": "500m"}},
                        }
                    ]
                }
            ),
            {"requests.cpu": "500m"},
            id="status-resources",
        ),
    ],
)
def test_an_update_quota_reads_is_projected_again(
    update: dict[str, Any], changed: dict[str, str | None]
) -> None:
    first = project_pod(_running())
    later = PodEvaluator(clock=lambda: NOW).reproject(first, update)
    assert later is not first
    usage = usage_strings(evaluator().usage(later))
    for name, value in changed.items():
        assert usage.get(name) == value, usage


def test_a_deletion_is_projected_again() -> None:
    first = project_pod(_running())
    deleted = _running(
        metadata={"deletionTimestamp": "2023-11-14T22:13:20Z", "deletionGracePeriodSeconds": 30}
    )
    later = PodEvaluator().reproject(first, deleted)
    # 2023-11-14T22:13:20Z is NOW (1 700 000 000 s); upstream counts the pod until then + 30 s.
    assert later.deletion_deadline == NOW + 30
    assert first.deletion_deadline is None


def test_a_resize_marked_infeasible_is_projected_again() -> None:
    allocated = {
        "containerStatuses": [
            {"name": "a", "restartCount": 0, "allocatedResources": {"cpu": "100m"}}
        ]
    }
    first = project_pod(_running(status=allocated))
    pending = {**allocated, "conditions": [{"type": "PodResizePending", "reason": "Infeasible"}]}
    assert PodEvaluator().reproject(first, _running(status=pending)) is not first


def test_without_a_generation_every_update_is_projected_in_full() -> None:
    first = project_pod(_running(None))
    later = PodEvaluator().reproject(first, _running(None, ready=False))
    assert later is not first
    assert later == first  # the same facts, computed again


def test_a_malformed_update_is_refused_as_a_full_projection_refuses_it() -> None:
    first = project_pod(_running())
    broken = _running(status={"containerStatuses": "all fine"})
    with pytest.raises(ObjectError) as info:
        PodEvaluator().reproject(first, broken)
    assert info.value.field == "status.containerStatuses"


def test_pods_of_one_workload_in_one_state_share_one_source() -> None:
    a, b = project_pod(_running()), project_pod(_running())
    assert a.source is not None
    assert a.source is b.source
