"""The evaluator registry, and the usage calculation a quota's status is made of.

This module owns the map from :class:`GroupResource` to :class:`Evaluator`, as upstream's
``pkg/quota/v1/evaluator/core/registry.go`` and ``pkg/quota/v1/install/registry.go`` build it:
pods, services, persistent volume claims and resource claims get their own evaluators;
``configmaps``, ``resourcequotas``, ``replicationcontrollers`` and ``secrets`` get object
counting with their legacy alias; a fixed set of virtual or never-quota'd resources is ignored.
Any other resource falls back to object counting (:meth:`Registry.get_or_count`), which is what
admission does for a resource without an evaluator; PodSet and other modules add their own with
:meth:`Registry.register`.

It also holds :func:`calculate_usage` (upstream ``quota.CalculateUsage``): the usage for one
quota's hard names in one namespace, given that namespace's objects per group/resource. It is a
pure function of plain data so the controller can call it on its caches and a differential test
on objects read back from the API.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from tally.evaluators.base import (
    Clock,
    Evaluator,
    GroupResource,
    Obj,
    ObjectError,
    ScopeRequirement,
    get_mapping,
    object_count_resource_name,
    quota_scopes,
)
from tally.evaluators.generic import LEGACY_OBJECT_COUNT_ALIASES, ObjectCountEvaluator
from tally.evaluators.pods import PodEvaluator
from tally.evaluators.pvcs import PersistentVolumeClaimEvaluator
from tally.evaluators.resourceclaims import ResourceClaimEvaluator
from tally.evaluators.services import ServiceEvaluator
from tally.quota import resources as quota
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList, ResourceListError, parse_resource_list

__all__ = [
    "IGNORED_RESOURCES",
    "Registry",
    "UsageError",
    "calculate_quota_usage",
    "calculate_usage",
    "group_resource_for_count_name",
    "new_registry",
]

IGNORED_RESOURCES: Final = frozenset(
    {
        # virtual resources that aren't stored and shouldn't be quota'd
        GroupResource("", "bindings"),
        GroupResource("", "componentstatuses"),
        GroupResource("authentication.k8s.io", "tokenreviews"),
        GroupResource("authentication.k8s.io", "selfsubjectreviews"),
        GroupResource("authorization.k8s.io", "subjectaccessreviews"),
        GroupResource("authorization.k8s.io", "selfsubjectaccessreviews"),
        GroupResource("authorization.k8s.io", "localsubjectaccessreviews"),
        GroupResource("authorization.k8s.io", "selfsubjectrulesreviews"),
        # events haven't been quota'd before
        GroupResource("", "events"),
        GroupResource("events.k8s.io", "events"),
    }
)
"""Upstream ``DefaultIgnoredResources``: never quota-tracked."""


class UsageError(ValueError):
    """Some evaluators failed; ``usage`` holds what the others computed (upstream keeps it)."""

    def __init__(self, usage: dict[str, Quantity], errors: Sequence[Exception]) -> None:
        self.usage = usage
        self.errors = tuple(errors)
        super().__init__("; ".join(str(error) for error in errors))


class Registry:
    """Evaluators by group/resource (upstream ``quota.Registry`` plus the ignored set).

    Not thread-safe for writes: register evaluators at start-up, before workers read it.
    """

    def __init__(
        self,
        evaluators: Iterable[Evaluator] = (),
        ignored: Iterable[GroupResource] = IGNORED_RESOURCES,
    ) -> None:
        self._evaluators: dict[GroupResource, Evaluator] = {}
        self._ignored = frozenset(ignored)
        for evaluator in evaluators:
            self.register(evaluator)

    def register(self, evaluator: Evaluator) -> None:
        """Add or replace the evaluator for ``evaluator.group_resource``."""
        self._evaluators[evaluator.group_resource] = evaluator

    def remove(self, group_resource: GroupResource) -> None:
        self._evaluators.pop(group_resource, None)

    def get(self, group_resource: GroupResource) -> Evaluator | None:
        """The registered evaluator, or ``None``."""
        return self._evaluators.get(group_resource)

    def names(self, group_resource: GroupResource, hard: object) -> bool:
        """Whether the hard list ``hard`` names ``group_resource``: by ``count/``, or by a name
        its evaluator matches (such as a ClusterQuota measure's)."""
        if not isinstance(hard, Mapping):
            return False
        names = [str(name) for name in hard]
        if object_count_resource_name(group_resource) in names:
            return True
        evaluator = self.get(group_resource)
        return evaluator is not None and bool(evaluator.matching_resources(names))

    def get_or_count(self, group_resource: GroupResource) -> Evaluator | None:
        """The registered evaluator, an object-count one for other resources, ``None`` if
        the resource is ignored (what admission uses)."""
        if group_resource in self._ignored:
            return None
        evaluator = self._evaluators.get(group_resource)
        if evaluator is None:
            evaluator = ObjectCountEvaluator(group_resource)
        return evaluator

    def is_ignored(self, group_resource: GroupResource) -> bool:
        return group_resource in self._ignored

    def list(self) -> list[Evaluator]:
        """Registered evaluators, ordered by group/resource."""
        return [self._evaluators[gr] for gr in sorted(self._evaluators)]


def new_registry(clock: Clock = time.time) -> Registry:
    """The core evaluators (upstream ``core.NewEvaluators``) in a fresh registry."""
    evaluators: list[Evaluator] = [
        PodEvaluator(clock),
        ServiceEvaluator(),
        PersistentVolumeClaimEvaluator(),
        # Upstream adds it when resourceclaims are served and DynamicResourceAllocation is on
        # (GA); tally always does, and reports a quota naming claims where none are served.
        ResourceClaimEvaluator(),
    ]
    evaluators.extend(
        ObjectCountEvaluator(gr, alias) for gr, alias in LEGACY_OBJECT_COUNT_ALIASES.items()
    )
    return Registry(evaluators)


def kinds_named(
    sections: Iterable[Iterable[str] | None],
    evaluators: Iterable[Evaluator],
    *,
    keep: Callable[[GroupResource], bool] = lambda gr: True,
) -> set[GroupResource]:
    """The kinds a quota's hard names name (``sections``: the names of its ``spec.hard`` and
    ``status.hard``, None for a section without one), among those ``keep`` keeps: by
    ``count/<r>[.<g>]``, or by a name one of ``evaluators`` measures
    (``gold.deviceclass.resource.k8s.io/devices`` names ``resourceclaims.resource.k8s.io``).
    What the webhook rules and the watched ``count/`` kinds both follow."""
    named: set[GroupResource] = set()
    candidates = [e for e in evaluators if keep(e.group_resource)]
    for section in sections:
        if section is None:
            continue
        names = list(section)
        for name in names:
            gr = group_resource_for_count_name(name)
            if gr is not None and keep(gr):
                named.add(gr)
        for evaluator in candidates:
            if evaluator.group_resource not in named and evaluator.matching_resources(names):
                named.add(evaluator.group_resource)
    return named


def group_resource_for_count_name(name: str) -> GroupResource | None:
    """``count/deployments.apps`` -> ``GroupResource("apps", "deployments")``; else ``None``.

    Plural resource names never contain dots and group names usually do, so the first dot
    separates them.
    """
    if not name.startswith("count/") or len(name) == len("count/"):
        return None
    resource, _, group = name[len("count/") :].partition(".")
    return GroupResource(group, resource) if resource else None


def calculate_usage(
    objects: Mapping[GroupResource, Iterable[Any]],
    hard: ResourceList | Iterable[str],
    scopes: Sequence[ScopeRequirement] = (),
    registry: Registry | None = None,
) -> dict[str, Quantity]:
    """Usage for the hard names of one quota in one namespace (upstream ``CalculateUsage``).

    ``objects`` holds the namespace's objects per group/resource (API JSON, or projections);
    ``scopes`` are the quota's scope requirements (:func:`~tally.evaluators.base.quota_scopes`).
    Every hard name some evaluator measures gets a value (zero when nothing matches); names no
    evaluator measures get none. Besides the registered evaluators, a ``count/<r>.<g>`` name
    whose objects were passed in is counted like upstream's discovered resources are.

    Raises :class:`UsageError` when an evaluator fails (a malformed object); like upstream, the
    error carries the usage of the names the other evaluators could compute.
    """
    registry = registry or new_registry()
    hard_names = list(hard)
    evaluators = registry.list()
    registered = {evaluator.group_resource for evaluator in evaluators}
    for name in hard_names:
        group_resource = group_resource_for_count_name(name)
        if (
            group_resource is not None
            and group_resource not in registered
            and group_resource in objects
            and not registry.is_ignored(group_resource)
        ):
            evaluators.append(ObjectCountEvaluator(group_resource))
            registered.add(group_resource)

    potential: list[str] = []
    for evaluator in evaluators:
        potential.extend(evaluator.matching_resources(hard_names))
    matched = quota.intersection(hard_names, potential)

    errors: list[Exception] = []
    usage: dict[str, Quantity] = {}
    for evaluator in evaluators:
        names = evaluator.matching_resources(matched)
        if not names:
            continue
        try:
            stats = evaluator.usage_stats(objects.get(evaluator.group_resource, ()), names, scopes)
        except ValueError as error:
            errors.append(error)
            matched = quota.difference(matched, names)
            continue
        usage = quota.add(usage, stats)
    usage = quota.mask(usage, matched)
    if errors:
        raise UsageError(usage, errors)
    return usage


def calculate_quota_usage(
    resource_quota: Obj,
    objects: Mapping[GroupResource, Iterable[Any]],
    registry: Registry | None = None,
) -> dict[str, Quantity]:
    """:func:`calculate_usage` for a ResourceQuota object: its ``spec.hard`` and scopes."""
    try:
        hard = parse_resource_list(get_mapping(resource_quota, "spec").get("hard"), "spec.hard")
    except (ResourceListError, ObjectError) as error:
        raise UsageError({}, [error]) from error
    return calculate_usage(objects, hard, quota_scopes(resource_quota), registry)
