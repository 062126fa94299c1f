"""tally.webhook: the registered rules cover what quotas can charge, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from tally.evaluators.base import GroupResource
from tally.webhook import (
    count_resources,
    validating_webhook_configuration,
    webhook_rules,
)

pytestmark = pytest.mark.unit


def quota(spec_hard: dict[str, str], status_hard: dict[str, str] | None = None) -> dict[str, Any]:
    return {"spec": {"hard": spec_hard}, "status": {"hard": status_hard or {}}}


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        pytest.param([quota({"pods": "1", "cpu": "1"})], set(), id="core-only"),
        pytest.param(
            [quota({"count/deployments.apps": "1"}), quota({"count/podsets.tally.dev": "2"})],
            {GroupResource("apps", "deployments"), GroupResource("tally.dev", "podsets")},
            id="groups",
        ),
        pytest.param(
            [quota({"count/secrets": "1", "count/endpoints": "1"})],
            {GroupResource("", "endpoints")},
            id="core-count-not-already-covered",
        ),
        pytest.param(
            [quota({}, {"count/jobs.batch": "1"})],
            {GroupResource("batch", "jobs")},
            id="removed-from-spec-but-still-in-status",
        ),
    ],
)
def test_count_resources(quotas: list[dict[str, Any]], expected: set[GroupResource]) -> None:
    assert count_resources(quotas) == expected


def test_rules_never_include_status_or_everything() -> None:
    rules = webhook_rules({GroupResource("apps", "deployments"), GroupResource("", "endpoints")})
    resources = [r for rule in rules for r in rule["resources"]]
    assert "*" not in resources
    assert not any(r.endswith("/status") for r in resources)
    assert rules[0]["apiGroups"] == [""]
    assert "endpoints" in rules[0]["resources"]
    assert "pods/resize" in rules[0]["resources"]
    assert rules[1] == {
        "apiGroups": ["apps"],
        "apiVersions": ["*"],
        "resources": ["deployments"],
        "operations": ["CREATE", "UPDATE"],
        "scope": "Namespaced",
    }


def test_configuration_fields_hold() -> None:
    config = validating_webhook_configuration(
        name="tally.dev",
        url="https://127.0.0.1:9443/",
        ca_bundle="Q0E=",
        rules=webhook_rules(()),
        exempt_namespaces=["kube-system", "tally-system"],
    )
    webhook, podsets = config["webhooks"]
    # A bare path would run no Kopf handler and allow everything.
    assert webhook["clientConfig"]["url"] == "https://127.0.0.1:9443/quota"
    assert podsets["clientConfig"]["url"] == "https://127.0.0.1:9443/validate-podsets"
    assert podsets["rules"][0]["resources"] == ["podsets"]
    assert podsets["failurePolicy"] == "Fail"
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["timeoutSeconds"] <= 10
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "tally-system"],
        }
    ]


def test_bad_failure_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="failurePolicy"):
        validating_webhook_configuration(
            name="x", url="https://h", ca_bundle="", rules=[], failure_policy="Maybe"
        )
