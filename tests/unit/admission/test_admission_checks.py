"""Pure quota admission: ``check_request``, ``check_batch``, messages, configuration, LRU.

Ported from kubernetes ``staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/
admission_test.go`` (TestPrettyPrint, TestHasUsageStats) and checked against
``controller.go``'s ``CheckRequest`` and ``checkQuotas``. Every expected message is upstream's
format string filled in by hand from the case's inputs (the comment names the format or the
upstream test), never copied from tally's output. The request-level TestAdmit* ports, which go
through :class:`QuotaEvaluator` and a fake accessor as upstream's go through the plugin and a
fake clientset, are in ``test_admission_evaluator.py``.

Not covered here: batching across tasks, writes and retries (``test_admission_evaluator.py``).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import builders
from tally.admission.attributes import Attributes, is_namespace_creation
from tally.admission.checks import (
    PRIOR_VERSION_NOT_FOUND,
    Request,
    check_batch,
    check_request,
    has_usage_stats,
    pretty_print,
)
from tally.admission.config import (
    Configuration,
    ConfigurationError,
    LimitedResource,
    parse_configuration,
)
from tally.admission.errors import AdmissionDenied
from tally.evaluators.base import GroupResource, parse_scope_requirement
from tally.evaluators.measured import MeasuredEvaluator
from tally.evaluators.registry import new_registry
from tally.kube.quota_accessor import UpdatedQuotas
from tally.measures import compile_measure
from tally.quota import resources as quota
from tally.quota.resources import parse_resource_list

pytestmark = pytest.mark.unit

Obj = dict[str, Any]
PODS = GroupResource("", "pods")
SERVICES = GroupResource("", "services")
PVCS = GroupResource("", "persistentvolumeclaims")
REGISTRY = new_registry(clock=lambda: 1_700_000_000.0)


# -- builders (upstream's validPod / getResourceList / ResourceQuota literals, as API JSON) --


# Upstream's validPod (one unnamed container "foo:V0" whose requests and limits are always
# there) and quota literals (a status, no spec.hard), as API JSON (builders.py).
pod = functools.partial(
    builders.pod,
    namespace="test",
    container_name=None,
    image="foo:V0",
    resources="both",
    with_kind=True,
)
resource_quota = functools.partial(
    builders.resource_quota,
    namespace="test",
    resource_version="124",
    hard_in="status",
    with_kind=True,
)


def service(name: str, type_: str, *, ports: int = 0, resource_version: str = "") -> Obj:
    metadata: Obj = {"name": name, "namespace": "test"}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    spec: Obj = {"type": type_}
    if ports:
        spec["ports"] = [{"port": 1234 + i} for i in range(ports)]
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def pvc(name: str, storage: str, *, resource_version: str = "") -> Obj:
    metadata: Obj = {"name": name, "namespace": "test"}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": {"resources": {"requests": {"storage": storage}}},
    }


def create(obj: Obj, gr: GroupResource = PODS, *, dry_run: bool = False) -> Attributes:
    return Attributes("test", obj["metadata"]["name"], gr, "", "CREATE", obj, None, dry_run)


def update(new: Obj, old: Obj | None, gr: GroupResource) -> Attributes:
    return Attributes("test", new["metadata"]["name"], gr, "", "UPDATE", new, old)


def check(
    quotas: list[Obj], attributes: Attributes, limited: tuple[LimitedResource, ...] = ()
) -> list[Any]:
    evaluator = REGISTRY.get_or_count(attributes.group_resource)
    assert evaluator is not None
    return check_request(quotas, attributes, evaluator, limited)


def used_of(q: Any) -> dict[str, str]:
    return dict(q["status"]["used"])


def denied(quotas: list[Obj], attributes: Attributes, **kwargs: Any) -> AdmissionDenied:
    with pytest.raises(AdmissionDenied) as info:
        check(quotas, attributes, **kwargs)
    return info.value


# -- TestPrettyPrint, TestHasUsageStats (staging admission_test.go) --


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        pytest.param({"cpu": "100m"}, "cpu=100m", id="one"),
        pytest.param(
            {
                "pods": "10",
                "services": "10",
                "replicationcontrollers": "10",
                "services.nodeports": "10",
                "requests.cpu": "100m",
                "requests.memory": "100Mi",
                "limits.cpu": "100m",
                "limits.memory": "100Mi",
            },
            "limits.cpu=100m,limits.memory=100Mi,pods=10,replicationcontrollers=10,"
            "requests.cpu=100m,requests.memory=100Mi,services=10,services.nodeports=10",
            id="sorted",
        ),
    ],
)
def test_pretty_print(items: dict[str, str], expected: str) -> None:
    # TestPrettyPrint
    assert expected == pretty_print(parse_resource_list(items))


@pytest.mark.parametrize(
    ("hard", "used", "relevant", "expected"),
    [
        pytest.param({}, {}, ["memory"], True, id="empty"),
        pytest.param({"memory": "1Gi"}, {}, ["memory"], False, id="hard-only"),
        pytest.param({"memory": "1Gi"}, {"memory": "500Mi"}, ["memory"], True, id="hard-used"),
        pytest.param(
            {"memory": "1Gi", "pods": "1"},
            {"memory": "500Mi"},
            ["memory"],
            True,
            id="hard-used-relevant",
        ),
    ],
)
def test_has_usage_stats(
    hard: dict[str, str], used: dict[str, str], relevant: list[str], expected: bool
) -> None:
    # TestHasUsageStats
    assert expected == has_usage_stats(
        parse_resource_list(hard), parse_resource_list(used), relevant
    )


# -- check_request: the order of checks and their messages --

COMPUTE = resource_quota(
    "compute", {"requests.cpu": "1", "pods": "10"}, {"requests.cpu": "600m", "pods": "2"}
)


def test_exceeded_message_lists_only_exceeded_names() -> None:
    # upstream checkRequest's last step (charge, then compare only the names charged):
    # exceeded quota: compute, requested: requests.cpu=600m, used: requests.cpu=600m,
    # limited: requests.cpu=1 (pods=1 is requested too but fits, so it is not listed)
    error = denied([COMPUTE], create(pod("p", {"cpu": "600m"})))
    assert 403 == error.code
    assert (
        "exceeded quota: compute, requested: requests.cpu=600m, used: requests.cpu=600m, "
        "limited: requests.cpu=1"
    ) == error.message


def test_exceeded_message_with_several_names_sorted() -> None:
    # upstream format "exceeded quota: %s, requested: %s, used: %s, limited: %s" with
    # prettyPrint of the exceeded names only, sorted
    q = resource_quota(
        "q",
        {"requests.cpu": "1", "requests.memory": "1Gi", "pods": "10"},
        {"requests.cpu": "1", "requests.memory": "1Gi", "pods": "0"},
    )
    error = denied([q], create(pod("p", {"cpu": "1", "memory": "1Gi"})))
    assert (
        "exceeded quota: q, requested: requests.cpu=1,requests.memory=1Gi, "
        "used: requests.cpu=1,requests.memory=1Gi, limited: requests.cpu=1,requests.memory=1Gi"
    ) == error.message


def test_first_failing_quota_in_list_order_wins() -> None:
    # CheckRequest step 8 returns on the first interesting quota that does not fit
    first = resource_quota("b-first", {"pods": "1"}, {"pods": "1"})
    second = resource_quota("a-second", {"pods": "1"}, {"pods": "1"})
    error = denied([first, second], create(pod("p")))
    assert error.message.startswith("exceeded quota: b-first, ")
    error = denied([second, first], create(pod("p")))
    assert error.message.startswith("exceeded quota: a-second, ")


def test_constraint_failure_comes_before_status_unknown_and_exceeded() -> None:
    # "failed quota: %s: %v" from the first matching quota, before its hasUsageStats check
    q = resource_quota("mem", {"limits.memory": "1Gi"}, None)
    error = denied([q], create(pod("p", {"cpu": "1"})))
    assert 403 == error.code
    assert "failed quota: mem: must specify limits.memory for: " == error.message


def test_status_unknown_lists_matched_names_sorted() -> None:
    # "status unknown for quota: %s, resources: %s" with prettyPrintResourceNames(restricted)
    q = resource_quota("q", {"pods": "5", "requests.cpu": "1", "secrets": "3"}, {"pods": "1"})
    error = denied([q], create(pod("p", {"cpu": "100m"})))
    assert 403 == error.code
    assert "status unknown for quota: q, resources: pods,requests.cpu" == error.message


def test_quota_without_status_is_not_enforced() -> None:
    # Matches looks at status.hard: a quota the controller has not filled yet matches nothing
    q = resource_quota("new", None, None)
    q["spec"]["hard"] = {"pods": "0"}
    quotas = [q]
    assert check(quotas, create(pod("p"))) == quotas


def test_negative_usage() -> None:
    # TestAdmitRejectsNegativeUsage; "quota usage is negative for resource(s): %s"
    q = resource_quota(
        "quota",
        {"persistentvolumeclaims": "3", "requests.storage": "100Gi"},
        {"persistentvolumeclaims": "1", "requests.storage": "10Gi"},
    )
    error = denied([q], create(pvc("not-allowed-pvc", "-1Gi"), PVCS))
    assert 403 == error.code
    assert "quota usage is negative for resource(s): requests.storage" == error.message
    [charged] = check([q], create(pvc("allowed-pvc", "1Gi"), PVCS))
    assert {"persistentvolumeclaims": "2", "requests.storage": "11Gi"} == used_of(charged)


def test_negative_usage_is_checked_even_without_matching_quota() -> None:
    # CheckRequest measures the object after the quota loop, whether or not a quota matched
    q = resource_quota("pods-only", {"pods": "3"}, {"pods": "1"})
    error = denied([q], create(pvc("p", "-1Gi"), PVCS))
    assert "quota usage is negative for resource(s): requests.storage" == error.message


def test_update_without_old_object() -> None:
    # "unable to get previous usage since prior version of object was not found"
    q = resource_quota("q", {"services": "10"}, {"services": "1"})
    error = denied([q], update(service("s", "ClusterIP"), None, SERVICES))
    assert 403 == error.code
    assert PRIOR_VERSION_NOT_FOUND == error.message


@pytest.mark.parametrize(
    ("old", "expected_used"),
    [
        # TestAdmitHandlesOldObjects: LoadBalancer → NodePort with a resourceVersion
        pytest.param(
            service("s", "LoadBalancer", resource_version="1"),
            {"services": "1", "services.loadbalancers": "1", "services.nodeports": "1"},
            id="delta",
        ),
        # TestAdmitHandlesCreatingUpdates: the old object has no resourceVersion
        pytest.param(
            service("s", "LoadBalancer"),
            {"services": "2", "services.loadbalancers": "1", "services.nodeports": "1"},
            id="create-on-update",
        ),
    ],
)
def test_update_deltas(old: Obj, expected_used: dict[str, str]) -> None:
    q = resource_quota(
        "quota",
        {"services": "10", "services.loadbalancers": "10", "services.nodeports": "10"},
        {"services": "1", "services.loadbalancers": "1", "services.nodeports": "0"},
    )
    [charged] = check([q], update(service("s", "NodePort", ports=1), old, SERVICES))
    assert expected_used == used_of(charged)


def test_update_scope_change_charges_full_usage_to_newly_matching_quota() -> None:
    # CheckRequest: the delta applies only to quotas that matched the old object too; a quota
    # that matches only the new object keeps the full new usage. A pod gains an active
    # deadline: Terminating-ness changes, so the Terminating quota is charged in full and the
    # unscoped one only the (zero) growth.
    terminating = resource_quota(
        "terminating",
        {"pods": "5", "requests.cpu": "3"},
        {"pods": "1", "requests.cpu": "1"},
        scopes=["Terminating"],
    )
    everything = resource_quota(
        "everything", {"pods": "5", "requests.cpu": "3"}, {"pods": "1", "requests.cpu": "1"}
    )
    old = pod("p", {"cpu": "500m"}, resource_version="7")
    new = pod("p", {"cpu": "500m"}, active_deadline_seconds=30)
    out = check([terminating, everything], update(new, old, PODS))
    assert {"pods": "2", "requests.cpu": "1500m"} == used_of(out[0])
    assert out[1] is everything


def test_only_requested_names_are_compared() -> None:
    # TestAdmitWhenUnrelatedResourceExceedsQuota: services are over, a pod is still admitted
    q = resource_quota("quota", {"services": "3", "pods": "4"}, {"services": "4", "pods": "1"})
    [charged] = check([q], create(pod("allowed-pod")))
    assert {"services": "4", "pods": "2"} == used_of(charged)


def test_zero_delta_update_changes_nothing() -> None:
    # TestAdmitHandlesNegativePVCUpdates: shrinking charges nothing (max(new - old, 0) = 0)
    q = resource_quota(
        "quota",
        {"persistentvolumeclaims": "3", "requests.storage": "100Gi"},
        {"persistentvolumeclaims": "1", "requests.storage": "10Gi"},
    )
    quotas = [q]
    old = pvc("pvc-to-update", "10Gi", resource_version="1")
    out = check(quotas, update(pvc("pvc-to-update", "5Gi"), old, PVCS))
    assert all(a is b for a, b in zip(out, quotas, strict=True))


def test_check_request_never_mutates_its_inputs() -> None:
    q = resource_quota("q", {"pods": "5"}, {"pods": "1"})
    obj = pod("p")
    obj["metadata"].pop("namespace")
    snapshot_q, snapshot_obj = repr(q), repr(obj)
    [charged] = check([q], create(obj))
    assert {"pods": "2"} == used_of(charged)
    assert snapshot_q == repr(q)
    assert snapshot_obj == repr(obj)


def test_unparseable_quota_status_is_a_500_naming_the_field() -> None:
    # tally rule: a value upstream's typed objects cannot hold denies, never allows
    q = resource_quota("broken", {"pods": "5"}, {"pods": "five"})
    error = denied([q], create(pod("p")))
    assert 500 == error.code
    assert "broken" in error.message
    assert "status.used[pods]" in error.message


def test_unhandled_request_returns_quotas_unchanged() -> None:
    # evaluator.Handles is false: a pod UPDATE that does not change Terminating-ness
    q = resource_quota("q", {"pods": "0"}, {"pods": "5"})
    quotas = [q]
    old = pod("p", resource_version="3")
    assert check(quotas, update(pod("p", {"cpu": "1"}), old, PODS)) == quotas


# -- LimitedResources (TestAdmitLimitedResource*, TestAdmit*CoveringQuota) --

LIMIT_POD_CPU = (LimitedResource("", "pods", ("cpu",)),)
LIMIT_LB = (LimitedResource("", "services", ("services.loadbalancers",)),)


@pytest.mark.parametrize(
    ("quotas", "limited", "expected"),
    [
        # TestAdmitLimitedResourceNoQuota
        pytest.param(
            [], LIMIT_POD_CPU, "insufficient quota to consume: cpu,requests.cpu", id="no-quota"
        ),
        # TestAdmitLimitedResourceNoQuotaIgnoresNonMatchingResources
        pytest.param(
            [], (LimitedResource("", "services", ("services",)),), None, id="other-resource"
        ),
        # TestAdmitLimitedResourceWithQuota: matchContains requests.cpu, covered
        pytest.param(
            [resource_quota("quota", {"requests.cpu": "10"}, {"requests.cpu": "1"})],
            (LimitedResource("", "pods", ("requests.cpu",)),),
            None,
            id="with-quota",
        ),
        # TestAdmitLimitedResourceWithMultipleQuota
        pytest.param(
            [
                resource_quota("quota1", {"requests.cpu": "10"}, {"requests.cpu": "1"}),
                resource_quota("quota2", {"memory": "10Gi"}, {"memory": "1Gi"}),
            ],
            (LimitedResource("", "pods", ("requests.cpu",)),),
            None,
            id="multiple-quota",
        ),
        # TestAdmitLimitedResourceWithQuotaThatDoesNotCover
        pytest.param(
            [resource_quota("quota", {"memory": "10Gi"}, {"memory": "1Gi"})],
            LIMIT_POD_CPU,
            "insufficient quota to consume: cpu,requests.cpu",
            id="does-not-cover",
        ),
    ],
)
def test_limited_resources(
    quotas: list[Obj], limited: tuple[LimitedResource, ...], expected: str | None
) -> None:
    attributes = create(pod("p", {"cpu": "3", "memory": "2Gi"}))
    if expected is None:
        check(quotas, attributes, limited)
        return
    error = denied(quotas, attributes, limited=limited)
    assert 403 == error.code
    assert expected == error.message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # TestAdmitZeroDeltaUsageWithoutCoveringQuota
        pytest.param(
            service("service", "LoadBalancer", resource_version="1"),
            service("service", "LoadBalancer"),
            None,
            id="zero-delta",
        ),
        # TestAdmitRejectIncreaseUsageWithoutCoveringQuota
        pytest.param(
            service("service", "NodePort", ports=1, resource_version="1"),
            service("service", "LoadBalancer"),
            "insufficient quota to consume: services.loadbalancers",
            id="increase",
        ),
        # TestAdmitAllowDecreaseUsageWithoutCoveringQuota
        pytest.param(
            service("service", "LoadBalancer", resource_version="1"),
            service("service", "NodePort", ports=1),
            None,
            id="decrease",
        ),
    ],
)
def test_limited_resources_on_update(old: Obj, new: Obj, expected: str | None) -> None:
    attributes = update(new, old, SERVICES)
    if expected is None:
        assert [] == check([], attributes, LIMIT_LB)
        return
    error = denied([], attributes, limited=LIMIT_LB)
    assert expected == error.message


def test_uncovered_scopes_are_a_500_in_go_slice_format() -> None:
    # TestAdmitLimitedScopeWithCoverQuota, "Both the scopes matches pod …": a plain
    # fmt.Errorf("insufficient quota to match these scopes: %v") → 500
    limited = (
        LimitedResource(
            "",
            "pods",
            (),
            (parse_scope_requirement({"scopeName": "BestEffort", "operator": "Exists"}),),
        ),
        LimitedResource(
            "",
            "pods",
            (),
            (
                parse_scope_requirement(
                    {"scopeName": "PriorityClass", "operator": "In", "values": ["cluster-services"]}
                ),
            ),
        ),
    )
    error = denied([], create(pod("p", priority_class_name="cluster-services")), limited=limited)
    assert 500 == error.code
    assert (
        "insufficient quota to match these scopes: "
        "[{BestEffort Exists []} {PriorityClass In [cluster-services]}]"
    ) == error.message


# -- check_batch: phase 1 of checkQuotas --


def test_batch_running_totals_refusals_and_dry_run() -> None:
    # checkQuotas phase 1: each request against the running quotas; a refused request leaves
    # them unchanged; a dry-run request is judged but never added.
    q = resource_quota("quota", {"pods": "2"}, {"pods": "0"})
    evaluator = REGISTRY.get_or_count(PODS)
    assert evaluator is not None
    requests = [
        Request(create(pod("dry", {"cpu": "1"}), dry_run=True), evaluator),  # judged, not added
        Request(create(pod("a")), evaluator),  # used 1
        Request(create(pod("b")), evaluator),  # used 2
        Request(create(pod("dry-too-many"), dry_run=True), evaluator),  # judged → refused
        Request(create(pod("c")), evaluator),  # refused, totals unchanged
        Request(
            Attributes("test", "x", PODS, "", "UPDATE", pod("x"), pod("x", resource_version="1")),
            evaluator,
        ),
    ]
    result = check_batch([q], requests)
    assert [1, 2] == result.pending
    assert [0] == result.changed
    assert {"pods": "2"} == used_of(result.quotas[0])
    assert result.decisions[0] is None
    refused = result.decisions[3]
    assert refused is not None
    assert (
        "exceeded quota: quota, requested: pods=1, used: pods=2, limited: pods=2" == refused.message
    )
    assert result.decisions[4] == refused
    assert result.decisions[5] is None  # not handled: changes nothing, allowed at once


def test_batch_with_only_unchanging_requests_changes_nothing() -> None:
    q = resource_quota("quota", {"services": "2"}, {"services": "0"})
    evaluator = REGISTRY.get_or_count(PODS)
    assert evaluator is not None
    result = check_batch([q], [Request(create(pod("a")), evaluator)])
    assert [] == result.changed
    assert [] == result.pending
    assert {0: None} == result.decisions


# -- configuration --


def test_parse_configuration() -> None:
    config = parse_configuration(
        {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "ResourceQuotaConfiguration",
            "limitedResources": [
                {
                    "resource": "persistentvolumeclaims",
                    "matchContains": [".storageclass.storage.k8s.io/requests.storage"],
                },
                {
                    "apiGroup": "",
                    "resource": "pods",
                    "matchScopes": [
                        {
                            "scopeName": "PriorityClass",
                            "operator": "In",
                            "values": ["cluster-services"],
                        }
                    ],
                },
            ],
        }
    )
    assert 2 == len(config.limited_resources)
    first, second = config.limited_resources
    assert PVCS == first.group_resource
    assert (".storageclass.storage.k8s.io/requests.storage",) == first.match_contains
    assert "{PriorityClass In [cluster-services]}" == str(second.match_scopes[0])
    assert Configuration() == parse_configuration(None)
    assert Configuration() == parse_configuration(
        {"apiVersion": "resourcequota.admission.k8s.io/v1beta1", "kind": "Configuration"}
    )


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param([], "", id="not-an-object"),
        pytest.param(
            {"apiVersion": "v1", "kind": "ResourceQuotaConfiguration"},
            "apiVersion/kind",
            id="wrong-type",
        ),
        pytest.param(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "ResourceQuotaConfiguration",
                "limitedResource": [],
            },
            "limitedResource",
            id="typo",
        ),
        pytest.param(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "ResourceQuotaConfiguration",
                "limitedResources": [{"matchContains": ["cpu"]}],
            },
            "limitedResources[0].resource",
            id="resource-required",
        ),
        pytest.param(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "ResourceQuotaConfiguration",
                "limitedResources": [{"resource": "pods", "matchContains": "cpu"}],
            },
            "limitedResources[0].matchContains",
            id="contains-not-a-list",
        ),
        pytest.param(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "ResourceQuotaConfiguration",
                "limitedResources": [
                    {
                        "resource": "pods",
                        "matchScopes": [
                            {"scopeName": "BestEffort", "operator": "In", "values": ["x"]}
                        ],
                    }
                ],
            },
            "limitedResources[0].matchScopes[0]",
            id="bad-scope",
        ),
    ],
)
def test_parse_configuration_errors(raw: object, field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_configuration(raw)
    assert field == info.value.field


# -- odds and ends --


def test_namespace_creation() -> None:
    ns = {"metadata": {"name": "n"}}
    assert is_namespace_creation(
        Attributes("n", "n", GroupResource("", "namespaces"), "", "CREATE", ns)
    )
    assert not is_namespace_creation(
        Attributes("n", "n", GroupResource("", "namespaces"), "", "UPDATE", ns, ns)
    )


def test_updated_quotas_prefers_newer_writes() -> None:
    # resource_access.go checkCache: the newer resourceVersion wins; a caught-up cache drops
    # the entry.
    cache = UpdatedQuotas(size=2)
    cached = resource_quota("q", {"pods": "5"}, {"pods": "1"}, resource_version="10")
    written = resource_quota("q", {"pods": "5"}, {"pods": "2"}, resource_version="11")
    cache.add(written)
    assert cache.check_cache(cached) is written
    caught_up = resource_quota("q", {"pods": "5"}, {"pods": "2"}, resource_version="11")
    assert cache.check_cache(caught_up) is caught_up
    assert 0 == len(cache)
    for name in ("a", "b", "c"):
        cache.add(resource_quota(name, {}, {}, resource_version="5"))
    assert 2 == len(cache)  # LRU bound
    old_a = resource_quota("a", {}, {}, resource_version="1")
    assert cache.check_cache(old_a) is old_a  # "a" was evicted


def test_to_strings_round_trip_of_charged_values() -> None:
    # what a charge writes parses back to the same quantities
    q = resource_quota("q", {"requests.memory": "100Gi"}, {"requests.memory": "50Gi"})
    [charged] = check([q], create(pod("p", {"memory": "2Gi"})))
    assert quota.equals(
        parse_resource_list({"requests.memory": "52Gi"}), parse_resource_list(used_of(charged))
    )


# -- tally: an update that fixes an object a measure could not read


def test_an_update_fixing_an_object_a_measure_fails_on_is_charged_its_whole_new_value() -> None:
    # The stored database has no spec.replicas (it predates the measure): its count is known
    # (1), its replicas never were. The fix asks for replicas 3: charged 3, and no second count.
    dbs = GroupResource("example.com", "databases")
    replicas = "example.com/replicas"
    measured = MeasuredEvaluator(dbs, [compile_measure({
        "name": replicas, "resource": {"group": dbs.group, "resource": dbs.resource},
        "expression": "object.spec.replicas",
    })])  # fmt: skip
    count = "count/databases.example.com"
    quota = resource_quota("q", {replicas: "10", count: "5"}, {replicas: "4", count: "2"})
    old = {"metadata": {"name": "d", "namespace": "test", "resourceVersion": "5"}, "spec": {}}
    new = {"metadata": {"name": "d", "namespace": "test", "resourceVersion": "5"},
           "spec": {"replicas": 3}}  # fmt: skip
    (charged,) = check_request([quota], update(new, old, dbs), measured)
    assert {replicas: "7", count: "2"} == used_of(charged)
    # Past the limit it is refused in quota's words, as any update.
    too_big = {**new, "spec": {"replicas": 7}}
    with pytest.raises(AdmissionDenied) as info:
        check_request([quota], update(too_big, old, dbs), measured)
    assert 403 == info.value.code
