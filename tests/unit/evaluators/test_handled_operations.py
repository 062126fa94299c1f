"""Each evaluator's ``handled_operations`` says exactly what its ``handles`` can answer yes to.

The webhook's rules are built from the declaration (tally.webhook.configuration), so a
declaration narrower than ``handles`` would keep requests from admission that it must judge,
and a wider one would send requests nobody charges. Expected declarations are upstream's
``Handles`` methods read by hand (pods.go, services.go, persistent_volume_claims.go,
resource_claims.go, generic/evaluator.go); PodSets and measured kinds are tally's own (their
module docstrings).
"""

from __future__ import annotations

from typing import Any

import pytest

from tally.evaluators.base import Evaluator, GroupResource, Operation, handled
from tally.evaluators.generic import ObjectCountEvaluator
from tally.evaluators.measured import MeasuredEvaluator
from tally.evaluators.pods import PodEvaluator
from tally.evaluators.podsets import PodSetEvaluator
from tally.evaluators.pvcs import PersistentVolumeClaimEvaluator
from tally.evaluators.resourceclaims import ResourceClaimEvaluator
from tally.evaluators.services import ServiceEvaluator
from tally.measures import compile_measure

pytestmark = pytest.mark.unit

CREATE, UPDATE = Operation.CREATE, Operation.UPDATE
SUBRESOURCES = (
    "",
    *("status", "scale", "resize", "binding", "eviction", "ephemeralcontainers"),
    *("exec", "attach", "log", "portforward", "proxy", "token", "approval"),
)
"""The object itself and the subresources the API serves for namespaced kinds."""
OBJECTS: list[dict[str, Any]] = [
    {"metadata": {"name": "x"}, "spec": {}},
    # Terminating (upstream IsTerminating: activeDeadlineSeconds set and >= 0).
    {"metadata": {"name": "x"}, "spec": {"activeDeadlineSeconds": 30}},
]


def measured() -> MeasuredEvaluator:
    widgets = GroupResource("example.com", "widgets")
    resource = {"group": widgets.group, "resource": widgets.resource}
    measure = compile_measure({"name": "example.com/gb", "resource": resource, "expression": "1"})
    return MeasuredEvaluator(widgets, [measure])


def can_handle(evaluator: Evaluator, operation: Operation, subresource: str) -> bool:
    """``handles`` says yes to some request as admission would ask it (admission asks only for
    CREATE, without an old object, and UPDATE)."""
    if operation is CREATE:
        requests = [(None, new) for new in OBJECTS]
    else:
        requests = [(old, new) for old in OBJECTS for new in OBJECTS]
    return any(evaluator.handles(operation, subresource, old, new) for old, new in requests)


@pytest.mark.parametrize(
    ("evaluator", "expected"),
    [
        # podEvaluator.Handles: "" CREATE, or UPDATE when IsTerminating changes; resize UPDATE.
        pytest.param(PodEvaluator(), {"": {CREATE, UPDATE}, "resize": {UPDATE}}, id="pods"),
        pytest.param(ServiceEvaluator(), {"": {CREATE, UPDATE}}, id="services"),
        # pvcEvaluator.Handles looks at the operation only; tally ports status writes too
        # (pvcs.py) and the webhook's rules leave them out.
        pytest.param(
            PersistentVolumeClaimEvaluator(), {"": {CREATE, UPDATE}, "status": {UPDATE}}, id="pvcs"
        ),
        # claimEvaluator.Handles: no subresource, CREATE or UPDATE.
        pytest.param(ResourceClaimEvaluator(), {"": {CREATE, UPDATE}}, id="resourceclaims"),
        # objectCountEvaluator.Handles: operation == Create.
        pytest.param(
            ObjectCountEvaluator(GroupResource("", "secrets"), "secrets"),
            {"": {CREATE}},
            id="count",
        ),
        pytest.param(PodSetEvaluator(), {"": {CREATE, UPDATE}, "scale": {UPDATE}}, id="podsets"),
        pytest.param(measured(), {"": {CREATE, UPDATE}}, id="measured"),
    ],
)
def test_declaration_is_what_handles_takes(
    evaluator: Evaluator, expected: dict[str, set[Operation]]
) -> None:
    assert expected == {sub: set(ops) for sub, ops in evaluator.handled_operations.items()}
    said_yes = {
        (subresource, operation)
        for subresource in SUBRESOURCES
        for operation in (CREATE, UPDATE)
        if can_handle(evaluator, operation, subresource)
    }
    declared = {(sub, op) for sub, ops in evaluator.handled_operations.items() for op in ops}
    assert declared == said_yes


def test_handled_is_read_only() -> None:
    declaration = handled([CREATE], resize=[UPDATE])
    assert {"": frozenset({CREATE}), "resize": frozenset({UPDATE})} == declaration
    with pytest.raises(TypeError):
        declaration[""] = frozenset({UPDATE})  # type: ignore[index]
