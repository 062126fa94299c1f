"""tally.cli.top: the objects using most of a resource, by the evaluators' own figures.

Expected usages are worked out by hand with upstream's pod formula (containers summed, the
largest init container if larger, overhead added) and PodSet measures (template x replicas).
"""

from __future__ import annotations

from typing import Any

import pytest

from tally.cli.main import registry
from tally.cli.top import Owner, evaluators_for, owner_of, rank
from tally.evaluators.base import GroupResource
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit


def q(text: str) -> Quantity:
    return Quantity.parse(text)


def pod(
    name: str, *cpus: str, owner: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    containers = [
        {"name": f"c{i}", "image": "x", "resources": {"requests": {"cpu": cpu}}}
        for i, cpu in enumerate(cpus)
    ]
    metadata: dict[str, Any] = {"name": name, "namespace": "a"}
    if owner is not None:
        metadata["ownerReferences"] = owner
    return {"metadata": metadata, "spec": {"containers": containers, **spec}}


def ref(kind: str, name: str, controller: bool | None = None) -> dict[str, Any]:
    return {"kind": kind, "name": name, "apiVersion": "v1", "uid": "u",
            **({} if controller is None else {"controller": controller})}  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "owner"),
    [
        pytest.param(pod("p"), None, id="no-owner"),
        pytest.param(pod("p", owner=[ref("PodSet", "web", True)]), Owner("PodSet", "web"),
                     id="controller"),
        pytest.param(
            pod("p", owner=[ref("ConfigMap", "c"), ref("Job", "nightly", True)]),
            Owner("Job", "nightly"),
            id="the-controller-among-several",
        ),
        pytest.param(pod("p", owner=[ref("ReplicaSet", "rs", False)]), Owner("ReplicaSet", "rs"),
                     id="no-controller-the-first"),
        pytest.param(pod("p", owner=[{"kind": "", "name": "x"}]), None, id="malformed"),
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
    finished = {**pod("done", "4"), "status": {"phase": "Succeeded"}}
    objects = [
        pod("small", "100m"),
        pod("two-containers", "250m", "250m", owner=[ref("ReplicaSet", "web-1", True)]),
        # Init containers run before the others: the pod needs the larger of 1 and 300m.
        pod("init", "300m", initContainers=[
            {"name": "i", "image": "x", "resources": {"requests": {"cpu": "1"}}}]),
        pod("overhead", "200m", overhead={"cpu": "50m"}),
        pod("none"),
        finished,
        pod("tie-a", "250m"),
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
        "spec": {"replicas": 4, "template": {"spec": pod("t", "250m")["spec"]}},
    }
    report = rank("a", "podsets.tally.dev/requests.cpu", [("PodSet", evaluator, [podset])], None)
    assert [("PodSet", "web", q("1"))] == [(r.kind, r.name, r.usage) for r in report.rows]


def test_rank_reports_an_object_it_cannot_measure() -> None:
    evaluator = registry().get(GroupResource("", "pods"))
    assert evaluator is not None
    broken = {"metadata": {"name": "bad"}, "spec": {"containers": "no"}}
    report = rank("a", "requests.cpu", [("Pod", evaluator, [broken, pod("ok", "1")])], None)
    assert ["ok"] == [row.name for row in report.rows]
    assert 1 == len(report.unmeasured)
    assert report.unmeasured[0].startswith("Pod bad: spec.containers")
