"""The PodSet controller's view of pods: what it keeps of a pod, and what an update keeps.

A pod another kind controls (a ReplicaSet's, a Job's) is never adopted, ranked or counted by a
PodSet, so its view is its identity, labels, owners and deletion only, and a kubelet's status
update of it keeps the view it had. Every other pod keeps the whole view: its status is what a
PodSet's ranking and status read. An update changing nothing the view keeps (the view holds no
resourceVersion) keeps the view it had, and the controller then has nothing to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tally.machinery.cache import ChangeKind, Store
from tally.podset.controller import (
    PodSetController,
    controlled_by_another_kind,
    pod_view,
    reproject_pod_view,
)

pytestmark = pytest.mark.unit

NAMESPACE = "ns"

REPLICA_SET_OWNER = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "web-5d4f",
    "uid": "rs-uid",
    "controller": True,
    "blockOwnerDeletion": True,
}
PODSET_OWNER = {
    "apiVersion": "tally.dev/v1alpha1",
    "kind": "PodSet",
    "name": "web",
    "uid": "podset-uid",
    "controller": True,
    "blockOwnerDeletion": True,
}


def _pod(
    *,
    owners: list[dict[str, Any]] | None = None,
    ready: bool = True,
    restarts: int = 0,
    version: str = "100",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "web-1",
        "namespace": NAMESPACE,
        "uid": "pod-uid",
        "resourceVersion": version,
        "labels": {"app": "web"} if labels is None else labels,
        "creationTimestamp": "2026-11-28T00:00:00Z",
        "annotations": {
            "controller.kubernetes.io/pod-deletion-cost": "5",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
        },
    }
    if owners is not None:
        metadata["ownerReferences"] = owners
    status = "True" if ready else "False"
    return {
        "metadata": metadata,
        "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "app", "image": "app:1"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": status, "lastTransitionTime": "2026-11-28T00:00:0"
                 f"{restarts}Z"},
            ],
            "containerStatuses": [
                {"name": "app", "ready": ready, "restartCount": restarts, "image": "app:1"}
            ],
        },
    }  # fmt: skip


# -- which pods another kind controls


@pytest.mark.parametrize(
    ("owners", "foreign"),
    [
        (None, False),  # an orphan: a PodSet may adopt it
        ([REPLICA_SET_OWNER], True),
        ([PODSET_OWNER], False),
        ([{**REPLICA_SET_OWNER, "controller": False}], False),  # an owner, not the controller
        ([{**REPLICA_SET_OWNER, "controller": False}, PODSET_OWNER], False),
        ([{**PODSET_OWNER, "controller": False}, REPLICA_SET_OWNER], True),
        ("not a list", False),  # malformed: the whole view, the controller's reads judge it
        (["not an object", REPLICA_SET_OWNER], False),
    ],
)
def test_controlled_by_another_kind(owners: Any, foreign: bool) -> None:
    pod = _pod()
    if owners is not None:
        pod["metadata"]["ownerReferences"] = owners
    assert foreign is controlled_by_another_kind(pod)


# -- what the view keeps


def test_a_pod_another_kind_controls_keeps_its_metadata_only() -> None:
    pod = _pod(owners=[REPLICA_SET_OWNER])
    pod["metadata"]["deletionTimestamp"] = "2026-11-28T00:01:00Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30

    assert {
        "metadata": {
            "name": "web-1",
            "namespace": NAMESPACE,
            "uid": "pod-uid",
            "labels": {"app": "web"},
            "ownerReferences": [REPLICA_SET_OWNER],
            "creationTimestamp": "2026-11-28T00:00:00Z",
            "deletionTimestamp": "2026-11-28T00:01:00Z",
            "deletionGracePeriodSeconds": 30,
        }
    } == pod_view(pod)


@pytest.mark.parametrize("owners", [None, [PODSET_OWNER]], ids=["orphan", "a PodSet's"])
def test_any_other_pod_keeps_what_ranking_and_status_read(owners: Any) -> None:
    pod = _pod(owners=owners, ready=False, restarts=2)
    metadata = {
        "name": "web-1",
        "namespace": NAMESPACE,
        "uid": "pod-uid",
        "labels": {"app": "web"},
        "creationTimestamp": "2026-11-28T00:00:00Z",
        "annotations": {"controller.kubernetes.io/pod-deletion-cost": "5"},
    }
    if owners is not None:
        metadata["ownerReferences"] = owners

    assert {
        "metadata": metadata,
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-28T00:00:02Z"}
            ],
            "containerStatuses": [{"name": "app", "restartCount": 2}],
        },
        "spec": {"nodeName": "kwok-node-0"},
    } == pod_view(pod)


# -- what an update keeps


def test_a_status_update_of_a_pod_another_kind_controls_keeps_the_view() -> None:
    before = pod_view(_pod(owners=[REPLICA_SET_OWNER]))
    after = _pod(owners=[REPLICA_SET_OWNER], ready=False, restarts=1, version="101")

    assert reproject_pod_view(before, after) is before


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda m: m.update(labels={"app": "web", "tier": "a"}), {"app": "web", "tier": "a"}),
        (lambda m: m.update(deletionTimestamp="2026-11-28T00:01:00Z"), {"app": "web"}),
        (lambda m: m.update(ownerReferences=[{**REPLICA_SET_OWNER, "uid": "rs2"}]), {"app": "web"}),
    ],
    ids=["labels", "deletion", "another controller of that kind"],
)  # fmt: skip
def test_a_metadata_change_of_a_pod_another_kind_controls_is_seen(
    change: Any, expected: dict[str, str]
) -> None:
    before = pod_view(_pod(owners=[REPLICA_SET_OWNER]))
    updated = _pod(owners=[REPLICA_SET_OWNER], version="101")
    change(updated["metadata"])

    view = reproject_pod_view(before, updated)

    assert view is not before
    assert view == pod_view(updated)
    assert expected == view["metadata"]["labels"]


def test_a_released_pod_gets_the_whole_view_back() -> None:
    before = pod_view(_pod(owners=[REPLICA_SET_OWNER]))
    released = _pod(owners=[], ready=False, restarts=3, version="101")

    view = reproject_pod_view(before, released)

    assert "status" in view
    assert [{"name": "app", "restartCount": 3}] == view["status"]["containerStatuses"]
    assert [] == view["metadata"]["ownerReferences"]


@pytest.mark.parametrize("owners", [None, [PODSET_OWNER]], ids=["orphan", "a PodSet's"])
def test_a_status_update_of_any_other_pod_is_seen(owners: Any) -> None:
    before = pod_view(_pod(owners=owners, ready=True))
    after = _pod(owners=owners, ready=False, restarts=1, version="101")

    view = reproject_pod_view(before, after)

    assert view is not before
    assert "False" == view["status"]["conditions"][0]["status"]
    assert [{"name": "app", "restartCount": 1}] == view["status"]["containerStatuses"]


@pytest.mark.parametrize("owners", [None, [PODSET_OWNER]], ids=["orphan", "a PodSet's"])
def test_an_update_of_any_other_pod_changing_nothing_kept_keeps_the_view(owners: Any) -> None:
    # A kubelet's report of what no ranking reads: the pod's IP, a container's image id and
    # state, another condition; and the new resourceVersion.
    before = pod_view(_pod(owners=owners))
    after = _pod(owners=owners, version="101")
    after["status"]["podIP"] = "10.244.0.7"
    after["status"]["conditions"][0]["lastProbeTime"] = "2026-11-28T00:00:09Z"
    after["status"]["containerStatuses"][0].update(
        imageID="app@sha256:1", state={"running": {"startedAt": "2026-11-28T00:00:01Z"}}
    )

    assert reproject_pod_view(before, after) is before


def test_a_pod_taken_by_another_kind_loses_its_status_in_the_view() -> None:
    before = pod_view(_pod(owners=None))
    taken = _pod(owners=[REPLICA_SET_OWNER], version="101")

    assert {"metadata"} == set(reproject_pod_view(before, taken))


# -- the store and the controller over it


class Recorder:
    def event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        pass


class NoWrites:
    """Nothing in these tests may write: they only route pod events."""

    async def get_podset(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        raise AssertionError("no read expected")

    async def update_status(self, podset: Any, new_status: Any) -> Mapping[str, Any]:
        raise AssertionError("no status write expected")

    async def create_pod(self, namespace: str, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        raise AssertionError("no create expected")

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        raise AssertionError("no delete expected")

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        raise AssertionError("no patch expected")


def _podset() -> dict[str, Any]:
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "PodSet",
        "metadata": {"name": "web", "namespace": NAMESPACE, "uid": "podset-uid",
                     "resourceVersion": "10"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {}}},
    }  # fmt: skip


def _controller() -> tuple[PodSetController, Store[Any]]:
    podsets: Store[Any] = Store(lambda obj: obj, name="podsets")
    podsets.upsert(_podset())
    pods: Store[Any] = Store(pod_view, reproject=reproject_pod_view, name="pods")
    return PodSetController(podsets, pods, NoWrites(), NoWrites(), Recorder()), pods


def _route(controller: PodSetController, pods: Store[Any], pod: dict[str, Any]) -> None:
    """A pod event as the runtime routes it: into the store, its change to the controller."""
    change = pods.upsert(pod)
    if change is not None:
        controller.on_pod(change)


async def _drain(controller: PodSetController) -> None:
    """Take what the pod's creation queued, as a sync would."""
    assert controller.queue.waiting(f"{NAMESPACE}/web")
    while len(controller.queue):
        controller.queue.done(await controller.queue.get())


def test_the_store_keeps_the_view_and_the_controller_wakes_nobody() -> None:
    controller, pods = _controller()
    _route(controller, pods, _pod(owners=[REPLICA_SET_OWNER]))
    before = pods.get(NAMESPACE, "web-1")

    change = pods.upsert(_pod(owners=[REPLICA_SET_OWNER], ready=False, version="101"))

    assert change is not None
    assert ChangeKind.UPDATED is change.kind
    assert change.old is change.new is before
    controller.on_pod(change)
    assert 0 == len(controller.queue)
    entry = pods.entry(NAMESPACE, "web-1")
    assert entry is not None
    assert "101" == entry.resource_version


def test_a_released_pod_wakes_the_podset_that_may_adopt_it() -> None:
    # Upstream's updatePod: a pod whose controller reference went away is an orphan now, and
    # every ReplicaSet whose selector matches it is synced to consider adopting it.
    controller, pods = _controller()
    _route(controller, pods, _pod(owners=[REPLICA_SET_OWNER]))
    assert 0 == len(controller.queue)

    _route(controller, pods, _pod(owners=[], version="101"))

    assert controller.queue.waiting(f"{NAMESPACE}/web")


async def test_an_update_keeping_a_podsets_pods_view_wakes_nobody() -> None:
    # Upstream's updatePod queues the owner for every update; a sync reads only the view, and
    # the view is the same, so such a sync would find what the last one found.
    controller, pods = _controller()
    _route(controller, pods, _pod(owners=[PODSET_OWNER]))
    await _drain(controller)
    updated = _pod(owners=[PODSET_OWNER], version="101")
    updated["status"]["podIP"] = "10.244.0.7"

    change = pods.upsert(updated)

    assert change is not None
    assert change.old is change.new
    controller.on_pod(change)
    assert 0 == len(controller.queue)


async def test_a_ready_change_of_a_podsets_pod_wakes_its_podset() -> None:
    controller, pods = _controller()
    _route(controller, pods, _pod(owners=[PODSET_OWNER]))
    await _drain(controller)

    _route(controller, pods, _pod(owners=[PODSET_OWNER], ready=False, version="101"))

    assert controller.queue.waiting(f"{NAMESPACE}/web")
