"""tally.clusterquota.controller: a new ClusterQuota's first status waits for admission's rules;
a measure failing on an existing object shows in the UsageComputed condition and one Event."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from tally.clusterquota import quota as cluster
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
from tally.machinery.errors import Conflict, encoded_size
from tally.measures import compile_measure
from tally.quota.quantity import Quantity

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
    controller.enqueue_naming(DBS)  # what the wiring says when the kind's cache is ready

    # Fixed: computed again, True, no Event.
    store.upsert(database("bad", 5, "2"))  # its watch event, and its replenishment
    controller.replenish(DBS, "a1")
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


# -- a sync calculates the namespaces whose usage may have changed, and takes the others'
# shares from the status as written


def pod(namespace: str, name: str) -> dict[str, Any]:
    metadata = {"name": name, "namespace": namespace, "uid": f"u-{namespace}-{name}",
                "resourceVersion": str(next(_VERSIONS))}  # fmt: skip
    return {"metadata": metadata, "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running"}}  # fmt: skip


class Shown:
    """What the API shows of the ClusterQuota: the last status written (``newest``)."""

    def __init__(self, controller: ClusterQuotaController, writer: Writer) -> None:
        self.controller, self.writer = controller, writer
        controller.newest = self

    def __call__(self, cq: Mapping[str, Any]) -> Mapping[str, Any]:
        return {**cq, "status": self.writer.writes[-1]} if self.writer.writes else cq

    async def sync(self) -> dict[str, str]:
        """One sync as the queue runs it; the namespaces' ``pods`` as written."""
        await self.controller._sync_key("team")
        status = self.writer.writes[-1]
        shares = {e["namespace"]: e["status"]["used"]["pods"] for e in status["namespaces"]}
        return {"total": status["total"]["used"]["pods"], **shares}


def _two_namespaces() -> tuple[ClusterQuotaController, Writer, Store[Any], Shown]:
    """Pods: one in a1, two in a2 (both selected), one in b1 (not)."""
    controller, writer, _ = _controller([True], [100.0])
    for name in ("a2", "b1"):
        labels = {"team": name[0]}
        controller.namespaces.upsert({"metadata": {"name": name, "labels": labels}})
    pods = controller.stores[PODS]
    for namespace, name in (("a1", "p1"), ("a2", "p1"), ("a2", "p2"), ("b1", "p1")):
        pods.upsert(pod(namespace, name))
    return controller, writer, pods, Shown(controller, writer)


async def test_a_sync_calculates_only_the_namespaces_named_and_the_resync_every_one() -> None:
    controller, _, pods, shown = _two_namespaces()
    assert {"total": "3", "a1": "1", "a2": "2"} == await shown.sync()
    # A pod created in a1, its replenishment; one of a2's deleted with no event seen (a status
    # edited by hand looks the same): only a1 is calculated, a2's share is the status's.
    pods.upsert(pod("a1", "p2"))
    controller.replenish(PODS, "a1")
    pods.delete(pod("a2", "p2"))
    assert {"total": "4", "a1": "2", "a2": "2"} == await shown.sync()
    # The full resync calculates every namespace.
    controller._resync_one("team")
    assert {"total": "3", "a1": "2", "a2": "1"} == await shown.sync()


async def test_a_share_the_status_lists_wrongly_is_calculated() -> None:
    controller, writer, _, shown = _two_namespaces()
    await shown.sync()
    status = writer.writes[-1]
    broken = {**status, "namespaces": [
        {"namespace": "a1", "status": {"used": {"pods": "1"}}},
        {"namespace": "a2", "status": {"used": {"pods": "two"}}},  # does not parse
        {"namespace": "b1", "status": {"used": {"pods": "1"}}},  # not selected
    ]}  # fmt: skip
    writer.writes.append(broken)
    controller.replenish(PODS, "a1")
    assert {"total": "3", "a1": "1", "a2": "2"} == await shown.sync()


async def test_a_share_admission_charged_since_is_read_as_now_written() -> None:
    controller, writer, _, shown = _two_namespaces()
    await shown.sync()
    controller.replenish(PODS, "a1")
    assert {"total": "3", "a1": "1", "a2": "2"} == await shown.sync()  # a2 taken as written
    # Admission charges a pod in a2 (its object not in the caches yet): the status says 3.
    charged = cluster.charged_status(
        shown(controller.cluster_quotas.get("", "team") or {}),
        {"a2": {"pods": Quantity.parse("1")}},
        {"pods": Quantity.parse("4")},
    )
    writer.writes.append(charged)
    controller.replenish(PODS, "a1")
    assert {"total": "4", "a1": "1", "a2": "3"} == await shown.sync()


async def test_a_sync_that_wrote_nothing_leaves_its_namespaces_to_the_next() -> None:
    controller, writer, pods, shown = _two_namespaces()
    await shown.sync()
    pods.upsert(pod("a1", "p2"))
    controller.replenish(PODS, "a1")

    async def conflict(cq: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        raise Conflict("the object has been modified")

    written = writer.update_status
    writer.update_status = conflict  # type: ignore[method-assign]
    with pytest.raises(Conflict):
        await shown.sync()
    writer.update_status = written  # type: ignore[method-assign]
    assert {"total": "4", "a1": "2", "a2": "2"} == await shown.sync()


async def test_namespaces_that_join_are_calculated_and_those_that_leave_dropped() -> None:
    controller, _, _, shown = _two_namespaces()
    await shown.sync()
    _relabel(controller, "b1", "a")
    assert {"total": "4", "a1": "1", "a2": "2", "b1": "1"} == await shown.sync()
    _relabel(controller, "a2", "b")
    assert {"total": "2", "a1": "1", "b1": "1"} == await shown.sync()


async def test_what_else_calculates_again() -> None:
    controller, _, pods, shown = _two_namespaces()
    await shown.sync()
    # A charge admission wrote for a pod in a2 that never came is released.
    pods.delete(pod("a2", "p2"))
    controller.recalculate("team", "a2")
    assert {"total": "2", "a1": "1", "a2": "1"} == await shown.sync()
    # The ledger hands back a sync it deferred while admission wrote: it keeps its namespaces.
    pods.upsert(pod("a1", "p2"))
    controller.replenish(PODS, "a1")
    controller.recalculate("team", "")
    assert {"total": "3", "a1": "2", "a2": "1"} == await shown.sync()
    # A change of spec: every namespace.
    pods.delete(pod("a1", "p2"))
    cq = controller.cluster_quotas.get("", "team")
    assert cq is not None
    raised = {**cq, "metadata": {**cq["metadata"], "resourceVersion": "8"},
              "spec": {**cq["spec"], "quota": {"hard": {"pods": "5"}}}}  # fmt: skip
    change = controller.cluster_quotas.upsert(raised)
    assert change is not None
    controller.on_cluster_quota(change)
    assert {"total": "2", "a1": "1", "a2": "1"} == await shown.sync()
    # A kind's cache is ready (listed again): every namespace.
    pods.upsert(pod("a2", "p2"))
    controller.enqueue_naming(PODS)
    assert {"total": "3", "a1": "1", "a2": "2"} == await shown.sync()


# -- a status near what the API server stores


class Sizes:
    def __init__(self) -> None:
        self.sizes: list[tuple[str, int]] = []

    def cluster_quota_synced(self, name: str, status: Mapping[str, Any]) -> None:
        pass

    def cluster_quota_status_size(self, name: str, size: int) -> None:
        self.sizes.append((name, size))

    def cluster_quota_deleted(self, name: str) -> None:
        pass


async def test_a_large_status_is_reported_at_each_sync_and_warned_of_once_until_it_shrinks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tally.clusterquota import controller as module

    controller, writer, cq = _controller([True], [100.0])
    controller.recorder, controller.observer = Recorder(), Sizes()
    recorder, sizes = controller.recorder, controller.observer
    monkeypatch.setattr(module, "STATUS_BYTES_WARNING", 10)
    await controller.sync_cluster_quota(cq)
    (status,) = writer.writes
    size = encoded_size(status)
    assert [("team", size)] == sizes.sizes
    ((name, reason, message),) = recorder.warnings
    assert ("team", "StatusLarge") == (name, reason)
    assert message.startswith(f"its status is {size} bytes, listing 0 namespaces;"), message

    # The same status again: reported, not warned of again.
    written = {**cq, "status": status}
    await controller.sync_cluster_quota(written)
    assert [("team", size)] * 2 == sizes.sizes
    assert 1 == len(recorder.warnings)
    # Below the threshold, then past it again: a new warning.
    monkeypatch.setattr(module, "STATUS_BYTES_WARNING", size + 1)
    await controller.sync_cluster_quota(written)
    monkeypatch.setattr(module, "STATUS_BYTES_WARNING", size)
    await controller.sync_cluster_quota(written)
    assert 2 == len(recorder.warnings)


def test_the_status_size_is_its_compact_json_in_utf8_bytes() -> None:
    # {"total":{"used":{"pods":"1"}}} is 31 characters; "é" in place of "1" is one byte more.
    assert 31 == encoded_size({"total": {"used": {"pods": "1"}}})
    assert 32 == encoded_size({"total": {"used": {"pods": "é"}}})


async def test_a_status_listing_many_namespaces_is_measured_at_most_once_a_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tally.clusterquota import controller as module

    now = [100.0]
    controller, writer, cq = _controller([True], now)
    controller.observer = Sizes()
    sizes = controller.observer
    monkeypatch.setattr(module, "SIZE_EVERY_SYNC_BELOW", 0)  # every status counts as long
    await controller.sync_cluster_quota(cq)
    written = {**cq, "status": writer.writes[0]}
    now[0] += module.SIZE_PERIOD_S - 0.1
    await controller.sync_cluster_quota(written)
    assert 1 == len(sizes.sizes)
    now[0] += 0.1
    await controller.sync_cluster_quota(written)
    assert 2 == len(sizes.sizes)
    # A short list is measured at every sync.
    monkeypatch.setattr(module, "SIZE_EVERY_SYNC_BELOW", 1)
    await controller.sync_cluster_quota(written)
    assert 3 == len(sizes.sizes)
