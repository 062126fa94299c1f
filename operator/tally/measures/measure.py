"""One measure: its spec checked and compiled, then evaluated on one object at a time.

A measure is ``{name, resource: {group, resource}, expression, when?}`` from a ClusterQuota's
``spec.measures``. :func:`compile_measure` turns it into a :class:`Measure` or refuses it with a
:class:`MeasureError` naming the field; :func:`validate_measures` reports every problem of a
list at once, for a validating webhook. :func:`evaluate` gives what one object uses, or raises
:class:`MeasureEvaluationError`: a measure that cannot be computed for an object is never
counted as zero, because a quota that silently under-counts admits what it should refuse.

**The name** must be ``<domain>/<name>``: a DNS-1123 subdomain with at least one dot, a slash,
and a qualified name's name part (``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``, at most 63
characters), e.g. ``example.com/storage-gb``. The name is what the quota's ``hard`` and its
status use, so it must be a valid quota resource name, and requiring a domain keeps it apart
from every name Kubernetes defines (``cpu``, ``requests.storage``, ``count/pods``: none has a
dotted prefix before a slash). ``kubernetes.io`` and ``k8s.io`` and their subdomains are
Kubernetes' own and refused.

**The value**: an ``int`` is that many units; a ``double`` must be finite and becomes the
shortest decimal that reads back as the same double (``0.1`` is ``100m``), rounded up to a
nano like a parsed quantity; a ``string`` must parse as a quantity (``"10Gi"``); a quantity is
itself. Anything else (bool, null, list, map, bytes, timestamp, ...) is an error, and so is a
negative value: usage is never negative, and a negative value would let one object's author
cancel out what other objects use. Magnitudes of ``10**64`` or more are refused, as by
:func:`~tally.quota.quantity.parse_quantity`.

**The cost bound**, and exactly what it bounds:

1. An expression is at most :data:`MAX_EXPRESSION_LENGTH` characters (checked on compile).
2. Before every evaluation, tally estimates ``k * n ** (d + 1)`` steps and refuses the object
   (:class:`MeasureCostError`) when that exceeds :data:`MAX_COST`: ``k`` is the number of
   comprehension macros in ``expression`` and ``when`` together, ``d`` how deeply they nest,
   ``n`` the item count of the largest list or map in the parts of the object they read (or of
   a literal in their text, whichever is larger). ``d`` nested comprehensions iterate at most
   ``n ** d`` times, and each iteration's body does work linear in its operands (a ``map``
   grows its result list by copying it in cel-cpp, an ``in`` scans a list), hence one more
   ``n``. Without a comprehension the work is linear in the expression and the object, and no
   estimate is made. The same estimate with the smallest ``n`` the text allows is checked on
   compile.
3. cel-cpp stops any evaluation at its 10 000th comprehension iteration, counted over all its
   comprehensions (:data:`~tally.measures.environment.ITERATION_LIMIT`), whatever the estimate
   said; and its parser refuses expressions nested more than 32 levels deep.
4. The parts of an object an expression reads may nest at most :data:`MAX_DEPTH` levels of
   maps and lists. cel-cpp converts a value recursively, on the thread's own stack (about
   1.3 KiB a level, measured): the API server stores custom resources nested up to 10 000
   levels, and converting one that deep overflows an 8 MiB stack and kills the process, where
   every other error only fails one evaluation. The limit applies to what the expression
   reads (:func:`~tally.measures.analysis.project`), so a deep field elsewhere in an object
   costs nothing.

What is *not* bounded exactly: the constant per step (a step may copy a list or scan a
string, and strings are not counted in ``n``), and lists an expression builds by concatenation,
which can exceed ``n`` by a factor set by the expression's own text (then 3. still holds). So
the bound caps how the cost grows with an object its author controls, not CPU time;
``bench/measures.py`` measures the slowest expression the bound admits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from cel_expr_python import cel

from tally.machinery import validation
from tally.measures import analysis, environment, library
from tally.measures.analysis import Shape
from tally.quota.quantity import Quantity, QuantityError, QuantityRangeError, parse_quantity

__all__ = [
    "MAX_COST",
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "Measure",
    "MeasureCostError",
    "MeasureError",
    "MeasureEvaluationError",
    "compile_measure",
    "evaluate",
    "validate_measures",
]

MAX_EXPRESSION_LENGTH: Final = 2048
"""Characters (code points) in one ``expression`` or ``when``."""

MAX_COST: Final = 1_000_000
"""Estimated steps one object may cost (see module docstring): e.g. one ``map`` over 1 000
items (35-80 ms on a shared 2-core machine, ``bench/measures.py``), or two nested
comprehensions over ~80 items each."""

MAX_DEPTH: Final = 1000
"""Levels of maps and lists in the parts of an object a measure reads (see module docstring,
4.). Far beyond real objects (a pod nests about 10 levels) and far within the stack a thread
starts with: converting 5 000 levels fit in 8 MiB, 9 000 did not."""

_SPEC_KEYS: Final = frozenset({"name", "resource", "expression", "when"})
_RESOURCE_KEYS: Final = frozenset({"group", "resource"})
_RESERVED_DOMAINS: Final = ("kubernetes.io", "k8s.io")
_EXPRESSION_TYPES: Final = (
    cel.Type.INT,
    cel.Type.UINT,
    cel.Type.DOUBLE,
    cel.Type.STRING,
    cel.Type.DYN,
    environment.QUANTITY_TYPE,
)
_WHEN_TYPES: Final = (cel.Type.BOOL, cel.Type.DYN)


class MeasureError(ValueError):
    """A measure spec is refused. ``path`` names the field (``spec.measures[2].expression``)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class MeasureEvaluationError(ValueError):
    """A measure cannot be computed for one object; ``reason`` says what failed.

    Callers deny the request (admission) or report a condition (usage): never count zero.
    """

    def __init__(self, measure: str, reason: str) -> None:
        self.measure = measure
        self.reason = reason
        super().__init__(f"measure {measure!r}: {reason}")


class MeasureCostError(MeasureEvaluationError):
    """The object would cost more than the bound allows (estimated, or cel-cpp's limit hit)."""


@dataclass(frozen=True, slots=True)
class Measure:
    """A compiled measure. Equal when their specs are; the programs are derived from them."""

    name: str
    """The quota resource name it charges (``example.com/storage-gb``)."""
    group: str
    """API group of the objects it measures; ``""`` is the core group."""
    resource: str
    """Resource (plural) of the objects it measures (``persistentvolumeclaims``)."""
    expression: str
    """CEL source of the value."""
    when: str | None
    """CEL source of the filter, or None: every object of the resource counts."""
    program: cel.Expression = field(compare=False, repr=False)
    """``expression`` compiled."""
    when_program: cel.Expression | None = field(compare=False, repr=False)
    """``when`` compiled, or None."""
    shape: Shape = field(compare=False, repr=False)
    """What ``expression`` and ``when`` read, and how their cost grows."""


def _required_str(spec: Mapping[str, Any], key: str, path: str) -> str:
    value = spec.get(key)
    if value is None:
        raise MeasureError(f"{path}.{key}", "required")
    if not isinstance(value, str):
        raise MeasureError(f"{path}.{key}", f"must be a string, not {type(value).__name__}")
    return value


def _check_name(name: str, path: str) -> None:
    prefix, slash, local = name.partition("/")
    reason = None
    if not slash:
        reason = "must be <domain>/<name>, e.g. example.com/storage-gb"
    elif validation.is_dns1123_subdomain(prefix) or "." not in prefix:
        reason = (
            f"the prefix {prefix!r} must be a DNS-1123 subdomain with at least one dot "
            "(lowercase letters, digits, '-' and '.'), e.g. example.com"
        )
    elif any(prefix == d or prefix.endswith("." + d) for d in _RESERVED_DOMAINS):
        reason = f"the prefix {prefix!r} is reserved for Kubernetes"
    elif "/" in local or validation.is_qualified_name(local):
        # The part after the domain is a qualified name's name part: no second slash.
        reason = (
            f"the name {local!r} must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    if reason is not None:
        raise MeasureError(f"{path}.name", f"invalid name {name!r}: {reason}")


def _check_resource(spec: Mapping[str, Any], path: str) -> tuple[str, str]:
    resource = spec.get("resource")
    path = f"{path}.resource"
    if resource is None:
        raise MeasureError(path, "required")
    if not isinstance(resource, Mapping):
        raise MeasureError(path, "must be an object {group, resource}")
    unknown = sorted(str(key) for key in resource if key not in _RESOURCE_KEYS)
    if unknown:
        raise MeasureError(path, f"unknown field(s): {', '.join(unknown)}")
    group = resource.get("group")
    if group is None:
        group = ""  # the core group, as `kubectl` and GroupResource write it
    if not isinstance(group, str):
        raise MeasureError(f"{path}.group", f"must be a string, not {type(group).__name__}")
    if group and (problems := validation.is_dns1123_subdomain(group)):
        raise MeasureError(f"{path}.group", f"invalid API group {group!r}: {'; '.join(problems)}")
    plural = _required_str(resource, "resource", path)
    if problems := validation.is_dns1123_label(plural):
        raise MeasureError(
            f"{path}.resource",
            f"invalid resource {plural!r}: a lowercase plural such as 'persistentvolumeclaims': "
            + "; ".join(problems),
        )
    return group, plural


def _compile(
    source: str, path: str, allowed: tuple[cel.Type, ...], wanted: str
) -> tuple[cel.Expression, Shape]:
    if not source.strip():
        raise MeasureError(path, "must not be empty")
    if len(source) > MAX_EXPRESSION_LENGTH:
        raise MeasureError(path, f"longer than {MAX_EXPRESSION_LENGTH} characters ({len(source)})")
    try:
        program, result_type = environment.compile_source(source)
    except environment.CompileError as error:
        raise MeasureError(path, f"does not compile: {error.message}") from None
    if result_type not in allowed:
        raise MeasureError(path, f"must return {wanted}; it returns {result_type.name().lower()}")
    try:
        shape = analysis.analyse(source)
    except analysis.ShapeError as error:
        # A bug here, or CEL syntax newer than tally's analysis: refuse rather than guess.
        raise MeasureError(path, f"tally cannot bound its cost: {error}") from None
    return program, shape


def _combine(first: Shape, second: Shape | None) -> Shape:
    if second is None:
        return first
    return Shape(
        projection=analysis.merge(first.projection, second.projection),
        comprehensions=first.comprehensions + second.comprehensions,
        depth=max(first.depth, second.depth),
        literal_items=max(first.literal_items, second.literal_items),
    )


def _estimate(shape: Shape, largest: int) -> int:
    items = max(largest, shape.literal_items, 1)
    steps: int = shape.comprehensions * items ** (shape.depth + 1)
    return steps


def compile_measure(spec: Mapping[str, Any], *, path: str = "spec.measures[0]") -> Measure:
    """Check and compile one measure spec. Raises :class:`MeasureError` at the first problem.

    Unknown fields are refused: the spec is tally's own, and a misspelt ``when`` must not
    silently count every object.
    """
    if not isinstance(spec, Mapping):
        raise MeasureError(path, "must be an object {name, resource, expression, when}")
    unknown = sorted(str(key) for key in spec if key not in _SPEC_KEYS)
    if unknown:
        raise MeasureError(path, f"unknown field(s): {', '.join(unknown)}")
    name = _required_str(spec, "name", path)
    _check_name(name, path)
    group, resource = _check_resource(spec, path)
    expression = _required_str(spec, "expression", path)
    program, shape = _compile(
        expression, f"{path}.expression", _EXPRESSION_TYPES, "a number, a quantity or a string"
    )
    when = spec.get("when")
    when_program = None
    when_shape = None
    if when is not None:
        when = _required_str(spec, "when", path)
        when_program, when_shape = _compile(when, f"{path}.when", _WHEN_TYPES, "a bool")
    combined = _combine(shape, when_shape)
    floor = _estimate(combined, 0)
    if floor > MAX_COST:
        raise MeasureError(
            path,
            f"cost limit exceeded: {combined.comprehensions} comprehension(s) nested "
            f"{combined.depth} deep cost about {floor:,} steps even on the smallest object "
            f"(limit {MAX_COST:,})",
        )
    return Measure(
        name=name,
        group=group,
        resource=resource,
        expression=expression,
        when=when,
        program=program,
        when_program=when_program,
        shape=combined,
    )


def validate_measures(specs: object, *, path: str = "spec.measures") -> list[str]:
    """Every problem of a ``spec.measures`` list, one message each, in order; empty when the
    list is fine (or absent). For a webhook that reports all problems of a write at once."""
    if specs is None:
        return []
    if not isinstance(specs, Sequence) or isinstance(specs, str):
        return [f"{path}: must be a list"]
    problems: list[str] = []
    first_seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        item = f"{path}[{index}]"
        try:
            compile_measure(spec, path=item)
        except MeasureError as error:
            problems.append(str(error))
        name = spec.get("name") if isinstance(spec, Mapping) else None
        if isinstance(name, str):
            if name in first_seen:
                problems.append(
                    f"{item}.name: duplicate name {name!r} (also {path}[{first_seen[name]}])"
                )
            else:
                first_seen[name] = index
    return problems


def _kind(value: object) -> str:
    """The CEL type name of a plain value, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes | bytearray):
        return "bytes"
    if isinstance(value, list):
        return "list"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, datetime):
        return "timestamp"
    if isinstance(value, timedelta):
        return "duration"
    return "type"


def _run(
    measure: Measure,
    program: cel.Expression,
    context: cel.Activation | Mapping[str, Any],
    role: str,
) -> Any:
    try:
        return environment.evaluate(program, context)
    except environment.IterationLimitError as error:
        raise MeasureCostError(measure.name, f"{role}{error.message}") from None
    except environment.CelError as error:
        raise MeasureEvaluationError(measure.name, f"{role}{error.message}") from None


def _to_quantity(measure: Measure, value: Any) -> Quantity:
    kind = _kind(value)
    result: Quantity | None = None
    try:
        if kind == "int":
            result = Quantity.from_int(value)
        elif kind == "double":
            if not math.isfinite(value):
                raise MeasureEvaluationError(
                    measure.name, f"expression returned a double that is not finite: {value}"
                )
            # repr: the shortest decimal that reads back as this double (0.1, not 0.1000...05).
            result = parse_quantity(repr(value))
        elif kind == "string":
            result = parse_quantity(value)
        elif kind == "map":
            result = library.decode(value)
    except QuantityRangeError as error:
        raise MeasureEvaluationError(
            measure.name, f"expression returned {value!r}, out of range: {error.reason}"
        ) from None
    except QuantityError:
        raise MeasureEvaluationError(
            measure.name, f"expression returned a string that is not a quantity: {value!r}"
        ) from None
    if result is None:
        raise MeasureEvaluationError(
            measure.name, f"expression returned a {kind}, not a number or a quantity"
        )
    if result.nanos < 0:
        raise MeasureEvaluationError(
            measure.name,
            f"expression returned a negative value: {result} (usage is never negative)",
        )
    return result


def evaluate(measure: Measure, obj: Mapping[str, Any]) -> Quantity | None:
    """What ``obj`` (a Kubernetes object as JSON) uses of ``measure``, or None when ``when`` is
    false. Raises :class:`MeasureEvaluationError` (:class:`MeasureCostError` for the bound).

    Synchronous and CPU-bound, a few to a few tens of microseconds for a typical measure
    (``bench/measures.py``); ``obj`` is read, never changed.
    """
    shape = measure.shape
    projected = analysis.project(obj, shape.projection)
    if analysis.deeper_than(projected, MAX_DEPTH):
        raise MeasureEvaluationError(
            measure.name,
            f"the object is nested more than {MAX_DEPTH} levels deep where the expression reads it",
        )
    if shape.comprehensions:
        largest = analysis.largest_collection(projected)
        steps = _estimate(shape, largest)
        if steps > MAX_COST:
            raise MeasureCostError(
                measure.name,
                f"cost limit exceeded: about {steps:,} steps for an object with a list or map "
                f"of {largest:,} items ({shape.comprehensions} comprehension(s) nested "
                f"{shape.depth} deep; limit {MAX_COST:,})",
            )
    if measure.when_program is None:
        return _to_quantity(measure, _run(measure, measure.program, projected, ""))
    # Both programs read the same object: convert it once.
    context = environment.activation(projected)
    matches = _run(measure, measure.when_program, context, "when: ")
    if type(matches) is not bool:
        raise MeasureEvaluationError(measure.name, f"when: returned a {_kind(matches)}, not a bool")
    if not matches:
        return None
    return _to_quantity(measure, _run(measure, measure.program, context, ""))
