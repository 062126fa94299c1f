"""The persistent volume claim evaluator: claims and requested storage, per storage class.

A port of upstream ``pkg/quota/v1/evaluator/core/persistent_volume_claims.go`` with the
``VolumeAttributesClass`` feature on (GA since 1.34).

Usage of one claim: ``persistentvolumeclaims`` = ``count/persistentvolumeclaims`` = 1, and
``requests.storage`` = the storage request rounded up to whole bytes, or
``status.allocatedResources.storage`` (rounded too) when that is larger, e.g. during an
expansion; no storage key without a storage request. A claim with a storage class also charges
``<class>.storageclass.storage.k8s.io/persistentvolumeclaims`` and, with storage,
``<class>.storageclass.storage.k8s.io/requests.storage``. The class is the beta annotation
``volume.beta.kubernetes.io/storage-class`` when present (even when empty), else
``spec.storageClassName``.

Scopes: only ``VolumeAttributesClass``, evaluated over the set of classes the claim references
(``spec.volumeAttributesClassName``, ``status.currentVolumeAttributesClassName``,
``status.modifyVolumeStatus.targetVolumeAttributesClassName``, empty values dropped): ``Exists``
asks for a non-empty set; any other operator is satisfied by any one name, and an empty set is
matched as the empty label set (so ``NotIn`` and ``DoesNotExist`` match claims without one).

Admission: CREATE and UPDATE (expansion charges the increase), and updates of the ``status``
subresource. Upstream's ``RequiresQuotaReplenish`` compares two freshly allocated pointers
(``Storage()`` returns the address of a copy), so it is always true: every status update is
handled and every update triggers replenishment. We port that behaviour, not the intent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from tally.evaluators import base
from tally.evaluators.base import (
    GroupResource,
    Obj,
    ObjectError,
    Operation,
    ScopeName,
    ScopeRequirement,
    get_mapping,
    get_resource_list,
    get_str,
)
from tally.machinery.selectors import Operator
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = [
    "PVC_RESOURCES",
    "PersistentVolumeClaimEvaluator",
    "persistent_volume_claim_class",
    "referenced_volume_attributes_class_names",
    "resource_by_storage_class",
]

PERSISTENT_VOLUME_CLAIMS: Final = GroupResource("", "persistentvolumeclaims")
PVC_OBJECT_COUNT_NAME: Final = "count/persistentvolumeclaims"
PVC_RESOURCES: Final = ("persistentvolumeclaims", "requests.storage")
"""Names that may also be refined by storage class (upstream ``pvcResources``)."""
STORAGE_CLASS_SUFFIX: Final = ".storageclass.storage.k8s.io/"
BETA_STORAGE_CLASS_ANNOTATION: Final = "volume.beta.kubernetes.io/storage-class"

_ONE: Final = Quantity.from_int(1)


def resource_by_storage_class(storage_class: str, resource_name: str) -> str:
    """``<class>.storageclass.storage.k8s.io/<resource>`` (``V1ResourceByStorageClass``)."""
    return storage_class + STORAGE_CLASS_SUFFIX + resource_name


def persistent_volume_claim_class(pvc: Obj) -> str:
    """The beta annotation if present, else ``spec.storageClassName``, else ``""``."""
    annotations = get_mapping(get_mapping(pvc, "metadata"), "annotations", "metadata.annotations")
    if BETA_STORAGE_CLASS_ANNOTATION in annotations:
        value = annotations[BETA_STORAGE_CLASS_ANNOTATION]
        if not isinstance(value, str):
            raise ObjectError(
                f"metadata.annotations[{BETA_STORAGE_CLASS_ANNOTATION}]", "expected a string"
            )
        return value
    return get_str(get_mapping(pvc, "spec"), "storageClassName", "spec.storageClassName")


def referenced_volume_attributes_class_names(pvc: Obj) -> frozenset[str]:
    """Every non-empty VolumeAttributesClass name the claim references."""
    spec = get_mapping(pvc, "spec")
    status = get_mapping(pvc, "status")
    modify = get_mapping(status, "modifyVolumeStatus", "status.modifyVolumeStatus")
    names = (
        get_str(spec, "volumeAttributesClassName", "spec.volumeAttributesClassName"),
        get_str(
            status, "currentVolumeAttributesClassName", "status.currentVolumeAttributesClassName"
        ),
        get_str(
            modify,
            "targetVolumeAttributesClassName",
            "status.modifyVolumeStatus.targetVolumeAttributesClassName",
        ),
    )
    return frozenset(name for name in names if name)


def _round_up_to_bytes(quantity: Quantity) -> Quantity:
    """Storage is charged in whole bytes (upstream rounds up too): a quota status with a
    fractional byte count would fail ResourceQuota validation."""
    rounded, exact = quantity.round_up(0)
    return quantity if exact else rounded


def _storage_usage(pvc: Obj) -> Quantity | None:
    """``getStorageUsage``: the request, or the allocated size when it is larger."""
    spec_resources = get_mapping(get_mapping(pvc, "spec"), "resources", "spec.resources")
    requests = get_resource_list(spec_resources, "requests", "spec.resources.requests")
    result = None
    request = requests.get("storage")
    if request is not None:
        result = _round_up_to_bytes(request)
    allocated_resources = get_resource_list(
        get_mapping(pvc, "status"), "allocatedResources", "status.allocatedResources"
    )
    allocated = allocated_resources.get("storage")
    if result is not None and allocated is not None and allocated.nanos > result.nanos:
        result = _round_up_to_bytes(allocated)
    return result


class PersistentVolumeClaimEvaluator:
    """Upstream ``pvcEvaluator``."""

    @property
    def group_resource(self) -> GroupResource:
        return PERSISTENT_VOLUME_CLAIMS

    def project(self, obj: Obj) -> Obj:
        return obj

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        result = []
        for name in names:
            # the object count, the static names, or a static name refined by storage class
            if (
                name == PVC_OBJECT_COUNT_NAME
                or name in PVC_RESOURCES
                or any(name.endswith(STORAGE_CLASS_SUFFIX + r) for r in PVC_RESOURCES)
            ):
                result.append(name)
        return result

    def usage(self, obj: Obj) -> ResourceList:
        if not isinstance(obj, Mapping):
            raise ObjectError("persistentvolumeclaim", f"expected an object, got {type(obj)}")
        result = {"persistentvolumeclaims": _ONE, PVC_OBJECT_COUNT_NAME: _ONE}
        storage_class = persistent_volume_claim_class(obj)
        if storage_class:
            result[resource_by_storage_class(storage_class, "persistentvolumeclaims")] = _ONE
        storage = _storage_usage(obj)
        if storage is not None:
            result["requests.storage"] = storage
            if storage_class:
                result[resource_by_storage_class(storage_class, "requests.storage")] = storage
        return result

    def constraints(self, required: Iterable[str], obj: Obj) -> None:
        """No constraints for claims."""

    handled_operations: Final = base.handled(
        [Operation.CREATE, Operation.UPDATE], status=[Operation.UPDATE]
    )
    """``status`` as :meth:`handles` takes it. The webhook's rules route no ``/status``
    subresource (:mod:`tally.webhook.configuration` says why), so admission never sees one and
    a status write's change of usage is counted by the next recalculation."""

    def handles(self, operation: str, subresource: str, old: Obj | None, new: Obj | None) -> bool:
        if subresource == "":
            return operation in (Operation.CREATE, Operation.UPDATE)
        if subresource == "status":
            # Upstream: RequiresQuotaReplenish, always true for two claims (see docstring).
            return isinstance(old, Mapping) and isinstance(new, Mapping)
        return False

    def matches_scope(self, scope: ScopeRequirement, obj: Obj) -> bool:
        if scope.scope_name is not ScopeName.VOLUME_ATTRIBUTES_CLASS:
            return False
        names = referenced_volume_attributes_class_names(obj)
        if scope.operator is Operator.EXISTS:
            return bool(names)
        req = scope.label_requirement()
        if not names:
            return req.matches({})
        key = str(ScopeName.VOLUME_ATTRIBUTES_CLASS)
        return any(req.matches({key: name}) for name in names)

    def matches(self, quota_obj: Obj, obj: Obj) -> bool:
        return base.matches_quota(self, quota_obj, obj)

    def matching_scopes(
        self, obj: Obj, scopes: Sequence[ScopeRequirement]
    ) -> list[ScopeRequirement]:
        return base.matching_scopes(self, obj, scopes)

    def uncovered_quota_scopes(
        self, limited: Sequence[ScopeRequirement], matched: Sequence[ScopeRequirement]
    ) -> list[ScopeRequirement]:
        return base.uncovered_quota_scopes(limited, matched)

    def usage_stats(
        self, objects: Iterable[Obj], resources: Iterable[str], scopes: Sequence[ScopeRequirement]
    ) -> dict[str, Quantity]:
        def matches(obj: Obj) -> bool:
            return all(self.matches_scope(scope, obj) for scope in scopes)

        return base.calculate_usage_stats(
            objects, resources, matches, lambda obj: self.usage(obj).items()
        )

    def requires_replenishment(self, old: Obj, new: Obj) -> bool:
        """Always: upstream's filter compares fresh pointers (see the module docstring)."""
        return True
