"""tally.resourcequota's discovery (documents, resolution), monitor (the named set, the
manager's passes) and reporting (what the passes tell).

Documents are shaped like what kube-apiserver serves at ``/api/v1``, ``/apis/<group>`` and
``/apis/<group>/<version>``. The manager tests replace the reflector with a stub (no watching
here; ``tests/e2e/test_count_custom_resources.py`` watches a real API server) and the
discovery GETs with a dict of documents.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

import builders
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import IGNORED_RESOURCES, new_registry
from tally.kube.reflector import StatusError
from tally.machinery.cache import Store
from tally.machinery.informers import Informer
from tally.resourcequota.discovery import (
    DiscoveredResource,
    Discovery,
    DiscoveryError,
    group_versions,
    parse_resource_list,
    problem_for_failure,
    quotable_problem,
    split_group_version,
)
from tally.resourcequota.monitor import DynamicKinds, named_resources
from tally.resourcequota.reporting import (
    REASON_FAILED_LIST,
    REASON_FORBIDDEN,
    REASON_UNKNOWN_RESOURCE,
    REASON_UNSUPPORTED,
    Problem,
)

pytestmark = pytest.mark.unit

Obj = Mapping[str, Any]
ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
WIDGETS = GroupResource("example.com", "widgets")
GADGETS = GroupResource("example.com", "gadgets")
DEPLOYMENTS = GroupResource("apps", "deployments")
CLAIMS = GroupResource("resource.k8s.io", "resourceclaims")


def resource_list(group_version: str, *resources: tuple[str, bool, list[str]]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "groupVersion": group_version,
        "resources": [
            {
                "name": name,
                "singularName": "",
                "namespaced": namespaced,
                "kind": "X",
                "verbs": verbs,
            }
            for name, namespaced, verbs in resources
        ],
    }


def api_group(name: str, versions: list[str], preferred: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": "APIGroup",
        "name": name,
        "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
    }
    if preferred:
        doc["preferredVersion"] = {"groupVersion": f"{name}/{preferred}", "version": preferred}
    return doc


DOCUMENTS: dict[str, Any] = {
    "/api/v1": resource_list(
        "v1",
        ("pods", True, ALL_VERBS),
        ("pods/status", True, ["get", "patch", "update"]),
        ("namespaces", False, ALL_VERBS),
        ("bindings", True, ["create"]),
        ("endpoints", True, ALL_VERBS),
    ),
    "/apis/apps": api_group("apps", ["v1"], "v1"),
    "/apis/apps/v1": resource_list("apps/v1", ("deployments", True, ALL_VERBS)),
    "/apis/example.com": api_group("example.com", ["v1", "v1beta1"], "v1"),
    "/apis/example.com/v1": resource_list(
        "example.com/v1", ("widgets", True, ALL_VERBS), ("clusterwidgets", False, ALL_VERBS)
    ),
    "/apis/example.com/v1beta1": resource_list(
        "example.com/v1beta1",
        ("widgets", True, ALL_VERBS),
        ("gadgets", True, ALL_VERBS),
        ("readonlies", True, ["get", "list", "watch"]),
    ),
    "/apis/resource.k8s.io": api_group("resource.k8s.io", ["v1", "v1beta2"], "v1"),
    "/apis/resource.k8s.io/v1": resource_list(
        "resource.k8s.io/v1",
        ("resourceclaims", True, ALL_VERBS),
        ("resourceclaims/status", True, ["get", "patch", "update"]),
    ),
    "/apis/secret.example.com": StatusError(403, "Forbidden"),
    "/apis/flaky.example.com": StatusError(503, "ServiceUnavailable"),
}


class FakeFetch:
    def __init__(self, documents: dict[str, Any]) -> None:
        self.documents = documents
        self.paths: list[str] = []

    async def __call__(self, path: str) -> Obj:
        self.paths.append(path)
        found = self.documents.get(path, StatusError(404, "NotFound"))
        if isinstance(found, Exception):
            raise found
        return dict(found)


# -- documents


@pytest.mark.parametrize(
    ("group_version", "expected"),
    [
        pytest.param("v1", ("", "v1"), id="core"),
        pytest.param("apps/v1", ("apps", "v1"), id="named group"),
        pytest.param("example.com/v1beta1", ("example.com", "v1beta1"), id="dotted group"),
    ],
)
def test_split_group_version(group_version: str, expected: tuple[str, str]) -> None:
    assert expected == split_group_version(group_version)


def test_parse_resource_list_leaves_out_subresources() -> None:
    parsed = parse_resource_list(DOCUMENTS["/api/v1"])
    assert {"pods", "namespaces", "bindings", "endpoints"} == {gr.resource for gr in parsed}
    assert (
        DiscoveredResource("", "v1", "pods", frozenset(ALL_VERBS), True)
        == parsed[GroupResource("", "pods")]
    )
    assert not parsed[GroupResource("", "namespaces")].namespaced


def test_parse_resource_list_of_a_named_group() -> None:
    parsed = parse_resource_list(DOCUMENTS["/apis/example.com/v1"])
    assert (
        DiscoveredResource("example.com", "v1", "widgets", frozenset(ALL_VERBS), True)
        == (parsed[WIDGETS])
    )


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(api_group("g", ["v1", "v2"], "v2"), ["v2", "v1"], id="preferred first"),
        pytest.param(api_group("g", ["v1", "v2"], None), ["v1", "v2"], id="no preferred"),
        pytest.param({"kind": "APIGroup"}, [], id="no versions"),
    ],
)
def test_group_versions(doc: Obj, expected: list[str]) -> None:
    assert expected == group_versions(doc)


@pytest.mark.parametrize(
    ("verbs", "namespaced", "reason"),
    [
        pytest.param(ALL_VERBS, True, None, id="quotable"),
        pytest.param(["create", "list", "watch", "delete"], True, None, id="exactly the verbs"),
        pytest.param(["get", "list", "watch"], True, REASON_UNSUPPORTED, id="read-only"),
        pytest.param(["create"], True, REASON_UNSUPPORTED, id="virtual (bindings)"),
        pytest.param(ALL_VERBS, False, REASON_UNSUPPORTED, id="cluster-scoped"),
    ],
)
def test_quotable_problem(verbs: list[str], namespaced: bool, reason: str | None) -> None:
    problem = quotable_problem(DiscoveredResource("g", "v1", "r", frozenset(verbs), namespaced))
    assert reason == (problem.reason if problem else None)


# -- the named set


# Quotas of namespace ns: spec.hard as given, status.hard (status_hard=) when given.
quota = functools.partial(builders.resource_quota, namespace="ns", uid="uid-{name}")


def test_named_resources_from_spec_and_status() -> None:
    q1 = quota("q1", {"count/widgets.example.com": "1", "pods": "3", "count/pods": "2"})
    q2 = quota(
        "q2",
        {"cpu": "1"},
        status_hard={"count/widgets.example.com": "1", "count/deployments.apps": "4"},
    )
    q3 = quota("q3", {"count/deployments.apps": "1"}, status_hard={"count/deployments.apps": "1"})
    found = named_resources(
        [q1, q2, q3],
        exclude={GroupResource("", "pods")},
        is_ignored=IGNORED_RESOURCES.__contains__,
    )
    assert {WIDGETS: [q1, q2], DEPLOYMENTS: [q2, q3]} == found


@pytest.mark.parametrize(
    ("hard", "expected"),
    [
        pytest.param({"count/events": "1"}, set(), id="ignored core events"),
        pytest.param({"count/events.events.k8s.io": "1"}, set(), id="ignored events.k8s.io"),
        pytest.param({"count/secrets": "1"}, set(), id="excluded (watched by Kopf)"),
        pytest.param({"count/": "1", "count": "1"}, set(), id="not count names"),
        pytest.param({"count/endpoints": "1"}, {GroupResource("", "endpoints")}, id="core group"),
        pytest.param({"requests.cpu": "1", "services.nodeports": "1"}, set(), id="no count/"),
    ],
)
def test_named_resources_filters(hard: dict[str, str], expected: set[GroupResource]) -> None:
    found = named_resources(
        [quota("q", hard)],
        exclude={GroupResource("", "secrets")},
        is_ignored=IGNORED_RESOURCES.__contains__,
    )
    assert expected == set(found)


def test_named_resources_by_a_registered_evaluators_names() -> None:
    # A quota naming only a device class's devices needs resource claims watched: the
    # registered claim evaluator measures the name. Watched kinds stay excluded (services).
    registry = new_registry()
    gold = quota("gold", {"gold.deviceclass.resource.k8s.io/devices": "1"})
    by_status = quota("s", {}, status_hard={"silver.deviceclass.resource.k8s.io/devices": "1"})
    core = quota("core", {"services.nodeports": "1", "requests.cpu": "1"})
    found = named_resources(
        [gold, by_status, core],
        exclude={GroupResource("", "services"), GroupResource("", "pods")},
        is_ignored=registry.is_ignored,
        evaluators=registry.list(),
    )
    assert {CLAIMS: [gold, by_status]} == found
    # Without the evaluators, only count/ names name a resource.
    assert {} == named_resources([gold], is_ignored=registry.is_ignored)


def test_named_resources_tolerates_malformed_quotas() -> None:
    malformed = [
        {"metadata": {"name": "a"}, "spec": None},
        {"metadata": {"name": "b"}, "spec": {"hard": ["count/widgets.example.com"]}},
        {"metadata": {"name": "c"}, "spec": "x", "status": {"hard": None}},
    ]
    assert {} == named_resources(malformed)


# -- resolution


@pytest.mark.parametrize(
    ("gr", "expected"),
    [
        pytest.param(
            WIDGETS,
            DiscoveredResource("example.com", "v1", "widgets", frozenset(ALL_VERBS), True),
            id="preferred version",
        ),
        pytest.param(
            GADGETS,
            DiscoveredResource("example.com", "v1beta1", "gadgets", frozenset(ALL_VERBS), True),
            id="only in a non-preferred version",
        ),
        pytest.param(
            GroupResource("", "endpoints"),
            DiscoveredResource("", "v1", "endpoints", frozenset(ALL_VERBS), True),
            id="core group",
        ),
        pytest.param(GroupResource("nope.example.com", "x"), REASON_UNKNOWN_RESOURCE,
                     id="group not served"),
        pytest.param(GroupResource("example.com", "things"), REASON_UNKNOWN_RESOURCE,
                     id="resource not served"),
        pytest.param(GroupResource("", "things"), REASON_UNKNOWN_RESOURCE, id="core missing"),
        pytest.param(GroupResource("secret.example.com", "x"), REASON_FORBIDDEN, id="forbidden"),
        pytest.param(GroupResource("example.com", "readonlies"), REASON_UNSUPPORTED,
                     id="read-only"),
        pytest.param(GroupResource("example.com", "clusterwidgets"), REASON_UNSUPPORTED,
                     id="cluster-scoped"),
        pytest.param(GroupResource("", "bindings"), REASON_UNSUPPORTED, id="create-only"),
    ],
)  # fmt: skip
async def test_resolve(gr: GroupResource, expected: DiscoveredResource | str) -> None:
    result = await Discovery(FakeFetch(DOCUMENTS)).resolve(gr)
    if isinstance(expected, str):
        assert isinstance(result, Problem)
        assert expected == result.reason
    else:
        assert expected == result


async def test_resolve_transient_failure_raises() -> None:
    with pytest.raises(DiscoveryError, match="503"):
        await Discovery(FakeFetch(DOCUMENTS)).resolve(GroupResource("flaky.example.com", "x"))


async def test_resolve_caches_documents_within_a_pass() -> None:
    fetch = FakeFetch(DOCUMENTS)
    discovery = Discovery(fetch)
    for gr in (WIDGETS, GADGETS, WIDGETS, GroupResource("nope.example.com", "x")) * 2:
        await discovery.resolve(gr)
    assert [
        "/apis/example.com",
        "/apis/example.com/v1",
        "/apis/example.com/v1beta1",
        "/apis/nope.example.com",
    ] == fetch.paths


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        pytest.param(403, REASON_FORBIDDEN, id="403"),
        pytest.param(404, REASON_UNKNOWN_RESOURCE, id="404 (CRD deleted)"),
        pytest.param(405, REASON_UNSUPPORTED, id="405"),
    ],
)
def test_problem_for_failure(code: int, reason: str) -> None:
    assert reason == problem_for_failure(WIDGETS, StatusError(code)).reason


# -- the manager, with stub reflectors


class StubReflector:
    """Stands in for :class:`tally.kube.reflector.Reflector`: lists nothing until told."""

    def __init__(self, source: Any, store: Store[Any], *, name: str, on_synced: Any,
                 on_failure: Any, on_list_trouble: Any) -> None:  # fmt: skip
        self.source = source
        self.informer: Informer[Any] = Informer(name, store, self._list)
        self.on_synced = on_synced
        self.on_failure = on_failure
        self.on_list_trouble = on_list_trouble
        self.running = False
        self.items: list[Obj] = []

    async def _list(self) -> AsyncIterator[list[Obj]]:
        yield self.items

    def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False

    async def sync(self) -> None:
        await self.informer.sync()
        self.on_synced()


class FakeRecorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def warn(self, quota_obj: Obj, reason: str, message: str) -> None:
        self.events.append((quota_obj["metadata"]["name"], reason))


class Harness:
    def __init__(self, documents: dict[str, Any], api: Any = None, watch_api: Any = None) -> None:
        self.quotas: list[Obj] = []
        self.stores: dict[GroupResource, Store[Any]] = {}
        self.registry = new_registry()
        self.replenished: list[tuple[GroupResource, str]] = []
        self.replenished_unsynced: list[tuple[GroupResource, str]] = []
        """Charged creations: only quotas without a status yet are to be synced."""
        self.synced: list[GroupResource] = []
        self.charged: set[GroupResource] = set()
        """Kinds quota admission charges on creation (the webhook's rules cover them)."""
        self.recorder = FakeRecorder()
        self.reflectors: list[StubReflector] = []
        self.fetch = FakeFetch(documents)

        def factory(*args: Any, **kwargs: Any) -> StubReflector:
            reflector = StubReflector(*args, **kwargs)
            self.reflectors.append(reflector)
            return reflector

        self.kinds = DynamicKinds(
            api,  # by default none: fetch, recorder and reflectors are stubs
            self.registry,
            lambda: self.quotas,
            self.stores,
            watched={GroupResource("", "pods")},
            replenish=self._replenish,
            creations_charged=lambda gr, _namespace: gr in self.charged,
            on_kind_synced=self.synced.append,
            recorder=self.recorder,
            fetch=self.fetch,
            reflector_factory=factory,  # type: ignore[arg-type]
            may_report=lambda: self.leading,
            watch_api=watch_api,
        )
        self.leading = True

    def _replenish(self, gr: GroupResource, namespace: str, *, unsynced_only: bool = False) -> None:
        (self.replenished_unsynced if unsynced_only else self.replenished).append((gr, namespace))

    def reflector(self, gr: GroupResource) -> StubReflector:
        found = self.kinds.reflector(gr)
        assert isinstance(found, StubReflector)
        return found


def widget(name: str, rv: str = "1") -> Obj:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}
    }


async def test_manager_registers_a_kind_only_after_its_first_list() -> None:
    h = Harness(DOCUMENTS)
    h.charged = {WIDGETS}
    h.quotas = [quota("q", {"count/widgets.example.com": "5", "count/pods": "1"})]
    await h.kinds.refresh()

    assert {WIDGETS} == h.kinds.active
    assert h.reflector(WIDGETS).running
    assert "example.com/v1/widgets" == str(h.reflector(WIDGETS).source.resource)
    # Not listed yet: the controller must not count from an empty store.
    assert {} == h.stores
    assert h.registry.get(WIDGETS) is None

    h.reflector(WIDGETS).items = [widget("w1"), widget("w2")]
    await h.reflector(WIDGETS).sync()
    assert [WIDGETS] == h.synced
    assert 2 == len(h.stores[WIDGETS])
    evaluator = h.registry.get(WIDGETS)
    assert evaluator is not None
    assert ["count/widgets.example.com"] == evaluator.matching_resources(
        ["count/widgets.example.com"]
    )

    # Admission charges widget creations: deletes replenish; adds and updates do not, but an
    # add still syncs quotas admission could not charge (no status yet).
    h.replenished_unsynced.clear()  # the first LIST's adds
    h.reflector(WIDGETS).informer.on_event("ADDED", widget("w3"))
    h.reflector(WIDGETS).informer.on_event("MODIFIED", widget("w3", "2"))
    h.reflector(WIDGETS).informer.on_event("DELETED", widget("w1"))
    assert [(WIDGETS, "ns")] == h.replenished
    assert [(WIDGETS, "ns")] == h.replenished_unsynced
    assert [] == h.recorder.events


async def test_reflectors_watch_through_the_client_without_a_request_limit() -> None:
    # A watch holds its connection for minutes: on the request pool (TALLY_API_CONNECTIONS)
    # a few counted kinds would leave no connection for status writes.
    requests, watches = object(), object()
    h = Harness(DOCUMENTS, api=requests, watch_api=watches)
    h.quotas = [quota("q", {"count/widgets.example.com": "5"})]
    await h.kinds.refresh()
    assert watches is h.reflector(WIDGETS).source._api
    # Without one of its own, the requests' client (a single client for everything).
    h = Harness(DOCUMENTS, api=requests)
    h.quotas = [quota("q", {"count/widgets.example.com": "5"})]
    await h.kinds.refresh()
    assert requests is h.reflector(WIDGETS).source._api


async def test_creations_admission_did_not_charge_are_counted() -> None:
    # Before tally's webhook has a rule for a newly counted resource (or with the webhook
    # off), nobody charges its creations: each must trigger a recalculation, the initial
    # LIST's objects included, or the quota would miss them until the next full resync.
    h = Harness(DOCUMENTS)
    h.quotas = [quota("q", {"count/widgets.example.com": "5"})]
    await h.kinds.refresh()
    h.reflector(WIDGETS).items = [widget("w1")]
    await h.reflector(WIDGETS).sync()
    assert [(WIDGETS, "ns")] == h.replenished
    h.reflector(WIDGETS).informer.on_event("ADDED", widget("w2"))
    assert [(WIDGETS, "ns")] * 2 == h.replenished
    h.reflector(WIDGETS).informer.on_event("MODIFIED", widget("w2", "2"))
    assert [(WIDGETS, "ns")] * 2 == h.replenished  # an update lowers nothing here
    # Once the rule is in force, creations are admission's again.
    h.charged = {WIDGETS}
    h.reflector(WIDGETS).informer.on_event("ADDED", widget("w3"))
    assert [(WIDGETS, "ns")] * 2 == h.replenished


async def test_manager_drops_kinds_no_quota_names() -> None:
    h = Harness(DOCUMENTS)
    h.quotas = [quota("q", {"count/widgets.example.com": "5"})]
    await h.kinds.refresh()
    await h.reflector(WIDGETS).sync()
    stub = h.reflector(WIDGETS)

    h.quotas = [quota("q", {"count/gadgets.example.com": "5"})]
    await h.kinds.refresh(full=False)
    assert {GADGETS} == h.kinds.active
    assert not stub.running
    assert WIDGETS not in h.stores
    assert h.registry.get(WIDGETS) is None


async def test_poke_pass_resolves_only_new_names() -> None:
    h = Harness(DOCUMENTS)
    h.quotas = [quota("q", {"count/widgets.example.com": "5"})]
    await h.kinds.refresh()
    fetched = len(h.fetch.paths)
    await h.kinds.refresh(full=False)
    assert fetched == len(h.fetch.paths), "same names: no discovery"
    await h.kinds.refresh(full=True)
    assert fetched < len(h.fetch.paths), "the periodic pass re-checks"


async def test_unknown_resources_are_reported_once_per_quota() -> None:
    h = Harness(DOCUMENTS)
    h.quotas = [
        quota("q1", {"count/things.nope.example.com": "1"}),
        quota("q2", {"count/things.nope.example.com": "1", "count/readonlies.example.com": "1"}),
    ]
    await h.kinds.refresh()
    await h.kinds.refresh()
    assert frozenset() == h.kinds.active
    assert [
        ("q2", REASON_UNSUPPORTED),
        ("q1", REASON_UNKNOWN_RESOURCE),
        ("q2", REASON_UNKNOWN_RESOURCE),
    ] == h.recorder.events
    assert {
        GroupResource("nope.example.com", "things"): REASON_UNKNOWN_RESOURCE,
        GroupResource("example.com", "readonlies"): REASON_UNSUPPORTED,
    } == {gr: problem.reason for gr, problem in h.kinds.problems.items()}

    # A new quota naming it is told too; the old ones are not told again.
    h.quotas.append(quota("q3", {"count/things.nope.example.com": "1"}))
    await h.kinds.refresh(full=False)
    assert ("q3", REASON_UNKNOWN_RESOURCE) == h.recorder.events[-1]
    assert 4 == len(h.recorder.events)


async def test_only_the_leader_posts_events_and_a_new_leader_posts_what_is_untold() -> None:
    # Leader election: every replica discovers and logs; only the leader posts Events. A
    # replica that becomes leader posts the problems nobody told yet, once each.
    h = Harness(DOCUMENTS)
    h.leading = False
    h.quotas = [quota("q1", {"count/things.nope.example.com": "1"})]
    await h.kinds.refresh()
    await h.kinds.refresh(full=False)
    assert {GroupResource("nope.example.com", "things")} == set(h.kinds.problems)
    assert [] == h.recorder.events

    h.leading = True
    await h.kinds.refresh(full=False)
    await h.kinds.refresh(full=False)
    assert [("q1", REASON_UNKNOWN_RESOURCE)] == h.recorder.events


async def test_a_crd_created_later_is_picked_up_by_the_periodic_pass() -> None:
    documents = {k: v for k, v in DOCUMENTS.items() if not k.startswith("/apis/example.com")}
    h = Harness(documents)
    h.quotas = [quota("q", {"count/widgets.example.com": "1"})]
    await h.kinds.refresh()
    assert WIDGETS in h.kinds.problems

    h.fetch.documents = DOCUMENTS
    await h.kinds.refresh(full=False)
    assert frozenset() == h.kinds.active, "a poke does not retry problems"
    await h.kinds.refresh(full=True)
    assert {WIDGETS} == h.kinds.active
    assert WIDGETS not in h.kinds.problems


async def test_a_reflector_that_gives_up_is_dropped_and_reported() -> None:
    h = Harness(DOCUMENTS)
    h.quotas = [quota("q", {"count/widgets.example.com": "1"})]
    await h.kinds.refresh()
    await h.reflector(WIDGETS).sync()
    first = h.reflector(WIDGETS)

    # The CRD was deleted: the watch gets 404.
    first.on_failure(StatusError(404, "NotFound"))
    h.fetch.documents = {k: v for k, v in DOCUMENTS.items() if k != "/apis/example.com/v1"}
    h.fetch.documents["/apis/example.com"] = api_group("example.com", ["v1"], "v1")
    await h.kinds.refresh(full=False)
    assert frozenset() == h.kinds.active
    assert not first.running
    assert WIDGETS not in h.stores
    assert h.registry.get(WIDGETS) is None
    assert [("q", REASON_UNKNOWN_RESOURCE)] == h.recorder.events

    await h.kinds.refresh(full=True)
    assert [("q", REASON_UNKNOWN_RESOURCE)] == h.recorder.events, "told once"


async def test_forbidden_watch_stays_reported_while_retried() -> None:
    h = Harness(DOCUMENTS)
    h.quotas = [quota("q", {"count/widgets.example.com": "1"})]
    await h.kinds.refresh()
    h.reflector(WIDGETS).on_failure(StatusError(403, "Forbidden"))
    await h.kinds.refresh(full=False)
    assert [("q", REASON_FORBIDDEN)] == h.recorder.events

    # Discovery still lists it, so the periodic pass tries again; no new event until it works.
    await h.kinds.refresh(full=True)
    assert {WIDGETS} == h.kinds.active
    assert WIDGETS in h.kinds.problems
    h.reflector(WIDGETS).on_failure(StatusError(403, "Forbidden"))
    await h.kinds.refresh(full=True)
    assert [("q", REASON_FORBIDDEN)] == h.recorder.events

    await h.reflector(WIDGETS).sync()
    assert WIDGETS not in h.kinds.problems
    assert WIDGETS in h.stores


async def test_a_kind_whose_lists_keep_failing_is_reported_and_stays_watched() -> None:
    # Its conversion webhook is down: every LIST of the preferred version fails with a 500.
    # Upstream's controller waits for every monitor to sync and so stalls every quota
    # (kubernetes#96066); here only the quotas naming the kind wait, and they say why.
    h = Harness(DOCUMENTS)
    h.quotas = [
        quota("broken", {"count/widgets.example.com": "1", "pods": "5"}),
        quota("fine", {"pods": "5"}),
    ]
    await h.kinds.refresh()
    trouble = StatusError(500, "StorageReadError", "conversion webhook for example.com/v2 failed")
    h.reflector(WIDGETS).on_list_trouble(trouble)
    await h.kinds.refresh(full=False)
    assert [("broken", REASON_FAILED_LIST)] == h.recorder.events
    assert REASON_FAILED_LIST == h.kinds.problems[WIDGETS].reason
    assert str(trouble) in h.kinds.problems[WIDGETS].message
    # Still watched (the reflector retries), told once, also across full passes.
    await h.kinds.refresh(full=True)
    await h.kinds.refresh(full=True)
    assert {WIDGETS} == h.kinds.active
    assert WIDGETS in h.kinds.problems
    assert [("broken", REASON_FAILED_LIST)] == h.recorder.events
    # The webhook is back: a LIST succeeds, the kind is counted, the problem is gone.
    h.reflector(WIDGETS).on_list_trouble(None)
    await h.reflector(WIDGETS).sync()
    await h.kinds.refresh(full=True)
    assert WIDGETS not in h.kinds.problems
    assert WIDGETS in h.stores


async def test_an_evaluator_registered_by_someone_else_is_used_and_kept() -> None:
    h = Harness(DOCUMENTS)
    from tally.evaluators.generic import ObjectCountEvaluator

    theirs = ObjectCountEvaluator(WIDGETS)
    h.registry.register(theirs)
    h.quotas = [quota("q", {"count/widgets.example.com": "1"})]
    await h.kinds.refresh()
    await h.reflector(WIDGETS).sync()
    assert h.registry.get(WIDGETS) is theirs
    await h.kinds.stop()
    assert h.registry.get(WIDGETS) is theirs
    assert {} == h.stores


async def test_a_device_class_name_watches_resource_claims_with_the_claim_evaluator() -> None:
    # A quota naming only gold.deviceclass.resource.k8s.io/devices: the claims are watched and
    # counted by the registered claim evaluator (kept when the kind is dropped), not by an
    # object count.
    h = Harness(DOCUMENTS)
    registered = h.registry.get(CLAIMS)
    assert registered is not None
    h.quotas = [quota("q", {"gold.deviceclass.resource.k8s.io/devices": "1"})]
    await h.kinds.refresh()
    assert {CLAIMS} == h.kinds.active
    assert "resource.k8s.io/v1/resourceclaims" == str(h.reflector(CLAIMS).source.resource)
    assert {} == h.stores  # not listed yet

    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-c", "resourceVersion": "1"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {
                            "deviceClassName": "gold",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                ]
            }
        },
    }
    h.reflector(CLAIMS).items = [claim]
    await h.reflector(CLAIMS).sync()
    assert [CLAIMS] == h.synced
    assert h.registry.get(CLAIMS) is registered
    assert 1 == len(h.stores[CLAIMS])
    assert [] == h.recorder.events

    h.quotas = []
    await h.kinds.refresh(full=False)
    assert frozenset() == h.kinds.active
    assert {} == h.stores
    assert h.registry.get(CLAIMS) is registered
