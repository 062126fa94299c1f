"""Object counting, ported from apiserver ``quota/v1/generic`` and the core registry aliases."""

from __future__ import annotations

import pytest

from tally.evaluators import GroupResource, ObjectCountEvaluator, object_count_resource_name
from tally.evaluators.base import parse_scope_requirement
from tally.quota import resources as quota

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("group_resource", "name"),
    [
        # ObjectCountQuotaResourceNameFor; spec 1.0
        pytest.param(GroupResource("", "pods"), "count/pods", id="core"),
        pytest.param(GroupResource("apps", "deployments"), "count/deployments.apps", id="apps"),
        pytest.param(
            GroupResource("tally.example.com", "podsets"),
            "count/podsets.tally.example.com",
            id="crd",
        ),
    ],
)
def test_object_count_resource_name(group_resource: GroupResource, name: str) -> None:
    assert object_count_resource_name(group_resource) == name


def test_alias_and_usage() -> None:
    # NewObjectCountEvaluator with the legacy alias: both names count 1
    ev = ObjectCountEvaluator(GroupResource("", "secrets"), "secrets")
    assert quota.to_strings(ev.usage({})) == {"count/secrets": "1", "secrets": "1"}
    assert ev.matching_resources(["secrets", "count/secrets", "configmaps"]) == [
        "count/secrets",
        "secrets",
    ]


def test_usage_stats_counts_every_object_and_no_scope_matches() -> None:
    ev = ObjectCountEvaluator(GroupResource("apps", "deployments"))
    objects = [{"metadata": {"name": str(i)}} for i in range(3)]
    assert quota.to_strings(ev.usage_stats(objects, ["count/deployments.apps"], [])) == {
        "count/deployments.apps": "3"
    }
    # MatchesNoScopeFunc: any scope excludes every object
    scope = parse_scope_requirement({"scopeName": "BestEffort", "operator": "Exists"})
    assert quota.to_strings(ev.usage_stats(objects, ["count/deployments.apps"], [scope])) == {
        "count/deployments.apps": "0"
    }
    # projections are None: nothing about the object matters
    assert ev.project(objects[0]) is None  # type: ignore[func-returns-value]
    assert quota.to_strings(ev.usage_stats([None, None], ["count/deployments.apps"], [])) == {
        "count/deployments.apps": "2"
    }


@pytest.mark.parametrize(
    ("operation", "subresource", "want"),
    [
        # spec 1.4: only CREATE without subresource
        pytest.param("CREATE", "", True, id="create"),
        pytest.param("UPDATE", "", False, id="update"),
        pytest.param("DELETE", "", False, id="delete"),
        pytest.param("CREATE", "token", False, id="create-subresource"),
    ],
)
def test_handles(operation: str, subresource: str, want: bool) -> None:
    ev = ObjectCountEvaluator(GroupResource("", "serviceaccounts"))
    assert ev.handles(operation, subresource, None, {}) is want


def test_matches_and_replenishment() -> None:
    ev = ObjectCountEvaluator(GroupResource("", "configmaps"), "configmaps")
    assert ev.matches({"status": {"hard": {"configmaps": "2"}}}, {})
    assert not ev.matches({"status": {"hard": {"secrets": "2"}}}, {})
    assert not ev.matches(
        {"spec": {"scopes": ["BestEffort"]}, "status": {"hard": {"configmaps": "2"}}}, {}
    )
    assert not ev.requires_replenishment({}, {})
    ev.constraints(["configmaps"], {})
