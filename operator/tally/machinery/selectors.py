"""Label selectors with Kubernetes semantics: parse, validate, match.

This module owns ``metav1.LabelSelector`` (``matchLabels`` plus ``matchExpressions`` with
``In``, ``NotIn``, ``Exists``, ``DoesNotExist``) as the apimachinery ``labels`` package
evaluates it. Quota scope selectors reuse :class:`Requirement` (a ``PriorityClass In [a b]``
expression is matched against the label set ``{"PriorityClass": <class>}``), and PodSet will
reuse :func:`parse_label_selector` for its pod selector.

Semantics kept from upstream (``labels/selector.go``, ``LabelSelectorAsSelector``):

- all requirements are ANDed; an empty selector (``{}``) matches everything, an absent one
  (``None``) matches nothing;
- ``In``: the key is present and its value is listed; ``NotIn``: the key is absent, or its
  value is not listed (so ``NotIn`` matches objects without the label);
- ``Exists`` / ``DoesNotExist``: presence of the key only;
- ``matchLabels`` entries are equality requirements (``key In [value]``).

Validation, as ``labels.NewRequirement`` does it: ``In``/``NotIn`` need at least one value,
``Exists``/``DoesNotExist`` take none, keys must be qualified names and values valid label
values, and an unknown operator is an error. Every failure is a :class:`SelectorError` (a
``ValueError``) naming the key or operator. Objects are immutable and hashable, so a parsed
selector can be cached beside the object it came from.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from tally.machinery import validation

__all__ = [
    "EVERYTHING",
    "NOTHING",
    "LabelSelector",
    "Operator",
    "Requirement",
    "SelectorError",
    "is_qualified_name",
    "parse_label_selector",
    "requirement",
]


class SelectorError(ValueError):
    """A selector is malformed; the message names the offending key, value or operator."""


class Operator(enum.StrEnum):
    """The operators a ``LabelSelectorRequirement`` and a scope selector may use."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``key <operator> values`` condition (upstream ``labels.Requirement``)."""

    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label set satisfies this requirement."""
        value = labels.get(self.key)
        if self.operator is Operator.IN:
            return value is not None and value in self.values
        if self.operator is Operator.NOT_IN:
            return value is None or value not in self.values
        if self.operator is Operator.EXISTS:
            return value is not None
        return value is None


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """All requirements ANDed. No requirements: matches everything (unless ``nothing``)."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False
    """The selector of an absent ``LabelSelector`` (``labels.Nothing()``): matches nothing."""

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.nothing:
            return False
        label_set: Mapping[str, str] = labels or {}
        return all(req.matches(label_set) for req in self.requirements)

    def is_empty(self) -> bool:
        """Whether the selector has no requirements (upstream ``Selector.Empty``)."""
        return not self.requirements and not self.nothing


EVERYTHING: Final = LabelSelector()
NOTHING: Final = LabelSelector(nothing=True)


def requirement(
    key: str,
    operator: str,
    values: Iterable[str] = (),
    *,
    operator_kind: str = "label selector",
) -> Requirement:
    """Build and validate one requirement like ``labels.NewRequirement``.

    ``operator_kind`` only words the unknown-operator error: upstream says
    ``"Foo" is not a valid label selector operator`` for label selectors and
    ``... scope selector operator`` for quota scope selectors.
    """
    if not isinstance(key, str):
        raise SelectorError(f"key: Invalid value: {key!r}: a key must be a string")
    _validate_key(key)
    try:
        op = Operator(operator)
    except ValueError:
        raise SelectorError(f"{operator!r} is not a valid {operator_kind} operator") from None
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise SelectorError(f"key {key!r}: values must be a list of strings, got {values!r}")
    value_list = list(values)
    if op in (Operator.IN, Operator.NOT_IN):
        if not value_list:
            raise SelectorError(
                f"key {key!r}: for 'in', 'notin' operators, values set can't be empty"
            )
    elif value_list:
        raise SelectorError(f"key {key!r}: values set must be empty for exists and does not exist")
    for value in value_list:
        _validate_value(key, value)
    return Requirement(key, op, frozenset(value_list))


def parse_label_selector(raw: object, field: str = "selector") -> LabelSelector:
    """Turn a JSON ``metav1.LabelSelector`` into a :class:`LabelSelector`.

    ``None`` matches nothing and ``{}`` matches everything, exactly like
    ``metav1.LabelSelectorAsSelector``. Errors are prefixed with ``field``.
    """
    if raw is None:
        return NOTHING
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{field}: expected an object, got {type(raw).__name__}")
    match_labels = raw.get("matchLabels") or {}
    match_expressions = raw.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping):
        raise SelectorError(f"{field}.matchLabels: expected a map of strings")
    if not isinstance(match_expressions, list):
        raise SelectorError(f"{field}.matchExpressions: expected a list")
    requirements: list[Requirement] = []
    try:
        for key, value in match_labels.items():
            if not isinstance(value, str):
                raise SelectorError(f"key {key!r}: label values must be strings, got {value!r}")
            requirements.append(requirement(key, Operator.IN, [value]))
        for index, expression in enumerate(match_expressions):
            if not isinstance(expression, Mapping):
                raise SelectorError(f"matchExpressions[{index}]: expected an object")
            requirements.append(
                requirement(
                    expression.get("key", ""),
                    expression.get("operator", ""),
                    expression.get("values") or (),
                )
            )
    except SelectorError as error:
        raise SelectorError(f"{field}: {error}") from error
    if not requirements:
        return EVERYTHING
    # Upstream sorts requirements by key; matching is an AND, so order only affects repr.
    requirements.sort(key=lambda req: (req.key, req.operator, sorted(req.values)))
    return LabelSelector(tuple(requirements))


def is_qualified_name(name: str) -> bool:
    """``validation.IsQualifiedName``: ``[DNS-subdomain/]name`` with a 63-character name."""
    try:
        _validate_key(name)
    except SelectorError:
        return False
    return True


def _validate_key(key: str) -> None:
    """``validateLabelKey``: ``IsQualifiedName``'s messages, joined as upstream joins them."""
    problems = validation.is_qualified_name(key)
    if problems:
        raise SelectorError(f"key: Invalid value: {key!r}: {'; '.join(problems)}")


def _validate_value(key: str, value: object) -> None:
    """``validateLabelValue``: empty, or a qualified name's name part."""
    if not isinstance(value, str):
        raise SelectorError(f"key {key!r}: values must be strings, got {value!r}")
    problems = validation.is_label_value(value)
    if problems:
        raise SelectorError(f"values[{value!r}]: Invalid value: {'; '.join(problems)}")
