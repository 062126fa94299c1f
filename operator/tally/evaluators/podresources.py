"""A pod's effective requests and limits: the pod resource formula of
``k8s.io/component-helpers/resource/helpers.go`` (``PodRequests``/``PodLimits``), with the
feature gates at their 1.34+ defaults: ``PodLevelResources`` and ``InPlacePodVerticalScaling``
on, the alpha ``InPlacePodLevelResourcesVerticalScaling`` off.

The formula: containers summed; init containers walked in order, a restartable one
(``restartPolicy: Always``, a sidecar) adding to the running total, a regular one needing its
own requests plus the sidecars started before it; the element-wise max of the two; pod-level
``spec.resources`` (cpu, memory, hugepages-*) replacing computed values; ``spec.overhead``
added to requests and to limits that exist and are non-zero. With in-place resize, each
container's value is the max of spec, ``allocatedResources`` and actual ``status.resources``
(actual and allocated only, while a resize is marked Infeasible).

Its own module because it is upstream's own package, not the quota evaluator's: what a pod
requests is one question whose answer :mod:`tally.evaluators.pods` charges and whose parsed
form (:class:`PodResources`, one parse per pod for both sums) :mod:`tally.evaluators.qos`
reads too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from tally.evaluators.base import (
    Obj,
    ObjectError,
    get_list,
    get_mapping,
    get_resource_list,
    get_str,
)
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = [
    "Container",
    "ContainerStatus",
    "PodResources",
    "effective_limits",
    "effective_requests",
    "pod_limits",
    "pod_requests",
]

HUGEPAGES_PREFIX: Final = "hugepages-"
"""``v1.ResourceHugePagesPrefix``."""


def _is_supported_pod_level_resource(name: str) -> bool:
    return name in ("cpu", "memory") or name.startswith(HUGEPAGES_PREFIX)


def _add_into(target: dict[str, Quantity], other: ResourceList | None) -> None:
    """``addResourceList``: ``Quantity.Add`` per name."""
    if not other:
        return
    for name, quantity in other.items():
        current = target.get(name)
        target[name] = quantity if current is None else current + quantity


def _max_into(target: dict[str, Quantity], other: ResourceList | None) -> None:
    """``maxResourceList``: take ``other``'s value when missing or strictly greater."""
    if not other:
        return
    for name, quantity in other.items():
        current = target.get(name)
        if current is None or quantity.nanos > current.nanos:
            target[name] = quantity


def _max_of(first: ResourceList | None, *others: ResourceList | None) -> dict[str, Quantity]:
    result = dict(first or {})
    for other in others:
        _max_into(result, other)
    return result


@dataclass(frozen=True, slots=True)
class Container:
    """The parts of one container (or its status) the formula reads, parsed once."""

    name: str
    restartable: bool
    requests: dict[str, Quantity]
    limits: dict[str, Quantity]


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    """A container's allocated and actual resources (``None`` where the status has none)."""

    allocated: dict[str, Quantity] | None
    resources_requests: dict[str, Quantity] | None
    resources_limits: dict[str, Quantity] | None


def _parse_container(raw: object, field: str) -> Container:
    if not isinstance(raw, Mapping):
        raise ObjectError(field, f"expected an object, got {type(raw).__name__}")
    resources = get_mapping(raw, "resources", f"{field}.resources")
    return Container(
        name=get_str(raw, "name", f"{field}.name"),
        restartable=raw.get("restartPolicy") == "Always",
        requests=get_resource_list(resources, "requests", f"{field}.resources.requests"),
        limits=get_resource_list(resources, "limits", f"{field}.resources.limits"),
    )


def _parse_status(raw: object, field: str) -> tuple[str, ContainerStatus]:
    if not isinstance(raw, Mapping):
        raise ObjectError(field, f"expected an object, got {type(raw).__name__}")
    allocated = (
        None
        if raw.get("allocatedResources") is None
        else get_resource_list(raw, "allocatedResources", f"{field}.allocatedResources")
    )
    resources = raw.get("resources")
    requests = limits = None
    if resources is not None:
        res = get_mapping(raw, "resources", f"{field}.resources")
        if res.get("requests") is not None:
            requests = get_resource_list(res, "requests", f"{field}.resources.requests")
        if res.get("limits") is not None:
            limits = get_resource_list(res, "limits", f"{field}.resources.limits")
    return get_str(raw, "name", f"{field}.name"), ContainerStatus(allocated, requests, limits)


@dataclass(frozen=True, slots=True)
class PodResources:
    """A pod's containers, statuses and pod-level fields, parsed once for the formula."""

    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...]
    statuses: dict[str, ContainerStatus]
    infeasible: bool
    pod_requests: dict[str, Quantity] | None
    pod_limits: dict[str, Quantity] | None
    overhead: dict[str, Quantity]

    @classmethod
    def parse(cls, pod: Obj) -> PodResources:
        spec = get_mapping(pod, "spec")
        status = get_mapping(pod, "status")
        containers = tuple(
            _parse_container(c, f"spec.containers[{i}]")
            for i, c in enumerate(get_list(spec, "containers", "spec.containers"))
        )
        init_containers = tuple(
            _parse_container(c, f"spec.initContainers[{i}]")
            for i, c in enumerate(get_list(spec, "initContainers", "spec.initContainers"))
        )
        statuses: dict[str, ContainerStatus] = {}
        # findContainerStatus looks through containerStatuses first, then init statuses.
        for key in ("containerStatuses", "initContainerStatuses"):
            for i, raw in enumerate(get_list(status, key, f"status.{key}")):
                name, parsed = _parse_status(raw, f"status.{key}[{i}]")
                statuses.setdefault(name, parsed)
        pod_level = spec.get("resources")
        pod_requests = pod_limits = None
        if pod_level is not None:
            pod_res = get_mapping(spec, "resources", "spec.resources")
            pod_requests = get_resource_list(pod_res, "requests", "spec.resources.requests")
            pod_limits = get_resource_list(pod_res, "limits", "spec.resources.limits")
        return cls(
            containers=containers,
            init_containers=init_containers,
            statuses=statuses,
            infeasible=_is_pod_resize_infeasible(status),
            pod_requests=pod_requests,
            pod_limits=pod_limits,
            overhead=get_resource_list(spec, "overhead", "spec.overhead"),
        )

    def aggregate(self, fn: _ContainerFn) -> dict[str, Quantity]:
        """``aggregateContainerResourcesByFn``: containers, sidecars and init containers."""
        result: dict[str, Quantity] = {}
        for container in self.containers:
            _add_into(result, fn(container, self.statuses.get(container.name), self.infeasible))
        sidecars: dict[str, Quantity] = {}
        init_max: dict[str, Quantity] = {}
        for container in self.init_containers:
            own = fn(container, self.statuses.get(container.name), self.infeasible)
            if container.restartable:
                # A sidecar keeps running: it adds to the pod total and to every later init
                # container's footprint.
                _add_into(result, own)
                _add_into(sidecars, own)
                footprint = dict(sidecars)
            else:
                footprint = dict(own or {})
                _add_into(footprint, sidecars)
            _max_into(init_max, footprint)
        _max_into(result, init_max)
        return result

    def statuses_change_nothing(self) -> bool:
        """No status carries resources and no resize is Infeasible: then allocated and actual
        values fall back to the spec, and max(spec, allocated, actual) is the spec itself."""
        return not self.infeasible and all(
            s.allocated is None and s.resources_requests is None and s.resources_limits is None
            for s in self.statuses.values()
        )

    def pod_level_requests_set(self) -> bool:
        return any(_is_supported_pod_level_resource(n) for n in self.pod_requests or ())

    def pod_level_resources_set(self) -> bool:
        return self.pod_level_requests_set() or any(
            _is_supported_pod_level_resource(n) for n in self.pod_limits or ()
        )


_ContainerFn: TypeAlias = Callable[[Container, ContainerStatus | None, bool], ResourceList | None]
"""Picks one container's resources: (container, its status or None, resize infeasible)."""


def _is_pod_resize_infeasible(status: Mapping[str, Any]) -> bool:
    for i, condition in enumerate(get_list(status, "conditions", "status.conditions")):
        if not isinstance(condition, Mapping):
            raise ObjectError(f"status.conditions[{i}]", "expected an object")
        if condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False


def _spec_requests(c: Container, _s: ContainerStatus | None, _inf: bool) -> ResourceList:
    return c.requests


def _allocated_requests(
    c: Container, s: ContainerStatus | None, infeasible: bool
) -> ResourceList | None:
    if s is not None and s.allocated is not None:
        return s.allocated
    return None if infeasible else c.requests


def _actuated_requests(
    c: Container, s: ContainerStatus | None, infeasible: bool
) -> ResourceList | None:
    if s is not None and s.resources_requests is not None:
        return s.resources_requests
    if s is not None and s.allocated is not None:
        return s.allocated
    return None if infeasible else c.requests


def _spec_limits(c: Container, _s: ContainerStatus | None, _inf: bool) -> ResourceList:
    return c.limits


def _actuated_limits(
    c: Container, s: ContainerStatus | None, infeasible: bool
) -> ResourceList | None:
    if s is not None and s.resources_limits is not None:
        return s.resources_limits
    return None if infeasible else c.limits


def effective_requests(res: PodResources) -> dict[str, Quantity]:
    """``PodRequests`` of a parsed pod: the formula above, overhead added."""
    spec = res.aggregate(_spec_requests)
    if res.statuses_change_nothing():
        reqs = spec  # the common case, and the one cache fills are made of
    else:
        allocated = res.aggregate(_allocated_requests)
        actuated = res.aggregate(_actuated_requests)
        reqs = (
            _max_of(actuated, allocated) if res.infeasible else _max_of(spec, actuated, allocated)
        )
    if res.pod_level_requests_set():
        for name, quantity in (res.pod_requests or {}).items():
            if _is_supported_pod_level_resource(name):
                reqs[name] = quantity
    _add_into(reqs, res.overhead)
    return reqs


def effective_limits(res: PodResources) -> dict[str, Quantity]:
    """``PodLimits`` of a parsed pod: the formula above, overhead added to non-zero limits."""
    spec = res.aggregate(_spec_limits)
    if res.statuses_change_nothing():
        limits = spec
    else:
        actuated = res.aggregate(_actuated_limits)
        limits = dict(actuated) if res.infeasible else _max_of(spec, actuated)
    if res.pod_level_resources_set():
        for name, quantity in (res.pod_limits or {}).items():
            if _is_supported_pod_level_resource(name):
                limits[name] = quantity
    # Overhead only raises limits that are set and non-zero: an unset limit stays unlimited.
    for name, quantity in res.overhead.items():
        current = limits.get(name)
        if current is not None and current.nanos != 0:
            limits[name] = current + quantity
    return limits


def pod_requests(pod: Obj) -> dict[str, Quantity]:
    """Effective pod requests (``resourcehelper.PodRequests``) with overhead."""
    return effective_requests(PodResources.parse(pod))


def pod_limits(pod: Obj) -> dict[str, Quantity]:
    """Effective pod limits (``resourcehelper.PodLimits``) with overhead on non-zero limits."""
    return effective_limits(PodResources.parse(pod))
