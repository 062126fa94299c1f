"""tally.app.runtime: what the composition root wires together, event by event.

A Runtime built from default settings and an API client that is never used (nothing here
starts it, so it makes no request): watch events go in through ``Runtime.on_event``, and the
tests look at what reached the quota controller's queues and the charge ledger.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

import builders
from tally.app import runtime as runtime_module
from tally.app.kinds import CLUSTER_QUOTAS, PODS, RESOURCE_QUOTAS
from tally.app.runtime import Runtime
from tally.app.settings import Settings
from tally.charges import ObjectRef
from tally.evaluators.base import GroupResource
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

KEY = ("team", "q")


# The quota team/q of 10 pods (its status.used given), and pods of team.
_quota = functools.partial(
    builders.resource_quota, "q", {"pods": "10"}, namespace="team", uid="u-q"
)
_pod = functools.partial(builders.pod, namespace="team", resource_version="7", image="i")


async def _queued(queue: Any) -> list[Any]:
    keys = []
    while len(queue):
        key = await asyncio.wait_for(queue.get(), 1)
        queue.done(key)
        keys.append(key)
    return keys


async def _runtime(**settings: Any) -> AsyncIterator[Runtime]:
    api = client.ApiClient()
    runtime = Runtime(Settings(**settings), api)
    runtime.on_event(RESOURCE_QUOTAS, "ADDED", _quota({"pods": "0"}, resource_version="1"))
    await _queued(runtime.quota.controller.queue)  # the quota's own first sync
    try:
        yield runtime
    finally:
        await api.close()


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    async for built in _runtime():
        yield built


async def test_a_pod_deletion_recalculates_the_namespaces_quotas(runtime: Runtime) -> None:
    runtime.on_event(PODS, "ADDED", _pod("p", uid="u-p"))
    await _queued(runtime.quota.controller.queue)
    runtime.on_event(PODS, "DELETED", _pod("p", uid="u-p"))
    assert [KEY] == await _queued(runtime.quota.controller.queue)


async def test_a_pod_event_confirms_its_charge(runtime: Runtime) -> None:
    ref = ObjectRef(PODS, "team", "p")
    runtime.quota.charges.record(ref, "u-p", "", {KEY: {"pods": Quantity.parse("1")}})
    runtime.on_event(PODS, "ADDED", _pod("p", uid="u-other"))  # another incarnation of the name
    assert 1 == len(runtime.quota.charges)
    runtime.on_event(PODS, "MODIFIED", _pod("p", uid="u-p"))
    assert 0 == len(runtime.quota.charges)


async def test_a_released_charge_recalculates_its_quota(runtime: Runtime) -> None:
    runtime.quota.charges.release_now({KEY: {"pods": Quantity.parse("1")}})
    assert [KEY] == await _queued(runtime.quota.controller.queue)


async def test_a_deleted_quota_leaves_no_charge_behind(runtime: Runtime) -> None:
    ref = ObjectRef(PODS, "team", "p")
    runtime.quota.charges.record(ref, "u-p", "", {KEY: {"pods": Quantity.parse("1")}})
    runtime.on_event(RESOURCE_QUOTAS, "DELETED", _quota({"pods": "1"}, resource_version="2"))
    assert (0, {}) == (len(runtime.quota.charges), runtime.quota.charges.held(KEY))


async def test_a_deleted_quota_leaves_no_metric_series_on_a_replica_that_does_not_lead(
    runtime: Runtime,
) -> None:
    # Every replica exports a quota's gauges from its status events, but only the leader's
    # controller syncs (and drops them for a deleted quota). This runtime never leads: were
    # the deletion not handled where the events are, a replica would keep four series per
    # quota ever made, forever.
    def series() -> list[float | None]:
        return [
            runtime.metrics.registry.get_sample_value(
                "kube_resourcequota",
                {"namespace": "team", "resourcequota": "q", "resource": "pods", "type": kind},
            )
            for kind in ("hard", "used")
        ]

    runtime.on_event(RESOURCE_QUOTAS, "MODIFIED", _quota({"pods": "1"}, resource_version="2"))
    assert [10.0, 1.0] == series()
    runtime.on_event(RESOURCE_QUOTAS, "DELETED", _quota({"pods": "1"}, resource_version="2"))
    assert [None, None] == series()
    assert KEY not in runtime.metrics._series


async def test_a_raise_nobody_here_wrote_is_held_only_with_leader_election() -> None:
    for leader_election, held in ((False, {}), (True, {"pods": Quantity.parse("3")})):
        async for runtime in _runtime(leader_election=leader_election):
            runtime.on_event(
                RESOURCE_QUOTAS, "MODIFIED", _quota({"pods": "3"}, resource_version="5")
            )
            assert held == runtime.quota.charges.held(KEY), leader_election


class _Registered:
    """A registrar whose rules have charged every kind's creations for long enough."""

    def charges_creations(self, gr: GroupResource) -> bool:
        return True


async def test_a_creation_in_an_exempt_namespace_recalculates_its_quotas() -> None:
    # Admission charged a creation elsewhere (the quota's status holds it): nothing to do. In
    # a namespace the webhook exempts nothing charged it: its quotas are recalculated.
    for exempt, queued in (("kube-system", []), ("kube-system,team", [KEY])):
        async for runtime in _runtime(exempt_namespaces=exempt):
            runtime.serving.registrar = _Registered()  # type: ignore[assignment]
            runtime.on_event(PODS, "ADDED", _pod("p", uid="u-p"))
            assert queued == await _queued(runtime.quota.controller.queue), exempt


async def test_namespaces_tally_does_not_manage_are_ignored() -> None:
    async for runtime in _runtime(namespaces="team"):
        runtime.on_event(PODS, "ADDED", _pod("p", uid="u-p", namespace="elsewhere"))
        assert 0 == len(runtime.informers[PODS].store)
        runtime.on_event(PODS, "ADDED", _pod("p", uid="u-p"))
        assert 1 == len(runtime.informers[PODS].store)


async def test_a_gap_kopf_relists_on_one_kind_relists_every_synced_kind(runtime: Runtime) -> None:
    # Kopf re-lists pods after a watch gap (events of type None); secrets, every one of which
    # was deleted during the gap, get no event at all: they must re-list all the same.
    secrets = runtime.informers[GroupResource("", "secrets")]
    pods = runtime.informers[PODS]
    for informer in (secrets, pods, runtime.pod_views):
        informer.store.replace([], started_at=0)
    unsynced = runtime.informers[GroupResource("", "services")]
    try:
        runtime.on_event(PODS, None, _pod("p", uid="u-p"))  # the watch's first listing
        assert secrets._relist_task is None
        # The gap: Kopf lists pods again (one pod listed twice, and the store holds one).
        runtime.on_event(PODS, None, _pod("p", uid="u-p"))
        assert secrets._relist_task is not None
        # The PodSet controller's view of pods is re-listed by the pods' one LIST.
        assert pods._relist_task is not None
        assert runtime.pod_views._relist_task is None
        assert unsynced._relist_task is None  # its first LIST is still to come
    finally:
        for informer in (secrets, pods, runtime.pod_views):
            await informer.stop()


async def test_the_heap_is_trimmed_unless_turned_off() -> None:
    async for runtime in _runtime():
        assert runtime.heap_trimmer is not None  # glibc: see tests/unit/app/test_heap.py
    async for runtime in _runtime(heap_trim_period=0):
        assert runtime.heap_trimmer is None


async def test_the_webhook_configuration_is_written_on_the_dedicated_client() -> None:
    # Never behind the controllers' pool: at a cold start their first status writes fill it.
    clients = [client.ApiClient() for _ in range(2)]
    api, dedicated = clients
    try:
        runtime = Runtime(Settings(), api, dedicated_api=dedicated)
        assert runtime.serving.registration_api is dedicated
    finally:
        for opened in clients:
            await opened.close()


async def test_the_requests_pools_are_renewed_and_the_watches_never() -> None:
    clients = [client.ApiClient() for _ in range(3)]
    api, dedicated, watches = clients
    try:
        runtime = Runtime(Settings(), api, dedicated_api=dedicated, watch_api=watches)
        renewal = runtime.pool_renewal
        assert renewal is not None
        before = [c.rest_client for c in clients]
        await renewal.renew_once()
        assert 2 == renewal.retired
        assert api.rest_client is not before[0]
        assert dedicated.rest_client is not before[1]
        # A reflector's watch lasts up to 10.5 minutes: its pool is never retired under it.
        assert watches.rest_client is before[2]
        await renewal.stop()
        off = Runtime(Settings(api_pool_renewal_period=0), api, dedicated_api=dedicated)
        assert off.pool_renewal is None
    finally:
        for opened in clients:
            await opened.close()


async def test_a_usage_write_does_not_send_discovery_through_every_quota(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admission writes usage many times a second: neither the dynamic count/ kinds nor the
    # webhook rules depend on it, only on the names in spec.hard and status.hard.
    pokes: list[str] = []
    monkeypatch.setattr(runtime.quota.dynamic, "poke", lambda: pokes.append("poke"))
    runtime.on_event(RESOURCE_QUOTAS, "MODIFIED", _quota({"pods": "1"}, resource_version="2"))
    runtime.on_event(RESOURCE_QUOTAS, "MODIFIED", _quota({"pods": "3"}, resource_version="3"))
    assert pokes == []
    named = _quota({"pods": "3"}, resource_version="4")
    named["spec"]["hard"]["count/widgets.example.com"] = "5"
    runtime.on_event(RESOURCE_QUOTAS, "MODIFIED", named)
    assert pokes == ["poke"]
    runtime.on_event(RESOURCE_QUOTAS, "DELETED", named)
    assert pokes == ["poke", "poke"]


async def test_a_cluster_quota_usage_write_does_not_poke_discovery(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    pokes: list[str] = []
    monkeypatch.setattr(runtime.quota.dynamic, "poke", lambda: pokes.append("poke"))

    def cq(used: str, version: str, hard: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "tally.dev/v1alpha1",
            "kind": "ClusterQuota",
            "metadata": {"name": "team", "uid": "u-cq", "resourceVersion": version},
            "spec": {"quota": {"hard": hard}, "selector": {"labels": {"matchLabels": {}}}},
            "status": {"total": {"hard": {"pods": "9"}, "used": {"pods": used}}},
        }

    runtime.on_event(CLUSTER_QUOTAS, "ADDED", cq("0", "1", {"pods": "9"}))
    assert pokes == ["poke"]
    runtime.on_event(CLUSTER_QUOTAS, "MODIFIED", cq("1", "2", {"pods": "9"}))
    runtime.on_event(CLUSTER_QUOTAS, "MODIFIED", cq("2", "3", {"pods": "9"}))
    assert pokes == ["poke"]
    runtime.on_event(CLUSTER_QUOTAS, "MODIFIED", cq("2", "4", {"pods": "9", "services": "1"}))
    assert pokes == ["poke", "poke"]
    # Any other change of the spec too: a ClusterQuota's measures decide which kinds its names
    # measure, and so which creations the webhook must see.
    moved = cq("2", "5", {"pods": "9", "services": "1"})
    moved["spec"]["selector"] = {"labels": {"matchLabels": {"team": "t1"}}}
    runtime.on_event(CLUSTER_QUOTAS, "MODIFIED", moved)
    assert pokes == ["poke", "poke", "poke"]


class _Leadership:
    """What the first pass asks of leading: whether this replica leads, or another does."""

    def __init__(self, *, leading: bool, led_elsewhere: bool = False) -> None:
        self.leading = leading
        self.led_elsewhere = led_elsewhere


async def test_the_leaders_first_pass_holds_kopfs_watches_until_every_quota_is_synced(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    left = [3, 2, 2, 0]
    monkeypatch.setattr(runtime, "leadership", _Leadership(leading=True))
    monkeypatch.setattr(runtime.quota, "unfinished_syncs", lambda: left[0])
    monkeypatch.setattr(runtime_module, "FIRST_PASS_POLL_S", 0.01)
    reasons: list[str | None] = []

    async def syncs() -> None:
        while len(left) > 1:
            reasons.append(runtime._start_up_pending())
            left.pop(0)
            await asyncio.sleep(0.02)

    with caplog.at_level("INFO", logger=runtime_module.__name__):
        await asyncio.gather(runtime._first_pass(), syncs())
    assert [0] == left
    assert (
        "the first recalculation of every quota is under way (3 left); Kopf's watches begin"
        " after it"
    ) == reasons[0]
    assert any("every quota recalculated" in r.getMessage() for r in caplog.records)


async def test_a_follower_lets_kopfs_watches_begin_at_once(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "leadership", _Leadership(leading=False, led_elsewhere=True))
    monkeypatch.setattr(runtime.quota, "unfinished_syncs", lambda: 10_000)
    await asyncio.wait_for(runtime._first_pass(), 0.5)


async def test_the_first_pass_holds_the_watches_back_for_a_bounded_time(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(runtime, "leadership", _Leadership(leading=True))
    monkeypatch.setattr(runtime.quota, "unfinished_syncs", lambda: 7)
    monkeypatch.setattr(runtime_module, "FIRST_PASS_LIMIT_S", 0.2)
    monkeypatch.setattr(runtime_module, "FIRST_PASS_POLL_S", 0.01)
    with caplog.at_level("WARNING", logger=runtime_module.__name__):
        await asyncio.wait_for(runtime._first_pass(), 1)
    assert [
        "7 quota(s) still to recalculate 0 s after the caches synced; Kopf's watches begin anyway"
    ] == [r.getMessage() for r in caplog.records]


async def test_unfinished_syncs_counts_what_the_quota_controllers_have_queued(
    runtime: Runtime,
) -> None:
    assert 0 == runtime.quota.unfinished_syncs()
    quota = builders.resource_quota(
        "q2", {"pods": "10"}, {"pods": "0"}, namespace="team", uid="u-q2", resource_version="1"
    )
    runtime.on_event(RESOURCE_QUOTAS, "ADDED", quota)
    assert 1 == runtime.quota.unfinished_syncs()
    key = await asyncio.wait_for(runtime.quota.controller.queue.get(), 1)
    assert 1 == runtime.quota.unfinished_syncs(), "a sync in flight is not finished"
    runtime.quota.controller.queue.done(key)
    assert 0 == runtime.quota.unfinished_syncs()


async def test_what_kopfs_first_listings_left_is_frozen_once_they_arrived(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    listings: list[tuple[str, int, int]] = [("pods", 5, 9)]
    relisting = ["pods"]
    frozen: list[str] = []
    monkeypatch.setattr(runtime.caches, "relisting", lambda: relisting)
    monkeypatch.setattr(runtime.caches, "listings_pending", lambda: listings)
    monkeypatch.setattr(runtime_module, "LISTINGS_FREEZE_POLL_S", 0.01)
    monkeypatch.setattr(runtime_module, "freeze_long_lived", lambda: frozen.append("x") or 7)
    with caplog.at_level("INFO", logger=runtime_module.__name__):
        runtime._listings_freeze = asyncio.create_task(runtime._freeze_after_listings())
        await asyncio.sleep(0.05)
        assert [] == frozen  # the re-list and the listing still under way
        assert "the start-up re-list of pods is scheduled or under way" == (
            runtime._start_up_pending()
        )
        relisting.clear()
        await asyncio.sleep(0.05)
        assert [] == frozen
        assert "Kopf's first listing has yet to deliver 5 of 9 pods" == runtime._start_up_pending()
        listings.clear()
        await asyncio.wait_for(runtime._listings_freeze, 1)
    assert ["x"] == frozen
    assert runtime._start_up_pending() is None
    assert any(
        "Kopf's first listings arrived: 7 objects kept out" in r.getMessage()
        for r in caplog.records
    )


async def test_readiness_waits_for_the_freeze_after_the_listings(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime.caches, "relisting", lambda: [])
    monkeypatch.setattr(runtime.caches, "listings_pending", lambda: [])
    release = asyncio.Event()

    async def freezing() -> None:
        await release.wait()

    runtime._listings_freeze = asyncio.create_task(freezing())
    assert "what Kopf's first listings left is to be frozen out of the collector's walks" == (
        runtime._start_up_pending()
    )
    release.set()
    await runtime._listings_freeze
    assert runtime._start_up_pending() is None
