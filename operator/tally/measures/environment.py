"""The one CEL environment measures compile in, and the two calls tally makes into the runtime.

The runtime is cel-expr-python, the CEL project's own Python binding of cel-cpp (the package
docstring says why this one). The environment is CEL's standard library plus
:mod:`tally.measures.library`, with one variable, ``object``, of type ``dyn``: measures read
objects of any kind, with no schema to type-check against, so a field that is missing is a
runtime error of that object, not a compile error.

Everything the runtime reports comes out of this module as :class:`CelError` with cel-cpp's
status code stripped (``NOT_FOUND: Key not found in map : "x"`` becomes cel-go's wording,
``no such key: x``), and cel-cpp's own iteration limit as :class:`IterationLimitError`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, Final

from cel_expr_python import cel

from tally.measures import library

__all__ = [
    "ITERATION_LIMIT",
    "QUANTITY_TYPE",
    "CelError",
    "CompileError",
    "IterationLimitError",
    "activation",
    "compile_source",
    "evaluate",
]

ITERATION_LIMIT: Final = 10_000
"""cel-cpp's ``comprehension_max_iterations`` default: an evaluation fails at the 10 000th
iteration of its comprehensions, counted together (9 999 pass). cel-expr-python 0.1.3 does not
let us change it; the test suite checks it still holds."""

QUANTITY_TYPE: Final = cel.Type.Map(cel.Type.STRING, cel.Type.STRING)
"""What the type checker calls a quantity (see :mod:`tally.measures.library`)."""

_INT = cel.Type.INT
_BOOL = cel.Type.BOOL
_DOUBLE = cel.Type.DOUBLE
_STRING = cel.Type.STRING


class CelError(ValueError):
    """The runtime refused: ``message`` is its reason, without status codes."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class CompileError(CelError):
    """The compiler refused the source; ``message`` is its report (position and caret)."""


class IterationLimitError(CelError):
    """The evaluation's comprehensions reached :data:`ITERATION_LIMIT` iterations."""


def _overload(
    overload_id: str,
    result: cel.Type,
    parameters: list[cel.Type],
    impl: Any,
    *,
    member: bool = True,
) -> cel.Overload:
    return cel.Overload(overload_id, result, parameters, is_member=member, impl=impl)


def _declarations() -> list[cel.FunctionDecl]:
    q = QUANTITY_TYPE
    return [
        cel.FunctionDecl(
            "quantity",
            [_overload("string_to_quantity", q, [_STRING], library.quantity, member=False)],
        ),
        cel.FunctionDecl(
            "isQuantity",
            [_overload("is_quantity_string", _BOOL, [_STRING], library.is_quantity, member=False)],
        ),
        cel.FunctionDecl(
            "sign",
            [
                _overload("quantity_sign", _INT, [q], library.sign, member=False),
                _overload("quantity_sign_member", _INT, [q], library.sign),
            ],
        ),
        cel.FunctionDecl(
            "isGreaterThan",
            [_overload("quantity_is_greater_than", _BOOL, [q, q], library.is_greater_than)],
        ),
        cel.FunctionDecl(
            "isLessThan",
            [_overload("quantity_is_less_than", _BOOL, [q, q], library.is_less_than)],
        ),
        cel.FunctionDecl(
            "compareTo", [_overload("quantity_compare_to", _INT, [q, q], library.compare_to)]
        ),
        cel.FunctionDecl(
            "asApproximateFloat",
            [_overload("quantity_get_float", _DOUBLE, [q], library.as_approximate_float)],
        ),
        cel.FunctionDecl(
            "asInteger", [_overload("quantity_get_int", _INT, [q], library.as_integer)]
        ),
        cel.FunctionDecl(
            "isInteger", [_overload("quantity_is_integer", _BOOL, [q], library.is_integer)]
        ),
        cel.FunctionDecl(
            "add",
            [
                _overload("quantity_add", q, [q, q], library.add),
                _overload("quantity_add_int", q, [q, _INT], library.add_int),
            ],
        ),
        cel.FunctionDecl(
            "sub",
            [
                _overload("quantity_sub", q, [q, q], library.sub),
                _overload("quantity_sub_int", q, [q, _INT], library.sub_int),
            ],
        ),
    ]


# Built once at import: compiling and evaluating never change it.
_ENV: Final = cel.NewEnv(variables={"object": cel.Type.DYN}, functions=_declarations())

# "INVALID_ARGUMENT: <text> [INVALID_ARGUMENT]" -> "<text>"
_STATUS_PREFIX: Final = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX: Final = re.compile(r"\s*\[[A-Z_]+\]\s*$")
# cel-cpp's wording -> cel-go's, which Kubernetes users see from the API server's CEL.
_REWORDINGS: Final = (
    (re.compile(r'^Key not found in map : "(.*)"$', re.DOTALL), r"no such key: \1"),
    (re.compile(r"^No matching overloads found : (.*)$", re.DOTALL), r"no such overload: \1"),
)


def _clean(message: str) -> str:
    text = _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", message.strip()))
    for pattern, replacement in _REWORDINGS:
        text = pattern.sub(replacement, text)
    return text


@functools.lru_cache(maxsize=512)
def compile_source(source: str) -> tuple[cel.Expression, cel.Type]:
    """The compiled program and its static result type. Raises :class:`CompileError`.

    Cached: a controller may rebuild a ClusterQuota's measures on every event, and compiling
    costs ~200 µs where a lookup costs nothing; programs are immutable and reusable.
    """
    try:
        program = _ENV.compile(source)
    except Exception as error:  # cel-expr-python raises RuntimeError; take no chances
        raise CompileError(_clean(str(error))) from None
    return program, program.return_type()


def activation(obj: Any) -> cel.Activation:
    """One evaluation context for ``obj``: the runtime converts the object once, on first use,
    and every program evaluated in the same activation shares that conversion."""
    return _ENV.Activation({"object": obj})


def evaluate(program: cel.Expression, context: cel.Activation | Mapping[str, Any]) -> Any:
    """The program's value as plain Python (``None``, bool, int, float, str, bytearray, list,
    dict, datetime, timedelta, or a type). Raises :class:`CelError`.

    ``context`` is an :func:`activation`, or for a single program the object itself (one
    evaluation with the object as ``object`` costs less than building an activation first).

    Any exception out of the runtime becomes a :class:`CelError`: the runtime is native code
    fed with objects from the API server, and one odd object must fail its evaluation, not the
    caller.
    """
    try:
        if isinstance(context, cel.Activation):
            value = program.eval(context)
        else:
            value = program.eval(data={"object": context})
        result = value.plain_value()
        # An error value reads as its message, a str: only a str needs the (slower) type check.
        if type(result) is str and value.type() == cel.Type.ERROR:
            raise CelError(_clean(result))
    except CelError:
        raise
    except Exception as error:
        message = _clean(str(error))
        if "Iteration budget exceeded" in message:
            raise IterationLimitError(
                f"cost limit exceeded: {ITERATION_LIMIT} comprehension iterations"
            ) from None
        raise CelError(message) from None
    return result
