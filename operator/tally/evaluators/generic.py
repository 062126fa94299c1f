"""Object counting for any group/resource: ``count/<resource>[.<group>]`` = 1 per object.

A port of upstream ``generic.NewObjectCountEvaluator``. The quota name is
``count/<resource>`` for the core group and ``count/<resource>.<group>`` otherwise
(``count/deployments.apps``, ``count/podsets.<our group>``). Four core resources also answer to
a legacy alias, from before object counting was generic: ``configmaps``, ``resourcequotas``,
``replicationcontrollers`` and ``secrets`` (so both ``secrets`` and ``count/secrets`` work).

Object-count evaluators have no scopes and no constraints, handle only CREATE (without a
subresource: upstream's evaluator checks the operation only, and the admission plugin is where
subresource requests are ignored, spec section 2), and never ask for replenishment on update:
an update cannot change a count, deletes always replenish.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from tally.evaluators import base
from tally.evaluators.base import (
    GroupResource,
    Obj,
    Operation,
    ScopeRequirement,
    object_count_resource_name,
)
from tally.quota import resources as quota
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = ["LEGACY_OBJECT_COUNT_ALIASES", "ObjectCountEvaluator"]

LEGACY_OBJECT_COUNT_ALIASES: Final[dict[GroupResource, str]] = {
    GroupResource("", "configmaps"): "configmaps",
    GroupResource("", "resourcequotas"): "resourcequotas",
    GroupResource("", "replicationcontrollers"): "replicationcontrollers",
    GroupResource("", "secrets"): "secrets",
}
"""Upstream ``legacyObjectCountAliases``."""

_ONE: Final = Quantity.from_int(1)


class ObjectCountEvaluator(base.NoScopes):
    """Counts objects of one group/resource (upstream ``objectCountEvaluator``)."""

    def __init__(self, group_resource: GroupResource, alias: str | None = None) -> None:
        self._group_resource = group_resource
        names = [object_count_resource_name(group_resource)]
        if alias:
            names.append(alias)
        self._resource_names: Final = tuple(names)
        self._usage: Final = dict.fromkeys(self._resource_names, _ONE)
        self._items: Final = tuple(self._usage.items())

    def __repr__(self) -> str:
        return f"ObjectCountEvaluator({self._group_resource!s}, names={list(self._resource_names)})"

    @property
    def group_resource(self) -> GroupResource:
        return self._group_resource

    @property
    def resource_names(self) -> tuple[str, ...]:
        """The quota names this evaluator answers to."""
        return self._resource_names

    def project(self, obj: Obj) -> None:
        """Nothing about an object matters to counting: caches can store ``None``."""
        return None

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return quota.intersection(names, self._resource_names)

    def usage(self, obj: Any) -> ResourceList:
        return dict(self._usage)

    def constraints(self, required: Iterable[str], obj: Obj) -> None:
        """No constraints for object counts."""

    handled_operations: Final = base.handled([Operation.CREATE])
    """Creations only: an update never changes a count (so a ``count/`` kind, a ConfigMap or
    a Secret gets no UPDATE rule)."""

    def handles(self, operation: str, subresource: str, old: Obj | None, new: Obj | None) -> bool:
        return operation == Operation.CREATE and subresource == ""

    def usage_stats(
        self, objects: Iterable[Any], resources: Iterable[str], scopes: Sequence[ScopeRequirement]
    ) -> dict[str, Quantity]:
        items = self._items
        return base.calculate_usage_stats(
            objects, resources, lambda obj: not scopes, lambda obj: items
        )

    def requires_replenishment(self, old: Any, new: Any) -> bool:
        return False
