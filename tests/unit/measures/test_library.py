"""Kubernetes' CEL quantity library in tally's environment: upstream's documented examples
(``k8s.io/apiserver/pkg/cel/library/quantity.go``), exact arithmetic, and the map that stands
for a quantity inside CEL."""

from __future__ import annotations

from typing import Any

import pytest

from tally.measures import environment, library
from tally.quota.quantity import Quantity, parse_quantity

pytestmark = pytest.mark.unit


def run(source: str, obj: dict[str, Any] | None = None) -> Any:
    program, _ = environment.compile_source(source)
    return environment.evaluate(program, obj or {})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # Upstream's examples, one for one.
        pytest.param("isQuantity('1.3G')", True, id="isQuantity-decimal"),
        pytest.param("isQuantity('1.3Gi')", True, id="isQuantity-binary"),
        pytest.param("isQuantity('1,3G')", False, id="isQuantity-comma"),
        pytest.param("isQuantity('10000k')", True, id="isQuantity-k"),
        pytest.param("isQuantity('200K')", False, id="isQuantity-upper-K"),
        pytest.param("isQuantity('Three')", False, id="isQuantity-word"),
        pytest.param("quantity('50000000G').isInteger()", True, id="isInteger-big"),
        pytest.param("quantity('50k').isInteger()", True, id="isInteger-k"),
        pytest.param(
            "quantity('9999999999999999999999999999999999999G').isInteger()",
            False,
            id="isInteger-beyond-int64",
        ),
        pytest.param("quantity('50k').asInteger() == 50000", True, id="asInteger"),
        pytest.param(
            "quantity('50k').sub(20000).asApproximateFloat() == 30000.0",
            True,
            id="asApproximateFloat",
        ),
        pytest.param("quantity('50k').add(quantity('20k')) == quantity('70k')", True, id="add"),
        pytest.param("quantity('50k').add(20) == quantity('50020')", True, id="add-int"),
        pytest.param("quantity('50k').sub(quantity('20k')) == quantity('30k')", True, id="sub"),
        pytest.param("quantity('50k').sub(20000) == quantity('30k')", True, id="sub-int"),
        pytest.param(
            "quantity('50k').add(20).sub(quantity('100k')).sub(-50000) == quantity('20')",
            True,
            id="chain",
        ),
        pytest.param("quantity('200M').compareTo(quantity('0.2G'))", 0, id="compareTo-equal"),
        pytest.param("quantity('50M').compareTo(quantity('50Mi'))", -1, id="compareTo-less"),
        pytest.param("quantity('50Mi').compareTo(quantity('50M'))", 1, id="compareTo-greater"),
        pytest.param("quantity('150Mi').isGreaterThan(quantity('100Mi'))", True, id="gt"),
        pytest.param("quantity('50Mi').isGreaterThan(quantity('100Mi'))", False, id="not-gt"),
        pytest.param("quantity('50M').isLessThan(quantity('100M'))", True, id="lt"),
        pytest.param("quantity('100M').isLessThan(quantity('50M'))", False, id="not-lt"),
        # sign: upstream declares a global function and documents a method; both work.
        pytest.param("sign(quantity('-3m'))", -1, id="sign-global"),
        pytest.param("quantity('0').sign()", 0, id="sign-zero"),
        pytest.param("quantity('3Ki').sign()", 1, id="sign-member"),
        # Equality is numeric, whatever the spelling.
        pytest.param("quantity('1Gi') == quantity('1073741824')", True, id="equal-across-formats"),
        pytest.param("quantity('1') == quantity('1000m')", True, id="equal-milli"),
        pytest.param("quantity('1') != quantity('1001m')", True, id="unequal"),
        # Exact, where a float would not be.
        pytest.param(
            "quantity('0.1').add(quantity('0.2')) == quantity('0.3')", True, id="exact-decimals"
        ),
        pytest.param("quantity('1.5').isInteger()", False, id="fraction-is-not-integer"),
        pytest.param("quantity('8Ei').asApproximateFloat()", 9223372036854775807 / 1, id="capped"),
        pytest.param(
            "quantity(object.spec.size).add(quantity('1n')).isGreaterThan(quantity(object.spec.size))",
            True,
            id="a-nano-counts",
        ),
    ],
)
def test_quantity_functions(source: str, expected: object) -> None:
    result = run(source, {"spec": {"size": "123456789012345678901234567890"}})
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        pytest.param("quantity('Three')", "cannot parse quantity 'Three'", id="not-a-quantity"),
        pytest.param("quantity('200K')", "unable to parse quantity's suffix", id="bad-suffix"),
        pytest.param(
            "quantity('9999999999999999999999999999999999999G').asInteger()",
            "cannot convert value to integer",
            id="asInteger-beyond-int64",
        ),
        pytest.param(
            "quantity('1.5').asInteger()", "cannot convert value to integer", id="asInteger-frac"
        ),
        pytest.param(
            "{'tally.dev/quantity': 'lots'}.add(1)",
            "not a quantity: {'tally.dev/quantity': 'lots'}",
            id="a-forged-quantity",
        ),
        pytest.param(
            "quantity('1').sub(quantity('9e63')).sub(quantity('9e63'))",
            "quantity out of range",
            id="below-the-range",
        ),
    ],
)
def test_quantity_function_errors(source: str, message: str) -> None:
    with pytest.raises(environment.CelError) as caught:
        run(source)
    assert message in caught.value.message


def test_a_quantity_in_cel_is_a_map_of_its_nanos() -> None:
    assert run("quantity('1.5Gi')") == {"tally.dev/quantity": "1610612736000000000"}
    assert library.encode(parse_quantity("-2m")) == {"tally.dev/quantity": "-2000000"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param({"tally.dev/quantity": "1000000000"}, Quantity.from_int(1), id="one"),
        pytest.param({"tally.dev/quantity": "-5"}, Quantity(-5), id="negative-nanos"),
        pytest.param({"tally.dev/quantity": "1.5"}, None, id="not-an-integer"),
        pytest.param({"tally.dev/quantity": "01"}, None, id="not-canonical"),
        pytest.param({"tally.dev/quantity": 1}, None, id="not-a-string"),
        pytest.param({"tally.dev/quantity": "1" + "0" * 73}, None, id="out-of-range"),
        pytest.param({"tally.dev/quantity": "1", "x": "y"}, None, id="two-keys"),
        pytest.param({"size": "1"}, None, id="another-map"),
        pytest.param("1", None, id="not-a-map"),
    ],
)
def test_decode(value: object, expected: Quantity | None) -> None:
    assert library.decode(value) == expected


def test_cel_cpps_iteration_limit_is_10000() -> None:
    # measure.py's cost bound documents this limit; a new cel-expr-python must keep it.
    program, _ = environment.compile_source("object.l.exists(x, false)")
    assert environment.ITERATION_LIMIT == 10_000
    assert environment.evaluate(program, {"l": list(range(9_999))}) is False
    with pytest.raises(environment.IterationLimitError, match="10000 comprehension iterations"):
        environment.evaluate(program, {"l": list(range(10_000))})


def test_compiling_is_cached() -> None:
    source = "object.spec.size + 41"
    assert environment.compile_source(source) is environment.compile_source(source)
