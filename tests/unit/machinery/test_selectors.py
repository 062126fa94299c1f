"""Label selectors with apimachinery semantics (``labels/selector_test.go`` and the
``LabelSelectorAsSelector`` rules): matching, the empty and absent selector, validation."""

from __future__ import annotations

import pytest

from tally.machinery.selectors import (
    EVERYTHING,
    NOTHING,
    Operator,
    SelectorError,
    is_qualified_name,
    parse_label_selector,
    requirement,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        pytest.param({}, {}, True, id="empty-matches-everything"),
        pytest.param({}, {"a": "b"}, True, id="empty-matches-labels"),
        pytest.param(None, {"a": "b"}, False, id="absent-matches-nothing"),
        pytest.param({"matchLabels": {"app": "web"}}, {"app": "web"}, True, id="match-labels"),
        pytest.param(
            {"matchLabels": {"app": "web"}}, {"app": "db"}, False, id="match-labels-other-value"
        ),
        pytest.param({"matchLabels": {"app": "web"}}, {}, False, id="match-labels-missing-key"),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "In", "values": ["a", "b"]}]},
            {"env": "b"}, True, id="in",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "In", "values": ["a"]}]},
            {}, False, id="in-missing-key",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["a"]}]},
            {}, True, id="notin-missing-key-matches",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["a"]}]},
            {"env": "a"}, False, id="notin-listed",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["a"]}]},
            {"env": "c"}, True, id="notin-other",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "Exists"}]},
            {"env": ""}, True, id="exists-empty-value",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "Exists"}]},
            {}, False, id="exists-missing",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]},
            {}, True, id="does-not-exist",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]},
            {"env": "x"}, False, id="does-not-exist-present",
        ),
        pytest.param(
            {
                "matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe"]}],
            },
            {"app": "web", "tier": "be"}, False, id="all-requirements-anded",
        ),
    ],
)  # fmt: skip
def test_matches(selector: object, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "In", "values": []}]},
            "for 'in', 'notin' operators, values set can't be empty",
            id="in-without-values",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "NotIn"}]},
            "for 'in', 'notin' operators, values set can't be empty",
            id="notin-without-values",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "Exists", "values": ["a"]}]},
            "values set must be empty for exists and does not exist",
            id="exists-with-values",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "DoesNotExist", "values": ["a"]}]},
            "values set must be empty for exists and does not exist",
            id="does-not-exist-with-values",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "env", "operator": "Equals", "values": ["a"]}]},
            "'Equals' is not a valid label selector operator",
            id="unknown-operator",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "bad key", "operator": "Exists"}]},
            "key: Invalid value: 'bad key'",
            id="bad-key",
        ),
        pytest.param(
            {"matchLabels": {"app": "not a value"}}, "Invalid value", id="bad-label-value"
        ),
        pytest.param({"matchLabels": {"app": 3}}, "label values must be strings", id="int-value"),
        pytest.param("app=web", "expected an object", id="not-an-object"),
        pytest.param({"matchExpressions": {"key": "a"}}, "expected a list", id="exprs-not-list"),
    ],
)
def test_validation(selector: object, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector(selector, "spec.selector")
    assert message in str(info.value)
    assert str(info.value).startswith("spec.selector")


def test_everything_and_nothing() -> None:
    assert EVERYTHING.matches(None)
    assert EVERYTHING.is_empty()
    assert not NOTHING.matches({})
    assert not NOTHING.is_empty()
    assert parse_label_selector({"matchLabels": {}, "matchExpressions": []}) == EVERYTHING


def test_requirement_and_scope_wording() -> None:
    req = requirement("PriorityClass", Operator.IN, ["high"])
    assert req.matches({"PriorityClass": "high"})
    with pytest.raises(SelectorError, match="'Foo' is not a valid scope selector operator"):
        requirement("PriorityClass", "Foo", ["x"], operator_kind="scope selector")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("app", True, id="simple"),
        pytest.param("example.com/dongle", True, id="prefixed"),
        pytest.param("requests.example.com/dongle", True, id="dotted-prefix"),
        pytest.param("Example.com/x", False, id="uppercase-prefix"),
        pytest.param("-app", False, id="leading-dash"),
        pytest.param("a" * 64, False, id="name-too-long"),
        pytest.param("/x", False, id="empty-prefix"),
    ],
)
def test_is_qualified_name(name: str, expected: bool) -> None:
    assert is_qualified_name(name) is expected
