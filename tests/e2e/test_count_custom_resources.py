"""``count/<resource>.<group>`` on custom resources: tally's discovery and reflectors, in-process.

Drives :class:`tally.resourcequota.monitor.DynamicKinds` (and through it
:class:`tally.kube.reflector.Reflector`) directly against the real control plane in operator mode,
with a quota store filled by the test and no operator running: what is checked is the machinery's
view (the stores it hands the controller, the registry, what it reports), plus the Events it writes,
read back from the API. The quota-level test (``status.used`` of a quota counting a CRD) belongs
with the operator's e2e tests once the runtime wires this in.

Each test makes its own CRD in its own API group, so tests never share discovery state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest_asyncio
from kubernetes_asyncio import client

from tally.evaluators.base import GroupResource
from tally.evaluators.registry import Registry, new_registry
from tally.kube import rest
from tally.machinery.cache import Store
from tally.resourcequota.monitor import DynamicKinds
from tally.resourcequota.reporting import REASON_UNKNOWN_RESOURCE
from tally_e2e import eventually

# within 1 s for a deletion to be seen.
PROMPTLY_S = 1.0
CORE_KINDS = frozenset(
    GroupResource("", r)
    for r in ("pods", "services", "persistentvolumeclaims", "configmaps", "secrets",
              "replicationcontrollers", "resourcequotas")
)  # fmt: skip
PLURAL = "widgets"


def crd_body(group: str, plural: str = PLURAL, kind: str = "Widget") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind,
                      "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }  # fmt: skip


async def create_crd(api: client.ApiClient, group: str, plural: str = PLURAL) -> None:
    extensions = client.ApiextensionsV1Api(api)
    await extensions.create_custom_resource_definition(crd_body(group, plural))

    async def established() -> bool:
        crd = await rest.get_json(
            api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}"
        )
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    await eventually(established, until=bool, what=f"CRD {plural}.{group} Established")


async def delete_crd(api: client.ApiClient, group: str, plural: str = PLURAL) -> None:
    with contextlib.suppress(client.ApiException):
        await client.ApiextensionsV1Api(api).delete_custom_resource_definition(f"{plural}.{group}")


@pytest_asyncio.fixture
async def group(api: client.ApiClient) -> AsyncIterator[str]:
    """A fresh API group with a ``widgets`` CRD in it, deleted afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:8]}.example.com"
    await create_crd(api, name)
    yield name
    await delete_crd(api, name)


async def create_widget(api: client.ApiClient, group: str, namespace: str, name: str) -> None:
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        group, "v1", namespace, PLURAL,
        {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name}},
    )  # fmt: skip


async def delete_widget(api: client.ApiClient, group: str, namespace: str, name: str) -> None:
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        group, "v1", namespace, PLURAL, name
    )


async def create_quota(api: client.ApiClient, namespace: str, hard: dict[str, str]) -> Any:
    body = {"metadata": {"name": "counts"}, "spec": {"hard": hard}}
    await client.CoreV1Api(api).create_namespaced_resource_quota(namespace, body)
    return await rest.get_json(api, f"/api/v1/namespaces/{namespace}/resourcequotas/counts")


class Harness:
    """A DynamicKinds as the runtime would build it, with recorders for its callbacks."""

    def __init__(self, api: client.ApiClient, quotas: Iterable[Any]) -> None:
        self.quotas: Store[Any] = Store(lambda quota: quota, name="resourcequotas")
        self.quotas.replace(quotas, started_at=time.monotonic())
        self.registry: Registry = new_registry()
        self.stores: dict[GroupResource, Store[Any]] = {}
        self.replenished: list[tuple[GroupResource, str]] = []
        self.replenished_unsynced: list[tuple[GroupResource, str]] = []
        """Charged creations: only quotas without a status yet are to be synced."""
        self.synced: list[GroupResource] = []
        self.kinds = DynamicKinds(
            api,
            self.registry,
            self._all_quotas,
            self.stores,
            watched=CORE_KINDS,
            replenish=self._replenish,
            # As when tally's webhook rules cover these kinds: creations were charged, so
            # only deletions replenish (tests/unit/resourcequota/test_discovery.py covers the
            # other case).
            creations_charged=lambda _gr, _namespace: True,
            on_kind_synced=self.synced.append,
            period=1.0,
        )

    def _replenish(self, gr: GroupResource, namespace: str, *, unsynced_only: bool = False) -> None:
        (self.replenished_unsynced if unsynced_only else self.replenished).append((gr, namespace))

    def _all_quotas(self) -> list[Any]:
        return [q for ns in self.quotas.namespaces() for q in self.quotas.in_namespace(ns)]

    def present(self, gr: GroupResource, namespace: str, names: Iterable[str]) -> set[str] | None:
        """Which of ``names`` the store for ``gr`` holds; None while it has no store."""
        store = self.stores.get(gr)
        if store is None:
            return None
        return {name for name in names if store.entry(namespace, name) is not None}


async def warning_reasons(api: client.ApiClient, namespace: str, quota: str) -> set[str]:
    events = await rest.get_json(api, f"/api/v1/namespaces/{namespace}/events")
    return {
        event["reason"]
        for event in events.get("items") or []
        if event["involvedObject"].get("kind") == "ResourceQuota"
        and event["involvedObject"].get("name") == quota
        and event.get("type") == "Warning"
    }


async def test_custom_objects_are_listed_watched_and_ghosts_dropped(
    api: client.ApiClient, namespace: str, group: str
) -> None:
    gr = GroupResource(group, PLURAL)
    for name in ("w1", "w2"):
        await create_widget(api, group, namespace, name)
    quota = await create_quota(api, namespace, {f"count/{PLURAL}.{group}": "10", "pods": "5"})
    h = Harness(api, [quota])
    names = ("w1", "w2", "w3")

    async def present() -> set[str] | None:
        return h.present(gr, namespace, names)

    h.kinds.start()
    try:
        # Listed: the store (and the evaluator) appear once the first LIST is in.
        await eventually(present, until=lambda found: found == {"w1", "w2"}, what="listed")
        assert [gr] == h.synced
        evaluator = h.registry.get(gr)
        assert evaluator is not None
        assert [f"count/{PLURAL}.{group}"] == evaluator.matching_resources(
            list(quota["spec"]["hard"])
        )
        assert 2 == len(h.stores[gr])
        assert {} == h.kinds.problems

        # Watched: a deletion leaves the store within a second and replenishes the namespace.
        await delete_widget(api, group, namespace, "w1")
        await eventually(
            present, until=lambda found: found == {"w2"}, within=PROMPTLY_S, interval=0.02,
            what="w1 deleted from the store",
        )  # fmt: skip
        assert (gr, namespace) in h.replenished

        # No ghosts: cut the watch, delete and create meanwhile, start again.
        reflector = h.kinds.reflector(gr)
        assert reflector is not None
        await reflector.stop()
        await delete_widget(api, group, namespace, "w2")
        await create_widget(api, group, namespace, "w3")
        assert {"w2"} == h.present(gr, namespace, names), "nothing seen while cut"
        h.replenished.clear()
        reflector.start()
        await eventually(present, until=lambda found: found == {"w3"}, what="re-listed")
        assert [(gr, namespace)] == h.replenished, "the ghost's removal replenishes"
        assert 1 == len(h.stores[gr])
        assert h.kinds.running
    finally:
        await h.kinds.stop()
    assert {} == h.stores
    assert h.registry.get(gr) is None


async def test_deleted_crd_drops_the_kind_and_is_reported(
    api: client.ApiClient, namespace: str, group: str
) -> None:
    gr = GroupResource(group, PLURAL)
    await create_widget(api, group, namespace, "w1")
    quota = await create_quota(api, namespace, {f"count/{PLURAL}.{group}": "10"})
    h = Harness(api, [quota])
    h.kinds.start()
    try:
        await eventually(
            lambda: asyncio.sleep(0, h.present(gr, namespace, ["w1"])),
            until=lambda found: found == {"w1"},
            what="listed",
        )
        await delete_crd(api, group)

        async def state() -> tuple[bool, bool, str | None]:
            problem = h.kinds.problems.get(gr)
            return gr in h.stores, gr in h.kinds.active, problem.reason if problem else None

        await eventually(
            state, until=lambda s: s == (False, False, REASON_UNKNOWN_RESOURCE), within=20,
            what="kind dropped and reported",
        )  # fmt: skip
        assert h.registry.get(gr) is None
        await eventually(
            lambda: warning_reasons(api, namespace, "counts"),
            until=lambda reasons: REASON_UNKNOWN_RESOURCE in reasons,
            what="UnknownResource event on the quota",
        )
        assert h.kinds.running
    finally:
        await h.kinds.stop()


async def test_unknown_resource_is_reported_and_picked_up_once_it_exists(
    api: client.ApiClient, namespace: str
) -> None:
    group = f"e2e-{uuid.uuid4().hex[:8]}.example.com"
    missing_crd = GroupResource(group, PLURAL)
    missing_core = GroupResource("", "widgetz")
    quota = await create_quota(
        api, namespace, {f"count/{PLURAL}.{group}": "3", "count/widgetz": "1", "pods": "1"}
    )
    h = Harness(api, [quota])
    h.kinds.start()
    try:

        async def reasons() -> dict[GroupResource, str]:
            return {gr: problem.reason for gr, problem in h.kinds.problems.items()}

        await eventually(
            reasons,
            until=lambda found: found == {missing_crd: REASON_UNKNOWN_RESOURCE,
                                          missing_core: REASON_UNKNOWN_RESOURCE},
            what="both reported",
        )  # fmt: skip
        await eventually(
            lambda: warning_reasons(api, namespace, "counts"),
            until=lambda found: found == {REASON_UNKNOWN_RESOURCE},
            what="UnknownResource event on the quota",
        )
        assert {} == h.stores
        assert h.kinds.running, "an unknown resource is never fatal"

        # The CRD appears later: the periodic pass starts counting it.
        await create_crd(api, group)
        await create_widget(api, group, namespace, "late")
        await eventually(
            lambda: asyncio.sleep(0, h.present(missing_crd, namespace, ["late"])),
            until=lambda found: found == {"late"},
            what="the late CRD watched",
        )
        assert missing_crd not in h.kinds.problems
        assert missing_core in h.kinds.problems
    finally:
        await h.kinds.stop()
        await delete_crd(api, group)
