"""ClusterQuota measures gathered per kind: compiled once, conflicts refused, some kinds not
measurable."""

from __future__ import annotations

from typing import Any

import pytest

from tally.clusterquota.measures import MeasureCatalog
from tally.evaluators.base import GroupResource

pytestmark = pytest.mark.unit

DBS = GroupResource("example.com", "databases")
PODS = GroupResource("", "pods")


def measure(name: str, expression: str = "object.spec.size", **resource: str) -> dict[str, Any]:
    return {
        "name": name,
        "resource": resource or {"group": "example.com", "resource": "databases"},
        "expression": expression,
    }


def cq(name: str, *measures: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"measures": list(measures)}}


def test_by_kind_gathers_every_clusterquotas_measures() -> None:
    catalog = MeasureCatalog()
    kinds, conflicts = catalog.by_kind(
        [cq("a", measure("example.com/size")), cq("b", measure("example.com/size"),
                                                   measure("example.com/two", "2"))]
    )  # fmt: skip
    assert [] == conflicts
    assert {DBS: ["example.com/size", "example.com/two"]} == {
        gr: sorted(measures) for gr, measures in kinds.items()
    }


def test_a_name_defined_twice_differently_keeps_the_first_and_says_so() -> None:
    catalog = MeasureCatalog()
    a, b = cq("a", measure("example.com/size")), cq("b", measure("example.com/size", "1"))
    kinds, conflicts = catalog.by_kind([b, a])
    assert "object.spec.size" == kinds[DBS]["example.com/size"].expression
    assert ["ClusterQuota 'b' defines measure 'example.com/size' differently from 'a', whose "
            "definition is used"] == conflicts  # fmt: skip
    # At write time the webhook refuses the second definition.
    assert any("defined differently by ClusterQuota 'a'" in p for p in catalog.problems(b, [a]))
    assert [] == catalog.problems(a, [a])  # itself, as stored, is no conflict


def test_problems_name_the_field() -> None:
    catalog = MeasureCatalog(unmeasurable={PODS})
    problems = catalog.problems(
        cq("a", measure("example.com/size", "object.spec.size +"),
           measure("example.com/pods", "1", group="", resource="pods"),
           measure("example.com/x", "1"), measure("example.com/x", "2"))
    )  # fmt: skip
    assert 3 == len(problems), problems
    assert problems[0].startswith("spec.measures[0].expression")
    assert problems[1].startswith("spec.measures[1].resource")
    assert "pods cannot be measured" in problems[1]
    assert problems[2].startswith("spec.measures[3].name: Duplicate value")


def test_compiled_once_and_forgotten_when_no_clusterquota_defines_it() -> None:
    catalog = MeasureCatalog()
    spec = measure("example.com/size")
    first = catalog.compile(spec, "spec.measures[0]")
    assert first is catalog.compile(dict(spec), "spec.measures[0]")
    catalog.by_kind([cq("a", spec)])
    assert first is catalog.compile(spec, "spec.measures[0]")
    catalog.by_kind([])
    again = catalog.compile(spec, "spec.measures[0]")
    assert first is not again
    assert first == again  # equal specs, equal measures
