"""PodSetController: a sync right after a status write reads that write, not the stale cache.

A scale-up re-queues its PodSet for every pod event while the sync that creates the pods runs,
so the next sync starts the moment the previous one wrote status, before the watch event of
that write reached the cache. Reading the cached copy there means judging the status from
before the write and writing with its old resourceVersion: a 409, and under the client's rate
limit one request more than upstream's ReplicaSet controller makes (measured with
bench/podset.py's setting: 2 status writes upstream for 0 -> 200, tally 2 + 2 conflicts before
this). The fakes below are plain data: a "server" that enforces resourceVersions as the API
server does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from tally.machinery.cache import Store
from tally.machinery.errors import Conflict
from tally.podset.controller import PodSetController, pod_view

pytestmark = pytest.mark.unit

NAMESPACE = "ns"


class Server:
    """The API server's copy of one PodSet: status writes are compare-and-swap."""

    def __init__(self, podset: dict[str, Any]) -> None:
        self.podset = copy.deepcopy(podset)
        self.writes: list[dict[str, Any]] = []
        self.conflicts = 0

    async def get_podset(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return copy.deepcopy(self.podset)

    async def update_status(
        self, podset: Mapping[str, Any], new_status: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        if podset["metadata"]["resourceVersion"] != self.podset["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise Conflict("the object has been modified")
        self.podset["status"] = dict(new_status)
        version = int(self.podset["metadata"]["resourceVersion"]) + 1
        self.podset["metadata"]["resourceVersion"] = str(version)
        self.writes.append(dict(new_status))
        return copy.deepcopy(self.podset)


class Pods:
    """Pod writes land in the controller's pod store at once (no event lag for pods)."""

    def __init__(self, store: Store[Any]) -> None:
        self.store = store
        self.created = 0

    async def create_pod(self, namespace: str, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        self.created += 1
        created = copy.deepcopy(dict(pod))
        created["metadata"] = {
            **created["metadata"],
            "name": f"web-{self.created}",
            "namespace": namespace,
            "uid": f"pod-uid-{self.created}",
            "resourceVersion": str(100 + self.created),
            "creationTimestamp": "2026-11-24T00:00:00Z",
        }
        self.store.upsert(created)
        return created

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        raise AssertionError("nothing is deleted in a scale-up")

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        raise AssertionError("nothing is adopted in a scale-up")


class Recorder:
    def event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        pass


def _podset(replicas: int) -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "PodSet",
        "metadata": {
            "name": "web",
            "namespace": NAMESPACE,
            "uid": "podset-uid",
            "resourceVersion": "10",
            "generation": 2,
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
            },
        },
        "status": {"replicas": 0, "observedGeneration": 1, "selector": "app=web"},
    }


async def test_the_sync_after_a_status_write_starts_from_that_write() -> None:
    podsets: Store[Any] = Store(lambda obj: obj, name="podsets")
    pods: Store[Any] = Store(pod_view, name="pods")
    server = Server(_podset(3))
    podsets.upsert(copy.deepcopy(server.podset))
    pod_control = Pods(pods)
    controller = PodSetController(podsets, pods, pod_control, server, Recorder())
    key = f"{NAMESPACE}/web"

    # The scale-up's sync: 3 pods, then status (from the pods it started with: none).
    await controller.sync_podset(key)
    assert 3 == pod_control.created
    assert [{"replicas": 0, "observedGeneration": 2}] == [
        {k: w[k] for k in ("replicas", "observedGeneration")} for w in server.writes
    ]

    # The next sync runs before the PodSet's watch event: the cache still holds version 10.
    controller.expectations.creation_observed(key)
    controller.expectations.creation_observed(key)
    controller.expectations.creation_observed(key)
    assert "10" == podsets.get(NAMESPACE, "web")["metadata"]["resourceVersion"]
    await controller.sync_podset(key)
    assert 0 == server.conflicts
    assert 3 == server.writes[-1]["replicas"]
    assert 2 == len(server.writes)

    # Once the cache catches up, the remembered write gives way to it.
    podsets.upsert(copy.deepcopy(server.podset))
    await controller.sync_podset(key)
    assert 0 == server.conflicts
    assert 2 == len(server.writes)  # nothing changed: no write
    assert 0 == len(controller.status_writes)
