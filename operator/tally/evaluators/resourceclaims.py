"""The ResourceClaim evaluator: claims and the devices they request, per device class.

A port of upstream ``pkg/quota/v1/evaluator/core/resource_claims.go`` (v1.37). Every claim
counts 1 for ``count/resourceclaims.resource.k8s.io``, and for each of its
``spec.devices.requests[]``:

- ``exactly``: ``<deviceClassName>.deviceclass.resource.k8s.io/devices`` += the number of
  devices: ``count`` for allocation mode ``ExactCount``, :data:`ALLOCATION_RESULTS_MAX_SIZE`
  (the worst case) for ``All``, nothing for an unknown mode (a newer server's, after a
  downgrade: upstream does not charge it either);
- ``firstAvailable``: one of the subrequests will be allocated, so the worst case per device
  class: the maximum over the subrequests of each class, then added;
- anything else (a future request type): nothing.

Admin access is *not* exempt from quota. Claims have no scopes (a scoped quota never matches
them) and no constraints. Admission: CREATE and UPDATE of the main resource only (upstream
``Handles`` refuses any subresource, e.g. ``status``). The spec of a claim is immutable, so no
update calls for replenishment; deletes always do.

The v1 shape is the one read (the version tally lists and watches). A request in the v1beta1
shape (``deviceClassName``, ``allocationMode``, ``count`` on the request itself, no
``exactly``), which admission may receive when a client writes through v1beta1, is read the same
way as ``exactly``: upstream converts every version to v1 before it measures.

Not ported: the ``DRAExtendedResource`` part (GA and locked on at v1.37), which also charges
``requests.deviceclass.resource.kubernetes.io/<class>`` and ``requests.<extended resource>``
for classes that map to an extended resource, minus what the owning pod's requests already
charged. It needs a DeviceClass informer and pod lookups; tally neither matches those names here
nor measures them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from tally.evaluators import base
from tally.evaluators.base import (
    GroupResource,
    Obj,
    ObjectError,
    Operation,
    ScopeRequirement,
    get_list,
    get_mapping,
    get_str,
    object_count_resource_name,
)
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = [
    "ALLOCATION_RESULTS_MAX_SIZE",
    "CLAIM_OBJECT_COUNT_NAME",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIMS_PER_CLASS",
    "ResourceClaimEvaluator",
    "resource_by_device_class",
]

RESOURCE_CLAIMS: Final = GroupResource("resource.k8s.io", "resourceclaims")

CLAIM_OBJECT_COUNT_NAME: Final = object_count_resource_name(RESOURCE_CLAIMS)
"""``count/resourceclaims.resource.k8s.io`` (upstream ``ClaimObjectCountName``)."""

RESOURCE_CLAIMS_PER_CLASS: Final = ".deviceclass.resource.k8s.io/devices"
"""Upstream ``corev1.ResourceClaimsPerClass``: the suffix of the per-device-class names."""

ALLOCATION_RESULTS_MAX_SIZE: Final = 32
"""Upstream ``resourceapi.AllocationResultsMaxSize`` (``k8s.io/api/resource/v1``, v1.37): the
most devices one claim can be allocated, charged for allocation mode ``All``."""

_EXACT_COUNT: Final = "ExactCount"
_ALL: Final = "All"
_ONE: Final = Quantity.from_int(1)


def resource_by_device_class(class_name: str) -> str:
    """``gpu`` -> ``gpu.deviceclass.resource.k8s.io/devices`` (``V1ResourceByDeviceClass``)."""
    return class_name + RESOURCE_CLAIMS_PER_CLASS


def _device_count(request: Mapping[str, Any], field: str) -> int:
    """How many devices one exact request or subrequest may be allocated (worst case)."""
    mode = get_str(request, "allocationMode", f"{field}.allocationMode")
    if mode == _EXACT_COUNT:
        count = request.get("count", 0)
        if count is None:
            return 0
        if not isinstance(count, int) or isinstance(count, bool):
            raise ObjectError(f"{field}.count", f"expected an integer, got {count!r}")
        return count
    if mode == _ALL:
        return ALLOCATION_RESULTS_MAX_SIZE
    # An unknown mode (after a downgrade) does not count towards the quota.
    return 0


def _mapping_at(items: Sequence[Any], index: int, field: str) -> Mapping[str, Any]:
    item = items[index]
    if not isinstance(item, Mapping):
        raise ObjectError(f"{field}[{index}]", f"expected an object, got {type(item).__name__}")
    return item


def claim_usage(claim: Obj) -> dict[str, int]:
    """Devices per quota name of one claim (upstream ``Usage``, without the count)."""
    if not isinstance(claim, Mapping):
        raise ObjectError("resourceclaim", f"expected an object, got {type(claim).__name__}")
    devices = get_mapping(get_mapping(claim, "spec"), "devices", "spec.devices")
    requests = get_list(devices, "requests", "spec.devices.requests")
    result: dict[str, int] = {}
    for i in range(len(requests)):
        field = f"spec.devices.requests[{i}]"
        request = _mapping_at(requests, i, "spec.devices.requests")
        subrequests = get_list(request, "firstAvailable", f"{field}.firstAvailable")
        if subrequests:
            # Worst case per device class over the subrequests, then added.
            worst: dict[str, int] = {}
            for j in range(len(subrequests)):
                sub_field = f"{field}.firstAvailable[{j}]"
                subrequest = _mapping_at(subrequests, j, f"{field}.firstAvailable")
                name = resource_by_device_class(
                    get_str(subrequest, "deviceClassName", f"{sub_field}.deviceClassName")
                )
                worst[name] = max(worst.get(name, 0), _device_count(subrequest, sub_field))
            for name, count in worst.items():
                result[name] = result.get(name, 0) + count
            continue
        exactly = request.get("exactly")
        if exactly is not None:
            exact_field = f"{field}.exactly"
            if not isinstance(exactly, Mapping):
                raise ObjectError(exact_field, f"expected an object, got {type(exactly).__name__}")
        elif "deviceClassName" in request:
            # v1beta1: the exact request's fields are on the request itself.
            exactly, exact_field = request, field
        else:
            continue  # some unknown, future request type: no quota for it
        name = resource_by_device_class(
            get_str(exactly, "deviceClassName", f"{exact_field}.deviceClassName")
        )
        result[name] = result.get(name, 0) + _device_count(exactly, exact_field)
    return result


class ResourceClaimEvaluator(base.NoScopes):
    """Upstream ``claimEvaluator``."""

    @property
    def group_resource(self) -> GroupResource:
        return RESOURCE_CLAIMS

    def project(self, obj: Obj) -> Obj:
        return obj

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        # Upstream keeps the input order; callers treat the result as a set.
        return [
            name
            for name in names
            if name == CLAIM_OBJECT_COUNT_NAME or name.endswith(RESOURCE_CLAIMS_PER_CLASS)
        ]

    def usage(self, obj: Obj) -> ResourceList:
        result: dict[str, Quantity] = {CLAIM_OBJECT_COUNT_NAME: _ONE}
        for name, count in claim_usage(obj).items():
            result[name] = Quantity.from_int(count)
        return result

    def constraints(self, required: Iterable[str], obj: Obj) -> None:
        """No constraints for resource claims."""

    handled_operations: Final = base.handled([Operation.CREATE, Operation.UPDATE])
    """Upstream's ``Handles`` takes updates too, although a claim's spec is immutable: its
    update never charges anything, and the rule costs a review per claim update."""

    def handles(self, operation: str, subresource: str, old: Obj | None, new: Obj | None) -> bool:
        return subresource == "" and operation in (Operation.CREATE, Operation.UPDATE)

    def usage_stats(
        self, objects: Iterable[Obj], resources: Iterable[str], scopes: Sequence[ScopeRequirement]
    ) -> dict[str, Quantity]:
        return base.scoped_usage_stats(self, objects, resources, scopes)

    def requires_replenishment(self, old: Obj, new: Obj) -> bool:
        """A claim's spec is immutable: an update never lowers usage."""
        return False
