"""Resource-list algebra, ported from apiserver ``pkg/quota/v1/resources_test.go``.

Each table names its upstream test; ``rl`` builds a list from strings the way the Go tables
use ``resource.MustParse``. Property tests check the algebra laws the quota code relies on.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.quota import resources as quota
from tally.quota.quantity import Format, Quantity, parse_quantity
from tally.quota.resources import ResourceListError

pytestmark = pytest.mark.unit


def rl(**values: str) -> dict[str, Quantity]:
    """A resource list; ``_`` in keyword names stands for ``.`` (requests_cpu)."""
    return {key.replace("_", "."): parse_quantity(value) for key, value in values.items()}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # TestEquals
        pytest.param({}, {}, True, id="isEqual"),
        pytest.param(
            rl(cpu="100m", memory="1Gi"), rl(cpu="100m", memory="1Gi"), True, id="isEqualWithKeys"
        ),
        pytest.param(
            rl(cpu="200m", memory="1Gi"),
            rl(cpu="100m", memory="1Gi"),
            False,
            id="isNotEqualSameKeys",
        ),
        pytest.param(
            rl(cpu="100m", memory="1Gi"),
            rl(cpu="100m", memory="1Gi", pods="1"),
            False,
            id="isNotEqualDiffKeys",
        ),
        # tally: equality is numeric, the spelling does not matter
        pytest.param(rl(memory="1Gi"), rl(memory="1073741824"), True, id="numericAcrossFormats"),
    ],
)
def test_equals(a: quota.ResourceList, b: quota.ResourceList, expected: bool) -> None:
    assert quota.equals(a, b) is expected
    assert quota.equals(b, a) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected", "out"),
    [
        # TestLessThanOrEqual
        pytest.param({}, {}, True, [], id="isEmpty"),
        pytest.param(rl(cpu="100m"), rl(cpu="100m"), True, [], id="isEqual"),
        pytest.param(rl(cpu="100m"), rl(cpu="200m"), True, [], id="isLessThan"),
        pytest.param(rl(cpu="200m"), rl(cpu="100m"), False, ["cpu"], id="isGreaterThan"),
        # the code, not the comment: keys missing from a are skipped, keys only in a ignored
        pytest.param({}, rl(cpu="1"), True, [], id="missingFromA"),
        pytest.param(rl(cpu="5", pods="9"), rl(cpu="1"), False, ["cpu"], id="onlyKeysOfB"),
        pytest.param(
            rl(cpu="2", memory="2Gi"), rl(cpu="1", memory="1Gi"), False, ["cpu", "memory"],
            id="sortedNames",
        ),
    ],
)  # fmt: skip
def test_less_than_or_equal(
    a: quota.ResourceList, b: quota.ResourceList, expected: bool, out: list[str]
) -> None:
    assert quota.less_than_or_equal(a, b) == (expected, out)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # TestMax
        pytest.param({}, {}, {}, id="noKeys"),
        pytest.param(rl(cpu="100m"), {}, rl(cpu="100m"), id="toEmpty"),
        pytest.param(rl(cpu="100m"), rl(cpu="150m"), rl(cpu="150m"), id="matching"),
        pytest.param(rl(cpu="150m"), rl(cpu="100m"), rl(cpu="150m"), id="matching(reverse)"),
        pytest.param(rl(cpu="100m"), rl(cpu="100m"), rl(cpu="100m"), id="matching-equal"),
        pytest.param({}, rl(cpu="1"), rl(cpu="1"), id="fromEmpty"),
    ],
)
def test_max(a: quota.ResourceList, b: quota.ResourceList, expected: quota.ResourceList) -> None:
    assert quota.equals(quota.max(a, b), expected)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # TestAdd
        pytest.param({}, {}, {}, id="noKeys"),
        pytest.param(rl(cpu="100m"), {}, rl(cpu="100m"), id="toEmpty"),
        pytest.param(rl(cpu="100m"), rl(cpu="100m"), rl(cpu="200m"), id="matching"),
        pytest.param({}, rl(cpu="100m"), rl(cpu="100m"), id="fromEmpty"),
    ],
)
def test_add(a: quota.ResourceList, b: quota.ResourceList, expected: quota.ResourceList) -> None:
    assert quota.equals(quota.add(a, b), expected)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # TestSubtract
        pytest.param({}, {}, {}, id="noKeys"),
        pytest.param(rl(cpu="100m"), {}, rl(cpu="100m"), id="value-empty"),
        pytest.param({}, rl(cpu="100m"), rl(cpu="-100m"), id="empty-value"),
        pytest.param(rl(cpu="200m"), rl(cpu="100m"), rl(cpu="100m"), id="value-value"),
    ],
)
def test_subtract(
    a: quota.ResourceList, b: quota.ResourceList, expected: quota.ResourceList
) -> None:
    assert quota.equals(quota.subtract(a, b), expected)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # SubtractWithNonNegativeResult (resources.go): clamped at zero, keys of both
        pytest.param(rl(cpu="200m"), rl(cpu="100m"), rl(cpu="100m"), id="positive"),
        pytest.param(rl(cpu="100m"), rl(cpu="200m"), rl(cpu="0"), id="clamped"),
        pytest.param({}, rl(cpu="100m"), rl(cpu="0"), id="only-b"),
        pytest.param(rl(cpu="1"), {}, rl(cpu="1"), id="only-a"),
    ],
)
def test_subtract_non_negative(
    a: quota.ResourceList, b: quota.ResourceList, expected: quota.ResourceList
) -> None:
    assert quota.equals(quota.subtract_non_negative(a, b), expected)


def test_add_keeps_left_format_unless_zero() -> None:
    # spec section 4: "add keeps a's format unless a's value is zero"
    got = quota.add(rl(memory="1Gi", cpu="0"), rl(memory="500M", cpu="1Gi"))
    assert quota.to_strings(got) == {"cpu": "1Gi", "memory": "1573741824"}


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        # TestResourceNames
        pytest.param({}, [], id="empty"),
        pytest.param(rl(cpu="100m", memory="1Gi"), ["cpu", "memory"], id="values"),
    ],
)
def test_resource_names(a: quota.ResourceList, expected: list[str]) -> None:
    assert quota.to_set(quota.resource_names(a)) == quota.to_set(expected)


@pytest.mark.parametrize(
    ("prefixes", "item", "expected"),
    [
        # TestContainsPrefix
        pytest.param(["hugepages-"], "cpu", False, id="does-not-contain"),
        pytest.param(["hugepages-"], "hugepages-2Mi", True, id="does-contain"),
    ],
)
def test_contains_prefix(prefixes: list[str], item: str, expected: bool) -> None:
    assert quota.contains_prefix(prefixes, item) is expected


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        # TestIsZero
        pytest.param({}, True, id="empty"),
        pytest.param(rl(cpu="0", memory="0"), True, id="zero"),
        pytest.param(rl(cpu="200m", memory="1Gi"), False, id="non-zero"),
    ],
)
def test_is_zero(a: quota.ResourceList, expected: bool) -> None:
    assert quota.is_zero(a) is expected


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        # TestRemoveZeros
        pytest.param({}, {}, id="empty"),
        pytest.param(rl(cpu="0", memory="0"), {}, id="all-zeros"),
        pytest.param(
            rl(cpu="0", memory="0", storage="100Gi"), rl(storage="100Gi"), id="some-zeros"
        ),
        pytest.param(rl(cpu="200m", memory="1Gi"), rl(cpu="200m", memory="1Gi"), id="non-zero"),
    ],
)
def test_remove_zeros(a: quota.ResourceList, expected: quota.ResourceList) -> None:
    assert quota.equals(quota.remove_zeros(a), expected)


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        # TestIsNegative
        pytest.param({}, [], id="empty"),
        pytest.param(rl(cpu="-10", memory="0"), ["cpu"], id="some-negative"),
        pytest.param(rl(cpu="-200m", memory="-1Gi"), ["cpu", "memory"], id="all-negative"),
    ],
)
def test_is_negative(a: quota.ResourceList, expected: list[str]) -> None:
    assert quota.is_negative(a) == expected


def test_negative_usage_message() -> None:
    # admission: "quota usage is negative for resource(s): <sorted names>"
    assert (
        quota.negative_usage_message(["memory", "cpu"])
        == "quota usage is negative for resource(s): cpu,memory"
    )


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # TestIntersection
        pytest.param([], [], [], id="empty"),
        pytest.param(["cpu", "memory"], ["cpu", "memory"], ["cpu", "memory"], id="equal"),
        pytest.param(["cpu", "memory"], ["cpu"], ["cpu"], id="a has extra"),
        pytest.param(["cpu"], ["cpu", "memory"], ["cpu"], id="b has extra"),
        pytest.param(["cpu", "cpu", "memory", "memory"], ["cpu"], ["cpu"], id="dedupes"),
        pytest.param(
            ["memory", "memory", "cpu", "cpu"], ["memory", "memory", "cpu", "cpu"],
            ["cpu", "memory"], id="sorts",
        ),
    ],
)  # fmt: skip
def test_intersection(a: list[str], b: list[str], expected: list[str]) -> None:
    assert quota.intersection(a, b) == expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # TestDifference
        pytest.param([], [], [], id="empty"),
        pytest.param(["cpu", "memory"], ["cpu", "memory"], [], id="equal"),
        pytest.param(["cpu", "memory"], ["cpu"], ["memory"], id="a has extra"),
        pytest.param(["cpu"], ["cpu", "memory"], [], id="b has extra"),
        pytest.param(["cpu", "cpu", "memory", "memory"], ["cpu"], ["memory"], id="dedupes"),
        pytest.param(["memory", "memory", "cpu", "cpu"], [], ["cpu", "memory"], id="sorts"),
    ],
)
def test_difference(a: list[str], b: list[str], expected: list[str]) -> None:
    assert quota.difference(a, b) == expected


def test_mask() -> None:
    got = quota.mask(rl(cpu="1", memory="1Gi", pods="3"), ["cpu", "pods", "secrets"])
    assert quota.to_strings(got) == {"cpu": "1", "pods": "3"}


def test_to_strings_and_pretty_print() -> None:
    usage = rl(requests_cpu="600m", memory="1.5Gi")
    assert quota.to_strings(usage) == {"memory": "1536Mi", "requests.cpu": "600m"}
    # admission's prettyPrint, as in "requested: requests.cpu=600m"
    assert quota.pretty_print(usage) == "memory=1536Mi,requests.cpu=600m"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param({"cpu": "lots"}, "spec.hard[cpu]: cannot parse quantity 'lots'", id="value"),
        pytest.param(["cpu"], "spec.hard: expected a map of quantities, got list", id="not-map"),
        pytest.param({"cpu": 1.5}, "spec.hard[cpu]: cannot parse quantity 1.5", id="float"),
    ],
)
def test_parse_resource_list_errors(raw: object, message: str) -> None:
    with pytest.raises(ResourceListError) as info:
        quota.parse_resource_list(raw, "spec.hard")
    assert str(info.value).startswith(message)


def test_parse_resource_list() -> None:
    assert quota.parse_resource_list(None) == {}
    assert quota.to_strings(quota.parse_resource_list({"cpu": "1000m"})) == {"cpu": "1"}


# -- algebra laws -------------------------------------------------------------------------------

names = st.sampled_from(["cpu", "memory", "pods", "requests.storage", "count/secrets"])
quantity_values = st.builds(
    Quantity, st.integers(min_value=-(10**20), max_value=10**20), st.sampled_from(list(Format))
)
lists = st.dictionaries(names, quantity_values, max_size=5)


@given(lists, lists)
def test_add_commutes_numerically(a: quota.ResourceList, b: quota.ResourceList) -> None:
    assert quota.equals(quota.add(a, b), quota.add(b, a))


@given(lists, lists)
def test_subtract_undoes_add(a: quota.ResourceList, b: quota.ResourceList) -> None:
    result = quota.subtract(quota.add(a, b), b)
    # keys only in b come back as explicit zeros
    assert quota.equals(quota.remove_zeros(result), quota.remove_zeros(a))
    assert set(result) == set(a) | set(b)


@given(lists, lists)
def test_max_is_an_upper_bound(a: quota.ResourceList, b: quota.ResourceList) -> None:
    result = quota.max(a, b)
    assert set(result) == set(a) | set(b)
    assert quota.less_than_or_equal(a, result) == (True, [])
    assert quota.less_than_or_equal(b, result) == (True, [])
    assert all(result[k] in (a.get(k), b.get(k)) for k in result)


@given(lists, st.sets(names))
def test_mask_keeps_only_names(a: quota.ResourceList, keep: set[str]) -> None:
    result = quota.mask(a, keep)
    assert set(result) == set(a) & keep
    assert all(result[k] is a[k] for k in result)


@given(lists, lists)
def test_subtract_non_negative_is_clamped_subtract(
    a: quota.ResourceList, b: quota.ResourceList
) -> None:
    clamped = quota.subtract_non_negative(a, b)
    plain = quota.subtract(a, b)
    zero = parse_quantity("0")
    assert set(clamped) == set(plain)
    for key in plain:
        # upstream: keys only in b become zero whatever b's sign
        expected = builtin_max(plain[key], zero) if key in a else zero
        assert clamped[key] == expected


builtin_max = max
