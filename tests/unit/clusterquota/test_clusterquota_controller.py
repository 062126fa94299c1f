"""tally.clusterquota.controller: a new ClusterQuota's first status waits for admission's rules;
a measure failing on an existing object shows in the UsageComputed condition and one Event."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from tally.clusterquota.controller import (
    FIRST_STATUS_WAIT_S,
    ClusterQuotaController,
    InvalidClusterQuotaError,
    namespace_labels,
)
from tally.evaluators.base import GroupResource
from tally.evaluators.measured import MeasuredEvaluator
from tally.evaluators.registry import UsageError, new_registry
from tally.machinery.cache import Store
from tally.measures import compile_measure

pytestmark = pytest.mark.unit

PODS = GroupResource("", "pods")


class Writer:
    def __init__(self) -> None:
        self.writes: list[Mapping[str, Any]] = []

    async def update_status(self, cq: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        self.writes.append(status)


def _controller(
    ready: list[bool], now: list[float], status: dict[str, Any] | None = None
) -> tuple[ClusterQuotaController, Writer, dict[str, Any]]:
    cq: dict[str, Any] = {
        "kind": "ClusterQuota",
        "metadata": {"name": "team", "resourceVersion": "7"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"team": "a"}},
            "quota": {"hard": {"pods": "2"}},
        },
        **({"status": status} if status is not None else {}),
    }  # fmt: skip
    cluster_quotas: Store[Any] = Store(lambda obj: obj, name="clusterquotas")
    cluster_quotas.replace([cq], started_at=0)
    namespaces: Store[Any] = Store(namespace_labels, name="namespaces")
    namespaces.replace([{"metadata": {"name": "a1", "labels": {"team": "a"}}}], started_at=0)
    pods: Store[Any] = Store(lambda obj: obj, name="pods")
    pods.replace([], started_at=0)
    writer = Writer()
    controller = ClusterQuotaController(
        new_registry(clock=lambda: 1_700_000_000.0),
        cluster_quotas,
        namespaces,
        {PODS: pods},
        writer,
        admission_ready=lambda: ready[0],
        clock=lambda: now[0],
    )
    return controller, writer, cq


async def test_the_first_status_waits_until_admission_is_asked_about_what_it_limits() -> None:
    # Until tally's webhook rules cover pods, the API server does not ask tally about pod
    # creates: a status saying "in force" (hard: pods 2) would be false, so none is written.
    ready, now = [False], [100.0]
    controller, writer, cq = _controller(ready, now)
    await controller.sync_cluster_quota(cq)
    assert [] == writer.writes
    assert 0 == len(controller.queue)  # asked again shortly (a delayed add), not at once
    ready[0] = True
    await controller.sync_cluster_quota(cq)
    assert [{"pods": "2"}] == [w["total"]["hard"] for w in writer.writes]
    assert {} == controller._first_status_waits


async def test_a_first_status_is_written_anyway_after_the_longest_wait() -> None:
    ready, now = [False], [100.0]
    controller, writer, cq = _controller(ready, now)
    await controller.sync_cluster_quota(cq)
    now[0] += FIRST_STATUS_WAIT_S - 0.1
    await controller.sync_cluster_quota(cq)
    assert [] == writer.writes
    now[0] += 0.1
    await controller.sync_cluster_quota(cq)
    assert 1 == len(writer.writes)
    assert {} == controller._first_status_waits


async def test_later_statuses_do_not_wait() -> None:
    status = {"total": {"hard": {"pods": "2"}, "used": {"pods": "1"}}, "namespaces": []}
    controller, writer, cq = _controller([False], [100.0], status)
    await controller.sync_cluster_quota(cq)
    assert [{"pods": "0"}] == [w["total"]["used"] for w in writer.writes]


# -- a measure failing on an object that exists

DBS = GroupResource("example.com", "databases")
STORAGE = "example.com/storage-gb"


class Recorder:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, str, str]] = []

    async def warn(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.warnings.append((obj["metadata"]["name"], reason, message))


def _measuring(
    databases: list[dict[str, Any]],
) -> tuple[ClusterQuotaController, Writer, Recorder, Store[Any], dict[str, Any]]:
    cq: dict[str, Any] = {
        "kind": "ClusterQuota",
        "metadata": {"name": "team", "resourceVersion": "7", "generation": 2},
        "spec": {"namespaceSelector": {}, "quota": {"hard": {STORAGE: "100"}}},
        "status": {"total": {"hard": {STORAGE: "100"}, "used": {STORAGE: "10"}},
                   "namespaces": [{"namespace": "a1", "status": {"used": {STORAGE: "10"}}}]},
    }  # fmt: skip
    cluster_quotas: Store[Any] = Store(lambda obj: obj, name="clusterquotas")
    cluster_quotas.replace([cq], started_at=0)
    namespaces: Store[Any] = Store(namespace_labels, name="namespaces")
    namespaces.replace([{"metadata": {"name": "a1"}}], started_at=0)
    store: Store[Any] = Store(lambda obj: obj, name="databases")
    store.replace(databases, started_at=0)
    registry = new_registry(clock=lambda: 1_700_000_000.0)
    resource = {"group": DBS.group, "resource": DBS.resource}
    registry.register(MeasuredEvaluator(DBS, [compile_measure(
        {"name": STORAGE, "resource": resource, "expression": "object.spec.storageGB"}
    )]))  # fmt: skip
    writer, recorder = Writer(), Recorder()
    controller = ClusterQuotaController(
        registry, cluster_quotas, namespaces, {DBS: store}, writer,  # a dict: tests edit it
        recorder=recorder, wall_clock=lambda: 1_800_000_000.0,
    )  # fmt: skip
    return controller, writer, recorder, store, cq


def database(name: str, storage: int | None, version: str = "1") -> dict[str, Any]:
    spec = {"storageGB": storage} if storage is not None else {}
    metadata = {"name": name, "namespace": "a1", "uid": f"u-{name}", "resourceVersion": version}
    return {"metadata": metadata, "spec": spec}


async def test_a_measure_failing_on_an_object_turns_usage_computed_false_once() -> None:
    databases = [database("ok", 10), database("bad", None)]
    controller, writer, recorder, store, cq = _measuring(databases)
    with pytest.raises(UsageError):
        await controller.sync_cluster_quota(cq)
    (status,) = writer.writes
    # The failed name keeps its last value; the condition says why it does not move.
    assert {STORAGE: "10"} == status["total"]["used"]
    (condition,) = status["conditions"]
    message = f"measure '{STORAGE}': databases.example.com a1/bad: "
    assert ("UsageComputed", "False", "EvaluationFailed", "2027-01-15T08:00:00Z", 2) == (
        condition["type"], condition["status"], condition["reason"],
        condition["lastTransitionTime"], condition["observedGeneration"],
    )  # fmt: skip
    assert condition["message"].startswith(message), condition["message"]
    assert [("team", "EvaluationFailed", condition["message"])] == recorder.warnings

    # The next sync finds the same: nothing new is written, no second Event.
    cq = {**cq, "status": status}
    with pytest.raises(UsageError):
        await controller.sync_cluster_quota(cq)
    assert (1, 1) == (len(writer.writes), len(recorder.warnings))

    # The kind's cache is re-listed (its measures changed): nothing computed, nothing said.
    stores = controller.stores
    assert isinstance(stores, dict)
    del stores[DBS]
    await controller.sync_cluster_quota(cq)
    assert (1, 1) == (len(writer.writes), len(recorder.warnings))
    stores[DBS] = store

    # Fixed: computed again, True, no Event.
    store.upsert(database("bad", 5, "2"))  # its watch event
    await controller.sync_cluster_quota(cq)
    fixed = writer.writes[-1]
    assert {STORAGE: "15"} == fixed["total"]["used"]
    assert ("True", "Computed") == (fixed["conditions"][0]["status"],
                                    fixed["conditions"][0]["reason"])  # fmt: skip
    assert 1 == len(recorder.warnings)


async def test_a_lost_warning_event_does_not_fail_the_sync() -> None:
    controller, writer, recorder, _, cq = _measuring([database("bad", None)])

    async def refused(obj: Mapping[str, Any], reason: str, message: str) -> None:
        raise RuntimeError("events are forbidden")

    recorder.warn = refused  # type: ignore[method-assign]
    with pytest.raises(UsageError):  # the measure's failure, not the Event's
        await controller.sync_cluster_quota(cq)
    assert "False" == writer.writes[0]["conditions"][0]["status"]


async def test_a_spec_that_cannot_be_used_is_reported_in_the_condition_and_an_event() -> None:
    # It got in while the webhook was down: a selector operator that does not exist.
    controller, writer, recorder, _, cq = _measuring([])
    cq = {**cq, "spec": {**cq["spec"], "namespaceSelector": {"matchExpressions": [
        {"key": "team", "operator": "Near", "values": ["a"]}]}}}  # fmt: skip
    with pytest.raises(InvalidClusterQuotaError):
        await controller.sync_cluster_quota(cq)
    (status,) = writer.writes
    (condition,) = status["conditions"]
    assert ("False", "InvalidSpec") == (condition["status"], condition["reason"])
    assert "spec.namespaceSelector" in condition["message"], condition
    # What the status said of the usage stays as it was.
    assert cq["status"]["total"] == status["total"]
    assert [("team", "InvalidSpec", condition["message"])] == recorder.warnings
    # Again: nothing new.
    with pytest.raises(InvalidClusterQuotaError):
        await controller.sync_cluster_quota({**cq, "status": status})
    assert (1, 1) == (len(writer.writes), len(recorder.warnings))


class NamespacedRecorder:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, str, str, str]] = []

    async def warn(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        metadata = obj["metadata"]
        self.warnings.append((metadata["namespace"], metadata["name"], reason, message))


async def test_each_namespace_gets_an_event_naming_only_its_own_objects() -> None:
    bad_a = database("bad", None)
    bad_b = {**database("other", None), "metadata": {**database("other", None)["metadata"],
                                                    "namespace": "b1"}}  # fmt: skip
    controller, writer, recorder, _, cq = _measuring([bad_a, bad_b])
    controller.namespaces.upsert({"metadata": {"name": "b1", "resourceVersion": "1"}})
    namespaced = NamespacedRecorder()
    controller.namespace_recorder = namespaced
    with pytest.raises(UsageError):
        await controller.sync_cluster_quota(cq)
    # The ClusterQuota's own Event names both objects; each namespace's, its own only, about
    # the AppliedClusterQuota (named as the ClusterQuota) there.
    ((_, _, message),) = recorder.warnings
    assert "a1/bad" in message
    assert "b1/other" in message
    assert [ns_name for ns_name, *_ in namespaced.warnings] == ["a1", "b1"]
    for namespace, name, reason, text in namespaced.warnings:
        assert ("team", "EvaluationFailed") == (name, reason)
        assert text.startswith(f"cluster quota team: measure '{STORAGE}': databases.example.com ")
        own, other = ("a1/bad", "b1/other") if namespace == "a1" else ("b1/other", "a1/bad")
        assert own in text
        assert other not in text
    # The next sync finds the same: no second Event anywhere.
    with pytest.raises(UsageError):
        await controller.sync_cluster_quota({**cq, "status": writer.writes[-1]})
    assert (1, 2) == (len(recorder.warnings), len(namespaced.warnings))


# -- creations admitted by a selection that has just changed


async def _drain(controller: ClusterQuotaController) -> list[str]:
    taken = []
    while len(controller.queue):
        item = await controller.queue.get()
        controller.queue.done(item)
        taken.append(item)
    return taken


_VERSIONS = itertools.count(100)


def _relabel(controller: ClusterQuotaController, name: str, team: str) -> None:
    metadata = {"name": name, "labels": {"team": team}, "resourceVersion": str(next(_VERSIONS))}
    change = controller.namespaces.upsert({"metadata": metadata})
    assert change is not None
    controller.on_namespace(change)


async def _recalculated_within_the_window_only(
    controller: ClusterQuotaController, now: list[float], namespace: str
) -> None:
    """A charged creation in ``namespace`` recalculates the ClusterQuota now, and no longer
    past the charge confirmation timeout."""
    controller.replenish(PODS, namespace, unsynced_only=True)
    assert ["team"] == await _drain(controller)
    now[0] += controller.first_syncs.window + 0.1
    controller.replenish(PODS, namespace, unsynced_only=True)
    assert [] == await _drain(controller)


SYNCED = {"total": {"hard": {"pods": "2"}, "used": {"pods": "0"}}, "namespaces": []}


async def test_a_create_in_a_namespace_that_just_joined_recalculates_the_cluster_quota() -> None:
    # The namespace was relabelled into the ClusterQuota while its pod was being created: the
    # webhook judged the create by the old labels (charged to nobody here), and the sync the
    # relabelling started may have run before the pod reached the caches. Without this, the
    # ClusterQuota stays one pod short until the full resync, minutes later.
    now = [100.0]
    controller, _, _ = _controller([True], now, SYNCED)
    controller.namespaces.upsert({"metadata": {"name": "b1", "labels": {"team": "b"}}})
    _relabel(controller, "b1", "a")
    assert ["team"] == await _drain(controller)  # the relabelling's own sync
    controller.replenish(PODS, "b1", unsynced_only=True)
    assert ["team"] == await _drain(controller)
    # A namespace selected all along: its creations were charged by admission.
    controller.replenish(PODS, "a1", unsynced_only=True)
    assert [] == await _drain(controller)
    # Past the charge confirmation timeout a create in b1 was judged by the new labels.
    now[0] += controller.first_syncs.window + 0.1
    controller.replenish(PODS, "b1", unsynced_only=True)
    assert [] == await _drain(controller)


async def test_a_create_in_a_namespace_that_just_left_recalculates_the_cluster_quota() -> None:
    # Judged by the old labels, the create was charged to this ClusterQuota, which no longer
    # selects the namespace: recalculated, it counts the namespace out.
    now = [100.0]
    controller, _, _ = _controller([True], now, SYNCED)
    _relabel(controller, "a1", "b")
    assert ["team"] == await _drain(controller)
    await _recalculated_within_the_window_only(controller, now, "a1")


async def test_a_create_anywhere_just_after_a_selector_change_recalculates() -> None:
    now = [100.0]
    controller, _, cq = _controller([True], now, SYNCED)
    team_b = {"matchLabels": {"team": "b"}}
    changed = {**cq, "metadata": {**cq["metadata"], "resourceVersion": "8"},
               "spec": {**cq["spec"], "namespaceSelector": team_b}}  # fmt: skip
    change = controller.cluster_quotas.upsert(changed)
    assert change is not None
    controller.on_cluster_quota(change)
    assert ["team"] == await _drain(controller)
    controller.namespaces.upsert({"metadata": {"name": "b1", "labels": {"team": "b"}}})
    controller.replenish(PODS, "b1", unsynced_only=True)
    assert ["team"] == await _drain(controller)
    # A change of hard only changes no selection.
    now[0] += controller.first_syncs.window + 0.1
    hard_only = {**changed, "metadata": {**cq["metadata"], "resourceVersion": "9"},
                 "spec": {**changed["spec"], "quota": {"hard": {"pods": "3"}}}}  # fmt: skip
    change = controller.cluster_quotas.upsert(hard_only)
    assert change is not None
    controller.on_cluster_quota(change)
    assert ["team"] == await _drain(controller)
    controller.replenish(PODS, "b1", unsynced_only=True)
    assert [] == await _drain(controller)


async def test_a_create_just_after_hard_gained_a_name_recalculates() -> None:
    # Admission charges status.total.hard's names: a pod judged while only pods was limited was
    # not charged requests.cpu.
    now = [100.0]
    controller, writer, cq = _controller([True], now, SYNCED)
    grown = {**cq, "spec": {**cq["spec"], "quota": {"hard": {"pods": "2", "requests.cpu": "1"}}}}
    await controller.sync_cluster_quota(grown)
    assert {"pods": "2", "requests.cpu": "1"} == writer.writes[-1]["total"]["hard"]
    controller.newest = lambda obj: {**grown, "status": writer.writes[-1]}
    await _recalculated_within_the_window_only(controller, now, "a1")
