"""Measures: a spec checked and compiled (refused with the field's path), evaluated on plain
objects (what one object uses, by hand), and every way an evaluation can fail (a typed error,
never a crash, never zero). The quantity functions are in ``test_library.py``, what an
expression reads in ``test_analysis.py``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tally.measures import (
    MAX_COST,
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    Measure,
    MeasureCostError,
    MeasureError,
    MeasureEvaluationError,
    compile_measure,
    evaluate,
    validate_measures,
)
from tally.quota.quantity import Quantity, parse_quantity

pytestmark = pytest.mark.unit


def spec(expression: str, when: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "example.com/storage-gb",
        "resource": {"group": "", "resource": "persistentvolumeclaims"},
        "expression": expression,
        **fields,
    }
    if when is not None:
        body["when"] = when
    return body


def measure(expression: str, when: str | None = None) -> Measure:
    return compile_measure(spec(expression, when))


def pvc(storage: str, storage_class: str | None = None, **annotations: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "ns", "annotations": dict(annotations)},
        "spec": {"resources": {"requests": {"storage": storage}}},
    }
    if storage_class is not None:
        body["spec"]["storageClassName"] = storage_class
    return body


def total(m: Measure, objects: list[dict[str, Any]]) -> Quantity:
    """A quota's usage for a measure: the sum over the matching objects."""
    used = Quantity(0)
    for obj in objects:
        value = evaluate(m, obj)
        if value is not None:
            used = used + value
    return used


# -- compiling ---------------------------------------------------------------------------------


def test_a_valid_spec_compiles_to_its_fields() -> None:
    m = compile_measure(
        {
            "name": "example.com/storage-gb",
            "resource": {"group": "storage.example.com", "resource": "volumes"},
            "expression": "object.spec.size",
            "when": "object.spec.tier == 'gold'",
        }
    )
    assert (m.name, m.group, m.resource) == (
        "example.com/storage-gb",
        "storage.example.com",
        "volumes",
    )
    assert (m.expression, m.when) == ("object.spec.size", "object.spec.tier == 'gold'")
    assert m.when_program is not None


def test_a_missing_group_is_the_core_group_and_when_is_optional() -> None:
    m = compile_measure(
        {"name": "example.com/pods", "resource": {"resource": "pods"}, "expression": "1"}
    )
    assert (m.group, m.when, m.when_program) == ("", None, None)


def test_measures_from_equal_specs_are_equal() -> None:
    assert measure("object.spec.size", "true") == measure("object.spec.size", "true")
    assert measure("object.spec.size") != measure("object.spec.size", "true")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("example.com/storage-gb", id="domain-and-name"),
        pytest.param("tally.dev/gpu.hours", id="dots-in-the-name"),
        pytest.param("a.b/C_d-9", id="upper-case-underscore-digits-in-the-name"),
        pytest.param("x.example.com/" + "n" * 63, id="63-character-name"),
    ],
)
def test_valid_names(name: str) -> None:
    assert compile_measure({**spec("1"), "name": name}).name == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        pytest.param("storage-gb", "must be <domain>/<name>", id="no-domain"),
        pytest.param("count/pods", "DNS-1123 subdomain with at least one dot", id="undotted"),
        pytest.param("Example.com/x", "DNS-1123 subdomain", id="upper-case-domain"),
        pytest.param("kubernetes.io/x", "reserved for Kubernetes", id="kubernetes-io"),
        pytest.param("quota.k8s.io/x", "reserved for Kubernetes", id="k8s-io-subdomain"),
        pytest.param("example.com/", "the name ''", id="empty-name"),
        pytest.param("example.com/-x", "starting and ending", id="leading-dash"),
        pytest.param("example.com/a/b", "the name 'a/b'", id="two-slashes"),
        pytest.param("example.com/" + "n" * 64, "at most 63", id="64-character-name"),
    ],
)
def test_invalid_names_are_refused_with_the_rule(name: str, reason: str) -> None:
    with pytest.raises(MeasureError) as caught:
        compile_measure({**spec("1"), "name": name}, path="spec.measures[3]")
    assert caught.value.path == "spec.measures[3].name"
    assert reason in str(caught.value)
    assert str(caught.value).startswith(f"spec.measures[3].name: invalid name {name!r}")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param("not a mapping", "spec.measures[0]: must be an object", id="not-an-object"),
        pytest.param(
            {**spec("1"), "whne": "true"},
            "spec.measures[0]: unknown field(s): whne",
            id="misspelt-field",
        ),
        pytest.param(
            {k: v for k, v in spec("1").items() if k != "name"},
            "spec.measures[0].name: required",
            id="missing-name",
        ),
        pytest.param({**spec("1"), "name": 7}, "name: must be a string, not int", id="int-name"),
        pytest.param(
            {k: v for k, v in spec("1").items() if k != "resource"},
            "spec.measures[0].resource: required",
            id="missing-resource",
        ),
        pytest.param(
            {**spec("1"), "resource": "pods"},
            "spec.measures[0].resource: must be an object {group, resource}",
            id="resource-not-an-object",
        ),
        pytest.param(
            {**spec("1"), "resource": {"group": ""}},
            "spec.measures[0].resource.resource: required",
            id="missing-plural",
        ),
        pytest.param(
            {**spec("1"), "resource": {"resource": "Pods"}},
            "spec.measures[0].resource.resource: invalid resource 'Pods'",
            id="upper-case-plural",
        ),
        pytest.param(
            {**spec("1"), "resource": {"group": "Apps", "resource": "deployments"}},
            "spec.measures[0].resource.group: invalid API group 'Apps'",
            id="invalid-group",
        ),
        pytest.param(
            {**spec("1"), "resource": {"resource": "pods", "version": "v1"}},
            "spec.measures[0].resource: unknown field(s): version",
            id="resource-unknown-field",
        ),
        pytest.param(
            {k: v for k, v in spec("1").items() if k != "expression"},
            "spec.measures[0].expression: required",
            id="missing-expression",
        ),
        pytest.param(spec("  "), "spec.measures[0].expression: must not be empty", id="blank"),
        pytest.param(
            spec("1", when=""), "spec.measures[0].when: must not be empty", id="blank-when"
        ),
    ],
)
def test_malformed_specs_are_refused_with_the_path(body: Any, message: str) -> None:
    with pytest.raises(MeasureError) as caught:
        compile_measure(body)
    assert message in str(caught.value)


def test_a_syntax_error_is_refused_with_the_compilers_message() -> None:
    with pytest.raises(MeasureError) as caught:
        compile_measure(spec("object.spec.size +"), path="spec.measures[1]")
    assert caught.value.path == "spec.measures[1].expression"
    message = str(caught.value)
    assert message.startswith("spec.measures[1].expression: does not compile: ERROR: <input>:1:19:")
    assert "Syntax error: mismatched input '<EOF>'" in message
    assert "| object.spec.size +\n | ..................^" in message
    assert "INVALID_ARGUMENT" not in message  # cel-cpp's status code is stripped


@pytest.mark.parametrize(
    ("expression", "when", "message"),
    [
        pytest.param(
            "quantity(1)",
            None,
            "expression: does not compile: ERROR: <input>:1:9: found no matching overload for "
            "'quantity' applied to '(int)'",
            id="quantity-of-an-int",
        ),
        pytest.param(
            "quantity('1').add('2')",
            None,
            "found no matching overload for 'add' applied to '(map(string, string), string)'",
            id="add-a-string",
        ),
        pytest.param(
            "size(object.spec) > 1",
            None,
            "expression: must return a number, a quantity or a string; it returns bool",
            id="bool-expression",
        ),
        pytest.param(
            "[object.spec.size]",
            None,
            "expression: must return a number, a quantity or a string; it returns list<dyn>",
            id="list-expression",
        ),
        pytest.param(
            "1", "size(object.spec)", "when: must return a bool; it returns int", id="int-when"
        ),
        pytest.param("1", "object.spec.x ==", "when: does not compile", id="when-syntax"),
        pytest.param("no_such_var + 1", None, "undeclared reference to 'no_such_var'", id="var"),
    ],
)
def test_expressions_of_the_wrong_type_are_refused_on_compile(
    expression: str, when: str | None, message: str
) -> None:
    with pytest.raises(MeasureError) as caught:
        measure(expression, when)
    assert message in str(caught.value)


def test_an_expression_over_the_length_bound_is_refused() -> None:
    longest = "size('" + "x" * (MAX_EXPRESSION_LENGTH - 8) + "')"
    assert evaluate(measure(longest), {}) == Quantity.from_int(MAX_EXPRESSION_LENGTH - 8)
    with pytest.raises(MeasureError, match=r"expression: longer than 2048 characters \(2049\)"):
        measure("size('" + "x" * (MAX_EXPRESSION_LENGTH - 7) + "')")


def test_the_compiler_bounds_nesting_too() -> None:
    # cel-cpp's parser stops at 32 levels of recursion, whatever the length.
    with pytest.raises(MeasureError, match="Exceeded max recursion depth of 32"):
        measure("1" + " + 1" * 40)


def test_comprehensions_too_deep_for_any_object_are_refused_on_compile() -> None:
    # Six nested comprehensions over literals of 9 items: at least 6 * 10**7 steps.
    nine = "[1, 2, 3, 4, 5, 6, 7, 8, 9]"
    text = "1"
    for var in "abcdef":
        text = f"{nine}.map({var}, {text}).size()"
    with pytest.raises(MeasureError, match="cost limit exceeded: 6 comprehension"):
        measure(text)


def test_validate_measures_reports_every_problem_at_once() -> None:
    def named(name: str, expression: str = "1") -> dict[str, Any]:
        return {**spec(expression), "name": name}

    problems = validate_measures(
        [
            named("example.com/a"),
            named("gb"),
            named("example.com/b", "object.spec.size +"),
            named("example.com/a"),
            named("example.com/c"),
            named("example.com/c", "[1]"),
        ]
    )
    assert len(problems) == 5, problems
    assert problems[0].startswith("spec.measures[1].name: invalid name 'gb': must be")
    assert problems[1].startswith("spec.measures[2].expression: does not compile: ERROR:")
    assert problems[2] == (
        "spec.measures[3].name: duplicate name 'example.com/a' (also spec.measures[0])"
    )
    assert problems[3] == (
        "spec.measures[5].expression: must return a number, a quantity or a string; "
        "it returns list<int>"
    )
    assert problems[4] == (
        "spec.measures[5].name: duplicate name 'example.com/c' (also spec.measures[4])"
    )


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        pytest.param(None, [], id="absent"),
        pytest.param([], [], id="empty"),
        pytest.param({"name": "x"}, ["spec.measures: must be a list"], id="an-object"),
        pytest.param("x", ["spec.measures: must be a list"], id="a-string"),
        pytest.param([spec("1")], [], id="one-good-measure"),
    ],
)
def test_validate_measures_shapes(specs: object, expected: list[str]) -> None:
    assert validate_measures(specs) == expected


# -- evaluating --------------------------------------------------------------------------------


def test_a_sum_of_quantity_strings() -> None:
    m = measure("object.spec.resources.requests.storage")
    claims = [pvc("10Gi"), pvc("512Mi"), pvc("1.5Gi")]
    # 10737418240 + 536870912 + 1610612736 = 12884901888 = 12Gi
    assert total(m, claims) == parse_quantity("12Gi")
    assert total(m, claims).canonical() == "12Gi"  # a string keeps its BinarySI spelling


def test_a_sum_of_ints() -> None:
    m = measure("int(object.metadata.annotations['example.com/gb'])")
    claims = [pvc("1Gi", **{"example.com/gb": str(n)}) for n in (3, 4, 5)]
    assert total(m, claims) == Quantity.from_int(12)


def test_a_sum_of_quantities_made_in_cel() -> None:
    m = measure("quantity(object.spec.resources.requests.storage).add(1)")
    # (10737418240 + 1) + (1000000 + 1) = 10738418242
    assert total(m, [pvc("10Gi"), pvc("1M")]) == Quantity.from_int(10_738_418_242)


def test_when_filters_objects() -> None:
    m = measure(
        "object.spec.resources.requests.storage",
        when="has(object.spec.storageClassName) && object.spec.storageClassName == 'gold'",
    )
    claims = [pvc("10Gi", "gold"), pvc("5Gi", "silver"), pvc("1Gi"), pvc("2Gi", "gold")]
    assert [evaluate(m, c) for c in claims] == [
        parse_quantity("10Gi"),
        None,
        None,
        parse_quantity("2Gi"),
    ]
    assert total(m, claims) == parse_quantity("12Gi")


def test_has_checks_a_field_that_may_be_missing() -> None:
    m = measure(
        "has(object.metadata.annotations) && "
        "'example.com/gb' in object.metadata.annotations "
        "? int(object.metadata.annotations['example.com/gb']) : 0"
    )
    assert total(m, [pvc("1Gi", **{"example.com/gb": "7"}), pvc("1Gi")]) == Quantity.from_int(7)
    no_annotations = pvc("1Gi")
    del no_annotations["metadata"]["annotations"]
    assert evaluate(m, no_annotations) == Quantity(0)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param("7", "7", id="int"),
        pytest.param("7u", "7", id="uint"),
        pytest.param("0", "0", id="zero"),
        pytest.param("0.1", "100m", id="double-shortest-decimal"),
        pytest.param("2.5", "2500m", id="double"),
        pytest.param("1e-10", "1n", id="double-below-a-nano-rounds-up"),
        pytest.param("1e18", "1E", id="large-double"),
        pytest.param("'1.5Gi'", "1536Mi", id="string"),
        pytest.param("quantity('50k').sub(20000)", "30k", id="quantity"),
        pytest.param("9223372036854775807", "9223372036854775807", id="int64-max"),
    ],
)
def test_values_become_quantities(expression: str, expected: str) -> None:
    assert evaluate(measure(expression), {}) == parse_quantity(expected)


def test_a_quantity_made_in_cel_comes_back_in_decimal_si() -> None:
    value = evaluate(measure("quantity('1Gi')"), {})
    assert value is not None
    assert value == parse_quantity("1Gi")
    assert value.canonical() == "1073741824"


@pytest.mark.parametrize(
    ("expression", "obj", "reason"),
    [
        pytest.param(
            "object.spec.storageGB",
            {"spec": {}},
            "no such key: storageGB",
            id="missing-field",
        ),
        pytest.param(
            "object.spec.size + 1",
            {"spec": {"size": "10"}},
            "no such overload: _+_(string, int64)",
            id="wrong-type",
        ),
        pytest.param(
            "object.spec.size",
            {"spec": {"size": "lots"}},
            "expression returned a string that is not a quantity: 'lots'",
            id="not-a-quantity",
        ),
        pytest.param(
            "object.spec.enabled",
            {"spec": {"enabled": True}},
            "expression returned a bool, not a number or a quantity",
            id="bool",
        ),
        pytest.param("object.spec.size", {"spec": {"size": None}}, "returned a null", id="null"),
        pytest.param("object.spec.l", {"spec": {"l": [1]}}, "returned a list", id="list"),
        pytest.param("object.spec", {"spec": {"a": "b"}}, "returned a map", id="map"),
        pytest.param(
            "object.spec.size",
            {"spec": {"size": "-5Gi"}},
            "expression returned a negative value: -5Gi (usage is never negative)",
            id="negative",
        ),
        pytest.param("-1", {}, "negative value: -1", id="negative-int"),
        pytest.param(
            "object.spec.ratio / 0.0",
            {"spec": {"ratio": 1.0}},
            "expression returned a double that is not finite: inf",
            id="infinite",
        ),
        pytest.param(
            "object.spec.size",
            {"spec": {"size": "1e70"}},
            "expression returned '1e70', out of range: magnitude of 10**64 or more",
            id="absurd-string",
        ),
        pytest.param(
            "1e70",
            {},
            "expression returned 1e+70, out of range: magnitude of 10**64 or more",
            id="absurd-double",
        ),
        pytest.param(
            "quantity('1e70')",
            {},
            "cannot parse quantity '1e70': magnitude of 10**64 or more",
            id="absurd-quantity",
        ),
        pytest.param(
            "quantity('9e63').add(quantity('9e63'))",
            {},
            "quantity out of range: magnitude of 10**64 or more",
            id="absurd-sum",
        ),
        pytest.param(
            "object.spec.n + 1",
            {"spec": {"n": 9223372036854775807}},
            "integer overflow",
            id="int-overflow",
        ),
        pytest.param(
            "object.spec.n",
            {"spec": {"n": 2**64}},
            "Integer value '18446744073709551616' out of range",
            id="int-beyond-int64-in-the-object",
        ),
        pytest.param(
            "object.spec.n",
            {"spec": {"n": (1, 2)}},
            "Non-CEL value type",
            id="not-json",
        ),
        pytest.param("object.spec.l[3]", {"spec": {"l": [1]}}, "index", id="index-out-of-range"),
    ],
)
def test_runtime_failures_are_typed_errors_naming_the_measure(
    expression: str, obj: dict[str, Any], reason: str
) -> None:
    m = measure(expression)
    with pytest.raises(MeasureEvaluationError) as caught:
        evaluate(m, obj)
    assert caught.value.measure == "example.com/storage-gb"
    assert reason in caught.value.reason
    assert str(caught.value).startswith("measure 'example.com/storage-gb': ")
    assert not isinstance(caught.value, MeasureCostError)


@pytest.mark.parametrize(
    ("when", "obj", "reason"),
    [
        pytest.param(
            "object.spec.tier == 'gold'", {"spec": {}}, "when: no such key: tier", id="key"
        ),
        pytest.param(
            "object.spec.tier",
            {"spec": {"tier": "gold"}},
            "when: returned a string, not a bool",
            id="string",
        ),
    ],
)
def test_when_failures_say_so(when: str, obj: dict[str, Any], reason: str) -> None:
    with pytest.raises(MeasureEvaluationError) as caught:
        evaluate(measure("1", when), obj)
    assert caught.value.reason == reason


def test_a_false_when_skips_the_expression_and_its_errors() -> None:
    assert evaluate(measure("object.spec.missing", "false"), {"spec": {}}) is None


def test_errors_absorbed_by_cel_logic_are_not_errors() -> None:
    # CEL's || and && commute over errors: a true (false) side decides.
    m = measure("1", "object.spec.tier == 'gold' || true")
    assert evaluate(m, {"spec": {}}) == Quantity.from_int(1)


def test_a_huge_comprehension_is_refused_before_it_runs() -> None:
    m = measure("object.spec.items.map(i, i * 2).size()")
    assert evaluate(m, {"spec": {"items": list(range(1000))}}) == Quantity.from_int(1000)
    with pytest.raises(MeasureCostError) as caught:
        evaluate(m, {"spec": {"items": list(range(100_000))}})
    assert caught.value.reason == (
        "cost limit exceeded: about 10,000,000,000 steps for an object with a list or map of "
        f"100,000 items (1 comprehension(s) nested 1 deep; limit {MAX_COST:,})"
    )


def test_nested_comprehensions_cost_a_power_more() -> None:
    m = measure("object.l.exists(x, object.l.exists(y, x * y < 0)) ? 1 : 0")
    assert evaluate(m, {"l": list(range(79))}) == Quantity(0)  # 2 * 79**3 = 986078
    with pytest.raises(MeasureCostError, match="about 1,024,000 steps"):
        evaluate(m, {"l": list(range(80))})  # 2 * 80**3


def test_cel_cpps_iteration_limit_is_a_cost_error_too() -> None:
    # The estimate sees lists of 60 (2 * 60**3 = 432000 steps), but the expression doubles
    # them: 120 + 120 * 120 = 14520 iterations, over cel-cpp's 10000.
    m = measure(
        "(object.l + object.l).exists(x, (object.l + object.l).exists(y, x * y < 0)) ? 1 : 0"
    )
    with pytest.raises(MeasureCostError) as caught:
        evaluate(m, {"l": list(range(60))})
    assert caught.value.reason == "cost limit exceeded: 10000 comprehension iterations"


def test_the_cost_estimate_counts_only_what_the_expression_reads() -> None:
    m = measure("object.spec.items.map(i, i).size()")
    huge_elsewhere = {"spec": {"items": [1, 2]}, "status": {"log": list(range(100_000))}}
    assert evaluate(m, huge_elsewhere) == Quantity.from_int(2)


def nested(levels: int) -> dict[str, Any]:
    """``{"a": {"a": ... 1}}``: ``levels`` maps deep, built without recursion."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return dict(value)


def test_an_object_nested_too_deep_where_it_is_read_is_an_error_not_a_crash() -> None:
    # The API server stores custom resources nested up to 10 000 levels; converting 9 000 of
    # them overflowed cel-cpp's stack and killed the process (a segmentation fault).
    m = measure("has(object.spec.deep) && object.spec.deep == object.spec.deep ? 1 : 0")
    # spec and deep are two levels above the nested value.
    assert evaluate(m, {"spec": {"deep": nested(MAX_DEPTH - 2)}}) == Quantity.from_int(1)
    with pytest.raises(MeasureEvaluationError) as caught:
        evaluate(m, {"spec": {"deep": nested(9_000)}})
    assert caught.value.reason == (
        f"the object is nested more than {MAX_DEPTH} levels deep where the expression reads it"
    )
    assert not isinstance(caught.value, MeasureCostError)


def test_a_deep_field_the_expression_does_not_read_costs_nothing() -> None:
    m = measure("object.spec.size")
    assert evaluate(m, {"spec": {"size": 3, "deep": nested(9_000)}}) == Quantity.from_int(3)


def test_evaluate_never_changes_the_object() -> None:
    obj = pvc("10Gi", "gold", **{"example.com/gb": "3"})
    before = copy.deepcopy(obj)
    m = measure(
        "quantity(object.spec.resources.requests.storage).add("
        "int(object.metadata.annotations['example.com/gb']))",
        when="object.spec.storageClassName == 'gold'",
    )
    assert evaluate(m, obj) == Quantity.from_int(10_737_418_243)
    assert obj == before
