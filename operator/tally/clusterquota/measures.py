"""ClusterQuota measures: ``spec.measures[]`` compiled once, and gathered per measured kind.

A ClusterQuota defines measures (:mod:`tally.measures`: a name, a kind, a CEL expression and an
optional ``when``) and names them in ``spec.quota.hard`` like any resource. A measure's name is
cluster-wide: every ClusterQuota naming it in ``hard`` is charged by the same definition, so two
ClusterQuotas may define one name only identically (the validating webhook refuses a different
definition; if one got in anyway, the first ClusterQuota by name wins and the other is
reported).

Measures over a kind whose cache keeps only a compact projection (pods, services, the kinds
tally always watches: ``unmeasurable``) are refused: their objects are not kept whole.

Compiling is the expensive part (the CEL checker), so :class:`MeasureCatalog` compiles each
distinct spec once and keeps it while some ClusterQuota still defines it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from tally.evaluators.base import GroupResource
from tally.evaluators.measured import MeasuredEvaluator
from tally.evaluators.registry import Registry
from tally.measures import Measure, MeasureError, compile_measure

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]


def measure_specs(cq: Obj) -> list[Any]:
    """``spec.measures`` as written (not checked); [] when absent."""
    spec = cq.get("spec")
    raw = spec.get("measures") if isinstance(spec, Mapping) else None
    return list(raw) if isinstance(raw, list) else []


def _name_of(cq: Obj) -> str:
    metadata = cq.get("metadata")
    return str(metadata.get("name") or "") if isinstance(metadata, Mapping) else ""


class MeasureCatalog:
    """Every ClusterQuota's compiled measures, by the kind they measure (module doc)."""

    def __init__(self, unmeasurable: Collection[GroupResource] = ()) -> None:
        self.unmeasurable = frozenset(unmeasurable)
        self._compiled: dict[str, Measure] = {}
        self._measured: dict[GroupResource, dict[str, Measure]] = {}

    def compile(self, spec: Any, path: str) -> Measure:
        """One measure spec, compiled (once per distinct spec); :class:`MeasureError` if it is
        invalid or measures a kind tally cannot."""
        key = json.dumps(spec, sort_keys=True, default=str)
        measure = self._compiled.get(key)
        if measure is None:
            measure = compile_measure(spec, path=path)
            self._compiled[key] = measure
        gr = GroupResource(measure.group, measure.resource)
        if gr in self.unmeasurable:
            raise MeasureError(
                f"{path}.resource",
                f"{gr} cannot be measured: tally keeps only what its quota names need of "
                "these objects (count them, or use their own quota names)",
            )
        return measure

    def problems(self, cq: Obj, others: Iterable[Obj] = ()) -> list[str]:
        """What is wrong with ``cq``'s measures (each problem once, with its field), including
        a name another ClusterQuota of ``others`` defines differently."""
        errors: list[str] = []
        mine: dict[str, Measure] = {}
        for index, spec in enumerate(measure_specs(cq)):
            path = f"spec.measures[{index}]"
            try:
                measure = self.compile(spec, path)
            except MeasureError as error:
                errors.append(str(error))
                continue
            if measure.name in mine:
                errors.append(f"{path}.name: Duplicate value: {measure.name!r}")
                continue
            mine[measure.name] = measure
        own_name = _name_of(cq)
        for other in others:
            if _name_of(other) == own_name:
                continue
            for measure in self.defined(other):
                theirs = mine.get(measure.name)
                if theirs is not None and theirs != measure:
                    errors.append(
                        f"spec.measures: measure {measure.name!r} is defined differently by "
                        f"ClusterQuota {_name_of(other)!r}; a measure name means one thing "
                        "cluster-wide"
                    )
        return errors

    def defined(self, cq: Obj) -> list[Measure]:
        """``cq``'s valid measures (invalid ones are left out: the webhook refused them)."""
        result: list[Measure] = []
        for index, spec in enumerate(measure_specs(cq)):
            try:
                result.append(self.compile(spec, f"spec.measures[{index}]"))
            except MeasureError:
                continue
        return result

    def by_kind(
        self, cqs: Iterable[Obj]
    ) -> tuple[dict[GroupResource, dict[str, Measure]], list[str]]:
        """Every measure of ``cqs``, by the kind it measures, and the conflicts left out."""
        cqs = list(cqs)
        found: dict[str, tuple[str, Measure]] = {}
        conflicts: list[str] = []
        for cq in sorted(cqs, key=_name_of):
            for measure in self.defined(cq):
                first = found.get(measure.name)
                if first is None:
                    found[measure.name] = (_name_of(cq), measure)
                elif first[1] != measure:
                    conflicts.append(
                        f"ClusterQuota {_name_of(cq)!r} defines measure {measure.name!r} "
                        f"differently from {first[0]!r}, whose definition is used"
                    )
        kinds: dict[GroupResource, dict[str, Measure]] = {}
        for name, (_, measure) in sorted(found.items()):
            kinds.setdefault(GroupResource(measure.group, measure.resource), {})[name] = measure
        live = {json.dumps(s, sort_keys=True, default=str) for cq in cqs for s in measure_specs(cq)}
        for key in set(self._compiled) - live:
            del self._compiled[key]
        return kinds, conflicts

    def refresh(self, cqs: Iterable[Obj], registry: Registry) -> list[GroupResource]:
        """Register an evaluator for each kind ``cqs`` measure, and remove those no ClusterQuota
        measures any more; the kinds whose measures changed (each to be watched again)."""
        wanted, conflicts = self.by_kind(cqs)
        for conflict in conflicts:
            logger.warning("measures: %s", conflict)
        changed: list[GroupResource] = []
        for gr in sorted(set(self._measured) | set(wanted)):
            measures = wanted.get(gr, {})
            if measures == self._measured.get(gr, {}):
                continue
            if measures:
                registry.register(MeasuredEvaluator(gr, measures.values()))
            else:
                registry.remove(gr)
            logger.info("measures: %s now measured by %s", gr, sorted(measures) or "nothing")
            changed.append(gr)
        self._measured = wanted
        return changed
