"""tally.cli.top: the objects using most of a resource, by the evaluators' own figures.

Expected usages are worked out by hand with upstream's pod formula (containers summed, the
largest init container if larger, overhead added) and PodSet measures (template x replicas).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import builders
from tally.cli.main import registry
from tally.cli.top import Owner, evaluators_for, owner_of, rank
from tally.evaluators.base import GroupResource
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit


def q(text: str) -> Quantity:
    return Quantity.parse(text)


# Pods of namespace a, with no container unless given.
pod = functools.partial(builders.pod, namespace="a", containers=[])
ref = builders.owner_reference


def cpus(*requests: str) -> list[dict[str, Any]]:
    """Containers c0, c1, ... requesting these cpus."""
    return [builders.container(f"c{i}", {"cpu": cpu}, image="x") for i, cpu in enumerate(requests)]


@pytest.mark.parametrize(
    ("obj", "owner"),
    [
        pytest.param(pod("p"), None, id="no-owner"),
        pytest.param(pod("p", owner_references=[ref("PodSet", "web", True)]),
                     Owner("PodSet", "web"), id="controller"),
        pytest.param(
            pod("p", owner_references=[ref("ConfigMap", "c"), ref("Job", "nightly", True)]),
            Owner("Job", "nightly"),
            id="the-controller-among-several",
        ),
        pytest.param(pod("p", owner_references=[ref("ReplicaSet", "rs", False)]),
                     Owner("ReplicaSet", "rs"), id="no-controller-the-first"),
        pytest.param(pod("p", owner_references=[{"kind": "", "name": "x"}]), None, id="malformed"),
    ],
)  # fmt: skip
def test_owner_of(obj: dict[str, Any], owner: Owner | None) -> None:
    assert owner == owner_of(obj)


@pytest.mark.parametrize(
    ("resource", "measured_by"),
    [
        pytest.param("requests.cpu", [GroupResource("", "pods")], id="pods"),
        pytest.param("podsets.tally.dev/requests.cpu", [GroupResource("tally.dev", "podsets")],
                     id="podset-measure"),
        pytest.param("count/configmaps", [GroupResource("", "configmaps")], id="registered-count"),
        pytest.param("count/deployments.apps", [GroupResource("apps", "deployments")],
                     id="any-kind-counted"),
        pytest.param("requests.storage", [GroupResource("", "persistentvolumeclaims")], id="pvcs"),
        pytest.param("count/events", [], id="ignored-kind"),
        pytest.param("nonsense", [], id="nothing-measures-it"),
    ],
)  # fmt: skip
def test_evaluators_for(resource: str, measured_by: list[GroupResource]) -> None:
    assert measured_by == [e.group_resource for e in evaluators_for(resource, registry())]


def test_rank_orders_by_the_evaluators_figures_and_leaves_out_what_uses_nothing() -> None:
    evaluator = registry().get(GroupResource("", "pods"))
    assert evaluator is not None
    finished = pod("done", containers=cpus("4"), phase="Succeeded")
    objects = [
        pod("small", containers=cpus("100m")),
        pod("two-containers", containers=cpus("250m", "250m"),
            owner_references=[ref("ReplicaSet", "web-1", True)]),
        # Init containers run before the others: the pod needs the larger of 1 and 300m.
        pod("init", containers=cpus("300m"), init=[
            {"name": "i", "image": "x", "resources": {"requests": {"cpu": "1"}}}]),
        pod("overhead", containers=cpus("200m"), spec={"overhead": {"cpu": "50m"}}),
        pod("none"),
        finished,
        pod("tie-a", containers=cpus("250m")),
    ]  # fmt: skip
    report = rank("a", "requests.cpu", [("Pod", evaluator, objects)], limit=3)
    # overhead and tie-a both use 250m: a tie goes by name.
    assert [("init", q("1")), ("two-containers", q("500m")), ("overhead", q("250m"))] == [
        (row.name, row.usage) for row in report.rows
    ]
    assert Owner("ReplicaSet", "web-1") == report.rows[1].owner
    # 100m + 500m + 1 + 250m (200m + 50m overhead) + 250m; "none" and the finished pod use 0.
    assert q("2100m") == report.total
    assert 5 == report.using
    assert 7 == report.counted


def test_rank_a_podset_by_its_template_times_its_replicas() -> None:
    evaluator = registry().get(GroupResource("tally.dev", "podsets"))
    assert evaluator is not None
    podset = {
        "metadata": {"name": "web", "namespace": "a"},
        "spec": {"replicas": 4, "template": {"spec": pod("t", containers=cpus("250m"))["spec"]}},
    }
    report = rank("a", "podsets.tally.dev/requests.cpu", [("PodSet", evaluator, [podset])], None)
    assert [("PodSet", "web", q("1"))] == [(r.kind, r.name, r.usage) for r in report.rows]


def test_rank_reports_an_object_it_cannot_measure() -> None:
    evaluator = registry().get(GroupResource("", "pods"))
    assert evaluator is not None
    broken = {"metadata": {"name": "bad"}, "spec": {"containers": "no"}}
    report = rank(
        "a", "requests.cpu", [("Pod", evaluator, [broken, pod("ok", containers=cpus("1"))])], None
    )
    assert ["ok"] == [row.name for row in report.rows]
    assert 1 == len(report.unmeasured)
    assert report.unmeasured[0].startswith("Pod bad: spec.containers")
