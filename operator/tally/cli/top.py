"""``kubectl tally top``: the objects of a namespace that use most of one quota resource.

"Use" is exactly what a quota would charge: each evaluator's own ``usage`` of each object
(the pod evaluator's formula for ``requests.cpu``, a PodSet's template times its replicas for
``podsets.tally.dev/requests.cpu``, one per object for ``count/…``), so the figures add up to
what a quota on that name in that namespace holds. A resource no evaluator measures is an
error, not an empty table. Objects that use none of it (a finished pod) are left out; each
shown object carries its owner (the controller reference, else the first owner reference),
which is how a reader gets from a pod to the PodSet, ReplicaSet or Job to scale down.

Pure: objects in, a :class:`TopReport` out; the caller lists the objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tally.evaluators.base import Evaluator
from tally.evaluators.registry import Registry, group_resource_for_count_name
from tally.quota.quantity import ZERO, Quantity

__all__ = [
    "Owner",
    "TopReport",
    "TopRow",
    "evaluators_for",
    "owner_of",
    "rank",
]

Obj = Mapping[str, Any]


@dataclass(frozen=True, order=True)
class Owner:
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class TopRow:
    kind: str
    name: str
    owner: Owner | None
    usage: Quantity


@dataclass(frozen=True)
class TopReport:
    namespace: str
    resource: str
    rows: tuple[TopRow, ...]
    """The top objects, most first."""
    total: Quantity
    """What every object of the namespace uses of ``resource`` (the shown and the rest)."""
    using: int
    """How many objects use some of it."""
    counted: int
    """How many objects were measured."""
    unmeasured: tuple[str, ...] = ()
    """Objects an evaluator could not measure (malformed), with the reason."""


def evaluators_for(resource: str, registry: Registry) -> list[Evaluator]:
    """The evaluators that measure ``resource`` (a quota resource name), as a quota would
    count it: the registered ones, and for ``count/<r>.<g>`` of any other kind an object
    count. Empty when nothing measures it."""
    found = [e for e in registry.list() if e.matching_resources([resource])]
    group_resource = group_resource_for_count_name(resource)
    if (
        not found
        and group_resource is not None
        and not registry.is_ignored(group_resource)
        and registry.get(group_resource) is None
    ):
        counter = registry.get_or_count(group_resource)
        if counter is not None:
            found.append(counter)
    return found


def owner_of(obj: Obj) -> Owner | None:
    """The controller reference (``ownerReferences[].controller``), else the first owner
    reference; None for an object nobody owns."""
    metadata = obj.get("metadata")
    refs = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    if not isinstance(refs, list):
        return None
    valid = [r for r in refs if isinstance(r, Mapping) and r.get("kind") and r.get("name")]
    if not valid:
        return None
    chosen = next((r for r in valid if r.get("controller") is True), valid[0])
    return Owner(str(chosen["kind"]), str(chosen["name"]))


def _name(obj: Obj) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("name") or "") if isinstance(metadata, Mapping) else ""


def rank(
    namespace: str,
    resource: str,
    objects: Sequence[tuple[str, Evaluator, Iterable[Obj]]],
    limit: int | None,
) -> TopReport:
    """The ``limit`` objects (all when None) using most of ``resource``: ``objects`` holds,
    per kind, its name (``Pod``), its evaluator and its objects. Ties go by kind, then name."""
    rows: list[TopRow] = []
    unmeasured: list[str] = []
    counted = 0
    total = ZERO
    for kind, evaluator, items in objects:
        for obj in items:
            counted += 1
            try:
                usage = evaluator.usage(obj).get(resource, ZERO)
            except ValueError as error:  # ObjectError, QuantityError: a malformed object
                unmeasured.append(f"{kind} {_name(obj)}: {error}")
                continue
            if usage.nanos <= 0:
                continue
            total = total + usage
            rows.append(TopRow(kind, _name(obj), owner_of(obj), usage))
    rows.sort(key=lambda row: (-row.usage.nanos, row.kind, row.name))
    shown = rows if limit is None else rows[:limit]
    return TopReport(
        namespace=namespace,
        resource=resource,
        rows=tuple(shown),
        total=total,
        using=len(rows),
        counted=counted,
        unmeasured=tuple(unmeasured),
    )
