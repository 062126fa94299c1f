"""Quantities: parsing, canonical formatting, arithmetic and comparison.

Expected values come from apimachinery ``pkg/api/resource/quantity_test.go`` (each case names
the upstream test) and from the spec section 4 table. Upstream writes expectations as
``decQuantity(mantissa, exponent, format)``; :func:`dec` turns that into our nano count, so the
tables read like the Go ones. Cases marked "tally" test limits that are ours, not upstream's.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.quota.quantity import (
    NANO,
    Format,
    Quantity,
    QuantityError,
    QuantityFormatError,
    QuantityRangeError,
    parse_quantity,
)

pytestmark = pytest.mark.unit

DSI = Format.DECIMAL_SI
BSI = Format.BINARY_SI
DEX = Format.DECIMAL_EXPONENT
MAX_INT64 = 2**63 - 1


def dec(mantissa: int, exponent: int) -> int:
    """Upstream ``dec(i, exponent)`` as nanos: ``mantissa * 10**exponent * 10**9``."""
    if exponent + 9 >= 0:
        return int(mantissa * 10 ** (exponent + 9))
    value, remainder = divmod(mantissa, 10 ** -(exponent + 9))
    assert remainder == 0, "test helper only handles nano-exact values"
    return int(value)


def q(mantissa: int, exponent: int, fmt: Format) -> Quantity:
    return Quantity(dec(mantissa, exponent), fmt)


# TestQuantityParse (apimachinery quantity_test.go): input -> value and format.
PARSE_TABLE = [
    ("0", 0, DSI),
    ("0n", 0, DSI),
    ("0u", 0, DSI),
    ("0m", 0, DSI),
    ("0Ki", 0, BSI),
    ("0k", 0, DSI),
    ("0Mi", 0, BSI),
    ("0M", 0, DSI),
    ("0Gi", 0, BSI),
    ("0G", 0, DSI),
    ("0Ti", 0, BSI),
    ("0T", 0, DSI),
    # Quantity less numbers are allowed
    ("1", dec(1, 0), DSI),
    # Binary suffixes
    ("1Ki", dec(1024, 0), BSI),
    ("8Ki", dec(8 * 1024, 0), BSI),
    ("7Mi", dec(7 * 1024**2, 0), BSI),
    ("6Gi", dec(6 * 1024**3, 0), BSI),
    ("5Ti", dec(5 * 1024**4, 0), BSI),
    ("4Pi", dec(4 * 1024**5, 0), BSI),
    ("3Ei", dec(3 * 1024**6, 0), BSI),
    ("10Ti", dec(10 * 1024**4, 0), BSI),
    ("100Ti", dec(100 * 1024**4, 0), BSI),
    # Decimal suffixes
    ("5n", dec(5, -9), DSI),
    ("4u", dec(4, -6), DSI),
    ("3m", dec(3, -3), DSI),
    ("9", dec(9, 0), DSI),
    ("8k", dec(8, 3), DSI),
    ("50k", dec(5, 4), DSI),
    ("7M", dec(7, 6), DSI),
    ("6G", dec(6, 9), DSI),
    ("5T", dec(5, 12), DSI),
    ("40T", dec(4, 13), DSI),
    ("300T", dec(3, 14), DSI),
    ("2P", dec(2, 15), DSI),
    ("1E", dec(1, 18), DSI),
    # Decimal exponents
    ("1E-3", dec(1, -3), DEX),
    ("1e3", dec(1, 3), DEX),
    ("1E6", dec(1, 6), DEX),
    ("1e9", dec(1, 9), DEX),
    ("1E12", dec(1, 12), DEX),
    ("1e15", dec(1, 15), DEX),
    ("1E18", dec(1, 18), DEX),
    # Nonstandard but still parsable
    ("1e14", dec(1, 14), DEX),
    ("1e13", dec(1, 13), DEX),
    ("100.035k", dec(100035, 0), DSI),
    # Things that look like floating point
    ("0.001", dec(1, -3), DSI),
    ("0.0005k", dec(5, -1), DSI),
    ("0.005", dec(5, -3), DSI),
    ("0.05", dec(5, -2), DSI),
    ("0.5", dec(5, -1), DSI),
    ("0.00050k", dec(5, -1), DSI),
    ("0.00500", dec(5, -3), DSI),
    ("0.05000", dec(5, -2), DSI),
    ("0.50000", dec(5, -1), DSI),
    ("0.5e0", dec(5, -1), DEX),
    ("0.5e-1", dec(5, -2), DEX),
    ("0.5e-2", dec(5, -3), DEX),
    ("10.035M", dec(10035, 3), DSI),
    ("1.2e3", dec(12, 2), DEX),
    ("1.3E+6", dec(13, 5), DEX),
    ("1.40e9", dec(14, 8), DEX),
    ("1.53E12", dec(153, 10), DEX),
    ("1.6e15", dec(16, 14), DEX),
    ("1.7E18", dec(17, 17), DEX),
    ("9.01", dec(901, -2), DSI),
    ("8.1k", dec(81, 2), DSI),
    ("7.123456M", dec(7123456, 0), DSI),
    ("6.987654321G", dec(6987654321, 0), DSI),
    ("5.444T", dec(5444, 9), DSI),
    ("40.1T", dec(401, 11), DSI),
    ("300.2T", dec(3002, 11), DSI),
    ("2.5P", dec(25, 14), DSI),
    ("1.01E", dec(101, 16), DSI),
    # Things that saturate/round
    ("3.001n", dec(4, -9), DSI),
    ("1.1E-9", dec(2, -9), DEX),
    ("0.0000000001", dec(1, -9), DSI),
    ("0.0000000005", dec(1, -9), DSI),
    ("0.00000000050", dec(1, -9), DSI),
    ("0.5e-9", dec(1, -9), DEX),
    ("0.9n", dec(1, -9), DSI),
    ("0.00000012345", dec(124, -9), DSI),
    ("0.00000012354", dec(124, -9), DSI),
    ("9Ei", dec(MAX_INT64, 0), BSI),
    ("9223372036854775807Ki", dec(MAX_INT64, 0), BSI),
    ("12E", dec(12, 18), DSI),
    # We'll accept fractional binary stuff, too.
    ("100.035Ki", dec(10243584, -2), BSI),
    ("0.5Mi", dec(512 * 1024, 0), BSI),
    ("0.05Gi", dec(536870912, -1), BSI),
    ("0.025Ti", dec(274877906944, -1), BSI),
    # Things written by trolls
    ("0.000000000001Ki", dec(2, -9), DSI),  # rounds up, changes format
    (".001", dec(1, -3), DSI),
    (".0001k", dec(100, -3), DSI),
    ("1.", dec(1, 0), DSI),
    ("1.G", dec(1, 9), DSI),
]


@pytest.mark.parametrize(("text", "nanos", "fmt"), [pytest.param(*c, id=c[0]) for c in PARSE_TABLE])
def test_parse(text: str, nanos: int, fmt: Format) -> None:
    # TestQuantityParse: the value, the sign variants "-x" and "+x", and the format.
    for prefix, sign in (("", 1), ("-", -1), ("+", 1)):
        got = parse_quantity(prefix + text)
        assert got.nanos == sign * nanos, prefix + text
        assert got.format is fmt, prefix + text


# TestQuantityParse: the invalid list (incl. "trailing whitespace is forbidden"), the empty
# string, and TestQuantityParseNonNumericPanic.
@pytest.mark.parametrize(
    "text",
    [
        pytest.param(t, id=repr(t))
        for t in ["", "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i",
                  "-3.01e-", " 1", "1 ", "Non-Numeric", "1e", "1Ki3", "1K", "1e3.5"]
    ],
)  # fmt: skip
def test_parse_invalid(text: str) -> None:
    with pytest.raises(QuantityFormatError) as info:
        parse_quantity(text)
    assert repr(text) in str(info.value)
    assert info.value.value == text


@pytest.mark.parametrize(
    ("text", "nanos", "fmt"),
    [
        # TestParseQuantityString: upstream's scanner takes these degenerate forms as zero.
        pytest.param(".", 0, DSI, id="dot"),
        pytest.param("-.", 0, DSI, id="minus-dot"),
        pytest.param("-", 0, DSI, id="minus"),
        pytest.param("m", 0, DSI, id="bare-suffix"),
        pytest.param("Ki", 0, BSI, id="bare-binary-suffix"),
    ],
)
def test_parse_degenerate_forms_are_zero(text: str, nanos: int, fmt: Format) -> None:
    got = parse_quantity(text)
    assert (got.nanos, got.format) == (nanos, fmt)
    assert got.canonical() == "0"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param("1e64", QuantityRangeError, id="tally-max-magnitude"),
        pytest.param("1e999999999", QuantityRangeError, id="tally-huge-exponent"),
        pytest.param("1e4294967296", QuantityRangeError, id="tally-exponent-beyond-int32"),
        pytest.param("1" * 300, QuantityRangeError, id="tally-too-long"),
        pytest.param("1" + "0" * 64, QuantityRangeError, id="tally-65-digits"),
        pytest.param(1.5, QuantityFormatError, id="float"),
        pytest.param(None, QuantityFormatError, id="none"),
        pytest.param(["1"], QuantityFormatError, id="list"),
    ],
)
def test_parse_rejects(value: object, error: type[QuantityError]) -> None:
    with pytest.raises(error):
        parse_quantity(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        pytest.param("9" * 64, int("9" * 64) * NANO, id="tally-64-digits-ok"),
        pytest.param("1e-999999999", 1, id="tiny-rounds-up-to-1n"),
        pytest.param("-1e-999999999", -1, id="tiny-negative-rounds-away-from-zero"),
        pytest.param(12, 12 * NANO, id="json-integer"),
    ],
)
def test_parse_extremes(text: str, nanos: int) -> None:
    assert parse_quantity(text).nanos == nanos


# TestQuantityString: (value, format) -> canonical string, and an alternate spelling that
# must parse back to the same canonical string.
STRING_TABLE = [
    (q(1024**3, 0, BSI), "1Gi", "1024Mi"),
    (q(300 * 1024**2, 0, BSI), "300Mi", "307200Ki"),
    (q(6 * 1024, 0, BSI), "6Ki", ""),
    (q(1001 * 1024**3, 0, BSI), "1001Gi", "1025024Mi"),
    (q(1024**4, 0, BSI), "1Ti", "1024Gi"),
    (q(5, 0, BSI), "5", "5000m"),
    (q(500, -3, BSI), "500m", "0.5"),
    (q(1, 9, DSI), "1G", "1000M"),
    (q(1000, 6, DSI), "1G", "0.001T"),
    (q(1000000, 3, DSI), "1G", ""),
    (q(1000000000, 0, DSI), "1G", ""),
    (q(1, -3, DSI), "1m", "1000u"),
    (q(80, -3, DSI), "80m", ""),
    (q(1080, -3, DSI), "1080m", "1.08"),
    (q(108, -2, DSI), "1080m", "1080000000n"),
    (q(10800, -4, DSI), "1080m", ""),
    (q(300, 6, DSI), "300M", ""),
    (q(1, 12, DSI), "1T", ""),
    (q(1, 18, DSI), "1E", ""),
    (q(1, 21, DSI), "1e21", "1000E"),
    (q(5, 21, DSI), "5e21", "5000E"),
    (q(1, 24, DSI), "1e24", "1000000E"),
    (q(1234567, 6, DSI), "1234567M", ""),
    (q(1234567, -3, BSI), "1234567m", ""),
    (q(3, 3, DSI), "3k", ""),
    (q(1025, 0, BSI), "1025", ""),
    (q(0, 0, DSI), "0", ""),
    (q(0, 0, BSI), "0", ""),
    (q(1, 9, DEX), "1e9", ".001e12"),
    (q(1, -3, DEX), "1e-3", "0.001e0"),
    (q(1, -9, DEX), "1e-9", "1000e-12"),
    (q(80, -3, DEX), "80e-3", ""),
    (q(300, 6, DEX), "300e6", ""),
    (q(1, 12, DEX), "1e12", ""),
    (q(1, 3, DEX), "1e3", ""),
    (q(3, 3, DEX), "3e3", ""),
    (q(3, 3, DSI), "3k", ""),
    (q(0, 0, DEX), "0", "00"),
    (q(1, -9, DSI), "1n", ""),
    (q(80, -9, DSI), "80n", ""),
    (q(1080, -9, DSI), "1080n", ""),
    (q(108, -8, DSI), "1080n", ""),
    (q(1, -6, DSI), "1u", ""),
    (q(80, -6, DSI), "80u", ""),
    (q(1080, -6, DSI), "1080u", ""),
]


@pytest.mark.parametrize(
    ("quantity", "expect", "alternate"),
    [pytest.param(*c, id=f"{c[1]}-{c[0].format}") for c in STRING_TABLE],
)
def test_string(quantity: Quantity, expect: str, alternate: str) -> None:
    assert str(quantity) == expect
    assert parse_quantity(expect).canonical() == expect
    if alternate:
        assert parse_quantity(alternate).canonical() == expect
    if quantity.nanos:
        # Upstream negates every non-zero case: never "-0", always "-" + expect.
        assert (-quantity).canonical() == "-" + expect


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        # TestQuantityParseEmit
        pytest.param("1Ki", "1Ki", id="1Ki"),
        pytest.param("1Mi", "1Mi", id="1Mi"),
        pytest.param("1Gi", "1Gi", id="1Gi"),
        pytest.param("1024Mi", "1Gi", id="1024Mi"),
        pytest.param("1000M", "1G", id="1000M"),
        pytest.param(".001Ki", "1024m", id=".001Ki"),
        pytest.param(".000001Ki", "1024u", id=".000001Ki"),
        pytest.param(".000000001Ki", "1024n", id=".000000001Ki"),
        pytest.param(".000000000001Ki", "2n", id=".000000000001Ki"),
        # spec section 4 table: single values
        pytest.param("1.5Gi", "1536Mi", id="spec-1.5Gi"),
        pytest.param("1000", "1k", id="spec-1000"),
        pytest.param("0.5", "500m", id="spec-0.5"),
        pytest.param("0.5Ki", "512", id="spec-0.5Ki"),
        # upstream comment on Quantity: 1.5 -> 1500m, 1.5Gi -> 1536Mi; "8Ei" is capped
        pytest.param("1.5", "1500m", id="comment-1.5"),
        pytest.param("8Ei", "9223372036854775807", id="binary-cap"),
    ],
)
def test_parse_emit(text: str, expect: str) -> None:
    assert parse_quantity(text).canonical() == expect
    if parse_quantity(text).nanos:
        assert parse_quantity("-" + text).canonical() == "-" + expect


@pytest.mark.parametrize(
    ("left", "right", "expect"),
    [
        # spec section 4 table: sums
        pytest.param("100m", "900m", "1", id="spec-100m+900m"),
        pytest.param("1", "100m", "1100m", id="spec-1+100m"),
        pytest.param("1Gi", "512Mi", "1536Mi", id="spec-1Gi+512Mi"),
        pytest.param("50Gi", "2Gi", "52Gi", id="spec-50Gi+2Gi"),
        pytest.param("1Gi", "500M", "1573741824", id="spec-1Gi+500M-left-binary"),
        # TestQuantityAddZeroPreservesSuffix: either order keeps the non-zero spelling
        pytest.param("100m", "0", "100m", id="zero-right-100m"),
        pytest.param("0", "100m", "100m", id="zero-left-100m"),
        pytest.param("1Gi", "0", "1Gi", id="zero-right-1Gi"),
        pytest.param("0", "1Gi", "1Gi", id="zero-left-1Gi"),
    ],
)
def test_add(left: str, right: str, expect: str) -> None:
    assert (parse_quantity(left) + parse_quantity(right)).canonical() == expect


@pytest.mark.parametrize(
    ("a", "b", "expect"),
    [
        # TestAdd: value and format of a.Add(b)
        pytest.param(q(10, 0, DSI), q(1, 1, DSI), q(20, 0, DSI), id="same-format"),
        pytest.param(q(10, 0, DSI), q(1, 0, BSI), q(11, 0, DSI), id="left-format-wins"),
        pytest.param(q(10, 0, BSI), q(1, 0, DSI), q(11, 0, BSI), id="left-binary-wins"),
        pytest.param(q(0, 0, DSI), q(50, 0, DSI), q(50, 0, DSI), id="zero-left"),
        pytest.param(q(50, 0, DSI), q(0, 0, DSI), q(50, 0, DSI), id="zero-right"),
        pytest.param(q(0, 0, DSI), q(0, 0, DSI), q(0, 0, DSI), id="zeros"),
        pytest.param(q(0, 0, DSI), q(1, 0, BSI), q(1, 0, BSI), id="zero-adopts-format"),
    ],
)
def test_add_table(a: Quantity, b: Quantity, expect: Quantity) -> None:
    got = a + b
    assert got == expect
    assert got.format is expect.format


@pytest.mark.parametrize(
    ("a", "b", "expect"),
    [
        # TestSub
        pytest.param(q(10, 0, DSI), q(1, 1, DSI), q(0, 0, DSI), id="to-zero"),
        pytest.param(q(10, 0, DSI), q(1, 0, BSI), q(9, 0, DSI), id="left-format-wins"),
        pytest.param(q(10, 0, BSI), q(1, 0, DSI), q(9, 0, BSI), id="left-binary-wins"),
        pytest.param(q(0, 0, DSI), q(50, 0, DSI), q(-50, 0, DSI), id="zero-left"),
        pytest.param(q(50, 0, DSI), q(0, 0, DSI), q(50, 0, DSI), id="zero-right"),
        pytest.param(q(0, 0, DSI), q(0, 0, DSI), q(0, 0, DSI), id="zeros"),
    ],
)
def test_sub_table(a: Quantity, b: Quantity, expect: Quantity) -> None:
    got = a - b
    assert got == expect
    assert got.format is expect.format


@pytest.mark.parametrize("text", ["100m", "1Gi"])
def test_sub_zero_preserves_suffix(text: str) -> None:
    # TestQuantitySubZeroPreservesSuffix
    value = parse_quantity(text)
    zero = parse_quantity("0")
    assert (value - zero).canonical() == text
    assert (zero - value).canonical() == (-value).canonical() == "-" + text


@pytest.mark.parametrize(
    ("x", "y", "expect"),
    [
        # TestQuantityCmp
        pytest.param("0", "0", 0, id="zeros"),
        pytest.param("100m", "50m", 1, id="greater"),
        pytest.param("50m", "100m", -1, id="less"),
        pytest.param("10000T", "100Gi", 1, id="mixed-formats"),
        pytest.param("1Gi", "1073741824", 0, id="equal-across-formats"),
    ],
)
def test_cmp(x: str, y: str, expect: int) -> None:
    a, b = parse_quantity(x), parse_quantity(y)
    assert a.cmp(b) == expect
    assert b.cmp(a) == -expect
    assert (a == b) == (expect == 0)
    assert (a < b) == (expect < 0)
    if expect == 0:
        assert hash(a) == hash(b)


@pytest.mark.parametrize(
    ("text", "scale", "expect", "exact"),
    [
        # TestQuantityRoundUp
        pytest.param("9.01", -3, q(901, -2, DSI), True, id="9.01@-3"),
        pytest.param("9.01", -2, q(901, -2, DSI), True, id="9.01@-2"),
        pytest.param("9.01", -1, q(91, -1, DSI), False, id="9.01@-1"),
        pytest.param("9.01", 0, q(10, 0, DSI), False, id="9.01@0"),
        pytest.param("9.01", 1, q(10, 0, DSI), False, id="9.01@1"),
        pytest.param("9.01", 2, q(100, 0, DSI), False, id="9.01@2"),
        pytest.param("-9.01", -3, q(-901, -2, DSI), True, id="-9.01@-3"),
        pytest.param("-9.01", -2, q(-901, -2, DSI), True, id="-9.01@-2"),
        pytest.param("-9.01", -1, q(-91, -1, DSI), False, id="-9.01@-1"),
        pytest.param("-9.01", 0, q(-10, 0, DSI), False, id="-9.01@0"),
        pytest.param("-9.01", 1, q(-10, 0, DSI), False, id="-9.01@1"),
        pytest.param("-9.01", 2, q(-100, 0, DSI), False, id="-9.01@2"),
    ],
)
def test_round_up(text: str, scale: int, expect: Quantity, exact: bool) -> None:
    got, got_exact = parse_quantity(text).round_up(scale)
    assert (got, got_exact) == (expect, exact)


@pytest.mark.parametrize(
    ("quantity", "expect"),
    [
        # TestQuantityNeg, TestNewSet, TestMilliNewSet, TestNewScaledSet
        pytest.param(q(901, -2, DSI), "9010m", id="neg-source"),
        pytest.param(Quantity.from_int(1000), "1k", id="new-1000"),
        pytest.param(Quantity.from_int(1234000), "1234k", id="new-1234000"),
        pytest.param(Quantity.from_int(1024, BSI), "1Ki", id="new-1024-binary"),
        pytest.param(Quantity.from_int(1000000, DEX), "1e6", id="new-exponent"),
        pytest.param(Quantity.from_int(1024 * 1024, BSI), "1Mi", id="new-1Mi"),
        pytest.param(Quantity.from_milli(1), "1m", id="milli-1"),
        pytest.param(Quantity.from_milli(1234000), "1234", id="milli-1234000"),
        pytest.param(Quantity.from_milli(1024, BSI), "1024m", id="milli-binary-changes-format"),
        pytest.param(Quantity.from_milli(1000000, DEX), "1e3", id="milli-exponent"),
        pytest.param(Quantity.from_milli(1024 * 1024, BSI), "1048576m", id="milli-binary-big"),
    ],
)
def test_constructors_format(quantity: Quantity, expect: str) -> None:
    assert quantity.canonical() == expect


def test_neg_does_not_mutate() -> None:
    # TestQuantityNeg
    source = q(901, -2, DSI)
    negated = -source
    assert negated.canonical() == "-9010m"
    assert source.canonical() == "9010m"


def test_binary_beyond_exa_keeps_magnitude() -> None:
    # tally: upstream finds no suffix for 1024**7 and would print "1"; we stay on Ei.
    assert Quantity(2**70 * NANO, BSI).canonical() == "1024Ei"
    # TestZeroSubMostNegativeInheritsFormat: 2**63 in BinarySI is "8Ei".
    assert (parse_quantity("0") - Quantity(-(2**63) * NANO, BSI)).canonical() == "8Ei"


def test_value_accessors() -> None:
    # TestScaledValue / Value / MilliValue round away from zero.
    assert parse_quantity("1n").value() == 1
    assert parse_quantity("1n").milli_value() == 1
    assert parse_quantity("-1n").value() == -1
    assert parse_quantity("1.5").milli_value() == 1500
    assert parse_quantity("1Mi").value() == 1024 * 1024


# -- properties ------------------------------------------------------------------------------

quantities = st.builds(
    Quantity,
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from(list(Format)),
)


@given(quantities)
def test_format_parse_round_trip(quantity: Quantity) -> None:
    text = quantity.canonical()
    parsed = parse_quantity(text)
    prints_binary = quantity.format is BSI and quantity.nanos % NANO == 0
    if prints_binary and abs(quantity.nanos) > MAX_INT64 * NANO:
        # upstream #140674: parsing caps BinarySI at MaxInt64, so big sums do not round-trip
        # (a non-integer prints as DecimalSI, which is not capped)
        assert abs(parsed.nanos) == MAX_INT64 * NANO
        return
    assert parsed == quantity
    # Canonicalising is idempotent: one re-parse reaches a fixed point. (Not zero re-parses:
    # BinarySI 2000 prints "2000", which parses as DecimalSI and prints "2k", upstream too.)
    again = parsed.canonical()
    assert parse_quantity(again).canonical() == again


@given(
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=9),
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "e3"]),
    st.sampled_from(["", "-", "+"]),
)
def test_parse_format_parse(whole: int, fraction: int, suffix: str, sign: str) -> None:
    parsed = parse_quantity(f"{sign}{whole}.{fraction}{suffix}")
    assert parse_quantity(parsed.canonical()) == parsed


@given(quantities, quantities)
def test_add_commutes_numerically_and_sub_inverts(a: Quantity, b: Quantity) -> None:
    assert a + b == b + a
    assert (a + b) - b == a
    assert a - a == parse_quantity("0")
