"""Kubernetes' CEL quantity library, over tally's exact :class:`~tally.quota.quantity.Quantity`.

The functions and their overload ids are upstream's (``k8s.io/apiserver/pkg/cel/library/
quantity.go``): ``quantity(string)``, ``isQuantity(string)``, and on a quantity ``sign()``,
``isGreaterThan(q)``, ``isLessThan(q)``, ``compareTo(q)``, ``asApproximateFloat()``,
``asInteger()``, ``isInteger()``, ``add(q | int)``, ``sub(q | int)``. Upstream declares
``sign`` as a global function while its documentation writes ``q.sign()``; both spellings work
here.

How a quantity lives inside CEL: the runtime (cel-expr-python) cannot carry an opaque Python
object, so a quantity is the one-entry map ``{"tally.dev/quantity": "<value in nanos>"}``. The
decimal string is exact at any size (a CEL int would overflow at 9.2e18 nanos, 9.2 G units),
and because it is canonical, CEL's ``==`` between two quantities compares their values, as
upstream's ``Quantity.Equal`` does (``quantity("1Gi") == quantity("1073741824")``). The type
checker sees ``map(string, string)``: ``quantity(1)`` and ``q.add("1")`` are refused when the
measure is written. What is lost is the format (``10Gi`` versus ``10737418240``): a quantity
made by these functions comes back in DecimalSI, which only changes how a sum prints.

Differences from upstream, all from tally's quantity parser: magnitudes of ``10**64`` or more
are errors (``quantity("1e70")``), and so is an ``add``/``sub`` whose result gets there; see
:mod:`tally.quota.quantity`. A failing function raises :class:`ValueError`; the runtime turns
it into a CEL error value, which the evaluation reports (and ``||``/``&&`` may absorb, as CEL
specifies).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from tally.quota.quantity import MAX_DECIMAL_EXPONENT, NANO, Quantity, QuantityError, parse_quantity

__all__ = [
    "QUANTITY_KEY",
    "add",
    "add_int",
    "as_approximate_float",
    "as_integer",
    "compare_to",
    "decode",
    "encode",
    "is_greater_than",
    "is_integer",
    "is_less_than",
    "is_quantity",
    "quantity",
    "sign",
    "sub",
    "sub_int",
]

QUANTITY_KEY: Final = "tally.dev/quantity"
"""The one key of the map that stands for a quantity inside CEL."""

_NANOS_RE: Final = re.compile(r"-?(?:0|[1-9][0-9]*)")
_MAX_NANOS_EXCLUSIVE: Final = 10 ** (MAX_DECIMAL_EXPONENT + 9)
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def encode(value: Quantity) -> dict[str, str]:
    return {QUANTITY_KEY: str(value.nanos)}


def decode(value: object) -> Quantity | None:
    """The quantity a CEL map stands for, or None when the map is not one."""
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    nanos = value.get(QUANTITY_KEY)
    if type(nanos) is not str or _NANOS_RE.fullmatch(nanos) is None:
        return None
    number = int(nanos)
    if abs(number) >= _MAX_NANOS_EXCLUSIVE:
        return None
    return Quantity(number)


def _operand(value: object) -> Quantity:
    decoded = decode(value)
    if decoded is None:
        # Only reachable with a hand-written map: the type checker lets any map(string, string)
        # through, the runtime hands it over as it is.
        raise ValueError(f"not a quantity: {value!r}")
    return decoded


def _checked(nanos: int) -> dict[str, str]:
    if abs(nanos) >= _MAX_NANOS_EXCLUSIVE:
        raise ValueError(f"quantity out of range: magnitude of 10**{MAX_DECIMAL_EXPONENT} or more")
    return {QUANTITY_KEY: str(nanos)}


def quantity(text: str) -> dict[str, str]:
    """``quantity(string)``: an error for anything :func:`parse_quantity` refuses."""
    try:
        return encode(parse_quantity(text))
    except QuantityError as error:
        raise ValueError(str(error)) from error


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def sign(value: Mapping[str, str]) -> int:
    return _operand(value).sign()


def is_greater_than(left: Mapping[str, str], right: Mapping[str, str]) -> bool:
    return _operand(left).nanos > _operand(right).nanos


def is_less_than(left: Mapping[str, str], right: Mapping[str, str]) -> bool:
    return _operand(left).nanos < _operand(right).nanos


def compare_to(left: Mapping[str, str], right: Mapping[str, str]) -> int:
    return _operand(left).cmp(_operand(right))


def as_approximate_float(value: Mapping[str, str]) -> float:
    # int / int is correctly rounded in Python; magnitudes below 10**64 never overflow.
    return _operand(value).nanos / NANO


def is_integer(value: Mapping[str, str]) -> bool:
    """Upstream ``AsInt64`` succeeds: a whole number that fits an int64."""
    nanos = _operand(value).nanos
    return nanos % NANO == 0 and _INT64_MIN <= nanos // NANO <= _INT64_MAX


def as_integer(value: Mapping[str, str]) -> int:
    if not is_integer(value):
        raise ValueError("cannot convert value to integer")
    return _operand(value).nanos // NANO


def add(left: Mapping[str, str], right: Mapping[str, str]) -> dict[str, str]:
    return _checked(_operand(left).nanos + _operand(right).nanos)


def add_int(left: Mapping[str, str], right: int) -> dict[str, str]:
    return _checked(_operand(left).nanos + right * NANO)


def sub(left: Mapping[str, str], right: Mapping[str, str]) -> dict[str, str]:
    return _checked(_operand(left).nanos - _operand(right).nanos)


def sub_int(left: Mapping[str, str], right: int) -> dict[str, str]:
    return _checked(_operand(left).nanos - right * NANO)
