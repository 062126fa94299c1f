"""The evaluator of a measured kind: its count and its measures, failures never a silent zero.

Expected values are sums worked out by hand from the objects below.
"""

from __future__ import annotations

from typing import Any

import pytest

from tally.evaluators.base import ConstraintError, GroupResource, Operation
from tally.evaluators.measured import MeasuredEvaluator
from tally.evaluators.registry import UsageError, calculate_usage, new_registry
from tally.measures import MeasureEvaluationError, compile_measure
from tally.quota import resources as quota

pytestmark = pytest.mark.unit

DBS = GroupResource("example.com", "databases")
STORAGE = "example.com/storage-gb"
GOLD = "example.com/gold-storage-gb"


def evaluator() -> MeasuredEvaluator:
    resource = {"group": "example.com", "resource": "databases"}
    return MeasuredEvaluator(
        DBS,
        [
            compile_measure(
                {"name": STORAGE, "resource": resource, "expression": "object.spec.storageGB"}
            ),
            compile_measure(
                {"name": GOLD, "resource": resource, "expression": "object.spec.storageGB",
                 "when": 'object.spec.tier == "gold"'}
            ),
        ],
    )  # fmt: skip


def db(storage: Any, tier: str = "gold") -> dict[str, Any]:
    return {"metadata": {"name": "d"}, "spec": {"storageGB": storage, "tier": tier}}


def test_usage_counts_and_measures() -> None:
    assert {"count/databases.example.com": "1", STORAGE: "10", GOLD: "10"} == quota.to_strings(
        evaluator().usage(db(10))
    )
    assert {"count/databases.example.com": "1", STORAGE: "5"} == quota.to_strings(
        evaluator().usage(db(5, "silver"))
    )


def test_matching_resources() -> None:
    names = [STORAGE, "count/databases.example.com", GOLD, "example.com/other", "pods"]
    assert sorted([STORAGE, "count/databases.example.com", GOLD]) == sorted(
        evaluator().matching_resources(names)
    )


def test_sums_over_objects_in_a_calculation() -> None:
    registry = new_registry()
    registry.register(evaluator())
    objects = {DBS: [db(10), db(5, "silver"), db(20)]}
    assert {STORAGE: "35", GOLD: "30", "count/databases.example.com": "3"} == quota.to_strings(
        calculate_usage(objects, [STORAGE, GOLD, "count/databases.example.com"], (), registry)
    )


def test_a_failing_measure_is_a_constraint_at_admission_never_zero() -> None:
    with pytest.raises(ConstraintError, match="no such key: storageGB"):
        evaluator().constraints([STORAGE], {"metadata": {}, "spec": {"tier": "gold"}})
    with pytest.raises(ConstraintError, match="not a quantity"):
        evaluator().constraints([STORAGE], db("lots"))
    # A measure the quota does not track is not evaluated.
    evaluator().constraints(["count/databases.example.com"], db("lots"))
    with pytest.raises(MeasureEvaluationError):
        evaluator().usage(db("lots"))


def test_handles_creates_and_updates_of_the_object_only() -> None:
    ev = evaluator()
    assert ev.handles(Operation.CREATE, "", None, None)
    assert ev.handles(Operation.UPDATE, "", None, None)
    assert not ev.handles(Operation.UPDATE, "status", None, None)
    assert not ev.handles(Operation.DELETE, "", None, None)


def test_replenishment_when_a_measure_goes_down() -> None:
    ev = evaluator()
    assert ev.requires_replenishment(db(10), db(5))
    assert ev.requires_replenishment(db(10), db(10, "silver"))  # gold lost
    assert not ev.requires_replenishment(db(5), db(10))


def test_a_measure_over_another_kind_is_refused() -> None:
    other = compile_measure(
        {"name": STORAGE, "resource": {"group": "", "resource": "configmaps"},
         "expression": "1"}
    )  # fmt: skip
    with pytest.raises(ValueError, match="another kind"):
        MeasuredEvaluator(DBS, [other])


def test_a_failing_measure_in_a_usage_calculation_names_the_object() -> None:
    # The usage controller reports it: whoever reads it must find the object to fix.
    registry = new_registry()
    registry.register(evaluator())
    broken = {"metadata": {"name": "d2", "namespace": "team-a"}, "spec": {"tier": "gold"}}
    with pytest.raises(UsageError) as failed:
        calculate_usage({DBS: [db(10), broken]}, [STORAGE], (), registry)
    (error,) = failed.value.errors
    assert isinstance(error, MeasureEvaluationError)
    assert STORAGE == error.measure
    assert str(error).startswith(f"measure '{STORAGE}': databases.example.com team-a/d2: "), str(
        error
    )
    assert "no such key: storageGB" in str(error)
