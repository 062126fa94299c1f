"""What an expression reads and how its cost grows, from its text: the projection (by hand,
and checked against the runtime on random objects: evaluating the projection must give what
the whole object gives, value or error), and the comprehension counts behind the cost bound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.measures import environment
from tally.measures.analysis import (
    Shape,
    ShapeError,
    analyse,
    deeper_than,
    largest_collection,
    merge,
    project,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("source", "projection"),
    [
        pytest.param("1", {}, id="constant-reads-nothing"),
        pytest.param("object", None, id="whole-object"),
        pytest.param("size(object)", None, id="whole-object-in-a-call"),
        pytest.param("object.spec.size", {"spec": {"size": None}}, id="field-chain"),
        pytest.param(
            "object.spec.a + object.spec.b.c",
            {"spec": {"a": None, "b": {"c": None}}},
            id="two-chains-merge",
        ),
        pytest.param(
            "object.spec.a.b + object.spec.a", {"spec": {"a": None}}, id="a-whole-prefix-wins"
        ),
        pytest.param("has(object.spec.x)", {"spec": {"x": None}}, id="has"),
        pytest.param(
            "object.metadata.annotations['example.com/gb']",
            {"metadata": {"annotations": {"example.com/gb": None}}},
            id="string-index",
        ),
        pytest.param(
            'object.spec.containers[0].resources.requests["memory"]',
            {"spec": {"containers": {0: {"resources": {"requests": {"memory": None}}}}}},
            id="list-and-string-index",
        ),
        pytest.param("object.l[i]", {"l": None}, id="variable-index-ends-the-chain"),
        pytest.param("object.l[0u]", {"l": None}, id="uint-index-ends-the-chain"),
        pytest.param(r'object.m["a\"b"]', {"m": None}, id="escaped-string-ends-the-chain"),
        pytest.param("object.m[r'x']", {"m": None}, id="raw-string-ends-the-chain"),
        pytest.param("object.spec.items.map(i, i)", {"spec": {"items": None}}, id="macro"),
        pytest.param("object.spec.name.size()", {"spec": {"name": None}}, id="method-call"),
        pytest.param("'x' in object.spec", {"spec": None}, id="in"),
        pytest.param("object.`a-b`.c", None, id="quoted-field-ends-the-chain"),
        pytest.param(".object.spec", {"spec": None}, id="root-scoped"),
        pytest.param(
            "object.items.map(object, object.size)",
            None,
            id="a-variable-named-object-only-reads-more",
        ),
        pytest.param(
            "'object.secret' + \"object.x\" + '''object.y''' + r'object.z' // object.w\n",
            {},
            id="strings-and-comments-are-not-references",
        ),
        pytest.param("object . spec\n . size", {"spec": {"size": None}}, id="spaces"),
    ],
)
def test_projection(source: str, projection: object) -> None:
    assert analyse(source).projection == projection


@pytest.mark.parametrize(
    ("source", "comprehensions", "depth", "literal_items"),
    [
        pytest.param("object.spec.size", 0, 0, 1, id="none"),
        pytest.param("object.l.map(x, x * 2).size()", 1, 1, 2, id="one"),
        pytest.param("object.l.all(x, x > 0) && object.m.exists(k, k == 'a')", 2, 1, 3, id="two"),
        pytest.param("object.l.map(x, object.l.filter(y, y > x).size())", 2, 2, 3, id="nested"),
        pytest.param("object.l.exists_one(x, [1, 2, 3].exists(y, y == x))", 2, 2, 5, id="literal"),
        pytest.param("object.map", 0, 0, 1, id="a-field-named-map"),
        pytest.param("has(object.a)", 0, 0, 1, id="has-is-no-comprehension"),
        pytest.param(
            "(object.l.map(x, x)).size() + [object.l.map(y, y)].size()", 2, 1, 3, id="side-by-side"
        ),
    ],
)
def test_comprehensions(source: str, comprehensions: int, depth: int, literal_items: int) -> None:
    shape = analyse(source)
    assert (shape.comprehensions, shape.depth, shape.literal_items) == (
        comprehensions,
        depth,
        literal_items,
    )


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("object.x # y", id="unknown-character"),
        pytest.param("(object.x", id="unclosed"),
        pytest.param("object.x)", id="unopened"),
    ],
)
def test_text_the_analysis_does_not_know_is_an_error(source: str) -> None:
    with pytest.raises(ShapeError):
        analyse(source)


def test_merge() -> None:
    assert merge({"a": {"b": None}}, {"a": {"c": None}, "d": None}) == {
        "a": {"b": None, "c": None},
        "d": None,
    }
    assert merge({"a": None}, {"a": {"b": None}}) == {"a": None}
    assert merge(None, {"a": None}) is None


def test_project_keeps_only_what_is_read_and_shares_it() -> None:
    containers = [{"name": "a", "resources": {"cpu": "1"}, "env": [1, 2, 3]}, {"name": "b"}]
    pod = {"spec": {"containers": containers, "nodeName": "n"}, "status": {"phase": "Running"}}
    projected = project(pod, analyse("object.spec.containers.size()").projection)
    assert projected == {"spec": {"containers": containers}}
    assert projected["spec"]["containers"] is containers


def test_project_a_list_read_at_literal_indexes() -> None:
    projection = analyse("object.l[2].x + object.l[0]").projection
    items = [{"x": 1, "y": 2}, 5, {"x": 3, "z": 4}, 7]
    assert project({"l": items}, projection) == {"l": [{"x": 1, "y": 2}, None, {"x": 3}]}
    # Shorter than the highest index: as short as the original, so the same index error.
    assert project({"l": [1]}, projection) == {"l": [1]}
    # Not a list: a map cannot hold an int key, the lookup fails alike.
    assert project({"l": {"2": 1}}, projection) == {"l": {}}


def test_project_leaves_missing_keys_missing_and_scalars_whole() -> None:
    projection = analyse("object.spec.a.b").projection
    assert project({"status": {}}, projection) == {}
    assert project({"spec": "text"}, projection) == {"spec": "text"}
    assert project({"spec": {"a": [1]}}, projection) == {"spec": {"a": [1]}}


@pytest.mark.parametrize(
    ("value", "depth"),
    [
        pytest.param(5, 0, id="scalar"),
        pytest.param({}, 1, id="empty-map"),
        pytest.param({"a": 1}, 1, id="map"),
        pytest.param({"a": [1, {"b": "c"}]}, 3, id="map-list-map"),
        pytest.param([[], [[[]]], {"x": {}}], 4, id="deepest-branch-counts"),
    ],
)
def test_deeper_than(value: Any, depth: int) -> None:
    assert not deeper_than(value, depth)
    assert deeper_than(value, depth - 1) is (depth > 0)


def test_largest_collection() -> None:
    assert largest_collection(5) == 0
    assert largest_collection({"a": [1, 2, 3], "b": {"c": list(range(7))}}) == 7
    assert largest_collection([{"a": 1, "b": 2, "c": 3, "d": 4}, [1]]) == 4


def test_shape_is_a_value() -> None:
    assert analyse("object.a") == Shape({"a": None}, 0, 0, 1)


# -- the projection against the runtime --------------------------------------------------------

_KEYS = st.sampled_from(["a", "b", "c", "l", "spec", "object", "size"])
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.sampled_from(["a", "b", "", "1Gi"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=20,
)
_OBJECTS = st.dictionaries(_KEYS, _JSON, max_size=5)

_EXPRESSIONS = [
    "object.a",
    "object.a.b",
    "object.spec.a.b.c",
    "has(object.a.b)",
    "has(object.a) && has(object.a.b) ? object.a.b : 'none'",
    "object.l[0]",
    "object.l[1].a",
    "object.l[0] == object.l[2]",
    "object['a']['b']",
    "object.a[object.b]",
    "object.a.exists(k, k == 'b')",
    "object.l.map(x, x)",
    "object.l.filter(object, object == 1)",
    "size(object)",
    "size(object.a)",
    "'a' in object",
    "'b' in object.a",
    "object.a.b == object.b.a",
    "object.`a`.b",
    "object.size",
    "object.a.size()",
    "object.spec.l.all(x, x.a == object.b)",
]
_PROGRAMS = [(source, environment.compile_source(source)[0]) for source in _EXPRESSIONS]


def _outcome(program: Any, obj: Any) -> tuple[str, Any]:
    try:
        value = environment.evaluate(program, obj)
    except environment.CelError as error:
        return ("error", error.message)
    return (type(value).__name__, value)


@settings(max_examples=150, deadline=None)
@given(_OBJECTS)
def test_the_projection_evaluates_like_the_whole_object(obj: dict[str, Any]) -> None:
    for source, program in _PROGRAMS:
        projected = project(obj, analyse(source).projection)
        assert _outcome(program, projected) == _outcome(program, obj), source
