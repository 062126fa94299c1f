"""The service evaluator, ported from ``pkg/quota/v1/evaluator/core/services_test.go``."""

from __future__ import annotations

from typing import Any

import pytest

import builders
from tally.evaluators import ObjectError, ServiceEvaluator
from tally.evaluators.base import parse_scope_requirement
from tally.quota import resources as quota
from tally.quota.quantity import parse_quantity

pytestmark = pytest.mark.unit


def service(
    service_type: str, ports: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    return builders.service("s", service_type, ports=ports, spec=spec, with_kind=True)


def expect(nodeports: str, loadbalancers: str) -> dict[str, str]:
    return {
        "services": "1",
        "count/services": "1",
        "services.nodeports": nodeports,
        "services.loadbalancers": loadbalancers,
    }


TWO_PORTS = [{"port": 27443}, {"port": 27444}]
TWO_NODE_PORTS = [{"port": 27443, "nodePort": 32001}, {"port": 27444, "nodePort": 32002}]


def test_matching_resources() -> None:
    # TestServiceEvaluatorMatchesResources
    names = ["configmaps", "cpu", "services", "services.nodeports", "services.loadbalancers"]
    assert quota.to_set(ServiceEvaluator().matching_resources(names)) == {
        "services",
        "services.nodeports",
        "services.loadbalancers",
    }


# TestServiceEvaluatorUsage
@pytest.mark.parametrize(
    ("obj", "usage"),
    [
        pytest.param(service("LoadBalancer"), expect("0", "1"), id="loadbalancer"),
        pytest.param(
            service("LoadBalancer", [{"port": 27443}]), expect("1", "1"), id="loadbalancer_ports"
        ),
        pytest.param(
            service("LoadBalancer", TWO_PORTS), expect("2", "1"), id="loadbalancer_2_ports"
        ),
        pytest.param(service("ClusterIP"), expect("0", "0"), id="clusterip"),
        pytest.param(service("NodePort", [{"port": 27443}]), expect("1", "0"), id="nodeports"),
        pytest.param(service("NodePort", TWO_PORTS), expect("2", "0"), id="multi-nodeports"),
        pytest.param(
            service("LoadBalancer", TWO_PORTS, allocateLoadBalancerNodePorts=False),
            expect("0", "1"),
            id="nodeports-disabled",
        ),
        pytest.param(
            service("LoadBalancer", TWO_NODE_PORTS),
            expect("2", "1"),
            id="nodeports-default-enabled",
        ),
        pytest.param(
            service("LoadBalancer", TWO_PORTS, allocateLoadBalancerNodePorts=True),
            expect("2", "1"),
            id="nodeports-explicitly-enabled",
        ),
        pytest.param(
            service("LoadBalancer", TWO_NODE_PORTS, allocateLoadBalancerNodePorts=False),
            expect("2", "1"),
            id="nodeports-disabled-but-specified",
        ),
        # spec 1.3: ExternalName counts nothing more; health-check node port not counted
        pytest.param(service("ExternalName"), expect("0", "0"), id="spec: externalname"),
        pytest.param(
            service("LoadBalancer", [{"port": 80}], healthCheckNodePort=30000),
            expect("1", "1"),
            id="spec: health-check node port",
        ),
    ],
)
def test_usage(obj: dict[str, Any], usage: dict[str, str]) -> None:
    got = ServiceEvaluator().usage(obj)
    assert quota.equals(got, {k: parse_quantity(v) for k, v in usage.items()})


# TestServiceConstraintsFunc: services have no constraints
@pytest.mark.parametrize(
    ("obj", "required"),
    [
        pytest.param(service("LoadBalancer"), ["services.loadbalancers"], id="loadbalancer"),
        pytest.param(service("ClusterIP"), ["services.loadbalancers", "services"], id="clusterip"),
        pytest.param(service("NodePort", [{"port": 1}]), ["services.nodeports"], id="nodeports"),
    ],
)
def test_constraints(obj: dict[str, Any], required: list[str]) -> None:
    ServiceEvaluator().constraints(required, obj)


@pytest.mark.parametrize(
    ("operation", "subresource", "want"),
    [
        # spec 1.3 / services.go Handles: create and update
        pytest.param("CREATE", "", True, id="create"),
        pytest.param("UPDATE", "", True, id="update"),
        pytest.param("DELETE", "", False, id="delete"),
        pytest.param("UPDATE", "status", False, id="tally: status subresource ignored"),
    ],
)
def test_handles(operation: str, subresource: str, want: bool) -> None:
    assert ServiceEvaluator().handles(operation, subresource, None, None) is want


@pytest.mark.parametrize(
    ("old", "new", "want"),
    [
        # spec 3 replenishment: the type class changes
        pytest.param(service("ClusterIP"), service("NodePort"), True, id="clusterip-to-nodeport"),
        pytest.param(service("NodePort"), service("LoadBalancer"), True, id="nodeport-to-lb"),
        pytest.param(service("ClusterIP"), service("ExternalName"), False, id="both-uncharged"),
        pytest.param(
            service("NodePort", [{"port": 1}]),
            service("NodePort", TWO_PORTS),
            False,
            id="port-count-only",
        ),
    ],
)
def test_requires_replenishment(old: dict[str, Any], new: dict[str, Any], want: bool) -> None:
    assert ServiceEvaluator().requires_replenishment(old, new) is want


def test_no_scopes_and_usage_stats() -> None:
    # spec 1.3: a quota with any scope never matches services
    ev = ServiceEvaluator()
    terminating = parse_scope_requirement({"scopeName": "Terminating", "operator": "Exists"})
    resource_quota = {"spec": {"scopes": ["Terminating"]}, "status": {"hard": {"services": "5"}}}
    assert not ev.matches(resource_quota, service("ClusterIP"))
    assert ev.matches({"status": {"hard": {"services": "5"}}}, service("ClusterIP"))
    objs = [service("NodePort", TWO_PORTS), service("LoadBalancer", [{"port": 1}])]
    names = ["services", "services.nodeports", "services.loadbalancers"]
    assert quota.to_strings(ev.usage_stats(objs, names, [])) == {
        "services": "2",
        "services.loadbalancers": "1",
        "services.nodeports": "3",
    }
    assert quota.to_strings(ev.usage_stats(objs, ["services"], [terminating])) == {"services": "0"}


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        pytest.param({"spec": {"ports": "80"}}, "spec.ports", id="ports-not-list"),
        pytest.param({"spec": {"type": 1}}, "spec.type", id="type-not-string"),
        pytest.param(
            service("LoadBalancer", [{"nodePort": "x"}], allocateLoadBalancerNodePorts=False),
            "spec.ports[0].nodePort",
            id="node-port-type",
        ),
    ],
)
def test_malformed(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError) as info:
        ServiceEvaluator().usage(obj)
    assert info.value.field == field
