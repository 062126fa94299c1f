"""Quota admission end to end on plain data: filtering, batching, writes, retries, concurrency.

The TestAdmit* cases are ported from kubernetes ``plugin/pkg/admission/resourcequota/
admission_test.go`` (and TestExcludedOperations from the staging ``admission_test.go``).
Upstream runs its plugin over an informer indexer and a fake clientset, then inspects the
client's actions; here :class:`QuotaEvaluator` runs over :class:`FakeAccessor`, an in-memory
store of quotas with integer resourceVersions that raises ``Conflict`` when a write carries a
stale one, and records every successful status write. "An update-resourcequotas-status action"
upstream is a recorded write here; upstream compares ``Quantity.String()`` and so do these
tests, on the written ``status.used`` strings.

Where an upstream test only asserts ``err != nil``, the expected message is upstream's format
string (``controller.go``) filled in by hand, and the comment says so. The conflict-retry,
batching and timeout cases have no upstream table: their expectations follow
upstream's ``checkQuotas``/``Evaluate`` code, and tally's deliberate differences are
named where they are tested.

Timeouts use real (short) time: the project has no fake loop time.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

import builders
from tally.admission import (
    AdmissionDenied,
    Attributes,
    Configuration,
    Conflict,
    CountingAdmissionMetrics,
    LimitedResource,
    NotFound,
    QuotaEvaluator,
)
from tally.admission.overcharges import OVERCHARGE_MEMORY_S, Overcharges
from tally.charges import ChargeLedger, ObjectRef
from tally.evaluators.base import GroupResource, parse_scope_requirement
from tally.evaluators.pods import PodEvaluator
from tally.evaluators.podsets import PODSETS, PodSetEvaluator
from tally.evaluators.registry import new_registry
from tally.machinery.cache import Store
from tally.machinery.errors import TooLarge
from tally.quota.identity import QuotaIdentity
from tally.quota.quantity import parse_quantity
from tally.resourcequota.controller import ResourceQuotaController

pytestmark = pytest.mark.unit

Obj = dict[str, Any]
PODS = GroupResource("", "pods")
SERVICES = GroupResource("", "services")
PVCS = GroupResource("", "persistentvolumeclaims")


# -- the fake accessor --


class FakeAccessor:
    """Quotas in memory, keyed by (namespace, name), with compare-and-swap status writes."""

    def __init__(self, quotas: Iterable[Obj] = ()) -> None:
        self.store: dict[tuple[str, str], Obj] = {}
        for q in quotas:
            self.put(q)
        #: Every successful write, as stored (upstream's "update resourcequotas status" actions).
        self.writes: list[Obj] = []
        self.write_attempts = 0
        self.get_calls = 0
        #: Exceptions the next writes raise, in order, before looking at the store.
        self.fail_writes: list[Exception] = []
        #: Called with the stored quota before each write is compared: a concurrent writer.
        self.before_write: Callable[[Obj], None] | None = None
        #: When set, ``get_quotas`` waits for it (to hold a pass open).
        self.gate: asyncio.Event | None = None
        self.get_error: Exception | None = None
        #: With ``lagging_cache``, ``get_quotas`` reads this copy of the store instead: it sees
        #: only our own writes and what ``refresh`` fetched, not ``before_write``'s (an informer
        #: that has not delivered another replica's write yet).
        self.lagging_cache: dict[tuple[str, str], Obj] | None = None
        #: Names of the quotas ``refresh`` was asked for, in order.
        self.refreshed: list[str] = []

    def put(self, q: Obj) -> None:
        q = copy.deepcopy(q)
        q["metadata"].setdefault("resourceVersion", "")
        self.store[(q["metadata"]["namespace"], q["metadata"]["name"])] = q

    def lag(self) -> None:
        """From now on reads come from a cache that misses other writers' writes."""
        self.lagging_cache = copy.deepcopy(self.store)

    def used(self, name: str, namespace: str = "test") -> dict[str, str]:
        return dict(self.store[(namespace, name)]["status"].get("used", {}))

    async def get_quotas(self, namespace: str) -> list[Mapping[str, Any]]:
        self.get_calls += 1
        await asyncio.sleep(0)
        if self.gate is not None:
            await self.gate.wait()
        if self.get_error is not None:
            raise self.get_error
        source = self.store if self.lagging_cache is None else self.lagging_cache
        return [copy.deepcopy(q) for (ns, _), q in source.items() if ns == namespace]

    async def refresh(self, quota: Any) -> None:
        self.refreshed.append(quota["metadata"]["name"])
        await asyncio.sleep(0)
        key = (quota["metadata"]["namespace"], quota["metadata"]["name"])
        if self.lagging_cache is not None and key in self.store:
            self.lagging_cache[key] = copy.deepcopy(self.store[key])

    async def update_quota_status(self, quota: Any, **_: Any) -> Obj:
        self.write_attempts += 1
        await asyncio.sleep(0)
        if self.fail_writes:
            raise self.fail_writes.pop(0)
        key = (quota["metadata"]["namespace"], quota["metadata"]["name"])
        stored = self.store.get(key)
        if stored is None:
            raise NotFound(f'resourcequotas "{key[1]}" not found')
        if self.before_write is not None:
            self.before_write(stored)
        if quota["metadata"].get("resourceVersion", "") != stored["metadata"]["resourceVersion"]:
            raise Conflict(f"resourcequotas {key[1]}")
        new = copy.deepcopy(stored)
        new["status"] = copy.deepcopy(dict(quota["status"]))
        new["metadata"]["resourceVersion"] = str(
            int(stored["metadata"]["resourceVersion"] or 0) + 1
        )
        self.store[key] = new
        if self.lagging_cache is not None:
            self.lagging_cache[key] = copy.deepcopy(new)
        self.writes.append(copy.deepcopy(new))
        return new


def bump(stored: Obj, used: dict[str, str] | None = None) -> None:
    """Another writer changed the quota (and maybe its usage) behind our back."""
    stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"] or 0) + 1)
    if used is not None:
        stored["status"]["used"] = dict(used)


# -- builders (upstream's validPod / validPersistentVolumeClaim / quota literals, as JSON) --


# Upstream's validPod (one unnamed container "foo:V0" whose requests and limits are always
# there) and quota literals (a status, no spec.hard), as JSON without apiVersion and kind.
pod = functools.partial(
    builders.pod, namespace="test", container_name=None, image="foo:V0", resources="both"
)
resource_quota = functools.partial(
    builders.resource_quota, namespace="test", resource_version="124", hard_in="status"
)


def service(name: str, type_: str, *, ports: int = 0, resource_version: str = "") -> Obj:
    metadata: Obj = {"name": name, "namespace": "test", "resourceVersion": resource_version}
    spec: Obj = {"type": type_}
    if ports:
        spec["ports"] = [{"port": 1234}]
    return {"metadata": metadata, "spec": spec}


def pvc(name: str, storage: str, *, resource_version: str = "") -> Obj:
    return {
        "metadata": {"name": name, "namespace": "test", "resourceVersion": resource_version},
        "spec": {"resources": {"requests": {"storage": storage}}},
    }


def create(
    obj: Obj, gr: GroupResource = PODS, *, subresource: str = "", dry_run: bool = False
) -> Attributes:
    namespace = obj["metadata"].get("namespace", "test")
    return Attributes(
        namespace, obj["metadata"]["name"], gr, subresource, "CREATE", obj, None, dry_run
    )


def update(new: Obj, old: Obj | None, gr: GroupResource) -> Attributes:
    return Attributes("test", new["metadata"]["name"], gr, "", "UPDATE", new, old)


def scope(name: str, operator: str = "Exists", values: list[str] | None = None) -> Any:
    raw: Obj = {"scopeName": name, "operator": operator}
    if values:
        raw["values"] = values
    return parse_scope_requirement(raw)


def handler(
    accessor: FakeAccessor,
    config: Configuration | None = None,
    **kwargs: Any,
) -> QuotaEvaluator:
    return QuotaEvaluator(accessor, new_registry(clock=lambda: 1_700_000_000.0), config, **kwargs)


async def validate(evaluator: QuotaEvaluator, attributes: Attributes) -> AdmissionDenied | None:
    try:
        await evaluator.evaluate(attributes)
    except AdmissionDenied as denied:
        return denied
    return None


@pytest.fixture
async def running() -> Any:
    """Stops every evaluator a test builds through ``running.append``."""
    evaluators: list[QuotaEvaluator] = []
    yield evaluators
    for evaluator in evaluators:
        await evaluator.stop(grace_period=1.0)


# -- filtering --


@pytest.mark.parametrize(
    "attributes",
    [
        # TestAdmissionIgnoresDelete
        pytest.param(Attributes("default", "name", PODS, "", "DELETE", None), id="delete"),
        # TestExcludedOperations: non-namespaced resource, namespace creation, subresource
        pytest.param(
            Attributes("", "namespace", GroupResource("", ""), "", "CREATE", {"metadata": {}}),
            id="non-namespaced",
        ),
        pytest.param(
            Attributes(
                "namespace",
                "namespace",
                GroupResource("", "namespaces"),
                "",
                "CREATE",
                {"metadata": {}},
            ),
            id="namespace-creation",
        ),
        pytest.param(
            Attributes(
                "namespace",
                "name",
                GroupResource("", ""),
                "subresource",
                "CREATE",
                {"metadata": {}},
            ),
            id="subresource",
        ),
        pytest.param(
            Attributes("test", "e", GroupResource("", "events"), "", "CREATE", {"metadata": {}}),
            id="ignored-resource",
        ),
    ],
)
async def test_excluded_requests_never_reach_the_accessor(attributes: Attributes) -> None:
    accessor = FakeAccessor(
        [
            resource_quota(
                "quota", {"pods": "0", "count/events": "0"}, {"pods": "0", "count/events": "0"}
            )
        ]
    )
    evaluator = handler(accessor)
    assert await validate(evaluator, attributes) is None
    assert 0 == accessor.get_calls
    await evaluator.stop()


async def test_admission_ignores_subresources(running: list[QuotaEvaluator]) -> None:
    # TestAdmissionIgnoresSubresources (the quota has no resourceVersion, as upstream's).
    # Message: upstream's "exceeded quota: %s, requested: %s, used: %s, limited: %s".
    accessor = FakeAccessor(
        [resource_quota("quota", {"memory": "2Gi"}, {"memory": "1Gi"}, resource_version="")]
    )
    running.append(evaluator := handler(accessor))
    new_pod = pod("123", {"cpu": "100m", "memory": "2Gi"})
    denied = await validate(evaluator, create(new_pod))
    assert denied is not None
    assert 403 == denied.code
    assert (
        "exceeded quota: quota, requested: memory=2Gi, used: memory=1Gi, limited: memory=2Gi"
        == denied.message
    )
    assert await validate(evaluator, create(new_pod, subresource="subresource")) is None


async def test_admit_pod_in_namespace_without_quota(running: list[QuotaEvaluator]) -> None:
    # TestAdmitPodInNamespaceWithoutQuota
    accessor = FakeAccessor(
        [resource_quota("quota", {"pods": "0"}, {"pods": "0"}, namespace="other")]
    )
    running.append(evaluator := handler(accessor))
    assert (
        await validate(evaluator, create(pod("allowed-pod", {"cpu": "100m"}, {"cpu": "200m"})))
        is None
    )
    assert [] == accessor.writes


# -- TestAdmit*: one request, its verdict and the written status --

STANDARD_HARD = {"cpu": "3", "memory": "100Gi", "pods": "5"}
STANDARD_USED = {"cpu": "1", "memory": "50Gi", "pods": "3"}


async def test_admit_below_quota_limit(running: list[QuotaEvaluator]) -> None:
    # TestAdmitBelowQuotaLimit
    accessor = FakeAccessor([resource_quota("quota", STANDARD_HARD, STANDARD_USED)])
    running.append(evaluator := handler(accessor))
    assert (
        await validate(evaluator, create(pod("allowed-pod", {"cpu": "100m", "memory": "2Gi"})))
        is None
    )
    [written] = accessor.writes
    assert {"cpu": "1100m", "memory": "52Gi", "pods": "4"} == written["status"]["used"]
    assert STANDARD_HARD == written["status"]["hard"]


async def test_admit_exceed_quota_limit(running: list[QuotaEvaluator]) -> None:
    # TestAdmitExceedQuotaLimit (upstream checks err != nil; message from its format string)
    accessor = FakeAccessor([resource_quota("quota", STANDARD_HARD, STANDARD_USED)])
    running.append(evaluator := handler(accessor))
    denied = await validate(
        evaluator, create(pod("not-allowed-pod", {"cpu": "3", "memory": "2Gi"}))
    )
    assert denied is not None
    assert (403, "exceeded quota: quota, requested: cpu=3, used: cpu=1, limited: cpu=3") == (
        denied.code,
        denied.message,
    )
    assert [] == accessor.writes


async def test_admit_enforce_quota_constraints(running: list[QuotaEvaluator]) -> None:
    # TestAdmitEnforceQuotaConstraints: limits.memory is tracked, the pod sets no memory limit.
    # Message: "failed quota: %s: %v" around the pod evaluator's "must specify %s for: %s"
    # (the container has no name, as upstream's validPod).
    accessor = FakeAccessor(
        [
            resource_quota(
                "quota",
                {"cpu": "3", "memory": "100Gi", "limits.memory": "200Gi", "pods": "5"},
                {"cpu": "1", "memory": "50Gi", "limits.memory": "100Gi", "pods": "3"},
            )
        ]
    )
    running.append(evaluator := handler(accessor))
    denied = await validate(
        evaluator, create(pod("not-allowed-pod", {"cpu": "100m", "memory": "2Gi"}, {"cpu": "200m"}))
    )
    assert denied is not None
    assert (403, "failed quota: quota: must specify limits.memory for: ") == (
        denied.code,
        denied.message,
    )


async def test_admit_dry_run(running: list[QuotaEvaluator]) -> None:
    # TestAdmitDryRun: judged, may be refused, never written
    accessor = FakeAccessor([resource_quota("quota", STANDARD_HARD, STANDARD_USED)])
    running.append(evaluator := handler(accessor))
    allowed = create(pod("allowed-pod", {"cpu": "100m", "memory": "2Gi"}), dry_run=True)
    assert await validate(evaluator, allowed) is None
    too_large = create(pod("too-large-pod", {"cpu": "100m", "memory": "60Gi"}), dry_run=True)
    denied = await validate(evaluator, too_large)
    assert denied is not None
    assert (
        "exceeded quota: quota, requested: memory=60Gi, used: memory=50Gi, limited: memory=100Gi"
        == denied.message
    )
    assert [] == accessor.writes
    assert 0 == accessor.write_attempts


SERVICE_HARD = {"services": "10", "services.loadbalancers": "10", "services.nodeports": "10"}
SERVICE_USED = {"services": "1", "services.loadbalancers": "1", "services.nodeports": "0"}


@pytest.mark.parametrize(
    ("old", "expected_used"),
    [
        # TestAdmitHandlesOldObjects: "we don't add negative values", loadbalancers stays 1
        pytest.param(
            service("service", "LoadBalancer", resource_version="1"),
            {"services": "1", "services.loadbalancers": "1", "services.nodeports": "1"},
            id="old-objects",
        ),
        # TestAdmitHandlesCreatingUpdates: the "old" object is ignored
        pytest.param(
            service("service", "LoadBalancer", resource_version=""),
            {"services": "2", "services.loadbalancers": "1", "services.nodeports": "1"},
            id="creating-updates",
        ),
    ],
)
async def test_admit_handles_service_updates(
    running: list[QuotaEvaluator], old: Obj, expected_used: dict[str, str]
) -> None:
    accessor = FakeAccessor([resource_quota("quota", SERVICE_HARD, SERVICE_USED)])
    running.append(evaluator := handler(accessor))
    new = service("service", "NodePort", ports=1)
    assert await validate(evaluator, update(new, old, SERVICES)) is None
    [written] = accessor.writes
    assert expected_used == written["status"]["used"]


PVC_HARD = {"persistentvolumeclaims": "3", "requests.storage": "100Gi"}
PVC_USED = {"persistentvolumeclaims": "1", "requests.storage": "10Gi"}


async def test_admit_handles_pvc_updates(running: list[QuotaEvaluator]) -> None:
    # TestAdmitHandlesPVCUpdates
    accessor = FakeAccessor([resource_quota("quota", PVC_HARD, PVC_USED)])
    running.append(evaluator := handler(accessor))
    old = pvc("pvc-to-update", "10Gi", resource_version="1")
    assert await validate(evaluator, update(pvc("pvc-to-update", "15Gi"), old, PVCS)) is None
    [written] = accessor.writes
    assert {"persistentvolumeclaims": "1", "requests.storage": "15Gi"} == written["status"]["used"]


async def test_admit_handles_negative_pvc_updates(running: list[QuotaEvaluator]) -> None:
    # TestAdmitHandlesNegativePVCUpdates: no client action for a shrinking claim
    accessor = FakeAccessor([resource_quota("quota", PVC_HARD, PVC_USED)])
    running.append(evaluator := handler(accessor))
    old = pvc("pvc-to-update", "10Gi", resource_version="1")
    assert await validate(evaluator, update(pvc("pvc-to-update", "5Gi"), old, PVCS)) is None
    assert 0 == accessor.write_attempts


async def test_admit_rejects_negative_usage(running: list[QuotaEvaluator]) -> None:
    # TestAdmitRejectsNegativeUsage; "quota usage is negative for resource(s): %s"
    accessor = FakeAccessor([resource_quota("quota", PVC_HARD, PVC_USED)])
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pvc("not-allowed-pvc", "-1Gi"), PVCS))
    assert denied is not None
    assert (403, "quota usage is negative for resource(s): requests.storage") == (
        denied.code,
        denied.message,
    )
    assert await validate(evaluator, create(pvc("not-allowed-pvc", "1Gi"), PVCS)) is None


async def test_admit_below_terminating_quota_limit(running: list[QuotaEvaluator]) -> None:
    # TestAdmitBelowTerminatingQuotaLimit: only quota-terminating is charged
    accessor = FakeAccessor(
        [
            resource_quota(
                "quota-non-terminating", STANDARD_HARD, STANDARD_USED, scopes=["NotTerminating"]
            ),
            resource_quota(
                "quota-terminating", STANDARD_HARD, STANDARD_USED, scopes=["Terminating"]
            ),
        ]
    )
    running.append(evaluator := handler(accessor))
    new_pod = pod("allowed-pod", {"cpu": "100m", "memory": "2Gi"}, active_deadline_seconds=30)
    assert await validate(evaluator, create(new_pod)) is None
    [written] = accessor.writes
    assert "quota-terminating" == written["metadata"]["name"]
    assert {"cpu": "1100m", "memory": "52Gi", "pods": "4"} == written["status"]["used"]


async def test_admit_below_best_effort_quota_limit(running: list[QuotaEvaluator]) -> None:
    # TestAdmitBelowBestEffortQuotaLimit
    accessor = FakeAccessor(
        [
            resource_quota("quota-besteffort", {"pods": "5"}, {"pods": "3"}, scopes=["BestEffort"]),
            resource_quota(
                "quota-not-besteffort", {"pods": "5"}, {"pods": "3"}, scopes=["NotBestEffort"]
            ),
        ]
    )
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("allowed-pod"))) is None
    [written] = accessor.writes
    assert "quota-besteffort" == written["metadata"]["name"]
    assert {"pods": "4"} == written["status"]["used"]


async def test_admit_best_effort_quota_limit_ignores_burstable(
    running: list[QuotaEvaluator],
) -> None:
    # TestAdmitBestEffortQuotaLimitIgnoresBurstable
    accessor = FakeAccessor(
        [resource_quota("quota-besteffort", {"pods": "5"}, {"pods": "3"}, scopes=["BestEffort"])]
    )
    running.append(evaluator := handler(accessor))
    assert (
        await validate(evaluator, create(pod("allowed-pod", {"cpu": "100m", "memory": "1Gi"})))
        is None
    )
    assert [] == accessor.writes


async def test_admission_sets_missing_namespace(running: list[QuotaEvaluator]) -> None:
    # TestAdmissionSetsMissingNamespace: the namespace comes from the request. tally measures a
    # copy with the namespace set instead of mutating the request's object.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "3"}, {"pods": "1"})])
    running.append(evaluator := handler(accessor))
    new_pod = pod("pod-without-namespace", {"cpu": "1", "memory": "2Gi"})
    del new_pod["metadata"]["namespace"]
    attributes = Attributes("test", "pod-without-namespace", PODS, "", "CREATE", new_pod)
    assert await validate(evaluator, attributes) is None
    assert {"pods": "2"} == accessor.used("quota")
    assert "namespace" not in new_pod["metadata"]


async def test_admit_when_unrelated_resource_exceeds_quota(running: list[QuotaEvaluator]) -> None:
    # TestAdmitWhenUnrelatedResourceExceedsQuota
    accessor = FakeAccessor(
        [resource_quota("quota", {"services": "3", "pods": "4"}, {"services": "4", "pods": "1"})]
    )
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("allowed-pod"))) is None
    assert {"services": "4", "pods": "2"} == accessor.used("quota")


# -- LimitedResources through the evaluator (TestAdmitLimitedResource*) --


async def test_admit_limited_resource_no_quota(running: list[QuotaEvaluator]) -> None:
    # TestAdmitLimitedResourceNoQuota: with LimitedResources, a namespace without quotas is
    # still checked; "insufficient quota to consume: %v" of the uncovered names, sorted
    config = Configuration((LimitedResource("", "pods", ("cpu",)),))
    running.append(evaluator := handler(FakeAccessor(), config))
    denied = await validate(
        evaluator, create(pod("not-allowed-pod", {"cpu": "3", "memory": "2Gi"}))
    )
    assert denied is not None
    assert (403, "insufficient quota to consume: cpu,requests.cpu") == (denied.code, denied.message)


PRIORITY_EXISTS = {"scopeName": "PriorityClass", "operator": "Exists"}
PRIORITY_IN_CLUSTER_SERVICES = {
    "scopeName": "PriorityClass",
    "operator": "In",
    "values": ["cluster-services"],
}
PRIORITY_IN_ANOTHER = {
    "scopeName": "PriorityClass",
    "operator": "In",
    "values": ["another-priorityclass-name"],
}
LIMIT_BEST_EFFORT = LimitedResource("", "pods", (), (scope("BestEffort"),))
LIMIT_CLUSTER_SERVICES = LimitedResource(
    "", "pods", (), (scope("PriorityClass", "In", ["cluster-services"]),)
)
LIMIT_TWO_CLASSES = LimitedResource(
    "",
    "pods",
    (),
    (scope("PriorityClass", "In", ["another-priorityclass-name", "cluster-services"]),),
)
BEST_EFFORT_QUOTA = resource_quota(
    "quota-besteffort", {"pods": "5"}, {"pods": "3"}, scopes=["BestEffort"]
)
BIG = {"cpu": "3", "memory": "2Gi"}


@pytest.mark.parametrize(
    ("test_pod", "quotas", "limited", "expected"),
    [
        # Each row is a row of upstream's TestAdmitLimitedScopeWithCoverQuota, same order; the
        # expected text is upstream's expErr (a 500 for uncovered scopes, a plain error).
        pytest.param(
            pod("allowed-pod", BIG, priority_class_name="fake-priority"),
            [resource_quota("quota", scope_selector=[PRIORITY_EXISTS])],
            (LimitedResource("", "pods", (), (scope("PriorityClass"),)),),
            None,
            id="covering-quota-exists-for-priorityclass-exists",
        ),
        pytest.param(
            pod("not-allowed-pod", BIG, priority_class_name="fake-priority"),
            [resource_quota("quota", scope_selector=[PRIORITY_EXISTS])],
            (LimitedResource("", "pods", ("requests.cpu",), (scope("PriorityClass"),)),),
            (403, "insufficient quota to consume: requests.cpu"),
            id="no-covering-quota-for-limited-cpu",
        ),
        pytest.param(
            pod("not-allowed-pod", BIG, priority_class_name="fake-priority"),
            [],
            (LimitedResource("", "pods", (), (scope("PriorityClass"),)),),
            (500, "insufficient quota to match these scopes: [{PriorityClass Exists []}]"),
            id="no-covering-quota-for-priorityclass-exists",
        ),
        pytest.param(
            pod("not-allowed-pod", priority_class_name="fake-priority"),
            [],
            (LIMIT_BEST_EFFORT,),
            (500, "insufficient quota to match these scopes: [{BestEffort Exists []}]"),
            id="no-covering-quota-for-besteffort",
        ),
        pytest.param(
            pod("allowed-pod", priority_class_name="fake-priority"),
            [BEST_EFFORT_QUOTA],
            (LIMIT_BEST_EFFORT,),
            None,
            id="covering-quota-for-besteffort",
        ),
        pytest.param(
            pod(
                "allowed-pod", {"cpu": "100m", "memory": "1Gi"}, priority_class_name="fake-priority"
            ),
            [],
            (LIMIT_BEST_EFFORT, LIMIT_CLUSTER_SERVICES),
            None,
            id="two-scopes-neither-matches",
        ),
        pytest.param(
            pod("allowed-pod", priority_class_name="fake-priority"),
            [],
            (LIMIT_BEST_EFFORT, LIMIT_CLUSTER_SERVICES),
            (500, "insufficient quota to match these scopes: [{BestEffort Exists []}]"),
            id="two-scopes-only-besteffort-matches",
        ),
        pytest.param(
            pod(
                "allowed-pod",
                {"cpu": "100m", "memory": "1Gi"},
                priority_class_name="cluster-services",
            ),
            [],
            (LIMIT_BEST_EFFORT, LIMIT_CLUSTER_SERVICES),
            (
                500,
                "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]",
            ),
            id="two-scopes-only-priorityclass-matches",
        ),
        pytest.param(
            pod("allowed-pod", priority_class_name="cluster-services"),
            [],
            (LIMIT_BEST_EFFORT, LIMIT_CLUSTER_SERVICES),
            (
                500,
                "insufficient quota to match these scopes: "
                "[{BestEffort Exists []} {PriorityClass In [cluster-services]}]",
            ),
            id="two-scopes-both-match-no-quota",
        ),
        pytest.param(
            pod("allowed-pod", priority_class_name="cluster-services"),
            [BEST_EFFORT_QUOTA],
            (LIMIT_BEST_EFFORT, LIMIT_CLUSTER_SERVICES),
            (
                500,
                "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]",
            ),
            id="two-scopes-both-match-besteffort-quota-only",
        ),
        pytest.param(
            pod("allowed-pod", priority_class_name="cluster-services"),
            [resource_quota("quota", scope_selector=[PRIORITY_IN_CLUSTER_SERVICES])],
            (LIMIT_BEST_EFFORT, LIMIT_CLUSTER_SERVICES),
            (500, "insufficient quota to match these scopes: [{BestEffort Exists []}]"),
            id="two-scopes-both-match-priorityclass-quota-only",
        ),
        pytest.param(
            pod("allowed-pod", priority_class_name="cluster-services"),
            [
                BEST_EFFORT_QUOTA,
                resource_quota("quota", scope_selector=[PRIORITY_IN_CLUSTER_SERVICES]),
            ],
            (LIMIT_BEST_EFFORT, LIMIT_CLUSTER_SERVICES),
            None,
            id="two-scopes-both-covered",
        ),
        pytest.param(
            pod("allowed-pod", BIG, priority_class_name="fake-priority"),
            [],
            (),
            None,
            id="priorityclass-not-limited",
        ),
        pytest.param(
            pod(
                "not-allowed-pod",
                {"cpu": "3", "memory": "20Gi"},
                priority_class_name="fake-priority",
            ),
            [
                resource_quota(
                    "quota", {"memory": "10Gi"}, {"memory": "1Gi"}, scope_selector=[PRIORITY_EXISTS]
                )
            ],
            (LimitedResource("", "pods", (), (scope("PriorityClass"),)),),
            (
                403,
                "exceeded quota: quota, requested: memory=20Gi, used: memory=1Gi, "
                "limited: memory=10Gi",
            ),
            id="covered-but-exceeded",
        ),
        pytest.param(
            pod("allowed-pod", BIG, priority_class_name="fake-priority"),
            [resource_quota("quota", scope_selector=[PRIORITY_IN_CLUSTER_SERVICES])],
            (LIMIT_CLUSTER_SERVICES,),
            None,
            id="other-priorityclass-than-limited",
        ),
        pytest.param(
            pod("allowed-pod", BIG, priority_class_name="cluster-services"),
            [resource_quota("quota", scope_selector=[PRIORITY_IN_CLUSTER_SERVICES])],
            (LIMIT_TWO_CLASSES,),
            None,
            id="limited-priorityclass-covered",
        ),
        pytest.param(
            pod("not-allowed-pod", BIG, priority_class_name="cluster-services"),
            [resource_quota("quota", scope_selector=[PRIORITY_IN_ANOTHER])],
            (LIMIT_TWO_CLASSES,),
            (
                500,
                "insufficient quota to match these scopes: "
                "[{PriorityClass In [another-priorityclass-name cluster-services]}]",
            ),
            id="limited-priorityclass-not-covered",
        ),
        pytest.param(
            pod("allowed-pod", BIG, priority_class_name="another-priorityclass-name"),
            [resource_quota("quota", scope_selector=[PRIORITY_IN_ANOTHER])],
            (LIMIT_TWO_CLASSES,),
            None,
            id="limited-priorityclass-covered-other-class",
        ),
        pytest.param(
            pod("not-allowed-pod", BIG, priority_class_name="cluster-services"),
            [],
            (LIMIT_TWO_CLASSES,),
            (
                500,
                "insufficient quota to match these scopes: "
                "[{PriorityClass In [another-priorityclass-name cluster-services]}]",
            ),
            id="limited-priorityclass-no-quota",
        ),
        pytest.param(
            pod("allowed-pod", BIG, priority_class_name="cluster-services"),
            [resource_quota("quota", scope_selector=[PRIORITY_EXISTS])],
            (LIMIT_TWO_CLASSES,),
            None,
            id="limited-priorityclass-covered-by-exists",
        ),
    ],
)
async def test_admit_limited_scope_with_cover_quota(
    running: list[QuotaEvaluator],
    test_pod: Obj,
    quotas: list[Obj],
    limited: tuple[LimitedResource, ...],
    expected: tuple[int, str] | None,
) -> None:
    # TestAdmitLimitedScopeWithCoverQuota
    running.append(evaluator := handler(FakeAccessor(quotas), Configuration(limited)))
    denied = await validate(evaluator, create(test_pod))
    if expected is None:
        assert denied is None
    else:
        assert denied is not None
        assert expected == (denied.code, denied.message)


# -- checkQuotas: compare-and-swap writes and retries --


async def test_conflict_then_retry_against_fresh_usage(running: list[QuotaEvaluator]) -> None:
    # checkQuotas phase 5: a lost write re-reads the quota and re-checks against its new usage
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    writes = iter([lambda q: bump(q, {"pods": "4"})])
    accessor.before_write = lambda q: next(writes, lambda _: None)(q)
    metrics = CountingAdmissionMetrics()
    running.append(evaluator := handler(accessor, metrics=metrics))
    assert await validate(evaluator, create(pod("p"))) is None
    assert {"pods": "5"} == accessor.used("quota")
    assert (2, 1, 1) == (accessor.write_attempts, metrics.conflicts, metrics.retries)


async def test_conflict_then_retry_refuses_when_fresh_usage_is_full(
    running: list[QuotaEvaluator],
) -> None:
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    writes = iter([lambda q: bump(q, {"pods": "5"})])
    accessor.before_write = lambda q: next(writes, lambda _: None)(q)
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert (
        "exceeded quota: quota, requested: pods=1, used: pods=5, limited: pods=5" == denied.message
    )
    assert {"pods": "5"} == accessor.used("quota")


async def test_conflicts_on_every_attempt_give_409_after_eleven_writes(
    running: list[QuotaEvaluator],
) -> None:
    # A lost compare-and-swap is retried CONFLICT_RETRIES (10) times, each against the quota
    # read from the API (upstream: 3, against its informer); then the last error (the API
    # server's 409 text) for every pending request.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    accessor.before_write = bump
    metrics = CountingAdmissionMetrics()
    running.append(evaluator := handler(accessor, metrics=metrics))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert 409 == denied.code
    assert (
        'Operation cannot be fulfilled on resourcequotas "quota": the object has been modified; '
        "please apply your changes to the latest version and try again"
    ) == denied.message
    assert (11, 11, 10) == (accessor.write_attempts, metrics.conflicts, metrics.retries)
    assert ["quota"] * 10 == accessor.refreshed
    assert {"pods": "3"} == accessor.used("quota")
    assert ("pods", "conflict") in metrics.requests


async def test_conflict_retry_judges_the_copy_that_won_not_the_lagging_cache(
    running: list[QuotaEvaluator],
) -> None:
    # Another replica charged the quota (3 → 4) and the cache has not seen it: a retry against
    # the cache would carry its old resourceVersion and lose every time (409 after all
    # retries). The retry reads the stored copy and charges on top of the other charge.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    accessor.lag()
    writes = iter([lambda q: bump(q, {"pods": "4"})])
    accessor.before_write = lambda q: next(writes, lambda _: None)(q)
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("p"))) is None
    assert {"pods": "5"} == accessor.used("quota")
    assert (2, ["quota"]) == (accessor.write_attempts, accessor.refreshed)


async def test_conflict_retry_refuses_with_quota_words_when_the_winner_filled_it(
    running: list[QuotaEvaluator],
) -> None:
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "4"})])
    accessor.lag()
    writes = iter([lambda q: bump(q, {"pods": "5"})])
    accessor.before_write = lambda q: next(writes, lambda _: None)(q)
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert (403, "exceeded quota: quota, requested: pods=1, used: pods=5, limited: pods=5") == (
        denied.code,
        denied.message,
    )
    assert {"pods": "5"} == accessor.used("quota")


async def test_a_failed_refresh_retries_against_the_cache(
    running: list[QuotaEvaluator],
) -> None:
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    writes = iter([bump])
    accessor.before_write = lambda q: next(writes, lambda _: None)(q)

    async def broken(quota: Any) -> None:
        raise RuntimeError("connection reset")

    accessor.refresh = broken  # type: ignore[method-assign]
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("p"))) is None
    assert {"pods": "4"} == accessor.used("quota")


async def test_other_failures_keep_upstreams_three_retries_beside_conflicts(
    running: list[QuotaEvaluator],
) -> None:
    # Conflicts have their own budget; any other failure still ends the pass after 3 retries.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    accessor.fail_writes = [
        Conflict("lost"), RuntimeError("a"), Conflict("lost"), RuntimeError("b"),
        RuntimeError("c"), RuntimeError("d"),
    ]  # fmt: skip
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert (500, "d") == (denied.code, denied.message)
    assert 6 == accessor.write_attempts
    assert {"pods": "3"} == accessor.used("quota")


def _with_uid(quota: Obj, uid: str) -> Obj:
    quota["metadata"]["uid"] = uid
    return quota


async def test_a_quota_deleted_before_its_write_is_skipped_though_the_cache_still_holds_it(
    running: list[QuotaEvaluator],
) -> None:
    # The write answers 404 while the watch has not delivered the deletion: the retry reads the
    # deleted quota from the cache again, and must go on without it, as a fresh LIST would
    # (upstream re-reads and skips it), rather than fail the request with the 404.
    accessor = FakeAccessor(
        [
            _with_uid(resource_quota("stays", {"pods": "5"}, {"pods": "0"}), "u-stays"),
            _with_uid(resource_quota("goes", {"pods": "5"}, {"pods": "0"}), "u-goes"),
        ]
    )
    accessor.lag()
    del accessor.store[("test", "goes")]
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("p"))) is None
    assert {"pods": "1"} == accessor.used("stays")
    assert ("test", "goes") in (accessor.lagging_cache or {})


async def test_a_quota_recreated_under_the_same_name_is_judged_on_the_retry(
    running: list[QuotaEvaluator],
) -> None:
    # The write of the old incarnation answers 404; by the retry the cache holds a new quota
    # of that name (another uid), which binds the request like any other.
    accessor = FakeAccessor([_with_uid(resource_quota("q", {"pods": "5"}, {"pods": "0"}), "u-1")])
    write = accessor.update_quota_status

    async def recreated_meanwhile(quota: Any, **kw: Any) -> Obj:
        if quota["metadata"]["uid"] == "u-1":
            accessor.put(_with_uid(resource_quota("q", {"pods": "1"}, {"pods": "1"}), "u-2"))
            raise NotFound('resourcequotas "q" not found')
        return await write(quota, **kw)

    accessor.update_quota_status = recreated_meanwhile  # type: ignore[method-assign]
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert denied.code == 403
    assert "exceeded quota: q" in denied.message


async def test_quota_deleted_during_retry_is_skipped(running: list[QuotaEvaluator]) -> None:
    # "If something has been removed it is skipped on this retry. After all, you removed it."
    accessor = FakeAccessor(
        [
            resource_quota("stays", {"pods": "5"}, {"pods": "0"}),
            resource_quota("goes", {"pods": "5"}, {"pods": "0"}),
        ]
    )

    def delete_goes(stored: Obj) -> None:
        if stored["metadata"]["name"] == "goes":
            del accessor.store[("test", "goes")]
            bump(stored)

    accessor.before_write = delete_goes
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("p"))) is None
    assert {"pods": "1"} == accessor.used("stays")
    assert ("test", "goes") not in accessor.store


async def test_other_write_failure_is_a_500_after_retries(running: list[QuotaEvaluator]) -> None:
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    accessor.fail_writes = [RuntimeError("etcd is on fire")] * 4
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert (500, "etcd is on fire") == (denied.code, denied.message)


async def test_a_status_refused_for_its_size_is_not_written_again(
    running: list[QuotaEvaluator],
) -> None:
    # The same charges would make the status as large again: the request is refused at once,
    # with the writer's words (what was refused, and what to do), and not retried.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    too_large = "clusterquotas/q: the API server refused its status of 1600000 bytes as too large"
    accessor.fail_writes = [TooLarge(too_large)] * 4
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert (500, too_large) == (denied.code, denied.message)
    assert 1 == accessor.write_attempts
    assert {"pods": "3"} == accessor.used("quota")


async def test_write_failure_then_success(running: list[QuotaEvaluator]) -> None:
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    accessor.fail_writes = [RuntimeError("transient")]
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("p"))) is None
    assert {"pods": "4"} == accessor.used("quota")


async def test_reading_quotas_fails(running: list[QuotaEvaluator]) -> None:
    # upstream GetQuotas: fmt.Errorf("error resolving quota: %v", err) → 500
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "3"})])
    accessor.get_error = RuntimeError("cache not synced")
    running.append(evaluator := handler(accessor))
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert (500, "error resolving quota: cache not synced") == (denied.code, denied.message)


async def test_retry_keeps_refusals_final(running: list[QuotaEvaluator]) -> None:
    # tally differs from upstream here. In one pass: a best-effort pod charges "all" (pods: 1)
    # and "besteffort"; a burstable pod is then refused by "all". The write of "all" succeeds,
    # the write of "besteffort" conflicts. Upstream's retry re-checks every waiter against
    # "besteffort" alone and resets the burstable pod, which changes nothing there, to allowed:
    # 2 pods admitted under pods: 1. tally re-checks only pending requests.
    accessor = FakeAccessor(
        [
            resource_quota("all", {"pods": "1"}, {"pods": "0"}),
            resource_quota("besteffort", {"pods": "10"}, {"pods": "0"}, scopes=["BestEffort"]),
        ]
    )
    conflicts = iter([True])

    def conflict_besteffort_once(stored: Obj) -> None:
        if stored["metadata"]["name"] == "besteffort" and next(conflicts, False):
            bump(stored)

    accessor.before_write = conflict_besteffort_once
    accessor.gate = asyncio.Event()
    metrics = CountingAdmissionMetrics()
    running.append(evaluator := handler(accessor, metrics=metrics))
    best_effort = asyncio.create_task(validate(evaluator, create(pod("be"))))
    burstable = asyncio.create_task(validate(evaluator, create(pod("bu", {"cpu": "1"}))))
    await asyncio.sleep(0.01)
    accessor.gate.set()
    assert await best_effort is None
    refused = await burstable
    assert refused is not None
    assert (
        "exceeded quota: all, requested: pods=1, used: pods=1, limited: pods=1" == refused.message
    )
    assert {"pods": "1"} == accessor.used("all")
    assert {"pods": "1"} == accessor.used("besteffort")
    assert ([2], 1) == (metrics.batch_sizes, metrics.retries)  # one pass, one retry


# -- where the cluster's own quota system enforces ResourceQuotas: judged, never written --


def cluster_quota_view(name: str, hard: dict[str, str], used: dict[str, str]) -> Obj:
    """A ClusterQuota as admission sees it (``tally.clusterquota.quota.as_resource_quota``)."""
    return {**resource_quota(name, hard, used), "kind": "ClusterQuota", "spec": {"hard": hard}}


def judging_only(accessor: FakeAccessor, running: list[QuotaEvaluator]) -> QuotaEvaluator:
    evaluator = handler(accessor)
    evaluator.charges_resource_quotas = False
    running.append(evaluator)
    return evaluator


async def test_a_full_resource_quota_refuses_before_the_cluster_quota_is_charged(
    running: list[QuotaEvaluator],
) -> None:
    # Upstream's plugin would refuse it after this webhook: refusing it first, in upstream's
    # words, leaves no charge on the ClusterQuota to release later.
    accessor = FakeAccessor(
        [
            resource_quota("rq", {"pods": "2"}, {"pods": "2"}),
            cluster_quota_view("cq", {"pods": "10"}, {"pods": "0"}),
        ]
    )
    evaluator = judging_only(accessor, running)
    denied = await validate(evaluator, create(pod("p")))
    assert denied is not None
    assert (403, "exceeded quota: rq, requested: pods=1, used: pods=2, limited: pods=2") == (
        denied.code,
        denied.message,
    )
    assert ([], 0) == (accessor.writes, accessor.write_attempts)


async def test_a_resource_quota_with_room_is_judged_but_only_the_cluster_quota_written(
    running: list[QuotaEvaluator],
) -> None:
    accessor = FakeAccessor(
        [
            resource_quota("rq", {"pods": "2"}, {"pods": "1"}),
            cluster_quota_view("cq", {"pods": "10"}, {"pods": "4"}),
        ]
    )
    evaluator = judging_only(accessor, running)
    assert await validate(evaluator, create(pod("p"))) is None
    assert ["cq"] == [w["metadata"]["name"] for w in accessor.writes]
    assert {"pods": "5"} == accessor.used("cq")
    assert {"pods": "1"} == accessor.used("rq")  # upstream's plugin charges it


async def test_a_request_charging_only_judged_quotas_is_allowed_without_a_write(
    running: list[QuotaEvaluator],
) -> None:
    accessor = FakeAccessor([resource_quota("rq", {"pods": "2"}, {"pods": "1"})])
    evaluator = judging_only(accessor, running)
    assert await validate(evaluator, create(pod("p"))) is None
    assert 0 == accessor.write_attempts


async def test_one_pass_judges_a_burst_against_the_running_total_of_a_judged_quota(
    running: list[QuotaEvaluator],
) -> None:
    # Three creates in one pass against one free pod in the ResourceQuota: the first is
    # admitted (and charged to the ClusterQuota only), the others see it in the running total.
    accessor = FakeAccessor(
        [
            resource_quota("rq", {"pods": "2"}, {"pods": "1"}),
            cluster_quota_view("cq", {"pods": "10"}, {"pods": "0"}),
        ]
    )
    accessor.gate = asyncio.Event()
    evaluator = judging_only(accessor, running)
    tasks = [asyncio.create_task(validate(evaluator, create(pod(f"p{i}")))) for i in range(3)]
    await asyncio.sleep(0.01)
    accessor.gate.set()
    verdicts = [await task for task in tasks]
    assert verdicts[0] is None
    assert ["exceeded quota: rq, requested: pods=1, used: pods=2, limited: pods=2"] * 2 == [
        v.message for v in verdicts[1:] if v is not None
    ]
    assert {"pods": "1"} == accessor.used("cq")
    assert ["cq"] == [w["metadata"]["name"] for w in accessor.writes]


async def test_by_default_resource_quotas_are_charged(running: list[QuotaEvaluator]) -> None:
    accessor = FakeAccessor(
        [
            resource_quota("rq", {"pods": "2"}, {"pods": "1"}),
            cluster_quota_view("cq", {"pods": "10"}, {"pods": "4"}),
        ]
    )
    running.append(evaluator := handler(accessor))
    assert await validate(evaluator, create(pod("p"))) is None
    assert ["cq", "rq"] == sorted(w["metadata"]["name"] for w in accessor.writes)
    assert ({"pods": "2"}, {"pods": "5"}) == (accessor.used("rq"), accessor.used("cq"))


# -- PodSet measures: a scale is judged as the PodSet it makes --


async def test_a_podset_scale_is_charged_by_its_growth_and_refused_past_the_limit(
    running: list[QuotaEvaluator],
) -> None:
    # The webhook adapter turns a Scale into the PodSet before and after (evaluators.podsets
    # .scaled); a template of 100m: 2 → 5 replicas grows requests.cpu by 300m, 5 → 10 by 500m.
    name = "podsets.tally.dev/requests.cpu"
    accessor = FakeAccessor([resource_quota("q", {name: "1"}, {name: "500m"})])
    registry = new_registry(clock=lambda: 1_700_000_000.0)
    registry.register(PodSetEvaluator())
    running.append(evaluator := QuotaEvaluator(accessor, registry))
    template = {"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}]}}

    def podset(replicas: int, version: str) -> Obj:
        return {
            "metadata": {"name": "web", "namespace": "test", "resourceVersion": version},
            "spec": {"replicas": replicas, "template": template},
        }

    def scale(old: int, new: int) -> Attributes:
        return Attributes(
            "test", "web", PODSETS, "scale", "UPDATE", podset(new, "8"), podset(old, "8")
        )

    assert await validate(evaluator, scale(2, 5)) is None
    assert {name: "800m"} == accessor.used("q")
    denied = await validate(evaluator, scale(5, 10))
    assert denied is not None
    assert (
        f"exceeded quota: q, requested: {name}=500m, used: {name}=800m, limited: {name}=1"
        == denied.message
    )
    assert await validate(evaluator, scale(5, 3)) is None  # shrinking charges nothing
    assert {name: "800m"} == accessor.used("q")


# -- batching and timeouts --


async def test_requests_arriving_during_a_pass_wait_for_the_next(
    running: list[QuotaEvaluator],
) -> None:
    # dirtyWork: while a namespace is in progress, new waiters join the next pass, which then
    # checks them all together and writes the quota once.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "50"}, {"pods": "0"})])
    accessor.gate = asyncio.Event()
    metrics = CountingAdmissionMetrics()
    running.append(evaluator := handler(accessor, metrics=metrics))
    first = asyncio.create_task(validate(evaluator, create(pod("first"))))
    await asyncio.sleep(0.01)  # the first pass is now waiting in get_quotas
    later = [asyncio.create_task(validate(evaluator, create(pod(f"p{i}")))) for i in range(10)]
    await asyncio.sleep(0.01)
    assert [1] == metrics.batch_sizes  # nobody else was picked up meanwhile
    accessor.gate.set()
    assert [None] * 11 == await asyncio.gather(first, *later)
    assert [1, 10] == metrics.batch_sizes
    assert 2 == len(accessor.writes)  # one write per pass
    assert {"pods": "11"} == accessor.used("quota")


async def test_timeout(running: list[QuotaEvaluator]) -> None:
    # Evaluate: time.After(10 * time.Second) → apierrors.NewInternalError(...), shortened here.
    # The second request timed out while queued behind the first pass and is never charged;
    # the first was already being checked and is (as upstream) charged anyway.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "50"}, {"pods": "0"})])
    accessor.gate = asyncio.Event()
    running.append(evaluator := handler(accessor, timeout=0.05))
    first = asyncio.create_task(validate(evaluator, create(pod("first"))))
    await asyncio.sleep(0.01)
    second = await validate(evaluator, create(pod("second")))
    assert second is not None
    assert (500, "Internal error occurred: resource quota evaluation timed out") == (
        second.code,
        second.message,
    )
    assert await first is not None
    accessor.gate.set()
    for _ in range(200):  # until both passes are over (bounded: 2 s)
        if accessor.writes and not evaluator._in_progress and not evaluator._work:
            break
        await asyncio.sleep(0.01)
    assert {"pods": "1"} == accessor.used("quota")
    assert 1 == len(accessor.writes)


async def test_stop_refuses_new_requests() -> None:
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "0"})])
    evaluator = handler(accessor)
    assert await validate(evaluator, create(pod("p"))) is None
    await evaluator.stop()
    denied = await validate(evaluator, create(pod("q")))
    assert denied is not None
    assert (500, "Internal error occurred: resource quota evaluator is shutting down") == (
        denied.code,
        denied.message,
    )


# -- never over-admit --


async def arrive(index: int, evaluator: QuotaEvaluator, attributes: Attributes) -> Any:
    """Spread arrivals over a few milliseconds (deterministically) so passes interleave."""
    await asyncio.sleep((index * 7 % 11) / 1000)
    return await validate(evaluator, attributes)


@pytest.mark.parametrize(
    "conflict_every",
    [pytest.param(0, id="no-conflicts"), pytest.param(2, id="every-other-write-conflicts")],
)
async def test_200_concurrent_pod_creates_against_pods_50(
    running: list[QuotaEvaluator], conflict_every: int
) -> None:
    # Issue 5's "never over-admit": exactly 50 admitted and status.used.pods == 50
    accessor = FakeAccessor([resource_quota("quota", {"pods": "50"}, {"pods": "0"})])
    if conflict_every:
        counter = iter(range(1, 10_000))
        # writes 1, 3, 5, … lose their race: every pass needs at least one retry
        accessor.before_write = lambda q: bump(q) if next(counter) % conflict_every == 1 else None
    metrics = CountingAdmissionMetrics()
    running.append(evaluator := handler(accessor, metrics=metrics))
    verdicts = await asyncio.gather(
        *(arrive(i, evaluator, create(pod(f"p{i}"))) for i in range(200))
    )
    allowed = [v for v in verdicts if v is None]
    refused = [v for v in verdicts if v is not None]
    assert 50 == len(allowed)
    assert {"pods": "50"} == accessor.used("quota")
    assert {(403, "exceeded quota: quota, requested: pods=1, used: pods=50, limited: pods=50")} == {
        (v.code, v.message) for v in refused
    }
    assert 200 == sum(metrics.batch_sizes)
    assert len(metrics.batch_sizes) > 1  # the arrivals spread over several passes
    if conflict_every:
        assert metrics.conflicts > 0
        assert metrics.retries > 0


async def test_two_replicas_sharing_quotas_never_over_admit() -> None:
    # Two webhook replicas: separate evaluators and batches, one store. Compare-and-swap is
    # all that keeps them from over-admitting; lost races end in refusals (409 or exceeded),
    # never in a pod beyond the limit. Two quotas and mixed shapes make the writes interleave.
    accessor = FakeAccessor(
        [
            resource_quota("pods", {"pods": "50"}, {"pods": "0"}),
            resource_quota("cpu", {"requests.cpu": "30"}, {"requests.cpu": "0"}),
        ]
    )
    replicas = [handler(accessor, workers=2), handler(accessor, workers=3)]
    requests = [create(pod(f"p{i}", {"cpu": "1"} if i % 2 else None)) for i in range(200)]
    verdicts = await asyncio.gather(
        *(arrive(i, replicas[i % 2], attributes) for i, attributes in enumerate(requests))
    )
    for replica in replicas:
        await replica.stop()
    allowed = [a for a, v in zip(requests, verdicts, strict=True) if v is None]
    cpu = sum(
        1 for a in allowed if a.obj and a.obj["spec"]["containers"][0]["resources"]["requests"]
    )
    assert len(allowed) <= 50
    assert {"pods": str(len(allowed))} == accessor.used("pods")
    assert {"requests.cpu": str(cpu)} == accessor.used("cpu")
    assert cpu <= 30
    assert {v.code for v in verdicts if v is not None} <= {403, 409}


# -- tally: charges handed to the ledger (not upstream: its plugin runs last in the chain)


class RecordingLedger(ChargeLedger):
    """A real ledger (fake clock) that also lists what ``recalculate`` was asked."""

    def __init__(self) -> None:
        super().__init__(5.0, clock=lambda: 100.0)
        self.recalculated: list[tuple[str, str]] = []
        self.recalculate = self.recalculated.extend


def uid_pod(name: str, uid: str, requests: dict[str, str] | None = None) -> Obj:
    obj = pod(name, requests)
    obj["metadata"]["uid"] = uid
    return obj


async def test_an_allowed_create_waits_for_its_object(running: list[QuotaEvaluator]) -> None:
    # What the ledger holds is exactly what was written: pods 1 and requests.cpu 500m to the
    # quota that tracks both, pods 1 to the one that tracks pods only.
    accessor = FakeAccessor(
        [
            resource_quota(
                "both", {"pods": "5", "requests.cpu": "2"}, {"pods": "0", "requests.cpu": "0"}
            ),
            resource_quota("count", {"pods": "5"}, {"pods": "0"}),
        ]
    )
    ledger = RecordingLedger()
    running.append(evaluator := handler(accessor, charges=ledger))
    assert await validate(evaluator, create(uid_pod("p", "u-1", {"cpu": "500m"}))) is None
    ref = ObjectRef(PODS, "test", "p")
    assert ledger.expects(ref)
    assert {"pods": parse_quantity("1"), "requests.cpu": parse_quantity("500m")} == ledger.held(
        ("test", "both")
    )
    assert {"pods": parse_quantity("1")} == ledger.held(("test", "count"))
    ledger.observed(ref, "u-other", "7")  # an older incarnation of the name confirms nothing
    assert 1 == len(ledger)
    ledger.observed(ref, "u-1", "7")
    assert 0 == len(ledger)
    assert [] == ledger.recalculated


async def test_an_allowed_update_waits_for_a_newer_version(running: list[QuotaEvaluator]) -> None:
    accessor = FakeAccessor(
        [resource_quota("quota", {"services.loadbalancers": "2"}, {"services.loadbalancers": "0"})]
    )
    ledger = RecordingLedger()
    running.append(evaluator := handler(accessor, charges=ledger))
    old = service("s", "ClusterIP", resource_version="41")
    new = service("s", "LoadBalancer", resource_version="41")
    old["metadata"]["uid"] = new["metadata"]["uid"] = "u-s"
    assert await validate(evaluator, update(new, old, SERVICES)) is None
    assert {"services.loadbalancers": parse_quantity("1")} == ledger.held(("test", "quota"))
    ref = ObjectRef(SERVICES, "test", "s")
    ledger.observed(ref, "u-s", "41")  # the object as it was: the update is not stored yet
    assert 1 == len(ledger)
    ledger.observed(ref, "u-s", "42")
    assert 0 == len(ledger)


async def test_refused_and_dry_run_requests_are_never_recorded(
    running: list[QuotaEvaluator],
) -> None:
    accessor = FakeAccessor([resource_quota("quota", {"pods": "1"}, {"pods": "1"})])
    ledger = RecordingLedger()
    running.append(evaluator := handler(accessor, charges=ledger))
    assert await validate(evaluator, create(uid_pod("full", "u-1"))) is not None
    accessor.put(resource_quota("quota", {"pods": "1"}, {"pods": "0"}))
    assert await validate(evaluator, create(uid_pod("dry", "u-2"), dry_run=True)) is None
    assert (0, []) == (len(ledger), ledger.recalculated)


async def test_a_request_refused_after_its_charge_was_written_is_released_at_once(
    running: list[QuotaEvaluator],
) -> None:
    # Two quotas: "a" is written, "b" loses every compare-and-swap. The request gets the 409,
    # and the charge already in "a" must not stay: "a" is recalculated now.
    accessor = FakeAccessor(
        [
            resource_quota("a", {"pods": "5"}, {"pods": "0"}),
            resource_quota("b", {"pods": "5"}, {"pods": "0"}),
        ]
    )
    accessor.before_write = lambda stored: (
        bump(stored) if stored["metadata"]["name"] == "b" else None
    )
    ledger = RecordingLedger()
    running.append(evaluator := handler(accessor, charges=ledger))
    denied = await validate(evaluator, create(uid_pod("p", "u-1")))
    assert denied is not None
    assert 409 == denied.code
    assert {"pods": "1"} == accessor.used("a")
    assert 0 == len(ledger)
    assert [("test", "a")] == ledger.recalculated


def losing_writes_of(name: str, count: int | None = None) -> Callable[[Obj], None]:
    """``before_write`` for a quota whose every write (the first ``count``) loses its
    compare-and-swap."""
    losses = itertools.count() if count is None else iter(range(count))

    def lose(stored: Obj) -> None:
        if stored["metadata"]["name"] == name and next(losses, None) is not None:
            bump(stored)

    return lose


async def refused_after_writing_a(
    running: list[QuotaEvaluator],
) -> tuple[FakeAccessor, QuotaEvaluator]:
    """Quota "a" (pods 1) is written for p1 and "b" loses every compare-and-swap: p1 is refused
    with the 409 and "a" says pods=1 with no pod behind it until a recalculation (none runs
    here). From then on writes succeed."""
    accessor = FakeAccessor(
        [
            resource_quota("a", {"pods": "1"}, {"pods": "0"}),
            resource_quota("b", {"pods": "5"}, {"pods": "0"}),
        ]
    )
    accessor.before_write = losing_writes_of("b")
    running.append(evaluator := handler(accessor, conflict_retries=1, charges=RecordingLedger()))
    denied = await validate(evaluator, create(uid_pod("p1", "u-1")))
    assert denied is not None
    assert 409 == denied.code
    assert {"pods": "1"} == accessor.used("a")
    accessor.before_write = None
    return accessor, evaluator


async def test_the_next_pass_judges_without_a_charge_written_for_a_refused_request(
    running: list[QuotaEvaluator],
) -> None:
    # p2 comes while "a" is still the version p1's write stored: judged against pods=0,
    # allowed, and "a" is written over that very version, so it ends at pods=1 for p2 alone.
    accessor, evaluator = await refused_after_writing_a(running)
    overcharged = accessor.store[("test", "a")]["metadata"]["resourceVersion"]
    assert await validate(evaluator, create(uid_pod("p2", "u-2"))) is None
    assert {"pods": "1"} == accessor.used("a")
    assert {"pods": "1"} == accessor.used("b")
    written_a = [w for w in accessor.writes if w["metadata"]["name"] == "a"]
    assert str(int(overcharged) + 1) == written_a[-1]["metadata"]["resourceVersion"]


async def test_a_charge_for_a_refused_request_is_judged_again_once_its_quota_changed(
    running: list[QuotaEvaluator],
) -> None:
    # "a" was written by someone else after p1 (a recalculation that counted something, or
    # another replica): that status is the truth, so p2 is refused against it.
    accessor, evaluator = await refused_after_writing_a(running)
    bump(accessor.store[("test", "a")], {"pods": "1"})
    denied = await validate(evaluator, create(uid_pod("p2", "u-2")))
    assert denied is not None
    assert (403, "exceeded quota: a, requested: pods=1, used: pods=1, limited: pods=1") == (
        denied.code,
        denied.message,
    )


class RecordingAccessor(FakeAccessor):
    """Also keeps what each status write was told of namespaces' shares given back."""

    def __init__(self, quotas: Iterable[Obj] = ()) -> None:
        super().__init__(quotas)
        self.given_back: list[tuple[str, dict[str, Any]]] = []

    async def update_quota_status(self, quota: Any, **kwargs: Any) -> Obj:
        given = kwargs.get("given_back_by_namespace") or {}
        self.given_back.append((quota["metadata"]["name"], dict(given)))
        return await super().update_quota_status(quota, **kwargs)


async def test_a_cluster_quota_holding_a_charge_for_a_refused_request_is_judged_without_it(
    running: list[QuotaEvaluator],
) -> None:
    # "cq" (pods 1) is written for p1, "b" loses every compare-and-swap: p1 gets the 409 and
    # "cq" says pods=1 with no pod behind it. p2 is judged against "cq" without that charge:
    # allowed, and the write over that very version tells the ClusterQuota that the namespace's
    # share gives the pod back (its status keeps the shares; the total alone would contradict
    # them). "cq" ends at pods=1, for p2.
    accessor = RecordingAccessor(
        [
            cluster_quota_view("cq", {"pods": "1"}, {"pods": "0"}),
            resource_quota("b", {"pods": "5"}, {"pods": "0"}),
        ]
    )
    accessor.before_write = losing_writes_of("b")
    running.append(evaluator := handler(accessor, conflict_retries=1, charges=RecordingLedger()))
    assert 409 == getattr(await validate(evaluator, create(uid_pod("p1", "u-1"))), "code", None)
    assert {"pods": "1"} == accessor.used("cq")
    accessor.before_write = None
    accessor.given_back.clear()
    assert await validate(evaluator, create(uid_pod("p2", "u-2"))) is None
    assert {"pods": "1"} == accessor.used("cq")
    assert {"pods": "1"} == accessor.used("b")
    assert [("b", {}), ("cq", {"test": {"pods": parse_quantity("1")}})] == sorted(
        accessor.given_back
    )


async def test_a_refusal_judged_against_a_charge_the_pass_gave_back_is_judged_again(
    running: list[QuotaEvaluator],
) -> None:
    # tally differs from upstream here. One pass: p1 charges "a" (pods 1) and "b"; p2 is then
    # refused by "a", full with p1's charge. "a" is written, "b" loses both its writes, so p1
    # gets the 409 and its charge in "a" charges nothing: p2 was refused against usage no pod
    # makes up, and upstream's refusal stands. Here p2 goes back to the namespace's next pass,
    # which judges it against "a" without p1's charge: allowed, "a" and "b" at pods 1 for p2.
    accessor = FakeAccessor(
        [
            resource_quota("a", {"pods": "1"}, {"pods": "0"}),
            resource_quota("b", {"pods": "5"}, {"pods": "0"}),
        ]
    )
    accessor.before_write = losing_writes_of("b", 2)
    accessor.gate = asyncio.Event()
    metrics = CountingAdmissionMetrics()
    ledger = RecordingLedger()
    running.append(
        evaluator := handler(accessor, conflict_retries=1, metrics=metrics, charges=ledger)
    )
    first = asyncio.create_task(validate(evaluator, create(uid_pod("p1", "u-1"))))
    second = asyncio.create_task(validate(evaluator, create(uid_pod("p2", "u-2"))))
    await asyncio.sleep(0.01)
    accessor.gate.set()
    refused = await first
    assert refused is not None
    assert 409 == refused.code
    assert await second is None
    assert {"pods": "1"} == accessor.used("a")
    assert {"pods": "1"} == accessor.used("b")
    assert ([2, 1], 1) == (metrics.batch_sizes, metrics.rejudged_refusals)
    # Only p2's charge waits for its object.
    assert {"pods": parse_quantity("1")} == ledger.held(("test", "a"))


async def test_a_refusal_judged_again_still_refuses_when_the_quota_is_full(
    running: list[QuotaEvaluator],
) -> None:
    # p2 is refused by "burstable" (full before the pass) in a pass that gave back p1's charge:
    # it is judged again, alone, and refused again in upstream's words.
    accessor = FakeAccessor(
        [
            resource_quota("b", {"pods": "5"}, {"pods": "0"}),
            resource_quota("burstable", {"pods": "1"}, {"pods": "1"}, scopes=["NotBestEffort"]),
        ]
    )
    accessor.before_write = losing_writes_of("b", 2)
    accessor.gate = asyncio.Event()
    metrics = CountingAdmissionMetrics()
    running.append(evaluator := handler(accessor, conflict_retries=1, metrics=metrics))
    first = asyncio.create_task(validate(evaluator, create(uid_pod("p1", "u-1"))))
    second = asyncio.create_task(validate(evaluator, create(uid_pod("p2", "u-2", {"cpu": "1"}))))
    await asyncio.sleep(0.01)
    accessor.gate.set()
    assert 409 == getattr(await first, "code", None)
    refused = await second
    assert refused is not None
    assert (
        403,
        "exceeded quota: burstable, requested: pods=1, used: pods=1, limited: pods=1",
    ) == (refused.code, refused.message)
    assert [2, 1] == metrics.batch_sizes
    assert {"pods": "0"} == accessor.used("b")  # p1's charge never landed there


async def test_a_refusal_is_judged_again_at_most_three_times(
    running: list[QuotaEvaluator],
) -> None:
    # Every write of "b" loses, and each pass brings a new pod charging it (q0, q1, …: each
    # write starts the next one's request, which joins the next pass) and so gives a charge
    # back. p, refused by the full "burstable" quota, goes back three times and is refused in
    # the fourth pass even though that pass gave a charge back too.
    accessor = FakeAccessor(
        [
            resource_quota("b", {"pods": "50"}, {"pods": "0"}),
            resource_quota("burstable", {"pods": "1"}, {"pods": "1"}, scopes=["NotBestEffort"]),
        ]
    )
    accessor.gate = asyncio.Event()
    metrics = CountingAdmissionMetrics()
    running.append(evaluator := handler(accessor, conflict_retries=0, metrics=metrics))
    followers: list[asyncio.Task[AdmissionDenied | None]] = []

    def lose_and_send_the_next(stored: Obj) -> None:
        bump(stored)
        if len(followers) < 4:
            name = f"q{len(followers) + 1}"
            followers.append(asyncio.ensure_future(validate(evaluator, create(pod(name)))))

    accessor.before_write = lose_and_send_the_next
    leader = asyncio.create_task(validate(evaluator, create(pod("q0"))))
    refused = asyncio.create_task(validate(evaluator, create(pod("p", {"cpu": "1"}))))
    await asyncio.sleep(0.01)
    accessor.gate.set()
    assert 409 == getattr(await leader, "code", None)
    denied = await refused
    assert denied is not None
    assert 403 == denied.code
    assert [409] * 4 == [getattr(d, "code", None) for d in await asyncio.gather(*followers)]
    # Pass 1: q0 and p; passes 2-4: p judged again beside q1-q3; pass 5: q4 alone.
    assert ([2, 2, 2, 2, 1], 3) == (metrics.batch_sizes, metrics.rejudged_refusals)


async def test_a_recalculation_waits_until_the_pass_ends_not_only_its_write(
    running: list[QuotaEvaluator],
) -> None:
    # "a" is written, "b" loses once and is retried. A recalculation of "a" asked for during
    # the retry would count p's charge, still held, into a new status version; were the retry
    # to refuse p, that version would charge it with nothing to say so. So it waits for the
    # pass's end, like one asked for while the write is in flight.
    accessor = FakeAccessor(
        [
            resource_quota("a", {"pods": "5"}, {"pods": "0"}),
            resource_quota("b", {"pods": "5"}, {"pods": "0"}),
        ]
    )
    ledger = RecordingLedger()
    deferred_during_retry: list[bool] = []
    losses = iter([True])

    def lose_once_then_ask(stored: Obj) -> None:
        if stored["metadata"]["name"] != "b":
            return
        if next(losses, False):
            bump(stored)
        else:
            deferred_during_retry.append(ledger.defer_sync(("test", "a")))

    accessor.before_write = lose_once_then_ask
    running.append(evaluator := handler(accessor, charges=ledger))
    assert await validate(evaluator, create(uid_pod("p", "u-1"))) is None
    assert [True] == deferred_during_retry
    assert [("test", "a")] == ledger.recalculated  # run once the pass ended


def test_charges_written_for_refused_requests_are_forgotten_after_a_minute() -> None:
    now = [100.0]
    overcharges = Overcharges(clock=lambda: now[0])
    quota = resource_quota("a", {"pods": "3"}, {"pods": "3"}, resource_version="7")
    overcharges.add(QuotaIdentity("", "test", "a"), "7", {"pods": parse_quantity("1")})
    overcharges.add(QuotaIdentity("", "test", "a"), "7", {"pods": parse_quantity("1")})
    assert {"pods": "1"} == overcharges.without([quota])[0]["status"]["used"]
    now[0] += OVERCHARGE_MEMORY_S + 1
    assert [quota] == overcharges.without([quota])
    assert 0 == len(overcharges)


async def test_a_charge_whose_caller_gave_up_is_released(running: list[QuotaEvaluator]) -> None:
    # The caller timed out while the pass was in flight: the API server answered 500, the
    # object will never exist, yet the pass writes the charge. It is released at once.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "0"})])
    accessor.gate = asyncio.Event()
    ledger = RecordingLedger()
    running.append(evaluator := handler(accessor, timeout=0.05, charges=ledger))
    denied = await validate(evaluator, create(uid_pod("p", "u-1")))
    assert denied is not None
    accessor.gate.set()
    for _ in range(200):  # until the pass is over (bounded: 2 s)
        if accessor.writes and not evaluator._in_progress:
            break
        await asyncio.sleep(0.01)
    assert {"pods": "1"} == accessor.used("quota")
    assert (0, [("test", "quota")]) == (len(ledger), ledger.recalculated)


async def test_a_charge_is_held_while_its_write_is_in_flight(
    running: list[QuotaEvaluator],
) -> None:
    # From the write on (and right after it, before the pass ends) the charge is held: a
    # recalculation running once the write landed must not write it away.
    accessor = FakeAccessor([resource_quota("quota", {"pods": "5"}, {"pods": "0"})])
    ledger = RecordingLedger()
    held_during_write: list[dict[str, Any]] = []
    accessor.before_write = lambda stored: held_during_write.append(ledger.held(("test", "quota")))
    running.append(evaluator := handler(accessor, charges=ledger))
    assert await validate(evaluator, create(uid_pod("p", "u-1"))) is None
    assert [{"pods": parse_quantity("1")}] == held_during_write


class PausingAccessor(FakeAccessor):
    """Admission's status writes wait at ``resume`` (when set) once they have started, as a
    PUT in flight does; the controller writes through :meth:`update_status`, unpaused."""

    def __init__(self, quotas: Iterable[Obj] = ()) -> None:
        super().__init__(quotas)
        self.resume: asyncio.Event | None = None
        self.paused = asyncio.Event()

    async def update_quota_status(self, quota: Any, **kwargs: Any) -> Obj:
        if self.resume is not None:
            self.paused.set()
            await self.resume.wait()
        return await super().update_quota_status(quota, **kwargs)

    async def update_status(self, quota_obj: Any, status: Mapping[str, Any]) -> None:
        await FakeAccessor.update_quota_status(self, {**quota_obj, "status": status})


async def test_a_recalculation_waits_for_a_status_write_in_flight(
    running: list[QuotaEvaluator],
) -> None:
    # The status says pods 2 for two charges just released (no pod exists). Admission charges
    # pod p: its write of 3 is in flight when the controller recalculates. Were the
    # recalculation to write 0 cached + 1 held (p's charge) = 1 first, admission's write would
    # lose its compare-and-swap, judge again against 1 and write 2: p counted twice, and
    # nothing recalculates after p's creation (charged creations replenish nothing). So the
    # recalculation waits for the write and runs when it ends: 3 lowered to 0 cached + 1 held.
    key = ("test", "quota")
    quota = resource_quota("quota", {"pods": "5"}, {"pods": "2"})
    quota["spec"]["hard"] = {"pods": "5"}  # the controller recalculates from the spec
    accessor = PausingAccessor([quota])
    ledger = RecordingLedger()
    running.append(evaluator := handler(accessor, charges=ledger))
    quotas: Store[Mapping[str, Any]] = Store(lambda obj: obj, name="resourcequotas")
    quotas.replace([accessor.store[key]], started_at=0)
    pods: Store[Any] = Store(PodEvaluator(clock=lambda: 1_700_000_000.0).project, name="pods")
    pods.replace([], started_at=0)
    controller = ResourceQuotaController(
        new_registry(clock=lambda: 1_700_000_000.0),
        quotas,
        {PODS: pods},
        accessor,
        charges=ledger,
        newest=lambda cached: accessor.store[key],  # the controller reads the newest copy
    )
    accessor.resume = asyncio.Event()
    admitted = asyncio.ensure_future(validate(evaluator, create(uid_pod("p", "u-p"))))
    await asyncio.wait_for(accessor.paused.wait(), 5)
    await controller._sync_key(key)  # the ledger's release asked for it: deferred
    accessor.resume.set()
    assert await admitted is None
    assert [key] == ledger.recalculated  # run again once the write ended
    await controller._sync_key(key)
    assert {"pods": "1"} == accessor.used("quota")
    # p reaches the caches: confirmed, counted by them, and the status already says so.
    pods.upsert(uid_pod("p", "u-p"))
    ledger.observed(ObjectRef(PODS, "test", "p"), "u-p", "1")
    await controller._sync_key(key)
    # Admission's 3, the recalculation's 1, and nothing since.
    assert ["3", "1"] == [w["status"]["used"]["pods"] for w in accessor.writes]
