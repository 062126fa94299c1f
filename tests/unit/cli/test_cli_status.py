"""tally.cli.status: which quotas bind the namespaces asked about, read from their status.

Expected values are worked out by hand from the objects.
"""

from __future__ import annotations

from typing import Any

import pytest

from builders import cluster_quota, resource_quota
from tally.cli.status import (
    RESOURCE_QUOTA,
    ResourceUse,
    applied_quota_use,
    binding_cluster_quotas,
    cluster_quota_use,
    resource_quota_use,
    status_report,
)
from tally.quota.identity import CLUSTER_QUOTA_KIND
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit


def q(text: str) -> Quantity:
    return Quantity.parse(text)


@pytest.mark.parametrize(
    ("use", "percent", "headroom", "full"),
    [
        pytest.param(ResourceUse("pods", q("5"), q("3")), 60.0, q("2"), False, id="part-used"),
        pytest.param(ResourceUse("cpu", q("1"), q("1")), 100.0, q("0"), True, id="full"),
        pytest.param(
            ResourceUse("cpu", q("1"), q("1500m")),
            150.0,
            q("-500m"),
            True,
            id="over-a-lowered-limit",
        ),
        pytest.param(ResourceUse("pods", q("0"), q("0")), None, q("0"), True, id="zero-limit"),
        pytest.param(ResourceUse("pods", q("5"), None), None, None, False, id="use-unknown"),
    ],
)
def test_resource_use(
    use: ResourceUse, percent: float | None, headroom: Quantity | None, full: bool
) -> None:
    assert percent == use.percent
    assert headroom == use.headroom
    assert full == use.full


def test_resource_quota_reads_the_status_the_controller_wrote() -> None:
    use = resource_quota_use(
        resource_quota(
            "demo",
            namespace="a",
            spec={"hard": {"pods": "9"}, "scopes": ["NotBestEffort"]},
            status={"hard": {"pods": "5", "requests.cpu": "1"}, "used": {"pods": "3"}},
        )
    )
    assert RESOURCE_QUOTA == use.kind
    assert "a/demo" == use.title
    assert ("NotBestEffort",) == use.scopes
    # status.hard wins over the spec: it is what admission judges against.
    assert [("pods", q("5"), q("3")), ("requests.cpu", q("1"), None)] == [
        (r.name, r.hard, r.used) for r in use.resources
    ]
    assert "" == use.problem


def test_a_resource_quota_before_its_first_sync_shows_its_spec_with_the_use_unknown() -> None:
    use = resource_quota_use(resource_quota("new", namespace="a", spec={"hard": {"pods": "2"}}))
    assert [("pods", q("2"), None)] == [(r.name, r.hard, r.used) for r in use.resources]


def test_a_value_that_does_not_parse_is_reported_not_raised() -> None:
    use = resource_quota_use(
        resource_quota("bad", namespace="a", status={"hard": {"pods": "x"}, "used": {}})
    )
    assert () == use.resources
    assert "status.hard[pods]" in use.problem


def test_scope_selectors_read_as_a_person_writes_them() -> None:
    expression = {"scopeName": "PriorityClass", "operator": "In", "values": ["high", "low"]}
    use = resource_quota_use(
        resource_quota(
            "p",
            namespace="a",
            spec={"hard": {"pods": "1"}, "scopeSelector": {"matchExpressions": [expression]}},
        )
    )
    assert ("PriorityClass In (high, low)",) == use.scopes


def test_cluster_quota_total_and_the_bound_namespaces_share() -> None:
    status = {
        "total": {"hard": {"pods": "10"}, "used": {"pods": "7"}},
        "namespaces": [
            {"namespace": "a", "status": {"used": {"pods": "4"}}},
            {"namespace": "b", "status": {"used": {"pods": "3"}}},
        ],
        "namespaceCount": 3,
    }
    use = cluster_quota_use(
        cluster_quota("team", {"pods": "10"}, selector={}, status=status), ["c", "a"]
    )
    assert CLUSTER_QUOTA_KIND == use.kind
    assert "team" == use.title
    assert [("pods", q("10"), q("7"))] == [(r.name, r.hard, r.used) for r in use.resources]
    # c is selected but uses nothing: the status does not list it.
    assert [("a", {"pods": q("4")}), ("c", {})] == [(s.namespace, dict(s.used)) for s in use.shares]
    assert 3 == use.namespace_count


def test_an_applied_cluster_quota_reads_as_its_cluster_quota_with_one_share() -> None:
    # What tally writes into namespace a of the ClusterQuota above (tally.clusterquota.applied).
    applied = {
        "kind": "AppliedClusterQuota",
        "metadata": {"name": "team", "namespace": "a"},
        "spec": {"quota": {"hard": {"pods": "10"}, "scopes": ["NotBestEffort"]}},
        "status": {
            "total": {"hard": {"pods": "10"}, "used": {"pods": "7"}},
            "namespace": {"used": {"pods": "4"}},
            "remaining": {"pods": "3"},
            "conditions": [{"type": "UsageComputed", "status": "False",
                            "reason": "EvaluationFailed"}],
        },
    }  # fmt: skip
    use = applied_quota_use(applied)
    assert (CLUSTER_QUOTA_KIND, "team", ("NotBestEffort",)) == (use.kind, use.title, use.scopes)
    assert [("pods", q("10"), q("7"))] == [(r.name, r.hard, r.used) for r in use.resources]
    assert [("a", {"pods": q("4")})] == [(s.namespace, dict(s.used)) for s in use.shares]
    assert use.namespace_count is None  # not shown to the namespace
    assert "EvaluationFailed" == use.not_computed
    assert "" == use.problem


def test_the_report_lists_applied_cluster_quotas_after_resource_quotas() -> None:
    applied = [
        {"metadata": {"name": n, "namespace": "a"}, "spec": {"quota": {"hard": {"pods": "1"}}}}
        for n in ("z-shared", "team")
    ]
    report = status_report(["a"], [resource_quota("rq", {"pods": "1"}, namespace="a")], [], {},
                           applied)  # fmt: skip
    expected = [(RESOURCE_QUOTA, "rq"), (CLUSTER_QUOTA_KIND, "team"),
                (CLUSTER_QUOTA_KIND, "z-shared")]  # fmt: skip
    assert expected == [(u.kind, u.name) for u in report.quotas]


@pytest.mark.parametrize(
    ("selector", "bound"),
    [
        pytest.param({"matchLabels": {"team": "a"}}, ["a1", "a2"], id="by-label"),
        pytest.param({}, ["a1", "a2", "b1"], id="empty-selects-all"),
        pytest.param(
            {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                   "values": ["b1"]}]},
            ["b1"],
            id="by-name",
        ),
        pytest.param({"matchLabels": {"team": "z"}}, None, id="selects-none-of-them"),
        pytest.param(
            {"matchLabels": {"team": "a"},
             "matchExpressions": [{"key": "team", "operator": "Near"}]},
            None,
            id="unparseable-selects-nothing",
        ),
    ],
)  # fmt: skip
def test_binding_cluster_quotas(selector: Any, bound: list[str] | None) -> None:
    labels = {
        "a1": {"team": "a", "kubernetes.io/metadata.name": "a1"},
        "a2": {"team": "a", "kubernetes.io/metadata.name": "a2"},
        "b1": {"team": "b", "kubernetes.io/metadata.name": "b1"},
    }
    found = binding_cluster_quotas([cluster_quota("x", {"pods": "1"}, selector=selector)], labels)
    assert ([] if bound is None else [("x", bound)]) == [
        (obj["metadata"]["name"], names) for obj, names in found
    ]


def test_report_orders_resource_quotas_then_cluster_quotas() -> None:
    report = status_report(
        ["a"],
        [
            resource_quota("z", namespace="a", spec={"hard": {"pods": "1"}}),
            resource_quota("m", namespace="a", spec={"hard": {"pods": "1"}}),
        ],
        [
            cluster_quota("later", {"pods": "1"}, selector={}),
            cluster_quota("earlier", {"pods": "1"}, selector={}),
            cluster_quota("other", {"pods": "1"}, selector={"matchLabels": {"team": "b"}}),
        ],
        {"a": {"team": "a"}},
    )
    assert ("a",) == report.namespaces
    assert [
        (RESOURCE_QUOTA, "m"),
        (RESOURCE_QUOTA, "z"),
        (CLUSTER_QUOTA_KIND, "earlier"),
        (CLUSTER_QUOTA_KIND, "later"),
    ] == [(u.kind, u.name) for u in report.quotas]
