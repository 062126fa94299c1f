"""The evaluator of a kind ClusterQuota measures: its object count plus every measure over it.

A measure (:mod:`tally.measures`) is a quota resource name whose usage per object is a CEL
expression's value. This evaluator answers for one group/resource: ``count/<r>.<g>`` as any
object count, and each measure defined over the kind. Measures are read from the objects as
stored (the caches keep them whole), so one evaluator instance stands for one set of measures;
when the set changes, a new instance replaces it.

An expression that fails on an object is never a silent zero:

* at admission, :meth:`MeasuredEvaluator.constraints` evaluates the measures a quota tracks and
  refuses the request with the error (``failed quota: <quota>: measure <name>: …``, upstream's
  form for a constraint);
* in the usage controller, :meth:`MeasuredEvaluator.usage_stats` raises, naming the object
  (``widgets.example.com team-a/w1``), and the controller keeps the name's last observation and
  reports the error (as for any evaluator that fails).

Scopes do not apply to measured kinds, as to other object counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from tally.evaluators import base
from tally.evaluators.base import (
    ConstraintError,
    GroupResource,
    Obj,
    ObjectError,
    Operation,
    ScopeRequirement,
    object_count_resource_name,
)
from tally.measures import Measure, MeasureEvaluationError, evaluate
from tally.quota import resources as quota
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = ["MeasuredEvaluator"]

_ONE: Final = Quantity.from_int(1)
_ZERO: Final = Quantity(0)


class MeasuredEvaluator(base.NoScopes):
    """``count/<r>.<g>`` and the measures over one group/resource (see module doc)."""

    def __init__(self, group_resource: GroupResource, measures: Iterable[Measure]) -> None:
        self._group_resource = group_resource
        self._count_name = object_count_resource_name(group_resource)
        self.measures: Final[dict[str, Measure]] = {m.name: m for m in measures}
        for measure in self.measures.values():
            if GroupResource(measure.group, measure.resource) != group_resource:
                raise ValueError(f"measure {measure.name} is over another kind")
        self._names: Final = (self._count_name, *sorted(self.measures))

    def __repr__(self) -> str:
        return f"MeasuredEvaluator({self._group_resource!s}, measures={sorted(self.measures)})"

    @property
    def group_resource(self) -> GroupResource:
        return self._group_resource

    def project(self, obj: Obj) -> Obj:
        """Objects are kept whole: any field may be measured."""
        return obj

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return quota.intersection(names, self._names)

    def _measure(self, measure: Measure, obj: Any) -> Quantity | None:
        if not isinstance(obj, Mapping):
            raise ObjectError("object", f"expected an object, got {type(obj).__name__}")
        return evaluate(measure, obj)

    def usage(self, obj: Any) -> ResourceList:
        """The count, and every measure whose ``when`` holds; raises
        :class:`~tally.measures.MeasureEvaluationError` when one fails."""
        return self._usage(obj, skip_failures=False)

    def _usage(self, obj: Any, *, skip_failures: bool) -> ResourceList:
        result: dict[str, Quantity] = {self._count_name: _ONE}
        for name, measure in self.measures.items():
            try:
                value = self._measure(measure, obj)
            except MeasureEvaluationError:
                if not skip_failures:
                    raise
                continue
            if value is not None:
                result[name] = value
        return result

    def computable_usage(self, obj: Any) -> ResourceList:
        """:meth:`usage` without the measures that fail on ``obj`` (admission's view of an
        object as stored that a measure cannot read: it was never charged that measure)."""
        return self._usage(obj, skip_failures=True)

    def constraints(self, required: Iterable[str], obj: Obj) -> None:
        """Every measure a quota tracks must be computable for ``obj``: a failure refuses the
        request with the error rather than charging it nothing."""
        failures: list[str] = []
        for name in sorted(set(required) & self.measures.keys()):
            try:
                self._measure(self.measures[name], obj)
            except MeasureEvaluationError as error:
                failures.append(str(error))
        if failures:
            raise ConstraintError("; ".join(failures))

    handled_operations: Final = base.handled([Operation.CREATE, Operation.UPDATE])

    def handles(self, operation: str, subresource: str, old: Obj | None, new: Obj | None) -> bool:
        """CREATE and UPDATE of the object itself (an update by what it grows)."""
        return subresource == "" and operation in (Operation.CREATE, Operation.UPDATE)

    def usage_stats(
        self, objects: Iterable[Any], resources: Iterable[str], scopes: Sequence[ScopeRequirement]
    ) -> dict[str, Quantity]:
        resources = list(resources)
        wanted = [name for name in resources if name in self.measures]
        count_wanted = self._count_name in resources

        def items(obj: Any) -> list[tuple[str, Quantity]]:
            found = [(self._count_name, _ONE)] if count_wanted else []
            for name in wanted:
                try:
                    value = self._measure(self.measures[name], obj)
                except MeasureEvaluationError as error:
                    # Whoever reads the report must find the object to fix.
                    raise type(error)(name, f"{self._describe(obj)}: {error.reason}") from None
                if value is not None:
                    found.append((name, value))
            return found

        return base.calculate_usage_stats(objects, resources, lambda obj: not scopes, items)

    def _describe(self, obj: Any) -> str:
        """``<resource>.<group> <namespace>/<name>``, kubectl's way of naming an object."""
        metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
        metadata = metadata if isinstance(metadata, Mapping) else {}
        kind = self._group_resource.resource
        if self._group_resource.group:
            kind = f"{kind}.{self._group_resource.group}"
        return f"{kind} {metadata.get('namespace') or ''}/{metadata.get('name') or ''}"

    def requires_replenishment(self, old: Any, new: Any) -> bool:
        """When some measure went down (or cannot be computed any more)."""
        try:
            before, after = self.usage(old), self.usage(new)
        except (MeasureEvaluationError, ObjectError):
            return True
        return any(after.get(name, _ZERO) < value for name, value in before.items())
