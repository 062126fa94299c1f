"""tally.clusterquota.applied: what a namespace's AppliedClusterQuota shows (its own share, the
total, what remains; nothing of any other namespace) and how the controller keeps one per
selected namespace, with bounded writes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from tally.clusterquota.applied import (
    AppliedQuotaController,
    applied_object,
    applied_status,
    shows_the_same,
)
from tally.clusterquota.controller import namespace_labels
from tally.clusterquota.quota import selector
from tally.machinery.cache import Change, ChangeKind, Store

pytestmark = pytest.mark.unit

Obj = Mapping[str, Any]


def cq(status: dict[str, Any] | None = None, *, version: str = "7") -> dict[str, Any]:
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "ClusterQuota",
        "metadata": {"name": "shared", "uid": "cq-uid", "resourceVersion": version},
        "spec": {
            "namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "In", "values": ["a", "b"]}]},
            "quota": {"hard": {"pods": "10", "requests.cpu": "4"},
                      "scopes": ["NotBestEffort"]},
        },
        **({"status": status} if status is not None else {}),
    }  # fmt: skip


STATUS = {
    "total": {"hard": {"pods": "10", "requests.cpu": "4"},
              "used": {"pods": "7", "requests.cpu": "4500m"}},
    "namespaces": [
        {"namespace": "a-api", "status": {"used": {"pods": "2", "requests.cpu": "1"}}},
        {"namespace": "b-secret-project", "status": {"used": {"pods": "5",
                                                               "requests.cpu": "3500m"}}},
    ],
    "namespaceCount": 3,
    "mostUsed": "requests.cpu 4500m/4",
    "conditions": [{"type": "UsageComputed", "status": "False", "reason": "EvaluationFailed",
                    "message": "b-secret-project/widgets/w1: no such field",
                    "lastTransitionTime": "2026-11-27T10:00:00Z", "observedGeneration": 1}],
}  # fmt: skip


def test_the_namespace_sees_its_share_the_total_and_what_remains() -> None:
    status = applied_status(cq(STATUS), "a-api")
    assert status == {
        "total": {"hard": {"pods": "10", "requests.cpu": "4"},
                  "used": {"pods": "7", "requests.cpu": "4500m"}},
        "namespace": {"used": {"pods": "2", "requests.cpu": "1"},
                      "usedSummary": "pods: 2, requests.cpu: 1"},
        # 10 - 7 pods; 4 - 4.5 cpu is over: nothing remains (never negative).
        "remaining": {"pods": "3", "requests.cpu": "0"},
        "remainingSummary": "pods: 3, requests.cpu: 0",
        "mostUsed": "requests.cpu 4500m/4",
        "conditions": [{"type": "UsageComputed", "status": "False", "reason": "EvaluationFailed",
                        "lastTransitionTime": "2026-11-27T10:00:00Z"}],
    }  # fmt: skip


def test_a_namespace_using_nothing_sees_zeros_for_its_share() -> None:
    # a-web is selected but not listed: the ClusterQuota's status leaves out namespaces that
    # use nothing.
    assert {"pods": "0", "requests.cpu": "0"} == applied_status(cq(STATUS), "a-web")["namespace"][
        "used"
    ]


def test_nothing_of_another_namespace_or_the_selector_is_shown() -> None:
    shown = json.dumps(applied_object(cq(STATUS), "a-api"))
    # Another namespace's name (also quoted in the condition's message), the selector's label
    # values, the number of namespaces and the other namespace's share (5, 3500m).
    for secret in ("b-secret-project", "no such field", "matchExpressions", "namespaceCount",
                   '"5"', "3500m"):  # fmt: skip
        assert secret not in shown


def test_before_the_first_status_only_the_limits_show() -> None:
    assert {"total": {"hard": {"pods": "10", "requests.cpu": "4"}}} == applied_status(cq(), "a-api")


def test_the_object_is_named_as_the_cluster_quota_and_owned_by_it() -> None:
    obj = applied_object(cq(STATUS), "a-api")
    assert {
        "name": "shared",
        "namespace": "a-api",
        "labels": {"app.kubernetes.io/managed-by": "tally"},
        "ownerReferences": [{"apiVersion": "tally.dev/v1alpha1", "kind": "ClusterQuota",
                             "name": "shared", "uid": "cq-uid", "controller": True}],
    } == obj["metadata"]  # fmt: skip
    assert {"quota": {"hard": {"pods": "10", "requests.cpu": "4"},
                      "scopes": ["NotBestEffort"]}} == obj["spec"]  # fmt: skip
    assert ("tally.dev/v1alpha1", "AppliedClusterQuota") == (obj["apiVersion"], obj["kind"])


def test_an_object_as_stored_shows_the_same_as_the_one_written() -> None:
    desired = applied_object(cq(STATUS), "a-api")
    stored = json.loads(json.dumps(desired))
    stored["metadata"].update(resourceVersion="9", creationTimestamp="2026-11-27T10:00:00Z")
    stored["metadata"]["labels"]["extra"] = "kept"
    assert shows_the_same(stored, desired)
    stored["status"]["namespace"]["used"]["pods"] = "1"
    assert not shows_the_same(stored, desired)


# -- the controller


class Writer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def create(self, body: Obj) -> None:
        self.calls.append(("create", body["metadata"]["namespace"]))

    async def replace(self, existing: Obj, body: Obj) -> None:
        self.calls.append(("replace", body["metadata"]["namespace"]))

    async def delete(self, existing: Obj) -> None:
        self.calls.append(("delete", existing["metadata"]["namespace"]))


def namespace(name: str, team: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version, "labels": {"team": team}}}


def setup(
    now: list[float], applied: list[dict[str, Any]] | None = None
) -> tuple[AppliedQuotaController, Writer, Store[Any], Store[Any], Store[Any]]:
    cluster_quotas: Store[Any] = Store(lambda obj: obj, name="clusterquotas")
    cluster_quotas.replace([cq(STATUS)], started_at=0)
    namespaces: Store[Any] = Store(namespace_labels, name="namespaces")
    namespaces.replace(
        [namespace("a-api", "a"), namespace("a-web", "a"), namespace("c-other", "c")], started_at=0
    )
    stored: Store[Any] = Store(lambda obj: obj, name="appliedclusterquotas")
    stored.replace(applied or [], started_at=0)
    writer = Writer()

    def selects(obj: Obj, ns: str) -> bool:
        labels = namespaces.get("", ns)
        return labels is not None and selector(obj).matches(labels)

    controller = AppliedQuotaController(
        cluster_quotas, namespaces, stored, writer, selects, qps=0, clock=lambda: now[0]
    )
    return controller, writer, cluster_quotas, namespaces, stored


async def drain(controller: AppliedQuotaController) -> None:
    """Every key ready on either queue, synced (the workers' part, in order)."""
    while len(controller.queue) or len(controller.background):
        for queue in (controller.queue, controller.background):
            if len(queue):
                key = await queue.get()
                await controller._sync_key(key)
                queue.done(key)


def _resync(controller: Any) -> None:
    """A full resync round at once, as SpreadResync hands it out."""
    for key in controller.resync_keys():
        controller.queue.add(key)


async def test_one_object_per_selected_namespace_and_none_elsewhere() -> None:
    now = [100.0]
    stray = applied_object(cq(STATUS), "c-other")  # left from when c-other was selected
    controller, writer, *_ = setup(now, [stray])
    _resync(controller)
    await drain(controller)
    assert sorted(writer.calls) == [("create", "a-api"), ("create", "a-web"),
                                    ("delete", "c-other")]  # fmt: skip


async def test_an_object_that_shows_the_cluster_quota_already_is_not_written() -> None:
    now = [100.0]
    current = [applied_object(cq(STATUS), ns) for ns in ("a-api", "a-web")]
    controller, writer, *_ = setup(now, current)
    _resync(controller)
    await drain(controller)
    assert [] == writer.calls


async def test_charges_in_a_burst_are_one_write_per_object_per_interval() -> None:
    now = [100.0]
    current = [applied_object(cq(STATUS), ns) for ns in ("a-api", "a-web")]
    controller, writer, cluster_quotas, _, stored = setup(now, current)
    charged = json.loads(json.dumps(STATUS))
    charged["total"]["used"]["pods"] = "8"
    charged["namespaces"][0]["status"]["used"]["pods"] = "3"
    old = cq(STATUS)
    new = cq(charged, version="8")
    cluster_quotas.upsert(new)
    controller.on_cluster_quota(Change("", "shared", old, new, ChangeKind.UPDATED))
    await drain(controller)
    assert sorted(writer.calls) == [("replace", "a-api"), ("replace", "a-web")]
    # Written just now: the next charge waits for the interval (a delayed add, not at once).
    stored.upsert({**applied_object(new, "a-api"), "metadata": {
        **applied_object(new, "a-api")["metadata"], "resourceVersion": "2"}})  # fmt: skip
    controller.on_cluster_quota(Change("", "shared", new, new, ChangeKind.UPDATED))
    assert 0 == len(controller.queue)


async def test_a_namespace_relabelled_out_loses_its_object() -> None:
    now = [100.0]
    current = [applied_object(cq(STATUS), ns) for ns in ("a-api", "a-web")]
    controller, writer, _, namespaces, _ = setup(now, current)
    before = namespaces.get("", "a-web")
    namespaces.upsert(namespace("a-web", "z", version="2"))
    controller.on_namespace(
        Change("", "a-web", before, namespaces.get("", "a-web"), ChangeKind.UPDATED)
    )
    await drain(controller)
    assert [("delete", "a-web")] == writer.calls


async def test_a_deleted_cluster_quota_leaves_nothing() -> None:
    now = [100.0]
    current = [applied_object(cq(STATUS), ns) for ns in ("a-api", "a-web")]
    controller, writer, cluster_quotas, _, _ = setup(now, current)
    gone = cq(STATUS)
    cluster_quotas.delete(gone)
    controller.on_cluster_quota(Change("", "shared", gone, None, ChangeKind.DELETED))
    await drain(controller)
    assert sorted(writer.calls) == [("delete", "a-api"), ("delete", "a-web")]


async def test_an_object_not_owned_by_a_cluster_quota_is_never_deleted() -> None:
    now = [100.0]
    foreign = {"apiVersion": "tally.dev/v1alpha1", "kind": "AppliedClusterQuota",
               "metadata": {"name": "hand-made", "namespace": "c-other"}}  # fmt: skip
    controller, writer, *_ = setup(now, [foreign])
    controller.queue.add("c-other/hand-made")
    await drain(controller)
    assert [] == writer.calls


async def test_no_object_where_tally_does_not_watch() -> None:
    # TALLY_NAMESPACES: tally could not see an object it wrote outside those namespaces.
    now = [100.0]
    controller, writer, *_ = setup(now)
    controller.manages = lambda namespace: namespace == "a-api"
    _resync(controller)
    await drain(controller)
    assert [("create", "a-api")] == writer.calls


async def test_a_charge_elsewhere_is_a_background_refresh_and_one_here_comes_first() -> None:
    now = [100.0]
    current = [applied_object(cq(STATUS), ns) for ns in ("a-api", "a-web")]
    controller, _, cluster_quotas, _, _ = setup(now, current)
    # A charge in a-api: its own share moves; a-web (selected, using nothing) sees only the
    # total move.
    charged = json.loads(json.dumps(STATUS))
    charged["total"]["used"]["pods"] = "8"
    charged["namespaces"][0]["status"]["used"]["pods"] = "3"
    new = cq(charged, version="8")
    cluster_quotas.upsert(new)
    controller.on_cluster_quota(Change("", "shared", cq(STATUS), new, ChangeKind.UPDATED))
    assert (1, 1) == (len(controller.queue), len(controller.background))
    assert "a-api/shared" == await controller.queue.get()
    assert "a-web/shared" == await controller.background.get()


async def test_an_echo_of_a_write_waits_as_a_background_refresh_and_a_deletion_does_not() -> None:
    now = [100.0]
    obj = applied_object(cq(STATUS), "a-api")
    controller, *_ = setup(now, [obj])
    controller._written["a-api/shared"] = 100.0  # written just now
    controller.on_applied(Change("a-api", "shared", obj, obj, ChangeKind.UPDATED))
    # Not at once on either queue: a delayed add on the background one, within the interval.
    assert (0, 0) == (len(controller.queue), len(controller.background))
    controller.on_applied(Change("a-api", "shared", obj, None, ChangeKind.DELETED))
    assert (1, 0) == (len(controller.queue), len(controller.background))


def _charge_in_a_api(status: Mapping[str, Any], pods: int, version: str) -> dict[str, Any]:
    """``cq`` after a charge of one pod in a-api, its share now ``pods``."""
    charged = json.loads(json.dumps(status))
    charged["total"]["used"]["pods"] = str(int(charged["total"]["used"]["pods"]) + 1)
    charged["namespaces"][0]["status"]["used"]["pods"] = str(pods)
    return cq(charged, version=version)


class Added:
    """The keys a queue is handed (now or after a delay)."""

    def __init__(self, queue: Any) -> None:
        self.keys: list[str] = []
        add, add_after = queue.add, queue.add_after

        def counting_add(key: str) -> None:
            self.keys.append(key)
            add(key)

        def counting_add_after(key: str, delay: float) -> None:
            self.keys.append(key)
            add_after(key, delay)

        queue.add, queue.add_after = counting_add, counting_add_after


async def test_a_charge_queues_again_only_the_objects_synced_since_the_last_one() -> None:
    now = [100.0]
    current = [applied_object(cq(STATUS), ns) for ns in ("a-api", "a-web")]
    controller, writer, cluster_quotas, _, _ = setup(now, current)
    first = _charge_in_a_api(STATUS, 3, "8")
    cluster_quotas.upsert(first)
    controller.on_cluster_quota(Change("", "shared", cq(STATUS), first, ChangeKind.UPDATED))
    foreground, background = Added(controller.queue), Added(controller.background)
    # Both objects are still queued: a second charge queues a-api's own share, nothing else.
    second = _charge_in_a_api(first["status"], 4, "9")
    cluster_quotas.upsert(second)
    controller.on_cluster_quota(Change("", "shared", first, second, ChangeKind.UPDATED))
    assert (["a-api/shared"], []) == (foreground.keys, background.keys)
    await drain(controller)
    assert sorted(writer.calls) == [("replace", "a-api"), ("replace", "a-web")]
    # Both were synced since: a third charge queues a-web again, as a background refresh,
    # and it shows the new total.
    now[0] += 10
    third = _charge_in_a_api(second["status"], 5, "10")
    cluster_quotas.upsert(third)
    controller.on_cluster_quota(Change("", "shared", second, third, ChangeKind.UPDATED))
    assert (["a-api/shared", "a-api/shared"], ["a-web/shared"]) == (
        foreground.keys,
        background.keys,
    )


async def test_objects_for_many_namespaces_parse_each_share_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One ClusterQuota over 1 000 namespaces, each using one pod: writing the 1 000 objects
    # must parse each namespace's share about once, not every share for every object (what
    # made a start at 5 000 namespaces spend minutes of CPU here).
    from tally.clusterquota import quota as cluster
    from tally.quota import resources

    names = [f"a-{index:04d}" for index in range(1000)]
    status = {
        "total": {"hard": {"pods": "10k"}, "used": {"pods": "1k"}},
        "namespaces": [{"namespace": ns, "status": {"used": {"pods": "1"}}} for ns in names],
    }
    body = cq(status, version="8")
    body["spec"]["quota"]["hard"] = {"pods": "10k"}
    now = [100.0]
    controller, writer, cluster_quotas, namespaces, _ = setup(now)
    cluster_quotas.upsert(body)
    for ns in names:
        namespaces.upsert(namespace(ns, "a"))
    parsed = [0]
    real = resources.parse_resource_list

    def counting(raw: Any, path: str = "") -> Any:
        parsed[0] += 1
        return real(raw, path)

    monkeypatch.setattr(cluster, "parse_resource_list", counting)
    _resync(controller)
    await drain(controller)
    # (a-api and a-web, team a from the setup, are selected too.)
    assert sorted(writer.calls) == sorted(("create", ns) for ns in [*names, "a-api", "a-web"])
    # The share, and the total's hard and used, per object: 3 000 at most (was 1 000 000).
    assert parsed[0] <= 3 * (len(names) + 2), parsed[0]


def test_a_share_that_does_not_parse_is_shown_as_nothing_used() -> None:
    from tally.clusterquota.quota import namespace_index, share_in

    status = json.loads(json.dumps(STATUS))
    status["namespaces"][1]["status"]["used"]["pods"] = "lots"
    index = namespace_index(cq(status))
    assert {"a-api", "b-secret-project"} == set(index)
    assert {} == share_in(index, "b-secret-project")
    assert {} == share_in(index, "a-web")  # not listed: uses nothing
    assert {"pods": "2", "requests.cpu": "1"} == applied_status(cq(status), "a-api")["namespace"][
        "used"
    ]
