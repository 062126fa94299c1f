"""The PVC evaluator, ported from ``persistent_volume_claims_test.go`` (evaluator/core)."""

from __future__ import annotations

from typing import Any

import pytest

from tally.evaluators import ObjectError, PersistentVolumeClaimEvaluator, ScopeRequirement
from tally.evaluators.base import ScopeName, parse_scope_requirement
from tally.machinery.selectors import Operator
from tally.quota import resources as quota
from tally.quota.quantity import parse_quantity

pytestmark = pytest.mark.unit

GOLD_CLAIMS = "gold.storageclass.storage.k8s.io/persistentvolumeclaims"
GOLD_STORAGE = "gold.storageclass.storage.k8s.io/requests.storage"


def claim(
    storage: str | None = "10Gi",
    storage_class: str | None = None,
    *,
    annotations: dict[str, str] | None = None,
    allocated: str | None = None,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "foo", "namespace": "ns"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "key2", "operator": "Exists"}]},
            "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "resources": {"requests": {"storage": storage}} if storage else {},
            **(spec or {}),
        },
        "status": dict(status or {}),
    }
    if storage_class is not None:
        body["spec"]["storageClassName"] = storage_class
    if annotations:
        body["metadata"]["annotations"] = annotations
    if allocated is not None:
        body["status"]["allocatedResources"] = {"storage": allocated}
    return body


def base_usage(storage: str | None) -> dict[str, str]:
    result = {"persistentvolumeclaims": "1", "count/persistentvolumeclaims": "1"}
    if storage:
        result["requests.storage"] = storage
    return result


# TestPersistentVolumeClaimEvaluatorUsage
@pytest.mark.parametrize(
    ("obj", "usage"),
    [
        pytest.param(claim(), base_usage("10Gi"), id="pvc-usage"),
        pytest.param(
            claim(storage_class="gold"),
            {**base_usage("10Gi"), GOLD_STORAGE: "10Gi", GOLD_CLAIMS: "1"},
            id="pvc-usage-by-class",
        ),
        pytest.param(claim("1001m"), base_usage("2"), id="pvc-usage-rounded"),
        pytest.param(
            claim("1001m", "gold"),
            {**base_usage("2"), GOLD_STORAGE: "2", GOLD_CLAIMS: "1"},
            id="pvc-usage-by-class-rounded",
        ),
        pytest.param(
            claim("5G", allocated="10G"),
            base_usage("10G"),
            id="pvc-usage-higher-allocated-resource",
        ),
        pytest.param(
            claim("10G", allocated="5G"), base_usage("10G"), id="pvc-usage-lower-allocated-resource"
        ),
        # spec 1.2: the beta annotation wins, even when empty; no storage request -> no key
        pytest.param(
            claim(
                storage_class="silver",
                annotations={"volume.beta.kubernetes.io/storage-class": "gold"},
            ),
            {**base_usage("10Gi"), GOLD_STORAGE: "10Gi", GOLD_CLAIMS: "1"},
            id="spec: beta annotation wins",
        ),
        pytest.param(
            claim(
                storage_class="gold", annotations={"volume.beta.kubernetes.io/storage-class": ""}
            ),
            base_usage("10Gi"),
            id="spec: empty beta annotation means no class",
        ),
        pytest.param(
            claim(None, "gold"), {**base_usage(None), GOLD_CLAIMS: "1"}, id="spec: no request"
        ),
        pytest.param(claim(None, allocated="5Gi"), base_usage(None), id="spec: allocated alone"),
        pytest.param(
            claim("1001m", allocated="1500m"), base_usage("2"), id="spec: allocated rounded up"
        ),
    ],
)
def test_usage(obj: dict[str, Any], usage: dict[str, str]) -> None:
    got = PersistentVolumeClaimEvaluator().usage(obj)
    assert quota.equals(got, {k: parse_quantity(v) for k, v in usage.items()}), quota.to_strings(
        got
    )


def test_rounding_keeps_exact_values_untouched() -> None:
    # roundUpFunc returns the original quantity when RoundUp(0) is exact
    got = PersistentVolumeClaimEvaluator().usage(claim("10Gi"))
    assert got["requests.storage"].canonical() == "10Gi"
    assert (
        PersistentVolumeClaimEvaluator().usage(claim("1001m"))["requests.storage"].canonical()
        == "2"
    )


# TestPersistentVolumeClaimEvaluatorMatchingResources
@pytest.mark.parametrize(
    ("items", "want"),
    [
        pytest.param(
            [
                "count/persistentvolumeclaims",
                "requests.storage",
                "persistentvolumeclaims",
                GOLD_STORAGE,
                GOLD_CLAIMS,
            ],
            [
                "count/persistentvolumeclaims",
                "requests.storage",
                "persistentvolumeclaims",
                GOLD_STORAGE,
                GOLD_CLAIMS,
            ],
            id="supported-resources",
        ),
        pytest.param(
            [
                "storage",
                "ephemeral-storage",
                "bronze.storageclass.storage.k8s.io/storage",
                "gold.storage.k8s.io/requests.storage",
            ],
            [],
            id="unsupported-resources",
        ),
    ],
)
def test_matching_resources(items: list[str], want: list[str]) -> None:
    assert PersistentVolumeClaimEvaluator().matching_resources(items) == want


def vac(operator: str, *values: str) -> ScopeRequirement:
    return ScopeRequirement(ScopeName.VOLUME_ATTRIBUTES_CLASS, Operator(operator), values)


# TestPersistentVolumeClaimEvaluatorMatchingScopes
@pytest.mark.parametrize(
    ("obj", "selectors", "want"),
    [
        pytest.param(
            claim(),
            [vac("DoesNotExist"), vac("Exists"), vac("In", "class1"), vac("NotIn", "class4")],
            [vac("DoesNotExist"), vac("NotIn", "class4")],
            id="EmptyPVC",
        ),
        pytest.param(
            claim(spec={"volumeAttributesClassName": "class1"}),
            [
                vac("DoesNotExist"),
                vac("Exists"),
                vac("In", "class1"),
                vac("In", "class4"),
                vac("NotIn", "class4"),
            ],
            [vac("Exists"), vac("In", "class1"), vac("NotIn", "class4")],
            id="VolumeAttributesClass",
        ),
        pytest.param(
            claim(
                spec={"volumeAttributesClassName": "class1"},
                status={"currentVolumeAttributesClassName": "class2"},
            ),
            [
                vac("DoesNotExist"),
                vac("Exists"),
                vac("In", "class1"),
                vac("In", "class2"),
                vac("In", "class1", "class2"),
                vac("In", "class1", "class2", "class4"),
                vac("In", "class4"),
                vac("NotIn", "class4"),
            ],
            [
                vac("Exists"),
                vac("In", "class1"),
                vac("In", "class2"),
                vac("In", "class1", "class2"),
                vac("In", "class1", "class2", "class4"),
                vac("NotIn", "class4"),
            ],
            id="VolumeAttributesClassWithTarget",
        ),
        pytest.param(
            claim(
                spec={"volumeAttributesClassName": "class1"},
                status={
                    "currentVolumeAttributesClassName": "class2",
                    "modifyVolumeStatus": {"targetVolumeAttributesClassName": "class3"},
                },
            ),
            [
                vac("DoesNotExist"),
                vac("Exists"),
                vac("In", "class1"),
                vac("In", "class2"),
                vac("In", "class3"),
                vac("In", "class1", "class2", "class3"),
                vac("In", "class1", "class2", "class3", "class4"),
                vac("In", "class4"),
                vac("NotIn", "class4"),
            ],
            [
                vac("Exists"),
                vac("In", "class1"),
                vac("In", "class2"),
                vac("In", "class3"),
                vac("In", "class1", "class2", "class3"),
                vac("In", "class1", "class2", "class3", "class4"),
                vac("NotIn", "class4"),
            ],
            id="VolumeAttributesClassWithModityStatus",
        ),
    ],
)
def test_matching_scopes(
    obj: dict[str, Any], selectors: list[ScopeRequirement], want: list[ScopeRequirement]
) -> None:
    assert PersistentVolumeClaimEvaluator().matching_scopes(obj, selectors) == want


# TestPersistentVolumeClaimEvaluatorHandles (+ the status subresource, see pvcs.py)
@pytest.mark.parametrize(
    ("operation", "subresource", "old", "new", "want"),
    [
        pytest.param("CREATE", "", None, None, True, id="create"),
        pytest.param("UPDATE", "", None, None, True, id="update"),
        pytest.param("DELETE", "", None, None, False, id="delete"),
        pytest.param("CONNECT", "", None, None, False, id="connect"),
        pytest.param("CREATE", "subresource", None, None, False, id="create-subresource"),
        pytest.param("UPDATE", "subresource", None, None, False, id="update-subresource"),
        pytest.param("UPDATE", "status", claim(), claim(), True, id="status-update"),
    ],
)
def test_handles(operation: str, subresource: str, old: Any, new: Any, want: bool) -> None:
    assert PersistentVolumeClaimEvaluator().handles(operation, subresource, old, new) is want


def test_usage_stats_with_scope_and_replenishment() -> None:
    ev = PersistentVolumeClaimEvaluator()
    objs = [
        claim("1Gi", "gold", spec={"volumeAttributesClassName": "fast"}),
        claim("2Gi", "gold"),
        claim("4Gi"),
    ]
    names = ["requests.storage", GOLD_STORAGE, "persistentvolumeclaims"]
    assert quota.to_strings(ev.usage_stats(objs, names, [])) == {
        GOLD_STORAGE: "3Gi",
        "persistentvolumeclaims": "3",
        "requests.storage": "7Gi",
    }
    exists = parse_scope_requirement({"scopeName": "VolumeAttributesClass", "operator": "Exists"})
    assert quota.to_strings(ev.usage_stats(objs, names, [exists])) == {
        GOLD_STORAGE: "1Gi",
        "persistentvolumeclaims": "1",
        "requests.storage": "1Gi",
    }
    # spec 3: every PVC update replenishes
    assert ev.requires_replenishment(claim(), claim())


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        pytest.param(claim("big"), "spec.resources.requests[storage]", id="bad-quantity"),
        pytest.param({"spec": {"resources": []}}, "spec.resources", id="resources-type"),
        pytest.param(
            {"metadata": {"annotations": {"volume.beta.kubernetes.io/storage-class": 5}}},
            "metadata.annotations[volume.beta.kubernetes.io/storage-class]",
            id="annotation-type",
        ),
    ],
)
def test_malformed(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError) as info:
        PersistentVolumeClaimEvaluator().usage(obj)
    assert info.value.field == field
