"""tally.builtin_quota.decision: reading the start-up probe's observations, and what tally does
then.

The API answers below are the API server's own words, taken from the local control plane
(v1.37.1): reference mode (upstream's plugin refusing the dry run), a webhook configuration
pointing at a dead port, and a ServiceAccount without the probe's Role.
"""

from __future__ import annotations

from typing import Any

import pytest

import builders
from tally.builtin_quota.decision import (
    APISERVER_FLAG,
    CONTROLLER_MANAGER_FLAG,
    PROBE_NAME,
    Action,
    Finding,
    ProbeResult,
    State,
    admission_finding,
    controller_finding,
    decide,
    foreign_status_writers,
    has_status_hard,
    probe_namespace,
    status_writers,
)

pytestmark = pytest.mark.unit

WHAT = "a dry-run create of a ResourceQuota"
PLUGIN_REFUSAL = (
    'resourcequotas "tally-builtin-quota-probe-dry-run" is forbidden: exceeded quota: '
    "tally-builtin-quota-probe, requested: resourcequotas=1, used: resourcequotas=1, "
    "limited: resourcequotas=0"
)
WEBHOOK_REFUSAL = (
    'resourcequotas "tally-builtin-quota-probe-dry-run" is forbidden: admission webhook '
    '"quota.tally.dev" denied the request: exceeded quota: tally-builtin-quota-probe, '
    "requested: resourcequotas=1, used: resourcequotas=0, limited: resourcequotas=0"
)
WEBHOOK_FAILURE = (
    'Internal error occurred: failed calling webhook "quota.tally.dev": failed to call webhook: '
    'Post "https://127.0.0.1:1/quota?timeout=2s": dial tcp 127.0.0.1:1: connect: connection '
    "refused"
)
RBAC_REFUSAL = (
    'resourcequotas is forbidden: User "system:serviceaccount:tally-system:tally" cannot create '
    'resource "resourcequotas" in API group "" in the namespace "tally-system"'
)


@pytest.mark.parametrize(
    ("status", "message", "state", "in_detail"),
    [
        pytest.param(201, "", State.OFF, "admitted", id="admitted"),
        pytest.param(
            403, PLUGIN_REFUSAL, State.ON, '"exceeded quota: tally-builtin-quota-probe, ',
            id="upstream-plugin-exceeded",
        ),
        pytest.param(
            403,
            'resourcequotas "x" is forbidden: status unknown for quota: tally-builtin-quota-probe, '
            "resources: resourcequotas",
            State.ON, '"status unknown for quota: tally-builtin-quota-probe',
            id="upstream-plugin-status-unknown",
        ),
        # tally's webhook says the same words, but in the webhook wording, and webhooks run
        # before the built-in plugin: nothing is known about the plugin.
        pytest.param(
            403, WEBHOOK_REFUSAL, State.UNKNOWN, "refused by webhook 'quota.tally.dev'",
            id="webhook-denied-with-quota-words",
        ),
        # A dead fail-closed webhook (tally's own, left registered) is not the built-in plugin.
        pytest.param(
            500, WEBHOOK_FAILURE, State.UNKNOWN, "failed at webhook 'quota.tally.dev'",
            id="webhook-failed",
        ),
        pytest.param(403, RBAC_REFUSAL, State.UNKNOWN, "HTTP 403", id="rbac-forbidden"),
        pytest.param(
            404, 'namespaces "tally-system" not found', State.UNKNOWN, "HTTP 404",
            id="no-namespace",
        ),
        pytest.param(0, "no answer: TimeoutError()", State.UNKNOWN, "HTTP 0", id="no-answer"),
        # The quota words in some other refusal (a 500, say) are not the plugin's refusal.
        pytest.param(
            500, "Internal error occurred: exceeded quota: x", State.UNKNOWN, "HTTP 500",
            id="quota-words-not-403",
        ),
    ],
)  # fmt: skip
def test_admission_finding(status: int, message: str, state: State, in_detail: str) -> None:
    finding = admission_finding(status, message, what=WHAT)
    assert state == finding.state
    assert in_detail in finding.detail
    assert finding.detail.startswith(WHAT)


def test_a_webhook_refusal_is_never_taken_for_the_plugin() -> None:
    # The webhook wording carries "exceeded quota: " too; the webhook prefix wins.
    assert "exceeded quota: " in WEBHOOK_REFUSAL
    assert State.UNKNOWN == admission_finding(403, WEBHOOK_REFUSAL, what=WHAT).state


def _probe(*entries: tuple[str, str], status: dict[str, Any] | None = None) -> dict[str, Any]:
    """The probe quota, written by ``(manager, subresource)`` entries (its managedFields)."""
    managed = [
        {"manager": manager, "operation": "Update", **({"subresource": sub} if sub else {})}
        for manager, sub in entries
    ]
    return builders.resource_quota(
        PROBE_NAME, metadata={"managedFields": managed}, status=status or {}
    )


@pytest.mark.parametrize(
    ("quota", "writers", "foreign"),
    [
        pytest.param(_probe(("tally", "")), set(), set(), id="created-by-tally"),
        pytest.param(
            _probe(("tally", ""), ("tally", "status")), {"tally"}, set(), id="status-by-tally"
        ),
        # What reference mode shows: the controller's write is an Update of the status.
        pytest.param(
            _probe(("tally", ""), ("tally", "status"), ("kube-controller-manager", "status")),
            {"tally", "kube-controller-manager"},
            {"kube-controller-manager"},
            id="status-by-the-controller",
        ),
        # Someone's spec edit is not a status write.
        pytest.param(_probe(("kubectl-edit", "")), set(), set(), id="spec-by-someone"),
        pytest.param({"metadata": {}}, set(), set(), id="no-managed-fields"),
    ],
)
def test_status_writers(quota: dict[str, Any], writers: set[str], foreign: set[str]) -> None:
    assert writers == status_writers(quota)
    assert foreign == foreign_status_writers(quota, "tally")


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param({}, False, id="no-status"),
        pytest.param({"used": {"resourcequotas": "1"}}, False, id="used-only"),
        pytest.param({"hard": {"resourcequotas": "0"}}, True, id="hard-zero"),
    ],
)
def test_has_status_hard(status: dict[str, Any], expected: bool) -> None:
    assert expected == has_status_hard(_probe(status=status))


@pytest.mark.parametrize(
    ("writers", "observed", "state", "in_detail"),
    [
        pytest.param(
            {"kube-controller-manager"}, True, State.ON,
            "kube-controller-manager wrote the probe quota's status within 6 ms",
            id="controller-wrote",
        ),
        pytest.param(set(), True, State.OFF, "nobody but tally", id="nobody-wrote"),
        pytest.param(set(), False, State.UNKNOWN, "could not be read: HTTP 403", id="unread"),
    ],
)  # fmt: skip
def test_controller_finding(
    writers: set[str], observed: bool, state: State, in_detail: str
) -> None:
    finding = controller_finding(writers, 0.006, observed=observed, error="HTTP 403 forbidden")
    assert state == finding.state
    assert in_detail in finding.detail


ON = Finding(State.ON, "seen on")
OFF = Finding(State.OFF, "seen off")
UNKNOWN = Finding(State.UNKNOWN, "could not tell")


def _result(admission: Finding, controller: Finding) -> ProbeResult:
    return ProbeResult("tally-system", admission, controller, 0.012)


@pytest.mark.parametrize(
    ("admission", "controller", "allowed", "action", "flags"),
    [
        pytest.param(OFF, OFF, False, Action.PROCEED, (), id="operator-mode"),
        pytest.param(
            ON, ON, False, Action.CLUSTER_QUOTAS_ONLY, (APISERVER_FLAG, CONTROLLER_MANAGER_FLAG),
            id="reference-mode",
        ),
        pytest.param(
            ON, OFF, False, Action.CLUSTER_QUOTAS_ONLY, (APISERVER_FLAG,), id="plugin-only"
        ),
        pytest.param(
            OFF, ON, False, Action.CLUSTER_QUOTAS_ONLY, (CONTROLLER_MANAGER_FLAG,),
            id="controller-only",
        ),
        # One part on and one unknown: ClusterQuotas only, and name both flags (the unknown one
        # may be on).
        pytest.param(
            ON, UNKNOWN, False, Action.CLUSTER_QUOTAS_ONLY,
            (APISERVER_FLAG, CONTROLLER_MANAGER_FLAG), id="on-and-unknown",
        ),
        # Fail-open: nothing seen on, something not known.
        pytest.param(UNKNOWN, OFF, False, Action.WARN, (APISERVER_FLAG,), id="plugin-unknown"),
        pytest.param(
            UNKNOWN, UNKNOWN, False, Action.WARN, (APISERVER_FLAG, CONTROLLER_MANAGER_FLAG),
            id="probe-failed",
        ),
        pytest.param(
            ON, ON, True, Action.WARN, (APISERVER_FLAG, CONTROLLER_MANAGER_FLAG),
            id="allowed-reference-mode",
        ),
        pytest.param(OFF, OFF, True, Action.PROCEED, (), id="allowed-operator-mode"),
    ],
)  # fmt: skip
def test_decide(
    admission: Finding,
    controller: Finding,
    allowed: bool,
    action: Action,
    flags: tuple[str, ...],
) -> None:
    decision = decide(_result(admission, controller), allowed=allowed)
    assert action == decision.action
    for flag in (APISERVER_FLAG, CONTROLLER_MANAGER_FLAG):
        assert (flag in decision.message) == (flag in flags), flag
    # Every message says what was seen, and where the probe ran.
    assert admission.detail in decision.message
    assert controller.detail in decision.message
    assert f"tally-system/{PROBE_NAME}, 12 ms" in decision.message


def test_cluster_quotas_only_says_how_to_have_both() -> None:
    decision = decide(_result(ON, ON), allowed=False)
    assert decision.message.startswith(
        "the cluster's built-in quota system is on: tally enforces ClusterQuotas only and "
        "leaves ResourceQuotas to it."
    )
    assert "For tally to enforce ResourceQuotas too, turn it off: " in decision.message
    assert "--disable-admission-plugins=ResourceQuota" in decision.message
    assert "--controllers=*,-resourcequota-controller" in decision.message


@pytest.mark.parametrize(
    ("operator_namespace", "expected"),
    [
        pytest.param("tally-system", "tally-system", id="in-cluster"),
        pytest.param("", "kube-system", id="unset"),
    ],
)
def test_probe_namespace_is_one_tallys_webhook_exempts(
    operator_namespace: str, expected: str
) -> None:
    assert expected == probe_namespace(operator_namespace)
