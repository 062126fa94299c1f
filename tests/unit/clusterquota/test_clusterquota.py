"""tally.clusterquota.quota: reading a ClusterQuota, its per-namespace view, its status.

Expected values are worked out by hand from the inputs.
"""

from __future__ import annotations

from typing import Any

import pytest

import builders
from tally.admission.attributes import Attributes
from tally.admission.checks import Request, check_batch
from tally.clusterquota import quota as cluster
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import new_registry
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

PODS = GroupResource("", "pods")


def q(text: str) -> Quantity:
    return Quantity.parse(text)


def _cq(hard: dict[str, str], status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """The ClusterQuota team selecting team=a; ``spec`` adds to its ``spec.quota``."""
    return builders.cluster_quota(
        "team",
        hard,
        selector={"matchLabels": {"team": "a"}},
        resource_version="7",
        quota=spec,
        status=status,
        kind_only=True,
    )


def test_status_total_is_the_sum_of_the_namespaces_sorted() -> None:
    status = cluster.build_status(
        {"pods": q("10"), "requests.cpu": q("2")},
        {
            "b": {"pods": q("1"), "requests.cpu": q("100m")},
            "a": {"pods": q("2"), "requests.cpu": q("350m")},
        },
        ["pods", "requests.cpu"],
    )
    assert {
        "hard": {"pods": "10", "requests.cpu": "2"},
        "used": {"pods": "3", "requests.cpu": "450m"},
    } == status["total"]
    assert ["a", "b"] == [entry["namespace"] for entry in status["namespaces"]]
    assert 2 == status["namespaceCount"]
    assert "pods 3/10" == status["mostUsed"]


def test_the_total_is_written_in_the_format_upstreams_add_keeps() -> None:
    # Upstream Add keeps the receiver's format, unless the receiver is zero: the total takes
    # the format of the first namespace (in order) that uses something of the name.
    def total(*shares: str) -> str:
        used = {f"n{index}": {"requests.memory": q(text)} for index, text in enumerate(shares)}
        status = cluster.build_status({"requests.memory": q("1Ti")}, used, ["requests.memory"])
        return str(status["total"]["used"]["requests.memory"])

    assert "1536Mi" == total("0", "1Gi", "512Mi")  # 0 is DecimalSI, then zero adopts BinarySI
    assert "1073742824" == total("1k", "1Gi")  # DecimalSI first: 1000 + 1073741824
    assert "0" == total()


def test_namespaces_that_use_nothing_are_counted_not_listed() -> None:
    status = cluster.build_status(
        {"pods": q("5")}, {"a": {"pods": q("0")}, "b": {"pods": q("1")}}, ["pods"]
    )
    assert (["b"], 2) == ([e["namespace"] for e in status["namespaces"]], status["namespaceCount"])


def test_no_namespace_selected_is_zero_for_every_measured_name() -> None:
    status = cluster.build_status({"pods": q("5"), "widgets": q("1")}, {}, ["pods"])
    assert {"pods": "0"} == status["total"]["used"]
    assert ([], 0) == (status["namespaces"], status["namespaceCount"])


@pytest.mark.parametrize(
    ("hard", "used", "expected"),
    [
        pytest.param({"pods": "10", "requests.cpu": "2"}, {"pods": "3", "requests.cpu": "1500m"},
                     "requests.cpu 1500m/2", id="largest-fraction"),
        pytest.param({"pods": "0"}, {"pods": "1"}, "pods 1/0", id="zero-limit-in-use-is-full"),
        pytest.param({}, {}, "", id="nothing-limited"),
    ],
)  # fmt: skip
def test_most_used(hard: dict[str, str], used: dict[str, str], expected: str) -> None:
    assert expected == cluster.most_used(
        {k: q(v) for k, v in hard.items()}, {k: q(v) for k, v in used.items()}
    )


def _three_pods_in_a_and_b(namespace_count: int) -> dict[str, Any]:
    """``pods: 10`` with 3 used: 2 in namespace "a", 1 in "b"."""
    return _cq(
        {"pods": "10"},
        {
            "total": {"hard": {"pods": "10"}, "used": {"pods": "3"}},
            "namespaces": [
                {"namespace": "a", "status": {"used": {"pods": "2"}}},
                {"namespace": "b", "status": {"used": {"pods": "1"}}},
            ],
            "namespaceCount": namespace_count,
        },
    )


def test_a_charge_grows_the_total_and_each_namespaces_share() -> None:
    cq = _three_pods_in_a_and_b(namespace_count=3)  # c is selected too, and uses nothing yet
    status = cluster.charged_status(
        cq, {"b": {"pods": q("2")}, "c": {"pods": q("1")}}, {"pods": q("6")}
    )
    assert {"pods": "6"} == status["total"]["used"]
    assert {"a": {"pods": "2"}, "b": {"pods": "3"}, "c": {"pods": "1"}} == {
        entry["namespace"]: entry["status"]["used"] for entry in status["namespaces"]
    }
    assert ("pods 6/10", 3) == (status["mostUsed"], status["namespaceCount"])


def test_a_charge_rewrites_only_the_shares_it_changed() -> None:
    # "a" is written as no sync of tally's would write it (1000m is 1): a charge of "b" leaves
    # it as it is, text and all, so a charge costs the same over ten thousand namespaces as
    # over two. The next sync rewrites it.
    cq = _cq(
        {"requests.cpu": "10"},
        {
            "total": {"hard": {"requests.cpu": "10"}, "used": {"requests.cpu": "1500m"}},
            "namespaces": [
                {"namespace": "a", "status": {"used": {"requests.cpu": "1000m"}}},
                {"namespace": "b", "status": {"used": {"requests.cpu": "500m"}}},
            ],
        },
    )
    status = cluster.charged_status(
        cq, {"b": {"requests.cpu": q("1500m")}}, {"requests.cpu": q("3")}
    )
    assert [
        {"namespace": "a", "status": {"used": {"requests.cpu": "1000m"}}},
        {"namespace": "b", "status": {"used": {"requests.cpu": "2"}}},
    ] == status["namespaces"]
    assert {"requests.cpu": "3"} == status["total"]["used"]


def test_build_status_lists_the_shares_given_as_written() -> None:
    status = cluster.build_status(
        {"requests.cpu": q("10")},
        {"a": {"requests.cpu": q("1")}, "b": {"requests.cpu": q("2")}},
        ["requests.cpu"],
        written={"a": {"requests.cpu": "1000m"}},
    )
    assert [
        {"namespace": "a", "status": {"used": {"requests.cpu": "1000m"}}},
        {"namespace": "b", "status": {"used": {"requests.cpu": "2"}}},
    ] == status["namespaces"]
    assert {"requests.cpu": "3"} == status["total"]["used"]


def test_a_charge_given_back_lowers_its_namespaces_share() -> None:
    # Admission judged the view without a pod of "b" charged for a request it then refused
    # (total 3 read as 2) and charges one pod of "a": the total it writes is 3, "a" grows to 3,
    # "b" drops from 1 to nothing and leaves the list, so the total is the sum again.
    cq = _three_pods_in_a_and_b(namespace_count=2)
    status = cluster.charged_status(
        cq, {"a": {"pods": q("1")}}, {"pods": q("3")}, {"b": {"pods": q("1")}}
    )
    assert {"pods": "3"} == status["total"]["used"]
    assert [{"namespace": "a", "status": {"used": {"pods": "3"}}}] == status["namespaces"]
    assert ("pods 3/10", 2) == (status["mostUsed"], status["namespaceCount"])


def test_the_view_is_the_spec_and_the_total() -> None:
    cq = _cq(
        {"pods": "10"},
        {"total": {"hard": {"pods": "10"}, "used": {"pods": "4"}}},
        scopes=["BestEffort"],
    )
    view = cluster.as_resource_quota(cq, "ns")
    assert {
        "kind": "ClusterQuota",
        "metadata": {"name": "team", "namespace": "ns", "resourceVersion": "7"},
        "spec": {"hard": {"pods": "10"}, "scopes": ["BestEffort"]},
        "status": {"hard": {"pods": "10"}, "used": {"pods": "4"}},
    } == view
    assert "status" not in cluster.as_resource_quota(_cq({"pods": "1"}), "ns")  # not synced yet


@pytest.mark.parametrize(
    ("cq", "problem"),
    [
        pytest.param({"spec": {"quota": {"hard": {"pods": "1"}}}},
                     "spec.namespaceSelector: Required value", id="no-selector"),
        pytest.param(_cq({"pods": "-1"}), "spec.quota.hard[pods]: Invalid value: -1",
                     id="negative"),
        pytest.param(_cq({"pods": "1"}, scopes=["Sometimes"]), "Sometimes", id="unknown-scope"),
        pytest.param(_cq({"pods": "lots"}), "spec.quota.hard", id="not-a-quantity"),
    ],
)  # fmt: skip
def test_invalid_specs_are_named(cq: dict[str, Any], problem: str) -> None:
    errors = cluster.validate(cq)
    assert any(problem in error for error in errors), errors


def test_a_valid_spec_has_no_problem() -> None:
    assert [] == cluster.validate(_cq({"pods": "10", "requests.cpu": "2"}))


def _pod_request(namespace: str, name: str) -> Request:
    obj = builders.pod(name, namespace=namespace, image=None)
    attributes = Attributes(namespace, name, PODS, "", "CREATE", obj)
    evaluator = new_registry().get(PODS)
    assert evaluator is not None
    return Request(attributes, evaluator)


def test_a_batch_across_namespaces_charges_one_cluster_quota_once_and_each_own_quota() -> None:
    # Requests of two namespaces in one pass: the ClusterQuota binds both, each namespace's
    # ResourceQuota only its own; the ClusterQuota is charged 3 pods in one change.
    view = cluster.as_resource_quota(
        _cq({"pods": "5"}, {"total": {"hard": {"pods": "5"}, "used": {"pods": "1"}}}), ""
    )
    own = {
        "metadata": {"name": "q", "namespace": "a", "resourceVersion": "1"},
        "spec": {"hard": {"pods": "1"}},
        "status": {"hard": {"pods": "1"}, "used": {"pods": "0"}},
    }
    requests = [
        _pod_request("a", "p1"),
        _pod_request("b", "p2"),
        _pod_request("a", "p3"),
        _pod_request("b", "p4"),
    ]

    def applies(request: Request, quota: Any) -> bool:
        return quota.get("kind") == "ClusterQuota" or request.attributes.namespace == "a"

    batch = check_batch([own, view], requests, applies=applies)
    assert [0, 1, 3] == batch.pending  # p3: the ResourceQuota of a is full after p1
    assert "exceeded quota: q" in (batch.decisions[2].message if batch.decisions[2] else "")
    assert {"pods": "4"} == batch.quotas[1]["status"]["used"]
    assert {"pods": "1"} == batch.quotas[0]["status"]["used"]
    assert [0, 1] == batch.changed


# -- the UsageComputed condition


def with_condition(status: str, since: str, message: str = "") -> dict[str, Any]:
    condition = {"type": "UsageComputed", "status": status, "lastTransitionTime": since,
                 "reason": "x", "message": message}  # fmt: skip
    return {"metadata": {"name": "team", "generation": 3}, "status": {"conditions": [condition]}}


def test_usage_computed_is_false_with_the_failures_quoted_and_counted() -> None:
    failures = [f"measure 'm': widgets.example.com ns/w{i}: no such key: size" for i in range(5)]
    condition = cluster.usage_computed({"metadata": {"name": "team"}}, failures, "T1")
    assert {
        "type": "UsageComputed",
        "status": "False",
        "lastTransitionTime": "T1",
        "reason": "EvaluationFailed",
        "message": "; ".join(failures[:3]) + " (and 2 more)",
    } == condition


def test_usage_computed_keeps_its_transition_time_while_its_status_stays() -> None:
    cq = with_condition("False", "T0", "old words")
    condition = cluster.usage_computed(cq, ["measure 'm': new words"], "T1")
    assert ("False", "T0", "measure 'm': new words", 3) == (
        condition["status"], condition["lastTransitionTime"], condition["message"],
        condition["observedGeneration"],
    )  # fmt: skip
    recovered = cluster.usage_computed(cq, [], "T2")
    assert ("True", "T2", "Computed") == (
        recovered["status"], recovered["lastTransitionTime"], recovered["reason"]
    )  # fmt: skip


def test_a_long_message_is_cut() -> None:
    condition = cluster.usage_computed({}, ["x" * 5000], "T1")
    assert cluster.CONDITION_MESSAGE_MAX == len(condition["message"])
    assert condition["message"].endswith("...")


def test_build_status_carries_the_conditions_given() -> None:
    condition = cluster.usage_computed({}, [], "T1")
    status = cluster.build_status({"pods": q("5")}, {}, ["pods"], [condition])
    assert [condition] == status["conditions"]
    assert "conditions" not in cluster.build_status({"pods": q("5")}, {}, ["pods"])


def test_usage_computed_waits_for_caches_not_listed_yet() -> None:
    # Names whose kind's cache is being listed were not computed: no verdict either way.
    first = cluster.usage_computed({}, [], "T1", pending=["example.com/b", "example.com/a"])
    assert ("Unknown", "Pending", "waiting for the caches of: example.com/a, example.com/b") == (
        first["status"], first["reason"], first["message"]
    )  # fmt: skip
    cq = with_condition("False", "T0", "measure 'm': broken")
    assert cq["status"]["conditions"][0] == cluster.usage_computed(cq, [], "T1", ["m"])
    # A failure found meanwhile still counts.
    assert "False" == cluster.usage_computed({}, ["measure 'm': x"], "T1", ["n"])["status"]
