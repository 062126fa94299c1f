"""The evaluator contract and the pieces every evaluator shares.

An evaluator knows, for one group/resource, which quota resource names it can measure, how much
one object uses, which admission requests can change usage, which quota scopes an object falls
under, and which updates must trigger a recalculation. This module mirrors upstream
``k8s.io/apiserver/pkg/quota/v1/interfaces.go`` (the :class:`Evaluator` protocol) and
``.../quota/v1/generic/evaluator.go`` (:func:`calculate_usage_stats`, the quota/scope matching
helpers), in Python form.

Objects are the Kubernetes API JSON as plain mappings (camelCase, as the API server returns
them). An evaluator may also offer a compact *projection* of an object (see ``pods.py``) that
its other methods accept in place of the mapping; caches hold projections to save memory.

Time enters through a :data:`Clock` given to the evaluator (``time.time`` by default), like
upstream's ``clock.Clock``: tests step a fake clock.

Deliberately left out: listing. Upstream evaluators list their objects through informers; here
the caller passes the namespace's objects in (from its cache, or read back from the API), which
keeps this layer pure.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeAlias, runtime_checkable

from tally.machinery.selectors import Operator, Requirement, SelectorError, requirement
from tally.quota.quantity import Format, Quantity
from tally.quota.resources import ResourceList, ResourceListError, parse_resource_list

__all__ = [
    "Clock",
    "ConstraintError",
    "Evaluator",
    "GroupResource",
    "HandledOperations",
    "NoScopes",
    "Obj",
    "ObjectError",
    "Operation",
    "ScopeError",
    "ScopeName",
    "ScopeRequirement",
    "calculate_usage_stats",
    "get_list",
    "get_mapping",
    "get_str",
    "handled",
    "matches_quota",
    "matching_scopes",
    "object_count_resource_name",
    "parse_scope_requirement",
    "parse_timestamp",
    "quota_hard_names",
    "quota_scopes",
    "uncovered_quota_scopes",
]

Obj: TypeAlias = Mapping[str, Any]
"""A Kubernetes object as API JSON."""

Clock: TypeAlias = Callable[[], float]
"""Returns the current time as seconds since the epoch."""


class ObjectError(ValueError):
    """An object is missing a field or has one of the wrong type. ``field`` is its path."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class ScopeError(ValueError):
    """A quota scope or scope selector expression is invalid."""


class ConstraintError(ValueError):
    """An object violates an evaluator's constraints (e.g. ``must specify cpu for: foo``).

    ``str(error)`` is upstream's message, ready for ``failed quota: <name>: <message>``.
    """


@dataclass(frozen=True, slots=True, order=True)
class GroupResource:
    """An API group and a resource (plural) name, like ``schema.GroupResource``."""

    group: str
    """The API group; ``""`` for the core group."""
    resource: str
    """The plural resource name, e.g. ``pods`` or ``deployments``."""

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource


def object_count_resource_name(gr: GroupResource) -> str:
    """``count/<resource>`` for the core group, ``count/<resource>.<group>`` otherwise."""
    return f"count/{gr.resource}.{gr.group}" if gr.group else f"count/{gr.resource}"


class Operation(enum.StrEnum):
    """Admission operations (``admission.Operation``)."""

    CREATE = "CREATE"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    CONNECT = "CONNECT"


HandledOperations: TypeAlias = Mapping[str, frozenset[Operation]]
"""Every request an evaluator's :meth:`Evaluator.handles` can answer yes to: per subresource
(``""`` for the object itself), the admission operations. ``handles`` may still say no to some
of them (the pod evaluator takes an update only when it changes whether the pod is
Terminating), never yes to anything else. Admission sees only what the webhook's rules send,
and the rules are built from this (:mod:`tally.webhook.configuration`): a kind whose evaluator
handles creations only (every object count) gets no UPDATE rule."""


def handled(
    operations: Iterable[Operation], /, **subresources: Iterable[Operation]
) -> HandledOperations:
    """A read-only :data:`HandledOperations`: ``operations`` on the object itself, and per
    subresource (``resize=[Operation.UPDATE]``)."""
    return MappingProxyType(
        {"": frozenset(operations)} | {name: frozenset(ops) for name, ops in subresources.items()}
    )


class ScopeName(enum.StrEnum):
    """``corev1.ResourceQuotaScope`` values the API server accepts."""

    TERMINATING = "Terminating"
    NOT_TERMINATING = "NotTerminating"
    BEST_EFFORT = "BestEffort"
    NOT_BEST_EFFORT = "NotBestEffort"
    PRIORITY_CLASS = "PriorityClass"
    CROSS_NAMESPACE_POD_AFFINITY = "CrossNamespacePodAffinity"
    VOLUME_ATTRIBUTES_CLASS = "VolumeAttributesClass"


# Scopes that only make sense with the Exists operator (API validation of scopeSelector).
_EXISTS_ONLY_SCOPES: Final = frozenset(
    {
        ScopeName.TERMINATING,
        ScopeName.NOT_TERMINATING,
        ScopeName.BEST_EFFORT,
        ScopeName.NOT_BEST_EFFORT,
        ScopeName.CROSS_NAMESPACE_POD_AFFINITY,
    }
)


@dataclass(frozen=True, slots=True)
class ScopeRequirement:
    """One ``corev1.ScopedResourceSelectorRequirement``, validated.

    A ``spec.scopes`` entry is the requirement ``{scopeName, Exists}``, as upstream's
    ``getScopeSelectorsFromQuota`` builds it.
    """

    scope_name: ScopeName
    operator: Operator
    values: tuple[str, ...] = ()

    def label_requirement(self) -> Requirement:
        """The same expression as a label requirement on the key ``scope_name``."""
        return requirement(
            self.scope_name, self.operator, self.values, operator_kind="scope selector"
        )

    def __str__(self) -> str:
        # Go's %v of the struct, as admission prints it: {PriorityClass In [a b]}
        return f"{{{self.scope_name} {self.operator} [{' '.join(self.values)}]}}"


def parse_scope_requirement(raw: object, field: str = "scopeSelector") -> ScopeRequirement:
    """Validate one JSON scope selector expression like the API server does."""
    if not isinstance(raw, Mapping):
        raise ScopeError(f"{field}: expected an object, got {type(raw).__name__}")
    name = raw.get("scopeName")
    try:
        scope = ScopeName(str(name))
    except ValueError:
        raise ScopeError(f"{field}.scopeName: Invalid value: {name!r}: unsupported scope") from None
    operator_text = raw.get("operator")
    try:
        operator = Operator(str(operator_text))
    except ValueError:
        raise ScopeError(
            f"{field}.operator: Invalid value: {operator_text!r}: not a valid selector operator"
        ) from None
    values = raw.get("values") or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ScopeError(f"{field}.values: expected a list of strings, got {values!r}")
    if scope in _EXISTS_ONLY_SCOPES and operator is not Operator.EXISTS:
        raise ScopeError(
            f"{field}.operator: Invalid value: {operator_text!r}: must be 'Exist' when scope is "
            "any of ResourceQuotaScopeTerminating, ResourceQuotaScopeNotTerminating, "
            "ResourceQuotaScopeBestEffort, ResourceQuotaScopeNotBestEffort or "
            "ResourceQuotaScopeCrossNamespacePodAffinity"
        )
    if operator in (Operator.IN, Operator.NOT_IN) and not values:
        raise ScopeError(
            f"{field}.values: Required value: must be at least one value when `operator` is "
            "'In' or 'NotIn' for scope selector"
        )
    if operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
        raise ScopeError(
            f"{field}.values: Invalid value: {values!r}: must be no value when `operator` is "
            "'Exist' or 'DoesNotExist' for scope selector"
        )
    result = ScopeRequirement(scope, operator, tuple(values))
    try:
        result.label_requirement()
    except SelectorError as error:
        raise ScopeError(f"{field}: {error}") from error
    return result


def quota_scopes(quota: Obj) -> tuple[ScopeRequirement, ...]:
    """All scope requirements of a ResourceQuota: ``spec.scopes`` then ``scopeSelector``.

    Every one must match for an object to be counted (upstream ``getScopeSelectorsFromQuota``).
    """
    spec = get_mapping(quota, "spec")
    scopes = get_list(spec, "scopes", "spec.scopes")
    result: list[ScopeRequirement] = []
    for index, scope in enumerate(scopes):
        result.append(
            parse_scope_requirement(
                {"scopeName": scope, "operator": "Exists"}, f"spec.scopes[{index}]"
            )
        )
    selector = get_mapping(spec, "scopeSelector", "spec.scopeSelector")
    expressions = get_list(selector, "matchExpressions", "spec.scopeSelector.matchExpressions")
    for index, expression in enumerate(expressions):
        result.append(
            parse_scope_requirement(expression, f"spec.scopeSelector.matchExpressions[{index}]")
        )
    return tuple(result)


def quota_hard_names(quota: Obj, section: str = "status") -> list[str]:
    """The names of ``<section>.hard`` (admission matches on ``status.hard``)."""
    try:
        hard = parse_resource_list(get_mapping(quota, section).get("hard"), f"{section}.hard")
    except ResourceListError as error:
        raise ObjectError(error.field, error.reason) from error
    return sorted(hard)


@runtime_checkable
class Reprojecting(Protocol):
    """An evaluator that can tell, cheaply, that an update of an object projects to what its
    previous version did (the pod evaluator: a kubelet's status write changes nothing quota
    reads); the cache then keeps the previous projection instead of computing it again."""

    def reproject(self, previous: Any, obj: Obj) -> Any:
        """The projection of ``obj``, an update of the object ``previous`` was projected
        from: ``previous`` itself when nothing it holds can have changed."""
        ...


@runtime_checkable
class Evaluator(Protocol):
    """Knows how to evaluate quota usage for one group/resource (upstream ``quota.Evaluator``).

    ``obj`` arguments are API JSON mappings, or whatever :meth:`project` returned for them.
    """

    @property
    def group_resource(self) -> GroupResource:
        """The group/resource this evaluator measures."""
        ...

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        """The subset of quota resource ``names`` this evaluator can measure."""
        ...

    def usage(self, obj: Any) -> ResourceList:
        """What one object uses. The result is shared and must not be mutated."""
        ...

    def constraints(self, required: Iterable[str], obj: Obj) -> None:
        """Raise :class:`ConstraintError` if ``obj`` misses something ``required`` demands."""
        ...

    def handles(self, operation: str, subresource: str, old: Obj | None, new: Obj | None) -> bool:
        """Whether an admission request can change usage and so must be checked."""
        ...

    @property
    def handled_operations(self) -> HandledOperations:
        """What :meth:`handles` can say yes to, declared for the webhook's rules."""
        ...

    def matches(self, quota: Obj, obj: Any) -> bool:
        """The quota tracks a name this evaluator measures and all its scopes match ``obj``."""
        ...

    def matches_scope(self, scope: ScopeRequirement, obj: Any) -> bool:
        """Whether ``obj`` falls under one scope requirement (upstream ``MatchesScopeFunc``)."""
        ...

    def matching_scopes(
        self, obj: Any, scopes: Sequence[ScopeRequirement]
    ) -> list[ScopeRequirement]:
        """The requirements among ``scopes`` that ``obj`` matches."""
        ...

    def uncovered_quota_scopes(
        self, limited: Sequence[ScopeRequirement], matched: Sequence[ScopeRequirement]
    ) -> list[ScopeRequirement]:
        """The ``limited`` scopes with no ``matched`` quota scope of the same name."""
        ...

    def usage_stats(
        self, objects: Iterable[Any], resources: Iterable[str], scopes: Sequence[ScopeRequirement]
    ) -> dict[str, Quantity]:
        """Aggregate usage of the objects matching every scope, for the names in ``resources``.

        Every requested name starts at zero, so the result always has all of them.
        """
        ...

    def requires_replenishment(self, old: Any, new: Any) -> bool:
        """Whether an update from ``old`` to ``new`` must trigger a quota recalculation."""
        ...

    def project(self, obj: Obj) -> Any:
        """A compact form of ``obj`` that this evaluator accepts wherever it takes objects."""
        ...


# -- shared implementations --


class NoScopes:
    """The scope half of :class:`Evaluator` for kinds no quota scope applies to.

    Upstream's object-count and service evaluators use ``MatchesNoScopeFunc``: any scoped
    quota never matches their objects, and they cover no limited scope.
    """

    def matches_scope(self, scope: ScopeRequirement, obj: Any) -> bool:
        return False

    def matches(self, quota_obj: Obj, obj: Any) -> bool:
        return matches_quota(self, quota_obj, obj)  # type: ignore[arg-type]

    def matching_scopes(
        self, obj: Any, scopes: Sequence[ScopeRequirement]
    ) -> list[ScopeRequirement]:
        return []

    def uncovered_quota_scopes(
        self, limited: Sequence[ScopeRequirement], matched: Sequence[ScopeRequirement]
    ) -> list[ScopeRequirement]:
        return []


def matches_quota(evaluator: Evaluator, quota: Obj, obj: Any) -> bool:
    """Upstream ``generic.Matches``: a tracked name on ``status.hard`` and all scopes match."""
    if not evaluator.matching_resources(quota_hard_names(quota)):
        return False
    return all(evaluator.matches_scope(scope, obj) for scope in quota_scopes(quota))


def matching_scopes(
    evaluator: Evaluator, obj: Any, scopes: Sequence[ScopeRequirement]
) -> list[ScopeRequirement]:
    """The requirements among ``scopes`` that ``obj`` matches (upstream ``MatchingScopes``)."""
    return [scope for scope in scopes if evaluator.matches_scope(scope, obj)]


def uncovered_quota_scopes(
    limited: Sequence[ScopeRequirement], matched: Sequence[ScopeRequirement]
) -> list[ScopeRequirement]:
    """Limited scopes with no matched quota scope of the same name (``UncoveredQuotaScopes``)."""
    covered = {scope.scope_name for scope in matched}
    return [scope for scope in limited if scope.scope_name not in covered]


UsageItems: TypeAlias = Iterable[tuple[str, Quantity]]


def calculate_usage_stats(
    objects: Iterable[Any],
    resources: Iterable[str],
    matches: Callable[[Any], bool],
    usage_items: Callable[[Any], UsageItems],
) -> dict[str, Quantity]:
    """Upstream ``generic.CalculateUsageStats``: sum the usage of every matching object.

    ``matches(obj)`` applies all scopes at once; ``usage_items(obj)`` yields (name, quantity)
    pairs. Only names in ``resources`` are summed: upstream also sums the others and its caller
    masks them away at once, so the quota's result is the same and we skip the work.

    The sum follows ``Quantity.Add`` exactly: each name starts at a DecimalSI zero and takes the
    format of the first non-zero value added to it.
    """
    wanted = frozenset(resources)
    totals = dict.fromkeys(wanted, 0)
    formats = dict.fromkeys(wanted, Format.DECIMAL_SI)
    for obj in objects:
        if not matches(obj):
            continue
        for name, quantity in usage_items(obj):
            total = totals.get(name)
            if total is None:
                continue
            if total == 0:
                formats[name] = quantity.format
            totals[name] = total + quantity.nanos
    return {name: Quantity(totals[name], formats[name]) for name in wanted}


def scoped_usage_stats(
    evaluator: Evaluator,
    objects: Iterable[Any],
    resources: Iterable[str],
    scopes: Sequence[ScopeRequirement],
) -> dict[str, Quantity]:
    """:func:`calculate_usage_stats` with the evaluator's own scope matching and usage, for
    evaluators whose cached objects are the objects themselves (upstream's generic
    ``UsageStats``)."""

    def matches(obj: Any) -> bool:
        return all(evaluator.matches_scope(scope, obj) for scope in scopes)

    return calculate_usage_stats(
        objects, resources, matches, lambda obj: evaluator.usage(obj).items()
    )


# -- reading API JSON safely --


def _field(obj: object, key: str, field: str | None) -> Any:
    """``obj[key]``, or an :class:`ObjectError` naming the parent when ``obj`` is no object."""
    # Decoded JSON is plain dicts: their exact type is checked first, at a fraction of an
    # ABC's isinstance (the pod watch runs these for every event).
    if type(obj) is not dict and not isinstance(obj, Mapping):
        path = (field or key).rpartition(".")[0] or "object"
        raise ObjectError(path, f"expected an object, got {type(obj).__name__}")
    return obj.get(key)


def get_mapping(obj: Obj, key: str, field: str | None = None) -> Mapping[str, Any]:
    """``obj[key]`` as a mapping; missing or null is an empty mapping."""
    value = _field(obj, key, field)
    if value is None:
        return _EMPTY
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ObjectError(field or key, f"expected an object, got {type(value).__name__}")
    return value


def get_list(obj: Obj, key: str, field: str | None = None) -> Sequence[Any]:
    """``obj[key]`` as a list; missing or null is an empty list."""
    value = _field(obj, key, field)
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ObjectError(field or key, f"expected a list, got {type(value).__name__}")
    return value


def get_str(obj: Obj, key: str, field: str | None = None) -> str:
    """``obj[key]`` as a string; missing or null is ``""``."""
    value = _field(obj, key, field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ObjectError(field or key, f"expected a string, got {type(value).__name__}")
    return value


def get_resource_list(obj: Obj, key: str, field: str) -> dict[str, Quantity]:
    """``obj[key]`` parsed as a resource list; errors name ``field``."""
    try:
        return parse_resource_list(obj.get(key), field)
    except ResourceListError as error:
        raise ObjectError(error.field, error.reason) from error


def parse_timestamp(value: object, field: str) -> float:
    """An RFC 3339 ``metav1.Time`` as seconds since the epoch."""
    if not isinstance(value, str):
        raise ObjectError(field, f"expected an RFC 3339 timestamp, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ObjectError(field, f"expected an RFC 3339 timestamp, got {value!r}") from None
    if parsed.tzinfo is None:
        raise ObjectError(field, f"timestamp {value!r} has no time zone")
    return parsed.timestamp()


_EMPTY: Final[Mapping[str, Any]] = {}
