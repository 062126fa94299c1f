"""The ResourceQuota controller on plain data, ported from kubernetes
``pkg/controller/resourcequota/resource_quota_controller_test.go``.

Upstream feeds its controller from informer listers and a fake clientset and then inspects the
client's actions; here the controller reads :class:`~tally.machinery.cache.Store` objects filled
with ``replace([...], started_at=0)`` through each evaluator's ``project``, and writes through a
:class:`FakeStatusWriter` that records every ``(quota, status)`` it is asked to write. "No
update action" upstream is "no recorded write" here.

Adaptations, named at the cases that need them:

* Upstream's ``errorLister`` (``List`` fails with "error listing") becomes
  :class:`FailingStore`, a store whose listing raises ``ValueError("error listing")`` while the
  evaluator reads it. tally's stores are in memory and cannot fail to list, but an evaluator can
  fail on what it reads, and that takes the same path: usage of the other evaluators is kept,
  the status is written, and the error is raised after the write.
* Upstream compares ``Quantity.String()``; these tests compare numerically (a status written in
  another canonical form is still the same status), and separately check that every written
  value is a string.

Cases marked "upstream rule" are not rows of an upstream table: their expected values are
worked out from upstream's code (``syncResourceQuota``, ``addQuota``, ``replenishQuota``, the
``UpdateFunc`` of ``NewController``) or from spec section 3, which the comment quotes.
Not covered here: the worker loop and the resync timer (``start``/``stop``), and upstream's
``TestDiscoverySync`` (tally has no discovery of quotable resources).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

import builders
from tally.charges import ChargeLedger, FirstSyncs, ObjectRef
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import Registry, UsageError, new_registry
from tally.machinery.cache import Store
from tally.quota.quantity import Quantity, parse_quantity
from tally.resourcequota.controller import (
    Conflict,
    QuotaKey,
    ResourceQuotaController,
    raised_usage,
)

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.0
"""The fixed clock of every evaluator here."""

PODS = GroupResource("", "pods")
SERVICES = GroupResource("", "services")
CONFIGMAPS = GroupResource("", "configmaps")
DEPLOYMENTS = GroupResource("apps", "deployments")

Obj = dict[str, Any]
Status = Mapping[str, Mapping[str, str]]


# -- fakes


class FakeStatusWriter:
    """Records what ``update_status`` was asked to write; raises ``Conflict`` when told to."""

    def __init__(self, *, conflict: bool = False) -> None:
        self.conflict = conflict
        self.writes: list[tuple[Mapping[str, Any], Status]] = []

    async def update_status(
        self, quota_obj: Mapping[str, Any], status: Mapping[str, Mapping[str, str]]
    ) -> None:
        self.writes.append((quota_obj, status))
        if self.conflict:
            raise Conflict("the object has been modified")


class _ErrorListing:
    """An iterator that fails at its first item, like upstream's ``errorLister.List``."""

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        raise ValueError("error listing")


class FailingStore(Store[Any]):
    """Upstream's ``newErrorLister()``: reading the namespace fails with "error listing"."""

    def __init__(self) -> None:
        super().__init__(lambda obj: obj, name="failing")

    def in_namespace(self, namespace: str) -> Iterator[Any]:
        return _ErrorListing()


# -- builders (upstream's fixtures, as API JSON)


def resource_list(cpu: str = "", memory: str = "") -> dict[str, str]:
    """Upstream ``getResourceList``: only the names given a value."""
    result: dict[str, str] = {}
    if cpu:
        result["cpu"] = cpu
    if memory:
        result["memory"] = memory
    return result


# Upstream's test objects (builders.py): pods with a volume and one container "ctr" whose
# limits are empty, quotas at resourceVersion 7 (spec always there, status only when given).
pod = functools.partial(
    builders.pod,
    namespace="testing",
    uid="uid-{name}",
    volumes=[{"name": "vol"}],
    container_name="ctr",
    image="image",
    resources="both",
    with_kind=True,
)
resource_quota = functools.partial(
    builders.resource_quota,
    namespace="testing",
    uid="uid-{namespace}-{name}",
    resource_version="7",
    spec={},
    with_kind=True,
)
config_map = functools.partial(
    builders.config_map, namespace="default", uid="uid-{name}", with_kind=True
)


def new_test_pods() -> list[Obj]:
    """Upstream ``newTestPods``: two running pods of 100m/1Gi, and a failed one."""
    return [
        pod("pod-running", resource_list("100m", "1Gi"), phase="Running"),
        pod("pod-running-2", resource_list("100m", "1Gi"), phase="Running"),
        pod("pod-failed", resource_list("100m", "1Gi"), phase="Failed"),
    ]


def new_best_effort_test_pods() -> list[Obj]:
    """Upstream ``newBestEffortTestPods``: two running best-effort pods, a failed burstable."""
    return [
        pod("pod-running", resource_list(), phase="Running"),
        pod("pod-running-2", resource_list(), phase="Running"),
        pod("pod-failed", resource_list("100m", "1Gi"), phase="Failed"),
    ]


def new_test_pods_with_priority_classes() -> list[Obj]:
    """Upstream ``newTestPodsWithPriorityClasses``: high 500m/50Gi, low 100m/1Gi, a failed."""
    return [
        pod(
            "pod-running",
            resource_list("500m", "50Gi"),
            phase="Running",
            priority_class_name="high",
        ),
        pod(
            "pod-running-2",
            resource_list("100m", "1Gi"),
            phase="Running",
            priority_class_name="low",
        ),
        pod("pod-failed", resource_list("100m", "1Gi"), phase="Failed"),
    ]


def new_terminating_test_pods() -> list[Obj]:
    """Not upstream: a running pod with a deadline (terminating), one without, a failed one."""
    return [
        pod(
            "pod-terminating",
            resource_list("500m", "50Gi"),
            phase="Running",
            active_deadline_seconds=60,
        ),
        pod("pod-running", resource_list("100m", "1Gi"), phase="Running"),
        pod("pod-failed", resource_list("100m", "1Gi"), phase="Failed", active_deadline_seconds=60),
    ]


# The quota spec shared by most rows of upstream's TestSyncResourceQuota.
HARD_3_100GI_5 = {"cpu": "3", "memory": "100Gi", "pods": "5"}


def priority_class_selector(operator: str, *values: str) -> list[dict[str, Any]]:
    expression: dict[str, Any] = {"scopeName": "PriorityClass", "operator": operator}
    if values:
        expression["values"] = list(values)
    return [expression]


# -- the controller under test


def registry() -> Registry:
    return new_registry(clock=lambda: NOW)


def new_controller(
    quotas: Sequence[Obj] = (),
    items: Mapping[GroupResource, Sequence[Obj]] | None = None,
    *,
    failing: Sequence[GroupResource] = (),
    writer: FakeStatusWriter | None = None,
) -> tuple[ResourceQuotaController, FakeStatusWriter]:
    """A controller over stores holding ``items`` (projected by their evaluators).

    Like upstream's ``mockListerForResourceFunc``, only the kinds given have a store; a kind in
    ``failing`` gets a :class:`FailingStore` (upstream's ``errorGVR``).
    """
    reg = registry()
    quota_store: Store[Mapping[str, Any]] = Store(lambda obj: obj, name="resourcequotas")
    quota_store.replace(quotas, started_at=0)
    stores: dict[GroupResource, Store[Any]] = {}
    for group_resource, objects in (items or {}).items():
        evaluator = reg.get(group_resource)
        assert evaluator is not None, group_resource
        store: Store[Any] = Store(evaluator.project, name=str(group_resource))
        store.replace(objects, started_at=0)
        stores[group_resource] = store
    for group_resource in failing:
        stores[group_resource] = FailingStore()
    writer = writer or FakeStatusWriter()
    return ResourceQuotaController(reg, quota_store, stores, writer), writer


def assert_resource_list(expected: Mapping[str, str], actual: Mapping[str, str]) -> None:
    """Same names, numerically equal values (expected first), every value a string."""
    assert sorted(expected) == sorted(actual)
    for name, value in actual.items():
        assert isinstance(value, str), (name, value)
        assert parse_quantity(expected[name]) == parse_quantity(value), (name, value)


# -- syncResourceQuota


@pytest.mark.parametrize(
    ("quota_obj", "items", "failing", "expected_status", "expected_error"),
    [
        # TestSyncResourceQuota "non-matching-best-effort-scoped-quota"
        pytest.param(
            resource_quota("quota", HARD_3_100GI_5, scopes=["BestEffort"]),
            {PODS: new_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "0", "memory": "0", "pods": "0"}},
            None,
            id="non-matching-best-effort-scoped-quota",
        ),
        # TestSyncResourceQuota "matching-best-effort-scoped-quota"
        pytest.param(
            resource_quota("quota", HARD_3_100GI_5, scopes=["BestEffort"]),
            {PODS: new_best_effort_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "0", "memory": "0", "pods": "2"}},
            None,
            id="matching-best-effort-scoped-quota",
        ),
        # TestSyncResourceQuota "non-matching-priorityclass-scoped-quota-OpExists"
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("Exists")
            ),
            {PODS: new_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "0", "memory": "0", "pods": "0"}},
            None,
            id="non-matching-priorityclass-scoped-quota-OpExists",
        ),
        # TestSyncResourceQuota "matching-priorityclass-scoped-quota-OpExists"
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("Exists")
            ),
            {PODS: new_test_pods_with_priority_classes()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "600m", "memory": "51Gi", "pods": "2"}},
            None,
            id="matching-priorityclass-scoped-quota-OpExists",
        ),
        # TestSyncResourceQuota "matching-priorityclass-scoped-quota-OpIn"
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("In", "high", "low")
            ),
            {PODS: new_test_pods_with_priority_classes()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "600m", "memory": "51Gi", "pods": "2"}},
            None,
            id="matching-priorityclass-scoped-quota-OpIn",
        ),
        # TestSyncResourceQuota "matching-priorityclass-scoped-quota-OpIn-high"
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("In", "high")
            ),
            {PODS: new_test_pods_with_priority_classes()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "500m", "memory": "50Gi", "pods": "1"}},
            None,
            id="matching-priorityclass-scoped-quota-OpIn-high",
        ),
        # TestSyncResourceQuota "matching-priorityclass-scoped-quota-OpIn-low"
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("In", "low")
            ),
            {PODS: new_test_pods_with_priority_classes()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "100m", "memory": "1Gi", "pods": "1"}},
            None,
            id="matching-priorityclass-scoped-quota-OpIn-low",
        ),
        # TestSyncResourceQuota "matching-priorityclass-scoped-quota-OpNotIn-low" (its
        # selector is NotIn [high], so it matches the "low" pod)
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("NotIn", "high")
            ),
            {PODS: new_test_pods_with_priority_classes()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "100m", "memory": "1Gi", "pods": "1"}},
            None,
            id="matching-priorityclass-scoped-quota-OpNotIn-low",
        ),
        # TestSyncResourceQuota "non-matching-priorityclass-scoped-quota-OpIn"
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("In", "random")
            ),
            {PODS: new_test_pods_with_priority_classes()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "0", "memory": "0", "pods": "0"}},
            None,
            id="non-matching-priorityclass-scoped-quota-OpIn",
        ),
        # TestSyncResourceQuota "non-matching-priorityclass-scoped-quota-OpNotIn" (pods without
        # a priority class are NotIn [random])
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("NotIn", "random")
            ),
            {PODS: new_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "200m", "memory": "2Gi", "pods": "2"}},
            None,
            id="non-matching-priorityclass-scoped-quota-OpNotIn",
        ),
        # TestSyncResourceQuota "matching-priorityclass-scoped-quota-OpDoesNotExist"
        pytest.param(
            resource_quota(
                "quota", HARD_3_100GI_5, scope_selector=priority_class_selector("DoesNotExist")
            ),
            {PODS: new_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "200m", "memory": "2Gi", "pods": "2"}},
            None,
            id="matching-priorityclass-scoped-quota-OpDoesNotExist",
        ),
        # TestSyncResourceQuota "pods" (also the old single-case TestSyncResourceQuota)
        pytest.param(
            resource_quota("quota", HARD_3_100GI_5),
            {PODS: new_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "200m", "memory": "2Gi", "pods": "2"}},
            None,
            id="pods",
        ),
        # TestSyncResourceQuota "quota-spec-hard-updated" (was TestSyncResourceQuotaSpecChange)
        pytest.param(
            resource_quota(
                "rq",
                {"cpu": "4"},
                namespace="default",
                status={"hard": {"cpu": "3"}, "used": {"cpu": "0"}},
            ),
            {PODS: []},
            [],
            {"hard": {"cpu": "4"}, "used": {"cpu": "0"}},
            None,
            id="quota-spec-hard-updated",
        ),
        # TestSyncResourceQuotaSpecHardChange: a name dropped from spec.hard leaves both
        # status.hard and status.used.
        pytest.param(
            resource_quota(
                "rq",
                {"cpu": "4"},
                namespace="default",
                status={
                    "hard": {"cpu": "3", "memory": "1Gi"},
                    "used": {"cpu": "0", "memory": "0"},
                },
            ),
            {PODS: []},
            [],
            {"hard": {"cpu": "4"}, "used": {"cpu": "0"}},
            None,
            id="quota-spec-hard-name-removed",
        ),
        # TestSyncResourceQuota "quota-unchanged". Its expectedActionSet is empty, but
        # upstream's HasAll of an empty set is vacuous and the case then requires an update
        # action: status.hard (cpu 0) differs from spec.hard and status.used is missing, so
        # the status is written.
        pytest.param(
            resource_quota("rq", {"cpu": "4"}, namespace="default", status={"hard": {"cpu": "0"}}),
            {PODS: []},
            [],
            {"hard": {"cpu": "4"}, "used": {"cpu": "0"}},
            None,
            id="quota-unchanged",
        ),
        # TestSyncResourceQuota "quota-missing-status-with-calculation-error": the pods lister
        # fails; the status is still written (hard, and no used), then the error is returned.
        pytest.param(
            resource_quota("rq", {"pods": "1"}, namespace="default", status={}),
            {},
            [PODS],
            {"hard": {"pods": "1"}, "used": {}},
            "error listing",
            id="quota-missing-status-with-calculation-error",
        ),
        # TestSyncResourceQuota "quota-missing-status-with-partial-calculation-error": the
        # configmaps usage is written although the pods lister fails.
        pytest.param(
            resource_quota("rq", {"pods": "1", "configmaps": "1"}, namespace="default", status={}),
            {CONFIGMAPS: []},
            [PODS],
            {"hard": {"pods": "1", "configmaps": "1"}, "used": {"configmaps": "0"}},
            "error listing",
            id="quota-missing-status-with-partial-calculation-error",
        ),
        # Upstream rule (syncResourceQuota starts `used` from status.used and overwrites only
        # what CalculateUsage returned): a failing lister keeps the last observed value.
        pytest.param(
            resource_quota(
                "rq",
                {"pods": "1", "configmaps": "5"},
                namespace="default",
                status={
                    "hard": {"pods": "1", "configmaps": "5"},
                    "used": {"pods": "1", "configmaps": "3"},
                },
            ),
            {CONFIGMAPS: [config_map("cm-1")]},
            [PODS],
            {"hard": {"pods": "1", "configmaps": "5"}, "used": {"pods": "1", "configmaps": "1"}},
            "error listing",
            id="partial-calculation-error-keeps-old-used",
        ),
        # Upstream rule, spec section 3: "Hard names that no evaluator matches never get a used
        # value". upstream TestAddQuota's "foobars.example.com" is such a name.
        pytest.param(
            resource_quota("quota", {"cpu": "3", "foobars.example.com": "4"}),
            {PODS: new_test_pods()},
            [],
            {"hard": {"cpu": "3", "foobars.example.com": "4"}, "used": {"cpu": "200m"}},
            None,
            id="hard-name-no-evaluator-matches",
        ),
        # Upstream rule, spec section 3: "values the evaluators could not compute are kept".
        pytest.param(
            resource_quota(
                "quota",
                {"cpu": "3", "foobars.example.com": "4"},
                status={
                    "hard": {"cpu": "3", "foobars.example.com": "4"},
                    "used": {"cpu": "0", "foobars.example.com": "2"},
                },
            ),
            {PODS: new_test_pods()},
            [],
            {
                "hard": {"cpu": "3", "foobars.example.com": "4"},
                "used": {"cpu": "200m", "foobars.example.com": "2"},
            },
            None,
            id="unmeasured-name-keeps-old-used",
        ),
        # Not an upstream row: the Terminating scope (activeDeadlineSeconds >= 0, upstream
        # IsTerminating) counts the running pod with a deadline; the failed one never counts.
        pytest.param(
            resource_quota("quota", HARD_3_100GI_5, scopes=["Terminating"]),
            {PODS: new_terminating_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "500m", "memory": "50Gi", "pods": "1"}},
            None,
            id="matching-terminating-scoped-quota",
        ),
        # Not an upstream row: NotTerminating counts the pod without a deadline.
        pytest.param(
            resource_quota("quota", HARD_3_100GI_5, scopes=["NotTerminating"]),
            {PODS: new_terminating_test_pods()},
            [],
            {"hard": HARD_3_100GI_5, "used": {"cpu": "100m", "memory": "1Gi", "pods": "1"}},
            None,
            id="matching-not-terminating-scoped-quota",
        ),
    ],
)
async def test_sync_resource_quota(
    quota_obj: Obj,
    items: Mapping[GroupResource, Sequence[Obj]],
    failing: Sequence[GroupResource],
    expected_status: Status,
    expected_error: str | None,
) -> None:
    controller, writer = new_controller([quota_obj], items, failing=failing)
    if expected_error is None:
        await controller.sync_resource_quota(quota_obj)
    else:
        with pytest.raises(UsageError, match=expected_error):
            await controller.sync_resource_quota(quota_obj)

    assert 1 == len(writer.writes)
    written, status = writer.writes[0]
    # The write carries the object as read: its resourceVersion is the compare-and-swap guard.
    assert quota_obj["metadata"] == written["metadata"]
    assert ["hard", "used"] == sorted(status)
    assert_resource_list(expected_status["hard"], status["hard"])
    assert_resource_list(expected_status["used"], status["used"])


@pytest.mark.parametrize(
    ("quota_obj", "items"),
    [
        # TestSyncResourceQuotaNoChange: status matches spec and usage, so the only action is
        # the pod list.
        pytest.param(
            resource_quota(
                "rq",
                {"cpu": "4"},
                namespace="default",
                status={"hard": {"cpu": "4"}, "used": {"cpu": "0"}},
            ),
            {PODS: []},
            id="TestSyncResourceQuotaNoChange",
        ),
        # Spec section 3: "Numerically equal values in another format do not cause a write"
        # (Semantic.DeepEqual and quota.Equals compare quantities with Cmp). Usage as in
        # TestSyncResourceQuota "pods", written in other formats.
        pytest.param(
            resource_quota(
                "quota",
                HARD_3_100GI_5,
                status={
                    "hard": {"cpu": "3000m", "memory": "102400Mi", "pods": "5"},
                    "used": {"cpu": "0.2", "memory": "2048Mi", "pods": "2000m"},
                },
            ),
            {PODS: new_test_pods()},
            id="numerically-equal-other-format",
        ),
        # Spec section 3, same rule for spec.hard against status.hard.
        pytest.param(
            resource_quota(
                "rq",
                {"cpu": "4000m"},
                namespace="default",
                status={"hard": {"cpu": "4"}, "used": {"cpu": "0"}},
            ),
            {PODS: []},
            id="spec-hard-numerically-equal-other-format",
        ),
        # Upstream rule: a hard name no evaluator measures has no used value, and a status
        # without one for it is not dirty.
        pytest.param(
            resource_quota(
                "quota",
                {"cpu": "3", "foobars.example.com": "4"},
                status={
                    "hard": {"cpu": "3", "foobars.example.com": "4"},
                    "used": {"cpu": "200m"},
                },
            ),
            {PODS: new_test_pods()},
            id="unmeasured-name-without-used",
        ),
    ],
)
async def test_sync_resource_quota_no_write(
    quota_obj: Obj, items: Mapping[GroupResource, Sequence[Obj]]
) -> None:
    controller, writer = new_controller([quota_obj], items)
    await controller.sync_resource_quota(quota_obj)
    assert [] == writer.writes


async def test_sync_resource_quota_converges() -> None:
    # Upstream rule (the dirty check of syncResourceQuota): once the status of
    # TestSyncResourceQuota "pods" is written, syncing the updated quota writes nothing.
    quota_obj = resource_quota("quota", HARD_3_100GI_5)
    controller, writer = new_controller([quota_obj], {PODS: new_test_pods()})
    await controller.sync_resource_quota(quota_obj)
    assert 1 == len(writer.writes)
    updated = {**quota_obj, "status": writer.writes[0][1]}
    await controller.sync_resource_quota(updated)
    assert 1 == len(writer.writes)


async def test_sync_resource_quota_conflict_is_returned() -> None:
    # Upstream: an UpdateStatus error is appended to errs and returned, so the key is retried.
    quota_obj = resource_quota("quota", HARD_3_100GI_5)
    controller, writer = new_controller(
        [quota_obj], {PODS: new_test_pods()}, writer=FakeStatusWriter(conflict=True)
    )
    with pytest.raises(Conflict):
        await controller.sync_resource_quota(quota_obj)
    assert 1 == len(writer.writes)


# -- addQuota


@pytest.mark.parametrize(
    ("quota_obj", "expected_priority"),
    [
        # TestAddQuota "no status"
        pytest.param(
            resource_quota("rq", {"cpu": "4"}, namespace="default"),
            True,
            id="no status",
        ),
        # TestAddQuota "status, no usage"
        pytest.param(
            resource_quota("rq", {"cpu": "4"}, namespace="default", status={"hard": {"cpu": "4"}}),
            True,
            id="status, no usage",
        ),
        # TestAddQuota "status, no usage(to validate it works for extended resources)"
        pytest.param(
            resource_quota(
                "rq",
                {"requests.example/foobars.example.com": "4"},
                namespace="default",
                status={"hard": {"requests.example/foobars.example.com": "4"}},
            ),
            True,
            id="status, no usage (extended resources)",
        ),
        # TestAddQuota "status, mismatch"
        pytest.param(
            resource_quota(
                "rq",
                {"cpu": "4"},
                namespace="default",
                status={"hard": {"cpu": "6"}, "used": {"cpu": "0"}},
            ),
            True,
            id="status, mismatch",
        ),
        # TestAddQuota "status, missing usage, but don't care (no informer)"
        pytest.param(
            resource_quota(
                "rq",
                {"foobars.example.com": "4"},
                namespace="default",
                status={"hard": {"foobars.example.com": "4"}},
            ),
            False,
            id="status, missing usage, but don't care (no informer)",
        ),
        # TestAddQuota "ready"
        pytest.param(
            resource_quota(
                "rq",
                {"cpu": "4"},
                namespace="default",
                status={"hard": {"cpu": "4"}, "used": {"cpu": "0"}},
            ),
            False,
            id="ready",
        ),
        # Upstream rule (addQuota compares with Semantic.DeepEqual, which compares quantities
        # with Cmp): the same hard value in another format is no mismatch.
        pytest.param(
            resource_quota(
                "rq",
                {"cpu": "4"},
                namespace="default",
                status={"hard": {"cpu": "4000m"}, "used": {"cpu": "0"}},
            ),
            False,
            id="status, same hard in another format",
        ),
        # Upstream rule: Semantic.DeepEqual treats an empty map and a nil one as equal ("An
        # empty slice *is* equal to a nil slice for our purposes; same for maps"), so an empty
        # spec.hard and a missing status.hard are no mismatch, and nothing lacks usage.
        pytest.param(
            resource_quota("rq", {}, namespace="default"),
            False,
            id="empty spec.hard, no status",
        ),
    ],
)
async def test_add_quota(quota_obj: Obj, expected_priority: bool) -> None:
    controller, _ = new_controller()
    controller.add_quota(quota_obj)
    key: QuotaKey = ("default", "rq")
    if expected_priority:
        assert 1 == len(controller.missing_usage_queue)
        assert 0 == len(controller.queue)
        assert key == await controller.missing_usage_queue.get()
    else:
        assert 0 == len(controller.missing_usage_queue)
        assert 1 == len(controller.queue)
        assert key == await controller.queue.get()


async def test_a_quota_waiting_for_its_missing_usage_is_not_queued_again_by_replenishment() -> None:
    # Its missing-usage sync has not started, so it counts what the replenishment is about: a
    # second sync from the primary queue would compute the same status again.
    new = _tracking("new", None)
    controller, _ = new_controller([new])
    controller.add_quota(new)
    controller.replenish(PODS, "ns")
    assert (1, 0) == (len(controller.missing_usage_queue), len(controller.queue))
    # Once a worker has it, a change may come too late for that sync: queued again.
    key = await controller.missing_usage_queue.get()
    controller.replenish(PODS, "ns")
    assert [key] == [await controller.queue.get() for _ in range(len(controller.queue))]


# -- the update and delete handlers


def _with_hard(quota_obj: Obj, hard: Mapping[str, str]) -> Obj:
    return {**quota_obj, "spec": {**quota_obj["spec"], "hard": dict(hard)}}


READY = resource_quota(
    "rq",
    {"cpu": "4", "pods": "5"},
    namespace="default",
    status={"hard": {"cpu": "4", "pods": "5"}, "used": {"cpu": "0", "pods": "0"}},
)


@pytest.mark.parametrize(
    ("old", "new", "expected_priority", "expected_primary"),
    [
        # Upstream UpdateFunc: a changed spec.hard value goes through addQuota; the new spec
        # differs from the status, so the key is prioritised.
        pytest.param(
            READY, _with_hard(READY, {"cpu": "5", "pods": "5"}), 1, 0, id="spec.hard value changed"
        ),
        # Upstream UpdateFunc (quota.V1Equals): a name added to spec.hard.
        pytest.param(
            READY,
            _with_hard(READY, {"cpu": "4", "pods": "5", "memory": "1Gi"}),
            1,
            0,
            id="spec.hard name added",
        ),
        # Upstream UpdateFunc (quota.V1Equals): a name removed from spec.hard.
        pytest.param(READY, _with_hard(READY, {"cpu": "4"}), 1, 0, id="spec.hard name removed"),
        # Upstream UpdateFunc: V1Equals compares numerically, so a reformatted value is no
        # change.
        pytest.param(
            READY,
            _with_hard(READY, {"cpu": "4000m", "pods": "5"}),
            0,
            0,
            id="spec.hard numerically equal",
        ),
        # Upstream UpdateFunc: status changes are this controller's own writes; ignored.
        pytest.param(
            READY,
            {**READY, "status": {"hard": {"cpu": "4", "pods": "5"}, "used": {"cpu": "1"}}},
            0,
            0,
            id="status only",
        ),
    ],
)
async def test_update_quota(
    old: Obj, new: Obj, expected_priority: int, expected_primary: int
) -> None:
    controller, _ = new_controller()
    controller.update_quota(old, new)
    assert expected_priority == len(controller.missing_usage_queue)
    assert expected_primary == len(controller.queue)
    if expected_priority:
        assert ("default", "rq") == await controller.missing_usage_queue.get()


async def test_delete_quota_enqueues_on_the_primary_queue() -> None:
    # Upstream DeleteFunc: rq.enqueueResourceQuota, the primary queue.
    controller, _ = new_controller()
    controller.delete_quota(READY)
    assert 0 == len(controller.missing_usage_queue)
    assert 1 == len(controller.queue)
    assert ("default", "rq") == await controller.queue.get()


async def test_the_resync_puts_every_quota_on_the_primary_queue() -> None:
    # Upstream enqueueAll (the full resync): every quota, on the primary queue; SpreadResync
    # hands resync_keys() to _enqueue.
    quotas = [
        resource_quota("a", {"cpu": "1"}, namespace="ns-1"),
        resource_quota("b", {"cpu": "1"}, namespace="ns-1"),
        resource_quota("c", {"cpu": "1"}, namespace="ns-2"),
    ]
    controller, _ = new_controller(quotas)
    for key in controller.resync_keys():
        controller._enqueue(key)
    assert 0 == len(controller.missing_usage_queue)
    assert 3 == len(controller.queue)
    keys = {await controller.queue.get() for _ in range(3)}
    assert {("ns-1", "a"), ("ns-1", "b"), ("ns-2", "c")} == keys


# -- replenishQuota


def _tracking(name: str, status_hard: Mapping[str, str] | None, namespace: str = "ns") -> Obj:
    status = None if status_hard is None else {"hard": dict(status_hard)}
    return resource_quota(
        name, dict(status_hard or {"pods": "5"}), namespace=namespace, status=status
    )


@pytest.mark.parametrize(
    ("quotas", "group_resource", "namespace", "expected_keys"),
    [
        # Upstream replenishQuota: a quota whose status.hard names something the pods
        # evaluator measures is enqueued (on the primary queue).
        pytest.param([_tracking("q", {"pods": "5"})], PODS, "ns", [("ns", "q")], id="tracks pods"),
        pytest.param(
            [_tracking("q", {"requests.cpu": "1"})],
            PODS,
            "ns",
            [("ns", "q")],
            id="tracks a compute name of pods",
        ),
        # Upstream replenishQuota: only quotas tracking the kind; others are left alone.
        pytest.param(
            [_tracking("pods-quota", {"pods": "5"}), _tracking("svc-quota", {"services": "1"})],
            SERVICES,
            "ns",
            [("ns", "svc-quota")],
            id="only the quota tracking services",
        ),
        pytest.param(
            [_tracking("q", {"services": "1"})], PODS, "ns", [], id="tracks something else"
        ),
        # Upstream replenishQuota matches on status.hard and leaves a quota not yet synced to
        # its own first sync. tally matches such a quota on spec.hard: that first sync may be
        # in flight, having counted the namespace before this change (make run's PodSet pods
        # stayed uncounted that way); enqueued again, it runs once more after it finishes.
        pytest.param([_tracking("q", None)], PODS, "ns", [("ns", "q")], id="no status.hard"),
        pytest.param(
            [resource_quota("q", {"services": "1"}, namespace="ns")],
            PODS,
            "ns",
            [],
            id="no status.hard, spec tracks something else",
        ),
        # Upstream replenishQuota: "check if this namespace even has a quota..."
        pytest.param(
            [_tracking("q", {"pods": "5"}, namespace="other")],
            PODS,
            "ns",
            [],
            id="namespace without quotas",
        ),
        # Upstream replenishQuota: "check if the quota controller can evaluate this
        # groupResource, if not, ignore it altogether..."
        pytest.param(
            [_tracking("q", {"count/deployments.apps": "5"})],
            DEPLOYMENTS,
            "ns",
            [],
            id="kind without an evaluator",
        ),
    ],
)
async def test_replenish(
    quotas: Sequence[Obj],
    group_resource: GroupResource,
    namespace: str,
    expected_keys: list[QuotaKey],
) -> None:
    controller, writer = new_controller(quotas)
    controller.replenish(group_resource, namespace)
    assert 0 == len(controller.missing_usage_queue)
    assert len(expected_keys) == len(controller.queue)
    keys = [await controller.queue.get() for _ in expected_keys]
    assert sorted(expected_keys) == sorted(keys)
    assert [] == writer.writes


async def test_replenish_for_a_charged_creation_syncs_only_quotas_without_status() -> None:
    # Admission skips a quota whose status it cannot read yet, so a create admitted then is
    # charged to nobody: only such a quota needs a sync; the others were charged.
    controller, _ = new_controller([_tracking("synced", {"pods": "5"}), _tracking("new", None)])
    controller.replenish(PODS, "ns", unsynced_only=True)
    assert 1 == len(controller.queue)
    assert ("ns", "new") == await controller.queue.get()


async def test_a_charged_creation_also_syncs_a_quota_whose_first_status_was_just_written() -> None:
    # A create admitted while the quota had no status is charged to nobody; the quota's first
    # sync ran before the object reached the cache and wrote 0. The creation event, arriving
    # after that first write, must still recalculate the quota, within the confirmation
    # window; a quota synced before that window is charged by admission and left alone.
    new = _tracking("new", None)
    controller, writer = new_controller([new, _tracking("old", {"pods": "5"})])
    now = [100.0]
    controller.first_syncs = FirstSyncs(5.0, clock=lambda: now[0])
    await controller.sync_resource_quota(new)
    assert [("ns", "new")] == [(w[0]["metadata"]["namespace"], w[0]["metadata"]["name"])
                               for w in writer.writes]  # fmt: skip
    # From now on this process's newest copy of the quota carries that first status.
    controller.newest = lambda quota_obj: (
        {**quota_obj, "status": writer.writes[0][1]}
        if quota_obj["metadata"]["name"] == "new"
        else quota_obj
    )
    controller.replenish(PODS, "ns", unsynced_only=True)
    assert [("ns", "new")] == [await controller.queue.get() for _ in range(len(controller.queue))]
    controller.queue.done(("ns", "new"))
    now[0] = 105.0  # past the window: charged like any synced quota
    controller.replenish(PODS, "ns", unsynced_only=True)
    assert 0 == len(controller.queue)


async def test_a_charged_creation_syncs_a_quota_whose_hard_just_gained_a_name() -> None:
    # A service judged while status.hard named only pods was charged nothing; the sync that
    # wrote services into status.hard ran before the service reached the cache. Its creation
    # event must recalculate the quota within the window, or services stay one short.
    grown = resource_quota("grown", {"pods": "5", "services": "2"}, namespace="ns",
                           status={"hard": {"pods": "5"}, "used": {"pods": "0"}})  # fmt: skip
    controller, writer = new_controller([grown])
    now = [100.0]
    controller.first_syncs = FirstSyncs(5.0, clock=lambda: now[0])
    await controller.sync_resource_quota(grown)
    assert {"pods": "5", "services": "2"} == writer.writes[0][1]["hard"]
    controller.newest = lambda quota_obj: {**quota_obj, "status": writer.writes[0][1]}
    controller.replenish(SERVICES, "ns", unsynced_only=True)
    assert [("ns", "grown")] == [await controller.queue.get() for _ in range(len(controller.queue))]
    controller.queue.done(("ns", "grown"))
    now[0] = 105.0
    controller.replenish(SERVICES, "ns", unsynced_only=True)
    assert 0 == len(controller.queue)


async def test_a_status_write_with_the_same_hard_names_marks_nothing() -> None:
    same = resource_quota("same", {"pods": "9"}, namespace="ns",
                          status={"hard": {"pods": "5"}, "used": {"pods": "0"}})  # fmt: skip
    controller, writer = new_controller([same])
    await controller.sync_resource_quota(same)
    assert {"pods": "9"} == writer.writes[0][1]["hard"]
    controller.newest = lambda quota_obj: {**quota_obj, "status": writer.writes[0][1]}
    controller.replenish(PODS, "ns", unsynced_only=True)
    assert 0 == len(controller.queue)


def test_first_syncs_forget_after_their_window() -> None:
    now = [0.0]
    syncs: FirstSyncs[str] = FirstSyncs(5.0, clock=lambda: now[0])
    syncs.wrote_first("a")
    now[0] = 3.0
    syncs.wrote_first("b")
    assert (True, True, 2) == (syncs.recent("a"), syncs.recent("b"), len(syncs))
    now[0] = 5.0
    assert (False, True, 1) == (syncs.recent("a"), syncs.recent("b"), len(syncs))
    now[0] = 8.0
    assert 0 == len(syncs)


async def test_replenish_reads_the_newest_copy_of_a_quota() -> None:
    # The cache still holds the quota from before this process's first status write (no
    # status.hard); the write that is newer says what the quota tracks.
    cached = _tracking("q", None)
    written = {**cached, "status": {"hard": {"services": "1"}, "used": {"services": "0"}}}
    controller, _ = new_controller([cached])
    controller.newest = lambda quota_obj: written
    controller.replenish(PODS, "ns")
    assert 0 == len(controller.queue)  # by its newest status it tracks services only
    controller.replenish(SERVICES, "ns")
    assert 1 == len(controller.queue)


# -- tally's pending charges (not upstream: closes upstream's charge-erasing race)


def _two_configmaps_charged_one_more(
    status_configmaps: str, held: str | None
) -> tuple[Obj, ResourceQuotaController, FakeStatusWriter, list[float]]:
    """A quota whose status says ``status_configmaps``, two configmaps cached, and (unless
    ``held`` is None) a pending charge of ``held`` configmaps for a third one; the clock at 100
    and the charge's deadline at 105."""
    quota_obj = resource_quota(
        "quota",
        {"configmaps": "10"},
        status={"hard": {"configmaps": "10"}, "used": {"configmaps": status_configmaps}},
    )
    controller, writer = new_controller(
        [quota_obj],
        {
            GroupResource("", "configmaps"): [
                config_map("a", namespace="testing"),
                config_map("b", namespace="testing"),
            ]
        },
    )
    now = [100.0]
    ledger = ChargeLedger(5.0, clock=lambda: now[0])
    controller.charges = ledger
    if held is not None:
        ledger.record(
            ObjectRef(GroupResource("", "configmaps"), "testing", "c"),
            uid="u-c",
            replaces="",
            amounts={("testing", "quota"): {"configmaps": Quantity.parse(held)}},
        )
    return quota_obj, controller, writer, now


@pytest.mark.parametrize(
    ("held", "status_configmaps", "written_configmaps"),
    [
        # Status says 3 (the last one charged by admission a moment ago), the cache holds 2.
        pytest.param("1", "3", None, id="a-pending-charge-keeps-what-admission-wrote"),
        pytest.param(None, "3", "2", id="released-charge-lowers-to-the-caches"),
        pytest.param("1", "4", "3", id="lowered-no-further-than-caches-plus-charges"),
        pytest.param("2", "3", None, id="never-above-the-status"),
        pytest.param("1", "1", "2", id="raising-writes"),
    ],
)
async def test_pending_charges_hold_usage(
    held: str | None, status_configmaps: str, written_configmaps: str | None
) -> None:
    quota_obj, controller, writer, _ = _two_configmaps_charged_one_more(status_configmaps, held)
    await controller.sync_resource_quota(quota_obj)
    if written_configmaps is None:
        assert [] == writer.writes
    else:
        assert [written_configmaps] == [w[1]["used"]["configmaps"] for w in writer.writes]


async def test_a_charge_past_its_deadline_holds_until_it_is_released() -> None:
    quota_obj, controller, writer, now = _two_configmaps_charged_one_more("3", "1")
    now[0] = 105.0  # past its deadline, not released yet: its object may still be confirmed
    await controller.sync_resource_quota(quota_obj)
    assert [] == writer.writes  # 2 cached + 1 held = the status: nothing to write
    assert controller.charges is not None
    controller.charges.expire()  # released (no verify function: unasked)
    await controller.sync_resource_quota(quota_obj)
    assert ["2"] == [w[1]["used"]["configmaps"] for w in writer.writes]


def _with_used(used: Mapping[str, str] | None) -> Obj:
    status = {} if used is None else {"status": {"hard": {"pods": "10"}, "used": dict(used)}}
    return {"metadata": {"name": "q", "namespace": "testing"}, **status}


@pytest.mark.parametrize(
    ("old_used", "new_used", "raised"),
    [
        pytest.param({"pods": "1"}, {"pods": "2"}, {"pods": "1"}, id="a-charge"),
        pytest.param(
            {"pods": "1", "cpu": "1"}, {"pods": "1", "cpu": "1500m"}, {"cpu": "500m"}, id="cpu"
        ),
        pytest.param({"pods": "2"}, {"pods": "1"}, {}, id="replenished"),
        pytest.param({"pods": "1"}, {"pods": "1"}, {}, id="unchanged"),
        pytest.param({"pods": "1"}, {"pods": "1000m"}, {}, id="same-in-another-form"),
        pytest.param(None, {"pods": "3"}, {}, id="first-calculation"),
        pytest.param({}, {"pods": "3"}, {}, id="new-name"),
        pytest.param({"pods": "1"}, {"pods": "not-a-quantity"}, {}, id="unparseable"),
    ],
)
def test_raised_usage(
    old_used: Mapping[str, str] | None, new_used: Mapping[str, str], raised: Mapping[str, str]
) -> None:
    # tally, for several replicas: another replica's reservation, seen on the quota's watch,
    # is what the leader holds until its object can have arrived.
    expected = {name: Quantity.parse(value) for name, value in raised.items()}
    assert expected == raised_usage(_with_used(old_used), _with_used(new_used))


async def test_a_kind_without_a_store_keeps_its_last_observation() -> None:
    # tally: resource claims have a registered evaluator, but their store exists only once the
    # dynamic kinds listed them. Until then their names keep what status says (nothing, for a
    # new quota) instead of a 0 computed from no claims; the other names are computed.
    claims = GroupResource("resource.k8s.io", "resourceclaims")
    gold = "gold.deviceclass.resource.k8s.io/devices"
    hard = {"pods": "5", "count/resourceclaims.resource.k8s.io": "2", gold: "2"}
    quota_obj = resource_quota("quota", hard)
    controller, writer = new_controller([quota_obj], {PODS: new_test_pods()})
    await controller.sync_resource_quota(quota_obj)
    assert 1 == len(writer.writes)
    assert {"pods": "2"} == dict(writer.writes[0][1]["used"])

    observed = {"pods": "2", "count/resourceclaims.resource.k8s.io": "1", gold: "1"}
    known = {**quota_obj, "status": {"hard": hard, "used": observed}}
    controller, writer = new_controller([known], {PODS: new_test_pods()})
    await controller.sync_resource_quota(known)
    assert [] == writer.writes  # nothing new to say

    # Once listed, the claims are counted (none here).
    controller, writer = new_controller([known], {PODS: new_test_pods(), claims: []})
    await controller.sync_resource_quota(known)
    assert 1 == len(writer.writes)
    used = dict(writer.writes[0][1]["used"])
    assert {"pods": "2", "count/resourceclaims.resource.k8s.io": "0", gold: "0"} == used
