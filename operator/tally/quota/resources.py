"""Resource-list algebra: pure functions over ``{resource name: Quantity}`` maps.

This module owns the operations quota decisions are made of, named after
``k8s.io/apiserver/pkg/quota/v1/resources.go`` so the Go original can be read beside it. The
behaviour is ported from upstream's *code* and ``resources_test.go``, not from its comments:

- ``less_than_or_equal(a, b)`` walks ``b``'s keys and skips keys missing from ``a`` (the Go
  comment says "a < b"; the code checks ``<=``).
- ``add`` and ``subtract`` produce the union of keys; a value keeps the left operand's format
  unless the left value is zero (``Quantity.Add``), keys only in ``b`` are copied (negated for
  ``subtract``).
- ``intersection`` and ``difference`` return de-duplicated, sorted lists.

Inputs are read-only ``Mapping``\\ s; every function returns a fresh ``dict`` and never mutates
its arguments. Where upstream returns names in Go map order, we return them sorted, so callers
and error messages are deterministic.

It also holds the list-level parsing and printing helpers used at the boundary
(:func:`parse_resource_list`, :func:`to_strings`, :func:`pretty_print`) and upstream's
``quota usage is negative`` message, which admission reports about a usage computed here.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

from tally.quota.quantity import ZERO, Quantity, QuantityError, parse_quantity

__all__ = [
    "NEGATIVE_USAGE_MESSAGE",
    "ResourceList",
    "ResourceListError",
    "add",
    "contains_prefix",
    "difference",
    "equals",
    "intersection",
    "is_negative",
    "is_zero",
    "less_than_or_equal",
    "mask",
    "max",
    "negative_usage_message",
    "parse_resource_list",
    "pretty_print",
    "remove_zeros",
    "resource_names",
    "subtract",
    "subtract_non_negative",
    "to_set",
    "to_strings",
]

ResourceList: TypeAlias = Mapping[str, Quantity]
"""``corev1.ResourceList``: resource name to quantity. Treated as read-only everywhere."""

NEGATIVE_USAGE_MESSAGE: Final = "quota usage is negative for resource(s): %s"
"""Upstream admission's message for an object whose computed usage has negative values."""


class ResourceListError(ValueError):
    """A resource list read from an object is malformed. ``field`` names where it was read."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def equals(a: ResourceList, b: ResourceList) -> bool:
    """Same key set and numerically equal values (upstream ``Equals``)."""
    if len(a) != len(b):
        return False
    for key, value in a.items():
        other = b.get(key)
        if other is None or other.nanos != value.nanos:
            return False
    return True


def less_than_or_equal(a: ResourceList, b: ResourceList) -> tuple[bool, list[str]]:
    """Whether ``a[k] <= b[k]`` for every key of ``b`` that ``a`` also has.

    Returns ``(ok, exceeded)`` with the sorted names where ``a`` exceeds ``b``. Keys missing
    from ``a`` are skipped, as upstream's code does.
    """
    exceeded = sorted(key for key, value in b.items() if key in a and a[key].nanos > value.nanos)
    return not exceeded, exceeded


def max(a: ResourceList, b: ResourceList) -> dict[str, Quantity]:
    """Element-wise maximum over the union of keys (upstream ``Max``).

    On a tie the value (and so the format) of ``b`` wins, as upstream's ``<=`` does.
    """
    result: dict[str, Quantity] = {}
    for key, value in a.items():
        other = b.get(key)
        result[key] = other if other is not None and value.nanos <= other.nanos else value
    for key, value in b.items():
        if key not in result:
            result[key] = value
    return result


def add(a: ResourceList, b: ResourceList) -> dict[str, Quantity]:
    """``a + b`` for each name in either list (upstream ``Add``)."""
    result = dict(a)
    for key, value in b.items():
        current = result.get(key)
        result[key] = value if current is None else current + value
    return result


def subtract(a: ResourceList, b: ResourceList) -> dict[str, Quantity]:
    """``a - b`` for each name in either list; names only in ``b`` are negated."""
    result = dict(a)
    for key, value in b.items():
        current = result.get(key)
        result[key] = -value if current is None else current - value
    return result


def subtract_non_negative(a: ResourceList, b: ResourceList) -> dict[str, Quantity]:
    """``a - b`` clamped at zero (upstream ``SubtractWithNonNegativeResult``).

    Clamped values are upstream's ``MustParse("0")`` (DecimalSI).
    """
    result: dict[str, Quantity] = {}
    for key, value in a.items():
        other = b.get(key)
        difference_ = value if other is None else value - other
        result[key] = difference_ if difference_.nanos > 0 else ZERO
    for key in b:
        if key not in result:
            result[key] = ZERO
    return result


def mask(resources: ResourceList, names: Iterable[str]) -> dict[str, Quantity]:
    """Only the entries whose name is in ``names`` (upstream ``Mask``)."""
    wanted = names if isinstance(names, set | frozenset) else set(names)
    return {key: value for key, value in resources.items() if key in wanted}


def resource_names(resources: ResourceList) -> list[str]:
    """The names in a list, sorted (upstream ``ResourceNames``, in map order)."""
    return sorted(resources)


def to_set(names: Iterable[str]) -> frozenset[str]:
    """Upstream ``ToSet``."""
    return frozenset(names)


def contains_prefix(prefixes: Iterable[str], item: str) -> bool:
    """Whether ``item`` starts with any of ``prefixes`` (upstream ``ContainsPrefix``)."""
    return any(item.startswith(prefix) for prefix in prefixes)


def intersection(a: Iterable[str], b: Iterable[str]) -> list[str]:
    """Names in both ``a`` and ``b``, de-duplicated and sorted (upstream ``Intersection``)."""
    other = set(b)
    return sorted({item for item in a if item in other})


def difference(a: Iterable[str], b: Iterable[str]) -> list[str]:
    """Names in ``a`` but not in ``b``, de-duplicated and sorted (upstream ``Difference``)."""
    other = set(b)
    return sorted({item for item in a if item not in other})


def is_zero(a: ResourceList) -> bool:
    """Every value is zero; an empty list is zero (upstream ``IsZero``)."""
    return all(value.nanos == 0 for value in a.values())


def remove_zeros(a: ResourceList) -> dict[str, Quantity]:
    """Only the non-zero entries (upstream ``RemoveZeros``)."""
    return {key: value for key, value in a.items() if value.nanos != 0}


def is_negative(a: ResourceList) -> list[str]:
    """The sorted names whose value is below zero (upstream ``IsNegative``)."""
    return sorted(key for key, value in a.items() if value.nanos < 0)


def negative_usage_message(names: Iterable[str]) -> str:
    """``quota usage is negative for resource(s): <sorted names joined by ",">``."""
    return NEGATIVE_USAGE_MESSAGE % ",".join(sorted(names))


def to_strings(a: ResourceList) -> dict[str, str]:
    """Canonical string form of every value, keys sorted, ready to write to the API."""
    return {key: a[key].canonical() for key in sorted(a)}


def pretty_print(a: ResourceList) -> str:
    """``name=quantity`` pairs, sorted by name, joined by ``,`` (admission's ``prettyPrint``)."""
    return ",".join(f"{key}={a[key].canonical()}" for key in sorted(a))


def parse_resource_list(raw: object, field: str = "resources") -> dict[str, Quantity]:
    """Parse a JSON resource list (``{"cpu": "100m"}``); ``None`` is an empty list.

    Errors name the field and the key: ``spec.hard[cpu]: cannot parse quantity 'x': ...``.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ResourceListError(field, f"expected a map of quantities, got {_kind(raw)}")
    result: dict[str, Quantity] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ResourceListError(field, f"resource names must be strings, got {key!r}")
        try:
            result[key] = parse_quantity(value)
        except QuantityError as error:
            raise ResourceListError(f"{field}[{key}]", str(error)) from error
    return result


def _kind(value: Any) -> str:
    return builtins.type(value).__name__


def hard_names(quota: Mapping[str, Any]) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """The names of a ResourceQuota-shaped object's ``spec.hard`` and ``status.hard``, in
    their order (None for a section without a hard map): what decides which kinds a quota
    names, and a key under which quotas with the same names are looked at once."""

    def names(section: object) -> tuple[str, ...] | None:
        hard = section.get("hard") if isinstance(section, Mapping) else None
        return tuple(map(str, hard)) if isinstance(hard, Mapping) else None

    return names(quota.get("spec")), names(quota.get("status"))


def names_read(obj: Mapping[str, Any], hard_at: tuple[str, ...]) -> tuple[object, frozenset[str]]:
    """What the webhook rules and the dynamic ``count/`` kinds read of a quota: its spec (the
    names in its hard; a ClusterQuota's measures say which kinds those measure) and the names
    of the hard list at ``hard_at`` in its status (a malformed one reads as none). A write of
    usage alone leaves both as they were."""
    hard: object = obj
    for key in hard_at:
        hard = hard.get(key) if isinstance(hard, Mapping) else None
    names = frozenset(map(str, hard)) if isinstance(hard, Mapping) else frozenset()
    return obj.get("spec"), names
