"""Objects as deep as the API server stores (10 000 levels of a custom resource's free-form
content) through what a review of one goes through: the envelope, quota admission's view of
it, PodSet validation and measures, and the PodSet controller's copy of the template; all with
the recursion limit tally sets at start-up (tally.app.recursion).

Not here: ClusterQuota measures (CEL) over a deep field; cel-expr-python's conversion of a
deep object recurses in native code without a bound.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tally.app.recursion import RECURSION_LIMIT, raise_recursion_limit
from tally.evaluators.podsets import PodSetEvaluator
from tally.podset import replicas
from tally.podset.validation import validate_podset
from tally.quota import resources as quota
from tally.webhook.server import MAX_OBJECT_DEPTH, attributes_from_review, parse_review

pytestmark = pytest.mark.unit

P = "podsets.tally.dev/"
TEMPLATE_SPEC_DEPTH = 4
"""The PodSet is level 1, ``spec`` 2, ``template`` 3, the pod ``spec`` 4."""


@pytest.fixture(autouse=True)
def recursion_limit() -> Iterator[None]:
    before = sys.getrecursionlimit()
    assert RECURSION_LIMIT == raise_recursion_limit()
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def _nested(levels: int) -> list[Any]:
    """``levels`` arrays, each the only item of the one above; built without recursion."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _podset(depth: int, replica_count: int = 2) -> dict[str, Any]:
    """A valid PodSet whose pod template carries a field nesting the PodSet ``depth`` deep."""
    return {
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-web"},
        "spec": {
            "replicas": replica_count,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "a",
                            "image": "registry.example/app:1",
                            "resources": {"requests": {"cpu": "100m"}},
                        }
                    ],
                    "x": _nested(depth - TEMPLATE_SPEC_DEPTH),
                },
            },
        },
    }


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend(
                (child, level + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


@pytest.mark.parametrize(
    "depth", [pytest.param(9_000, id="9000"), pytest.param(MAX_OBJECT_DEPTH, id="max")]
)
def test_a_review_of_a_deep_podset_parses_into_attributes(depth: int) -> None:
    new, old = _podset(depth, 3), _podset(depth)
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "resource": {"group": "tally.dev", "version": "v1alpha1", "resource": "podsets"},
            "namespace": "ns",
            "name": "web",
            "operation": "UPDATE",
            "userInfo": {"username": "alice"},
            "object": new,
            "oldObject": old,
        },
    }
    parsed = parse_review(json.dumps(review).encode())
    attributes = attributes_from_review(parsed)
    assert (depth, depth) == (_depth(attributes.obj), _depth(attributes.old_obj))
    assert new == attributes.obj


def test_a_deep_podset_is_valid() -> None:
    # Only the selector is compared between old and new; the deep field is the pod's business.
    assert [] == validate_podset(_podset(9_000, 3), _podset(9_000))
    assert [] == validate_podset(_podset(MAX_OBJECT_DEPTH))


def test_a_deep_podset_is_measured_like_any_other() -> None:
    # 3 replicas of a pod requesting 100m of CPU.
    evaluator = PodSetEvaluator()
    usage = quota.to_strings(evaluator.usage(_podset(9_000, 3)))
    assert ("3", "300m") == (usage[P + "pods"], usage[P + "requests.cpu"])
    assert evaluator.requires_replenishment(_podset(9_000, 3), _podset(9_000, 2))


def test_the_podset_controller_copies_a_deep_template_into_its_pods() -> None:
    podset = _podset(MAX_OBJECT_DEPTH)
    pod = replicas.pod_from_template(podset)
    assert pod["spec"] == podset["spec"]["template"]["spec"]
    assert pod["spec"]["x"] is not podset["spec"]["template"]["spec"]["x"]
