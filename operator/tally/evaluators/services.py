"""The service evaluator: services, node ports and load balancers.

A port of upstream ``pkg/quota/v1/evaluator/core/services.go``. Every service counts 1 for
``services`` and ``count/services``, and 0 for ``services.nodeports`` and
``services.loadbalancers`` unless its type says otherwise:

- ``NodePort``: one node port per entry of ``spec.ports``;
- ``LoadBalancer``: one load balancer, and one node port per port, or, when
  ``spec.allocateLoadBalancerNodePorts`` is false, only the ports with a non-zero ``nodePort``
  (node ports are not allocated yet at admission, so the intent is counted);
- ``ClusterIP`` and ``ExternalName``: nothing more. The health-check node port is not counted.

Services have no scopes: a quota with any scope never matches them. Services are small, so the
evaluator works on the API JSON directly and its projection is the object itself.

Admission: CREATE and UPDATE (a type change NodePort -> LoadBalancer charges the difference).
Upstream's evaluator checks only the operation; tally also requires an empty subresource, which
is where the admission plugin ignores subresource requests (spec section 2).
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
)
from tally.quota import resources as quota
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = ["SERVICE_RESOURCES", "ServiceEvaluator", "quota_service_type"]

SERVICES: Final = GroupResource("", "services")

SERVICE_RESOURCES: Final = frozenset(
    {"count/services", "services", "services.nodeports", "services.loadbalancers"}
)
"""Names the service evaluator measures (upstream ``serviceResources``)."""

_ZERO: Final = Quantity.from_int(0)
_ONE: Final = Quantity.from_int(1)


def quota_service_type(service: Obj) -> str:
    """``NodePort`` or ``LoadBalancer`` when the type is charged, else ``""``."""
    service_type = get_str(get_mapping(service, "spec"), "type", "spec.type")
    return service_type if service_type in ("NodePort", "LoadBalancer") else ""


def _ports_with_node_ports(ports: Sequence[Any]) -> int:
    count = 0
    for i, port in enumerate(ports):
        if not isinstance(port, Mapping):
            raise ObjectError(f"spec.ports[{i}]", "expected an object")
        node_port = port.get("nodePort")
        if node_port is not None and not isinstance(node_port, int):
            raise ObjectError(f"spec.ports[{i}].nodePort", f"expected an integer: {node_port!r}")
        if node_port:
            count += 1
    return count


class ServiceEvaluator(base.NoScopes):
    """Upstream ``serviceEvaluator``."""

    @property
    def group_resource(self) -> GroupResource:
        return SERVICES

    def project(self, obj: Obj) -> Obj:
        return obj

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return quota.intersection(names, SERVICE_RESOURCES)

    def usage(self, obj: Obj) -> ResourceList:
        if not isinstance(obj, Mapping):
            raise ObjectError("service", f"expected an object, got {type(obj).__name__}")
        spec = get_mapping(obj, "spec")
        ports = get_list(spec, "ports", "spec.ports")
        result = {
            "count/services": _ONE,
            "services": _ONE,
            "services.loadbalancers": _ZERO,
            "services.nodeports": _ZERO,
        }
        service_type = quota_service_type(obj)
        if service_type == "NodePort":
            result["services.nodeports"] = Quantity.from_int(len(ports))
        elif service_type == "LoadBalancer":
            if spec.get("allocateLoadBalancerNodePorts") is False:
                result["services.nodeports"] = Quantity.from_int(_ports_with_node_ports(ports))
            else:
                result["services.nodeports"] = Quantity.from_int(len(ports))
            result["services.loadbalancers"] = _ONE
        return result

    def constraints(self, required: Iterable[str], obj: Obj) -> None:
        """No constraints for services."""

    handled_operations: Final = base.handled([Operation.CREATE, Operation.UPDATE])

    def handles(self, operation: str, subresource: str, old: Obj | None, new: Obj | None) -> bool:
        return subresource == "" and operation in (Operation.CREATE, Operation.UPDATE)

    def usage_stats(
        self, objects: Iterable[Obj], resources: Iterable[str], scopes: Sequence[ScopeRequirement]
    ) -> dict[str, Quantity]:
        return base.scoped_usage_stats(self, objects, resources, scopes)

    def requires_replenishment(self, old: Obj, new: Obj) -> bool:
        """Only a change of charged type class (NodePort / LoadBalancer / other) matters."""
        return quota_service_type(old) != quota_service_type(new)
