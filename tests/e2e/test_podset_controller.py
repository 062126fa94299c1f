"""The PodSet controller on the real control plane (operator mode, tally running).

Expectations are upstream's ReplicaSet behaviour; the upstream e2e tests they mirror
are named on each test. No kubelet: tests mark pods Running/Ready through the status
subresource.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

import builders
from tally_e2e import ControlPlane, RunningOperator, eventually, set_pod_status

CRD = Path(__file__).resolve().parents[2] / "crds" / "podsets.tally.dev.yaml"
GROUP, VERSION, PLURAL = "tally.dev", "v1alpha1", "podsets"


@pytest.fixture(scope="module")
def podset_crd(control_plane: ControlPlane) -> None:
    """The CRD, installed before tally starts (the fixture order in each test puts it first)."""
    control_plane.kubectl("apply", "-f", str(CRD))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/podsets.tally.dev", "--timeout=60s"
    )
    # No teardown: the CRD stays (other modules may use it; re-applying is idempotent).


def podset(
    name: str,
    replicas: int,
    *,
    min_ready: int = 0,
    app: str | None = None,
    played: bool = False,
) -> dict[str, Any]:
    """``played``: its pods stay unbound and the test writes their status (``set_pod_status``)."""
    return builders.podset(
        name,
        replicas,
        selector={"app": app or name},
        containers=[builders.container("app", {"cpu": "100m"})],
        template_spec={"schedulerName": builders.NO_SCHEDULER} if played else None,
        spec={"minReadySeconds": min_ready},
    )


async def owned_pods(api: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """Active pods whose controller is the PodSet ``name``, as raw JSON."""
    response = await client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    pods = json.loads(await response.read())["items"]
    return [
        p
        for p in pods
        if any(
            ref.get("controller") and ref.get("kind") == "PodSet" and ref.get("name") == name
            for ref in p["metadata"].get("ownerReferences") or []
        )
        and not p["metadata"].get("deletionTimestamp")
    ]


async def get_podset(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    return dict(await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


async def wait_pods(api: client.ApiClient, namespace: str, name: str, count: int) -> list[Any]:
    return await eventually(
        lambda: owned_pods(api, namespace, name),
        until=lambda pods: len(pods) == count,
        within=15,
        what=f"{count} pods of {name}",
    )


async def wait_status(
    api: client.ApiClient, namespace: str, name: str, **expected: int
) -> dict[str, Any]:
    def matches(obj: dict[str, Any]) -> bool:
        status = obj.get("status") or {}
        return all(status.get(key, 0) == value for key, value in expected.items())

    return await eventually(
        lambda: get_podset(api, namespace, name),
        until=matches,
        within=15,
        what=f"{name} status {expected}",
    )


async def scale(api: client.ApiClient, namespace: str, name: str, replicas: int) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"spec": {"replicas": replicas}},
        _content_type="application/merge-patch+json",
    )


async def create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


async def test_scales_up_and_down_and_replaces_deleted_pods(
    podset_crd: None, operator: RunningOperator, api: client.ApiClient, namespace: str,
    control_plane: ControlPlane,
) -> None:  # fmt: skip
    await create(api, namespace, podset("web", 0))
    await wait_status(api, namespace, "web", replicas=0, observedGeneration=1)

    await scale(api, namespace, "web", 5)
    pods = await wait_pods(api, namespace, "web", 5)
    assert all(p["metadata"]["generateName"] == "web-" for p in pods)
    assert all(p["metadata"]["labels"] == {"app": "web"} for p in pods)
    ref = pods[0]["metadata"]["ownerReferences"][0]
    assert (ref["controller"], ref["blockOwnerDeletion"]) == (True, True)
    status = (await wait_status(api, namespace, "web", replicas=5, fullyLabeledReplicas=5))[
        "status"
    ]
    assert status["selector"] == "app=web"

    # A deleted pod comes back.
    await client.CoreV1Api(api).delete_namespaced_pod(
        pods[0]["metadata"]["name"], namespace, grace_period_seconds=0
    )
    replaced = await eventually(
        lambda: owned_pods(api, namespace, "web"),
        until=lambda now: (
            len(now) == 5
            and pods[0]["metadata"]["name"] not in {p["metadata"]["name"] for p in now}
        ),
        within=15,
        what="the deleted pod replaced",
    )
    assert len(replaced) == 5

    # kubectl scale goes through the scale subresource (upstream e2e "Replicaset should have a
    # working scale subresource").
    control_plane.kubectl("scale", "podset/web", "--replicas=2", "-n", namespace)
    await wait_pods(api, namespace, "web", 2)
    await wait_status(api, namespace, "web", replicas=2)
    await scale(api, namespace, "web", 0)
    await wait_pods(api, namespace, "web", 0)
    await wait_status(api, namespace, "web", replicas=0)


async def test_ready_and_available_follow_pod_status(
    podset_crd: None, operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    await create(api, namespace, podset("ready", 3, min_ready=3, played=True))
    pods = await wait_pods(api, namespace, "ready", 3)
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    await set_pod_status(api, namespace, pods[0]["metadata"]["name"], since=long_ago)
    await set_pod_status(api, namespace, pods[1]["metadata"]["name"])  # ready just now
    await wait_status(api, namespace, "ready", replicas=3, readyReplicas=2, availableReplicas=1)
    # After minReadySeconds the second pod is available too, without any pod event.
    await wait_status(api, namespace, "ready", readyReplicas=2, availableReplicas=2)


async def test_adopts_matching_orphans_and_releases_relabelled_pods(
    podset_crd: None, operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    """Upstream e2e "should adopt matching pods on creation and release no longer matching"."""
    core = client.CoreV1Api(api)
    orphan = {
        "metadata": {"name": "orphan", "labels": {"app": "adopt"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }
    await core.create_namespaced_pod(namespace, orphan)
    await create(api, namespace, podset("adopt", 1))
    pods = await wait_pods(api, namespace, "adopt", 1)
    assert pods[0]["metadata"]["name"] == "orphan"  # adopted, not a new pod
    await wait_status(api, namespace, "adopt", replicas=1)

    await core.patch_namespaced_pod("orphan", namespace, {"metadata": {"labels": {"app": "x"}}})
    # Released (owner reference removed) and replaced by a new pod.
    released = await eventually(
        lambda: core.read_namespaced_pod("orphan", namespace),
        until=lambda pod: not pod.metadata.owner_references,
        within=15,
        what="the relabelled pod released",
    )
    assert released.metadata.labels == {"app": "x"}
    pods = await wait_pods(api, namespace, "adopt", 1)
    assert pods[0]["metadata"]["name"] != "orphan"


async def test_scale_down_deletes_the_least_valuable_pods_first(
    podset_crd: None, operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    await create(api, namespace, podset("rank", 4, played=True))
    pods = await wait_pods(api, namespace, "rank", 4)
    names = [p["metadata"]["name"] for p in pods]
    core = client.CoreV1Api(api)
    # names[0] stays Pending; names[1] Running not ready; names[2], names[3] Running and ready,
    # names[3] with a lower deletion cost.
    await set_pod_status(api, namespace, names[1], ready=False)
    await set_pod_status(api, namespace, names[2])
    await set_pod_status(api, namespace, names[3])
    await core.patch_namespaced_pod(
        names[3],
        namespace,
        {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-10"}}},
    )
    await wait_status(api, namespace, "rank", readyReplicas=2)

    async def remaining() -> set[str]:
        return {p["metadata"]["name"] for p in await owned_pods(api, namespace, "rank")}

    await scale(api, namespace, "rank", 3)
    assert await eventually(remaining, until=lambda r: len(r) == 3, within=15) == set(names[1:])
    await scale(api, namespace, "rank", 2)
    assert await eventually(remaining, until=lambda r: len(r) == 2, within=15) == set(names[2:])
    await scale(api, namespace, "rank", 1)
    assert await eventually(remaining, until=lambda r: len(r) == 1, within=15) == {names[2]}


async def test_quota_denial_surfaces_as_replica_failure(
    podset_crd: None, operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    """Upstream e2e "should surface a failure condition on a common issue like exceeded quota"."""
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "condition-test"}, "spec": {"hard": {"pods": "2"}}}
    )
    await eventually(
        lambda: core.read_namespaced_resource_quota("condition-test", namespace),
        until=lambda q: (q.status.used or {}).get("pods") == "0",
        within=10,
        what="quota usage computed",
    )
    await create(api, namespace, podset("condition-test", 3))

    def failure(obj: dict[str, Any]) -> dict[str, Any] | None:
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition["type"] == "ReplicaFailure":
                return dict(condition)
        return None

    obj = await eventually(
        lambda: get_podset(api, namespace, "condition-test"),
        until=lambda o: failure(o) is not None,
        within=15,
        what="ReplicaFailure condition",
    )
    condition = failure(obj)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "FailedCreate")
    assert (
        "exceeded quota: condition-test, requested: pods=1, used: pods=2, limited: pods=2"
        in (condition["message"])
    )
    assert len(await owned_pods(api, namespace, "condition-test")) == 2

    await scale(api, namespace, "condition-test", 2)
    await eventually(
        lambda: get_podset(api, namespace, "condition-test"),
        until=lambda o: failure(o) is None,
        within=15,
        what="ReplicaFailure removed",
    )


async def test_deleting_the_podset_removes_its_pods(
    podset_crd: None, operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    await create(api, namespace, podset("gc", 2))
    await wait_pods(api, namespace, "gc", 2)
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "gc"
    )
    # The garbage collector (kube-controller-manager) follows the owner references. It learns
    # about a newly installed CRD at its next discovery sync (every 30 s upstream), so on a
    # fresh control plane this can take a little over that.
    await eventually(
        lambda: client.CoreV1Api(api).list_namespaced_pod(namespace),
        until=lambda pods: not pods.items,
        within=90,
        what="pods garbage-collected",
    )


async def test_the_webhook_refuses_invalid_podsets(
    podset_crd: None, operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    body = podset("bad", 1)
    body["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    with pytest.raises(client.ApiException) as refused:
        await create(api, namespace, body)
    assert refused.value.status == 422
    assert json.loads(refused.value.body)["message"] == (
        'admission webhook "podsets.tally.dev" denied the request: PodSet.tally.dev "bad" is '
        'invalid: spec.template.metadata.labels: Invalid value: {"app":"other"}: `selector` does '
        "not match template `labels`"
    )
    # Status and scale writes are not spec edits: the webhook does not see them.
    await create(api, namespace, podset("good", 1))
    await scale(api, namespace, "good", 2)
    await wait_pods(api, namespace, "good", 2)
