"""ClusterQuota on the real control plane (operator mode): usage over many namespaces, the
selection following labels, admission never past the limit, bad specs refused.

Expected numbers are worked out by hand from the objects each test creates (a pod with one
container requesting 100m counts pods=1 and requests.cpu=100m, as upstream's pod evaluator
counts it); the differential test compares with upstream itself.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from clusterquota_e2e import (
    GROUP,
    PLURAL,
    VERSION,
    Create,
    Team,
    burst,
    exceeded_cluster_quota,
    pods_used,
    used_by_namespace,
    wait_for_status,
)
from kubernetes_asyncio import client
from policy_webhook import PolicyWebhook

from tally.charges.ledger import DEFAULT_TIMEOUT_S
from tally_e2e import eventually

# The fixtures `cq_crd` and `team`, shared with test_clusterquota_concurrency.
pytest_plugins = ["clusterquota_e2e"]


async def test_usage_per_namespace_and_in_total(team: Team) -> None:
    first, second = await team.namespace(), await team.namespace()
    outsider = await team.namespace(member=False)
    name = await team.cluster_quota({"pods": "10", "requests.cpu": "2"})
    await team.pod(first, "a")
    await team.pod(first, "b", cpu="250m")
    await team.pod(second, "c")
    await team.pod(outsider, "d")  # not selected: not counted
    status = await eventually(
        lambda: team.status(name),
        until=lambda s: (s.get("total") or {}).get("used") == {"pods": "3", "requests.cpu": "450m"},
        within=10,
        what="the total",
    )
    assert {"pods": "10", "requests.cpu": "2"} == status["total"]["hard"]
    assert {
        first: {"pods": "2", "requests.cpu": "350m"},
        second: {"pods": "1", "requests.cpu": "100m"},
    } == used_by_namespace(status)
    assert [first, second] == [entry["namespace"] for entry in status["namespaces"]]  # sorted
    assert 2 == status["namespaceCount"]
    assert "pods 3/10" == status["mostUsed"]  # 30 % against requests.cpu at 22.5 %


async def test_selection_follows_labels_deletions_and_spec_changes(team: Team) -> None:
    first, second = await team.namespace(), await team.namespace()
    name = await team.cluster_quota({"pods": "10"})
    await team.pod(first, "a")
    await team.pod(second, "b")
    await team.pod(second, "c")

    async def used() -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
        status = await team.status(name)
        return (status.get("total") or {}).get("used") or {}, used_by_namespace(status)

    await eventually(used, until=lambda u: u[0] == {"pods": "3"}, within=10, what="3 pods")
    # The second namespace stops matching: it leaves the status, within seconds.
    await team.core.patch_namespace(second, {"metadata": {"labels": {"team": "other"}}})
    result = await eventually(used, until=lambda u: u[0] == {"pods": "1"}, within=10,
                              what="the relabelled namespace gone")  # fmt: skip
    assert [first] == list(result[1])
    # … and comes back.
    await team.core.patch_namespace(second, {"metadata": {"labels": {"team": team.id}}})
    await eventually(used, until=lambda u: u[0] == {"pods": "3"}, within=10, what="it is back")
    # A hard change shows at once; a selector change too.
    await team.merge_patch(
        name,
        {"spec": {"quota": {"hard": {"pods": "10", "count/configmaps": "5"}}}},
    )
    # Every namespace has kube-root-ca.crt (created by kube-controller-manager).
    await eventually(
        used,
        until=lambda u: u[0] == {"pods": "3", "count/configmaps": "2"},
        within=10,
        what="the new hard name counted",
    )
    await team.merge_patch(
        name,
        {
            "spec": {
                "namespaceSelector": {
                    "matchLabels": {"team": None, "kubernetes.io/metadata.name": first}
                }
            }
        },
    )
    result = await eventually(used, until=lambda u: u[0] == {"pods": "1", "count/configmaps": "1"},
                              within=10, what="selected by name")  # fmt: skip
    assert [first] == list(result[1])
    # A deleted namespace leaves the status.
    await team.merge_patch(
        name,
        {
            "spec": {
                "namespaceSelector": {
                    "matchLabels": {"team": team.id, "kubernetes.io/metadata.name": None}
                }
            }
        },
    )
    await eventually(used, until=lambda u: len(u[1]) == 2, within=10, what="both again")
    await team.core.delete_namespace(second)
    await eventually(used, until=lambda u: list(u[1]) == [first], within=60,
                     what="the deleted namespace gone")  # fmt: skip


RELABEL_ROUNDS = 4
CREATES_WITH_A_RELABEL = 6
POLICY_DELAY_S = 1.5
"""How long the slow policy webhook holds each pod create after tally judged it."""
RELABEL_AFTER_S = 0.5
"""The relabel comes this long after the creates: tally has judged them all by the old labels,
and the policy still holds them."""
COUNTED_WITHIN_S = 10.0
"""Far under the full resync (300 s): only a recalculation started by the creates themselves
counts them this soon."""
POD_CREATES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
]


async def test_creates_judged_by_labels_a_relabel_then_changes_are_counted_within_seconds(
    team: Team,
) -> None:
    # Pods judged by tally, then held by a slow policy webhook while their namespace is
    # relabelled into or out of the ClusterQuota: charged by the old labels (to nothing, or to
    # the ClusterQuota the namespace leaves), stored after the sync the relabelling started.
    # The status must still equal what a LIST shows within seconds, not at the next resync.
    member = await team.namespace()
    moving = await team.namespace(member=False)
    name = await team.cluster_quota({"pods": "1000"})
    await team.pod(member, "anchor")
    await wait_for_status(team, name, {"pods": "1"}, pods_used({member: 1}), what="the start")
    slow = PolicyWebhook(team.api, moving, POD_CREATES, labels={}, allow=True,
                         delay=POLICY_DELAY_S)  # fmt: skip
    async with slow:
        # Past the window after the ClusterQuota's first status, in which every creation
        # recalculates it anyway.
        await asyncio.sleep(DEFAULT_TIMEOUT_S + 1.0)
        for round_ in range(RELABEL_ROUNDS):
            joins = round_ % 2 == 0
            creates = [
                asyncio.create_task(team.pod(moving, f"r{round_}-{index}", cpu="1m"))
                for index in range(CREATES_WITH_A_RELABEL)
            ]
            await asyncio.sleep(RELABEL_AFTER_S)
            label = team.id if joins else "other"
            await team.core.patch_namespace(moving, {"metadata": {"labels": {"team": label}}})
            await asyncio.gather(*creates)
            pods = await team.pod_names([member, moving])
            selected = {member: len(pods[member])}
            if joins:
                selected[moving] = len(pods[moving])
            await wait_for_status(
                team, name, {"pods": str(sum(selected.values()))}, pods_used(selected),
                within=COUNTED_WITHIN_S, what=f"round {round_}: the pods counted",
            )  # fmt: skip
    # Every create of every round went through the slow policy.
    assert RELABEL_ROUNDS * CREATES_WITH_A_RELABEL == len(slow.allowed)


@pytest.mark.parametrize("round_", range(3))
async def test_concurrent_creates_across_namespaces_never_over_admit(
    team: Team, round_: int
) -> None:
    namespaces = await team.member_namespaces(10)
    name = await team.cluster_quota({"pods": "50"})
    await wait_for_status(team, name, {"pods": "0"}, {}, what="the first status")
    refusals = await burst(team, [Create(namespaces[i % 10], f"p{i}") for i in range(200)])
    counts = {ns: len(names) for ns, names in (await team.pod_names(namespaces)).items()}
    assert 50 == sum(counts.values()), counts
    assert 150 == len(refusals)
    expected = exceeded_cluster_quota(name, "pods=1", "pods=50", "pods=50")
    assert {expected} == {message for _, message in refusals}
    await wait_for_status(team, name, {"pods": "50"}, pods_used(counts))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]},
             "quota": {"hard": {"pods": "1"}}},
            "spec.namespaceSelector: 'Near' is not a valid label selector operator",
            id="invalid-selector",
        ),
        pytest.param(
            {"namespaceSelector": {}, "quota": {"hard": {"pods": "1"}, "scopes": ["Sometimes"]}},
            "Sometimes",
            id="unknown-scope",
        ),
        pytest.param(
            {"namespaceSelector": {}, "quota": {"hard": {"pods": "-1"}}},
            "spec.quota.hard[pods]: Invalid value: -1: must be greater than or equal to 0",
            id="negative-quantity",
        ),
        pytest.param(
            {"namespaceSelector": {}, "quota": {"hard": {"pods": "1e70"}}},
            "spec.quota.hard",
            id="absurd-quantity",
        ),
        pytest.param(
            {"namespaceSelector": {}, "quota": {"hard": {"widgets": "1"}}},
            'spec.quota.hard[widgets]: Unsupported value: "widgets"',
            id="unknown-resource",
        ),
    ],
)  # fmt: skip
async def test_bad_specs_are_refused_and_nothing_is_written(
    team: Team, spec: dict[str, Any], message: str
) -> None:
    name = f"cq-bad-{team.id}"
    with pytest.raises(client.ApiException) as refused:
        await team.custom.create_cluster_custom_object(
            GROUP, VERSION, PLURAL,
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQuota",
             "metadata": {"name": name}, "spec": spec},
        )  # fmt: skip
    assert refused.value.status in (400, 422), refused.value.body
    assert refused.value.body is not None
    assert message in json.loads(refused.value.body)["message"]
    with pytest.raises(client.ApiException) as missing:
        await team.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    assert 404 == missing.value.status
