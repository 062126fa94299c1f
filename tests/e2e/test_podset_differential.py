"""Differential test of the PodSet controller: the same scripts with an apps/v1 ReplicaSet on
upstream (reference mode: kube-controller-manager's replicaset controller and upstream quota
admission) and with a PodSet on tally (operator mode: tally's controller and tally's webhook).

Each script runs on both sides at once, each in a fresh namespace, and stops at named
checkpoints. At a checkpoint a side first waits for an anchor (an explicit expected value, so
that two equally wrong answers cannot pass), then until two reads ``STABLE_AFTER_S`` apart
agree; then both sides' snapshots must be equal: the number of active pods the workload
controls; ``status.replicas``, ``fullyLabeledReplicas``, ``readyReplicas``,
``availableReplicas`` (absent = 0, upstream omits zeros); whether ``observedGeneration`` is the
current generation; the conditions by type, status and reason; and for a ``ReplicaFailure``
the ``exceeded quota: ...`` part of its message (the prefixes differ: upstream's quota plugin
says ``pods "..." is forbidden: ...``, tally's webhook adds ``admission webhook ... denied the
request: ...``).

Events are compared the same way, at their own checkpoints: the Events about the workload as
(type, reason, count, message with the pod name replaced), sorted. Both controllers' recorders
aggregate, count and spam-filter (client-go's correlator), so 12 creates leave 9 Events of
their own and one ``(combined from similar events): ...`` Event with count 3.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kubernetes_asyncio import client
from podset_differential import Side, assert_same, counts, run_both
from podset_e2e import PODSET, REPLICASET, install_podset_crd

from tally_e2e import ControlPlane, RunningOperator, eventually, set_pod_status

MIN_READY_S = 10


@pytest.fixture(scope="module")
def podset_crd(control_plane: ControlPlane) -> None:
    install_podset_crd(control_plane)


@pytest.fixture
def sides(
    podset_crd: None,
    operator: RunningOperator,
    api: client.ApiClient,
    namespace: str,
    reference_api: client.ApiClient,
    reference_namespace: str,
) -> tuple[Side, Side]:
    return (
        Side("upstream ReplicaSet", reference_api, reference_namespace, REPLICASET),
        Side("tally PodSet", api, namespace, PODSET),
    )


# -- scripts ---------------------------------------------------------------------------------


async def scale_script(side: Side) -> None:
    await side.create("web", 0)
    await side.checkpoint("created with 0", "web", counts(0))
    await side.scale("web", 5)
    await side.checkpoint("scaled to 5", "web", counts(5, fullyLabeledReplicas=5))
    await side.scale("web", 2)
    await side.checkpoint("scaled to 2", "web", counts(2, fullyLabeledReplicas=2))
    await side.scale("web", 0)
    await side.checkpoint("scaled to 0", "web", counts(0))


async def ready_script(side: Side) -> None:
    await side.create("ready", 3, min_ready=MIN_READY_S, played=True)
    await side.checkpoint("3 pending", "ready", counts(3, readyReplicas=0))
    names = await side.pod_names("ready")
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    await set_pod_status(side.api, side.namespace, names[0], since=long_ago)
    await set_pod_status(side.api, side.namespace, names[1])  # ready just now
    await set_pod_status(side.api, side.namespace, names[2], ready=False)
    await side.checkpoint(
        "2 ready, 1 available", "ready", counts(3, readyReplicas=2, availableReplicas=1)
    )
    # After minReadySeconds the second ready pod is available too, with no pod event.
    await side.checkpoint(
        "2 ready, 2 available", "ready", counts(3, readyReplicas=2, availableReplicas=2)
    )


async def adopt_release_script(side: Side) -> None:
    core = client.CoreV1Api(side.api)
    orphan = {
        "metadata": {"name": "orphan", "labels": {"app": "adopt"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }
    await core.create_namespaced_pod(side.namespace, orphan)
    await side.create("adopt", 1)
    await side.checkpoint("orphan adopted", "adopt", counts(1))
    assert await side.pod_names("adopt") == ["orphan"], side.label  # adopted, not a new pod
    await core.patch_namespaced_pod(
        "orphan", side.namespace, {"metadata": {"labels": {"app": "x"}}}
    )
    await side.checkpoint("relabelled pod released and replaced", "adopt", counts(1))
    assert "orphan" not in await side.pod_names("adopt"), side.label
    released = await core.read_namespaced_pod("orphan", side.namespace)
    assert not released.metadata.owner_references, side.label


async def quota_script(side: Side) -> None:
    core = client.CoreV1Api(side.api)
    await core.create_namespaced_resource_quota(
        side.namespace,
        {"metadata": {"name": "condition-test"}, "spec": {"hard": {"pods": "2"}}},
    )
    await eventually(
        lambda: core.read_namespaced_resource_quota("condition-test", side.namespace),
        until=lambda q: (q.status.used or {}).get("pods") == "0",
        within=30,
        what=f"{side.label}: quota usage computed",
    )
    await side.create("condition-test", 3)
    failed = (
        "ReplicaFailure",
        "True",
        "FailedCreate",
        "exceeded quota: condition-test, requested: pods=1, used: pods=2, limited: pods=2",
    )
    await side.checkpoint(
        "ReplicaFailure FailedCreate",
        "condition-test",
        lambda s: counts(2)(s) and s["conditions"] == [failed],
    )
    await side.scale("condition-test", 2)
    await side.checkpoint(
        "condition removed at 2",
        "condition-test",
        lambda s: counts(2)(s) and s["conditions"] == [],
    )


def aggregated(event_type: str, reason: str, message: str, total: int) -> list[Any]:
    """``total`` Events of one reason about one object, as client-go's correlator writes them:
    the first 9 on their own, the 10th and later as one aggregate counting them."""
    single = [(event_type, reason, 1, message)] * 9
    combined = (event_type, reason, total - 9, f"(combined from similar events): {message}")
    return [*single, combined]


async def events_script(side: Side) -> None:
    await side.create("burst", 0)
    await side.checkpoint("created with 0", "burst", counts(0))
    await side.scale("burst", 12)
    await side.checkpoint("scaled to 12", "burst", counts(12, fullyLabeledReplicas=12))
    creates = aggregated("Normal", "SuccessfulCreate", "Created pod: <pod>", 12)
    await side.event_checkpoint("events of 12 creates", "burst", sorted(creates))
    await side.scale("burst", 0)
    await side.checkpoint("scaled to 0", "burst", counts(0))
    deletes = aggregated("Normal", "SuccessfulDelete", "Deleted pod: <pod>", 12)
    await side.event_checkpoint("events of 12 deletes", "burst", sorted(creates + deletes))


# -- tests -----------------------------------------------------------------------------------


async def test_scale_up_and_down(sides: tuple[Side, Side]) -> None:
    assert_same(await run_both(*sides, scale_script))


async def test_ready_and_available(sides: tuple[Side, Side]) -> None:
    assert_same(await run_both(*sides, ready_script))


async def test_adoption_and_release(sides: tuple[Side, Side]) -> None:
    assert_same(await run_both(*sides, adopt_release_script))


async def test_quota_failure_condition(sides: tuple[Side, Side]) -> None:
    """Upstream e2e "should surface a failure condition on a common issue like exceeded quota"."""
    assert_same(await run_both(*sides, quota_script))


async def test_events_aggregated_like_upstream(sides: tuple[Side, Side]) -> None:
    """12 creates and 12 deletes: the same Events as upstream's recorder leaves, aggregated."""
    assert_same(await run_both(*sides, events_script))
