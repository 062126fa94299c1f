"""Exact Kubernetes quantities: parse, compare, add and format them like apimachinery.

This module owns the one number type of tally's quota core. It is a port of the *behaviour* of
``k8s.io/apimachinery/pkg/api/resource`` (``quantity.go``, ``amount.go``, ``suffix.go``), not of
its code: upstream juggles an int64 fast path and an ``inf.Dec`` slow path, we keep one exact
Python ``int`` counting nano-units (``value * 10**9``). Nothing here ever touches a float.

Why nano units: upstream parsing keeps a value only down to nano and rounds anything finer *away
from zero* ("if you want some resources, you should get some resources"), so every quantity the
API server can hold is an integer number of nanos, and so is every sum and difference of them.

What upstream behaviour is kept, on purpose:

- Grammar (the ``quantity.go`` header)::

      <quantity>        ::= <signedNumber><suffix>
      <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
      <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
      <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
      <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
      <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

  No whitespace is allowed (``ParseQuantity`` rejects ``" 1"``; only JSON unmarshalling trims).
  Upstream's scanner also accepts a few degenerate strings as zero (``"."``, ``"-"``, ``"+."``,
  a bare suffix such as ``"m"`` or ``"Ki"``); we accept them as zero too, because the API server
  does, and an object it stored must parse here.
- Format memory: a quantity remembers whether it was written DecimalSI, BinarySI or
  DecimalExponent, and formats itself canonically in that format. A BinarySI value with
  ``0 < |v| < 1`` becomes DecimalSI at parse time; a BinarySI magnitude above ``2**63 - 1`` is
  silently capped at ``2**63 - 1`` (``"8Ei"`` parses as 9223372036854775807, upstream #140674).
- Canonical form (``CanonicalizeBytes``): zero is ``0``; DecimalSI/DecimalExponent write
  ``mantissa * 10**e`` with ``e`` a multiple of three, as large as possible without fractional
  digits; BinarySI writes ``mantissa * 1024**k`` when the value is an integer with
  ``|v| >= 1024``, else falls back to DecimalSI. A DecimalSI exponent beyond ``E`` (10**18)
  falls back to ``e<n>`` notation (``1e21``), as current upstream does.
- Arithmetic: ``a + b`` and ``a - b`` keep ``a``'s format unless ``a`` is zero, in which case the
  result takes ``b``'s format (``Quantity.Add``/``Sub``). Comparison, equality and hashing are
  numeric and ignore the format, like ``Quantity.Cmp``.

Where tally differs, and why:

- Absurd magnitudes are rejected with :class:`QuantityRangeError` instead of being computed:
  a value whose magnitude is ``10**MAX_DECIMAL_EXPONENT`` or more, an exponent outside int32
  (upstream wraps it), or an input longer than ``MAX_QUANTITY_LENGTH`` characters. Upstream would
  happily build ``1e999999999`` as a billion-digit number; nothing real comes near our limits
  (the largest suffix is ``E`` = 10**18), and they bound the work a hostile string can cause.
- A BinarySI value of ``1024**7`` or more formats as ``<n>Ei``; upstream finds no suffix for
  ``1024**7`` and silently drops it (``2**70`` would print as ``1``). Only sums can get there.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAX_DECIMAL_EXPONENT",
    "MAX_QUANTITY_LENGTH",
    "NANO",
    "Format",
    "Quantity",
    "QuantityError",
    "QuantityFormatError",
    "QuantityRangeError",
    "parse_quantity",
]

NANO: Final = 10**9
"""Internal units per unit: every quantity is an integer number of nanos."""

MAX_DECIMAL_EXPONENT: Final = 64
"""Parsed magnitudes must stay below ``10**MAX_DECIMAL_EXPONENT`` (tally's own limit)."""

MAX_QUANTITY_LENGTH: Final = 256
"""Longer input strings are rejected before any arithmetic is attempted (tally's own limit)."""

_MAX_INT64: Final = 2**63 - 1
_BINARY_CAP_NANOS: Final = _MAX_INT64 * NANO
_MAX_NANOS_EXCLUSIVE: Final = 10 ** (MAX_DECIMAL_EXPONENT + 9)
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1

# The same shape as upstream's scanner (parseQuantityString): sign, digits, an optional
# fraction, then a run of suffix letters with an optional signed integer. The suffix is checked
# against the tables afterwards, exactly like upstream's interpret step.
_QUANTITY_RE: Final = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[+-]?[0-9]*)")
_UPSTREAM_REGEX: Final = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


class QuantityError(ValueError):
    """A string is not a Kubernetes quantity. ``value`` holds the offending input."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"cannot parse quantity {value!r}: {reason}")


class QuantityFormatError(QuantityError):
    """The string does not follow the quantity grammar or uses an unknown suffix."""


class QuantityRangeError(QuantityError):
    """The string is well formed but its magnitude is beyond what tally accepts."""


class Format(enum.StrEnum):
    """How a quantity was written, and so how it is written back (upstream ``Format``)."""

    DECIMAL_EXPONENT = "DecimalExponent"
    """``12e6``"""
    BINARY_SI = "BinarySI"
    """``12Mi`` (12 * 2**20)"""
    DECIMAL_SI = "DecimalSI"
    """``12M`` (12 * 10**6)"""


_DECIMAL_SUFFIXES: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: Final[dict[str, int]] = {
    "Ki": 10,
    "Mi": 20,
    "Gi": 30,
    "Ti": 40,
    "Pi": 50,
    "Ei": 60,
}
_DECIMAL_SUFFIX_BY_EXPONENT: Final[dict[int, str]] = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIX_BY_POWER: Final = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


@functools.total_ordering
@dataclass(frozen=True, slots=True, eq=False)
class Quantity:
    """An exact quantity: an integer number of nano-units plus the format it is written in.

    Immutable. Equality, ordering and hashing are numeric (``1Gi == 1073741824``), exactly like
    upstream ``Cmp``; use :attr:`format` or :meth:`canonical` when the spelling matters.
    """

    nanos: int
    """The value times 10**9. Always exact."""
    format: Format = Format.DECIMAL_SI
    """The format the value is written back in."""

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse ``text`` like upstream ``ParseQuantity``; see :func:`parse_quantity`."""
        return parse_quantity(text)

    @classmethod
    def from_int(cls, value: int, fmt: Format = Format.DECIMAL_SI) -> Quantity:
        """``value`` whole units (upstream ``NewQuantity``)."""
        return cls(value * NANO, fmt)

    @classmethod
    def from_milli(cls, value: int, fmt: Format = Format.DECIMAL_SI) -> Quantity:
        """``value`` thousandths (upstream ``NewMilliQuantity``)."""
        return cls(value * 1_000_000, fmt)

    # -- inspection ---------------------------------------------------------------------------

    def is_zero(self) -> bool:
        return self.nanos == 0

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.nanos > 0) - (self.nanos < 0)

    def value(self) -> int:
        """The value in whole units, rounded away from zero (upstream ``Value``)."""
        return _div_away_from_zero(self.nanos, NANO)

    def milli_value(self) -> int:
        """The value in thousandths, rounded away from zero (upstream ``MilliValue``)."""
        return _div_away_from_zero(self.nanos, 1_000_000)

    def round_up(self, scale: int) -> tuple[Quantity, bool]:
        """Round away from zero to a multiple of ``10**scale`` (upstream ``RoundUp``).

        Returns the rounded quantity and whether no precision was lost. Scales finer than nano
        are already exact.
        """
        if scale <= -9:
            return self, True
        unit = 10 ** (scale + 9)
        rounded = _div_away_from_zero(self.nanos, unit) * unit
        return Quantity(rounded, self.format), rounded == self.nanos

    # -- arithmetic ---------------------------------------------------------------------------

    def __add__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        # Upstream Add: a zero receiver adopts the addend's format.
        fmt = other.format if self.nanos == 0 else self.format
        return Quantity(self.nanos + other.nanos, fmt)

    def __sub__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other.format if self.nanos == 0 else self.format
        return Quantity(self.nanos - other.nanos, fmt)

    def __neg__(self) -> Quantity:
        return Quantity(-self.nanos, self.format)

    def __abs__(self) -> Quantity:
        return Quantity(abs(self.nanos), self.format)

    # -- comparison ---------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.nanos == other.nanos

    def __lt__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.nanos < other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def cmp(self, other: Quantity) -> int:
        """-1, 0 or 1, like upstream ``Cmp``."""
        return (self.nanos > other.nanos) - (self.nanos < other.nanos)

    # -- formatting ---------------------------------------------------------------------------

    def canonical(self) -> str:
        """The canonical string, exactly as the API server writes it (``String``)."""
        return _format(self.nanos, self.format)

    def __str__(self) -> str:
        return _format(self.nanos, self.format)

    def __repr__(self) -> str:
        return f"Quantity({_format(self.nanos, self.format)!r})"


ZERO: Final = Quantity(0, Format.DECIMAL_SI)
"""``resource.MustParse("0")``"""


def _div_away_from_zero(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded away from zero; ``denominator`` must be positive."""
    quotient, remainder = divmod(abs(numerator), denominator)
    if remainder:
        quotient += 1
    return -quotient if numerator < 0 else quotient


def parse_quantity(text: str | int) -> Quantity:
    """Parse a quantity string exactly like upstream ``resource.ParseQuantity``.

    Raises :class:`QuantityFormatError` for strings outside the grammar or with an unknown
    suffix, and :class:`QuantityRangeError` for magnitudes tally refuses (see module docstring).
    A JSON integer is accepted as its decimal string (upstream ``UnmarshalJSON`` does the same);
    anything else, floats included, is refused.

    Results are cached: a cache of pods holds the same few strings thousands of times, and
    :class:`Quantity` is immutable, so sharing one object per string saves time and memory.
    """
    if type(text) is int:
        text = str(text)
    if type(text) is not str:
        raise QuantityFormatError(text, f"a quantity must be a string, not {type(text).__name__}")
    return _parse(text)


@functools.lru_cache(maxsize=8192)
def _parse(text: str) -> Quantity:
    if not text:
        raise QuantityFormatError(text, "quantities must not be empty")
    if len(text) > MAX_QUANTITY_LENGTH:
        raise QuantityRangeError(text[:32] + "...", f"longer than {MAX_QUANTITY_LENGTH} characters")
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityFormatError(
            text, f"quantities must match the regular expression '{_UPSTREAM_REGEX}'"
        )
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""

    # Interpret the suffix first, as upstream does (ErrSuffix before any arithmetic).
    binary_power = 0
    decimal_exponent = 0
    if suffix in _DECIMAL_SUFFIXES:
        fmt = Format.DECIMAL_SI
        decimal_exponent = _DECIMAL_SUFFIXES[suffix]
    elif suffix in _BINARY_SUFFIXES:
        fmt = Format.BINARY_SI
        binary_power = _BINARY_SUFFIXES[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE":
        fmt = Format.DECIMAL_EXPONENT
        exponent_text = suffix[1:]
        if not re.fullmatch(r"[+-]?[0-9]+", exponent_text):
            raise QuantityFormatError(text, "unable to parse quantity's suffix")
        decimal_exponent = int(exponent_text)
        if not _INT32_MIN <= decimal_exponent <= _INT32_MAX:
            raise QuantityRangeError(text, "the exponent does not fit in 32 bits")
    else:
        raise QuantityFormatError(text, "unable to parse quantity's suffix")

    digits = (whole + fraction).lstrip("0")
    if not digits:
        return Quantity(0, fmt)

    # value = int(digits) * 10**(decimal_exponent - len(fraction)) * 2**binary_power, then
    # scaled to nanos and rounded away from zero (upstream: amount.Round(Nano, inf.RoundUp)).
    power = decimal_exponent - len(fraction) + 9
    # The magnitude of the value is below 10**(len(digits) + power - 9) * 2**binary_power;
    # refuse before building huge integers.
    # (ceil(log10(2**p)) <= ceil(0.302 p); the slack of 2 keeps the pre-check conservative, the
    # exact check follows the arithmetic.)
    magnitude_digits = len(digits) + power - 9 + (binary_power * 302 + 999) // 1000
    if magnitude_digits > MAX_DECIMAL_EXPONENT + 2:
        raise QuantityRangeError(text, f"magnitude of 10**{MAX_DECIMAL_EXPONENT} or more")
    mantissa = int(digits) << binary_power
    if power >= 0:
        nanos = mantissa * 10**power
    elif -power > len(str(mantissa)):
        # Non-zero but finer than a nano: the smallest representable amount.
        nanos = 1
    else:
        nanos = _div_away_from_zero(mantissa, 10**-power)
    if fmt is Format.BINARY_SI:
        if nanos > _BINARY_CAP_NANOS:
            # Upstream's "simple cap" at MaxInt64, applied to BinarySI only.
            nanos = _BINARY_CAP_NANOS
        elif nanos < NANO:
            # 0 < |v| < 1 in BinarySI would round when printed; upstream switches format.
            fmt = Format.DECIMAL_SI
    if nanos >= _MAX_NANOS_EXCLUSIVE:
        raise QuantityRangeError(text, f"magnitude of 10**{MAX_DECIMAL_EXPONENT} or more")
    return Quantity(-nanos if sign == "-" else nanos, fmt)


def _format(nanos: int, fmt: Format) -> str:
    """Upstream ``CanonicalizeBytes`` plus the suffix, for a value in nanos."""
    if nanos == 0:
        return "0"
    if fmt is Format.BINARY_SI and abs(nanos) >= 1024 * NANO and nanos % NANO == 0:
        mantissa = nanos // NANO
        power = 0
        while mantissa % 1024 == 0 and power < len(_BINARY_SUFFIX_BY_POWER) - 1:
            mantissa //= 1024
            power += 1
        return f"{mantissa}{_BINARY_SUFFIX_BY_POWER[power]}"
    # DecimalSI and DecimalExponent (and BinarySI that would otherwise round): move every
    # factor of ten into the exponent, then lower the exponent to a multiple of three.
    mantissa = nanos
    exponent = -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3
    if shift:
        mantissa *= 10**shift
        exponent -= shift
    if fmt is not Format.DECIMAL_EXPONENT:
        suffix = _DECIMAL_SUFFIX_BY_EXPONENT.get(exponent)
        if suffix is not None:
            return f"{mantissa}{suffix}"
        # No DecimalSI suffix beyond E (10**18): exponent notation keeps the magnitude.
    if exponent == 0:
        return str(mantissa)
    return f"{mantissa}e{exponent}"
