"""ClusterQuota on the real control plane (operator mode): usage over many namespaces, the
selection following labels, admission never past the limit, bad specs refused.

Expected numbers are worked out by hand from the objects each test creates (a pod with one
container requesting 100m counts pods=1 and requests.cpu=100m, as upstream's pod evaluator
counts it); the differential test compares with upstream itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from tally_e2e import ControlPlane, RunningOperator, eventually, wait_for_default_service_account

CRD = Path(__file__).resolve().parents[2] / "crds" / "clusterquotas.tally.dev.yaml"
GROUP, VERSION, PLURAL = "tally.dev", "v1alpha1", "clusterquotas"
IMAGE = "registry.example/app:1"


@pytest.fixture(scope="module")
def cq_crd(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", str(CRD))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/clusterquotas.tally.dev", "--timeout=60s"
    )


class Team:
    """Namespaces labelled ``team=<id>`` (and one more that is not), and the ClusterQuotas a
    test makes; all deleted afterwards."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.id = uuid.uuid4().hex[:8]
        self.namespaces: list[str] = []
        self.quotas: list[str] = []

    async def namespace(self, *, member: bool = True) -> str:
        name = f"e2e-cq-{self.id}-{len(self.namespaces)}"
        labels = {"tally.dev/e2e": "true", **({"team": self.id} if member else {})}
        await self.core.create_namespace({"metadata": {"name": name, "labels": labels}})
        await wait_for_default_service_account(self.api, name)
        self.namespaces.append(name)
        return name

    async def cluster_quota(self, hard: dict[str, str], **spec: Any) -> str:
        name = f"cq-{self.id}-{len(self.quotas)}"
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterQuota",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {"matchLabels": {"team": self.id}},
                "quota": {"hard": hard},
                **spec,
            },
        }
        await self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        self.quotas.append(name)
        return name

    async def merge_patch(
        self, group: str, version: str, plural: str, name: str, body: dict[str, Any]
    ) -> None:
        await self.custom.patch_cluster_custom_object(
            group, version, plural, name, body, _content_type="application/merge-patch+json"
        )

    async def status(self, name: str) -> dict[str, Any]:
        obj = await self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        return dict(obj.get("status") or {})

    async def pod(self, namespace: str, name: str, cpu: str = "100m") -> None:
        await self.core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "containers": [
                        {"name": "a", "image": IMAGE, "resources": {"requests": {"cpu": cpu}}}
                    ]
                },
            },
        )

    async def close(self) -> None:
        for name in self.quotas:
            with contextlib.suppress(client.ApiException):
                await self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        for namespace in self.namespaces:
            with contextlib.suppress(client.ApiException):
                await self.core.delete_namespace(namespace)


@pytest_asyncio.fixture
async def team(
    cq_crd: None, operator: RunningOperator, api: client.ApiClient
) -> AsyncIterator[Team]:
    created = Team(api)
    try:
        yield created
    finally:
        await created.close()


def _used_by_namespace(status: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        entry["namespace"]: dict((entry.get("status") or {}).get("used") or {})
        for entry in status.get("namespaces") or []
    }


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
    } == _used_by_namespace(status)
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
        return (status.get("total") or {}).get("used") or {}, _used_by_namespace(status)

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
        GROUP,
        VERSION,
        PLURAL,
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
        GROUP,
        VERSION,
        PLURAL,
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
        GROUP,
        VERSION,
        PLURAL,
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


@pytest.mark.parametrize("round_", range(3))
async def test_concurrent_creates_across_namespaces_never_over_admit(
    team: Team, round_: int
) -> None:
    namespaces = [await team.namespace() for _ in range(10)]
    name = await team.cluster_quota({"pods": "50"})
    await eventually(
        lambda: team.status(name),
        until=lambda s: (s.get("total") or {}).get("used") == {"pods": "0"},
        within=10,
        what="the first status",
    )
    refusals: list[str] = []

    async def create(index: int) -> None:
        try:
            await team.pod(namespaces[index % 10], f"p{index}")
        except client.ApiException as error:
            refusals.append(json.loads(error.body)["message"])

    await asyncio.gather(*(create(index) for index in range(200)))
    counts = [len((await team.core.list_namespaced_pod(ns)).items) for ns in namespaces]
    assert 50 == sum(counts), counts
    assert 150 == len(refusals)
    expected = f"exceeded cluster quota: {name}, requested: pods=1, used: pods=50, limited: pods=50"
    assert all(expected in message for message in refusals), set(refusals)
    status = await eventually(
        lambda: team.status(name),
        until=lambda s: (s.get("total") or {}).get("used") == {"pods": "50"},
        within=10,
        what="the total",
    )
    assert {ns: {"pods": str(c)} for ns, c in zip(namespaces, counts, strict=True) if c} == {
        ns: used for ns, used in _used_by_namespace(status).items() if used["pods"] != "0"
    }


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
    assert message in json.loads(refused.value.body)["message"]
    with pytest.raises(client.ApiException) as missing:
        await team.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    assert 404 == missing.value.status
