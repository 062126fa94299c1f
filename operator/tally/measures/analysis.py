"""What tally reads from a measure expression's text before it ever runs it.

Two facts, both taken from the expression's tokens (CEL's lexical grammar is small; the
expression has already compiled, so only valid CEL reaches this module):

- **The fields it can read** (:attr:`Shape.projection`). A measure usually reads two or three
  fields of an object, while the CEL runtime converts every part of ``object`` an expression
  touches into its own values, and a whole pod costs several times what its two fields do.
  An ``object.a["b"][0]`` chain goes on while it selects a field or indexes with a literal,
  and ends at anything else (a call, another index, an operator, the end): the value reached
  is then handed over whole, so whatever the expression does with it (index it, iterate it,
  ``has()`` a key of it, compare it) sees exactly what it would in the full object. A chain
  that stops at ``object`` itself hands over the whole object. Every identifier ``object``
  counts, even a comprehension variable of that name or a field called ``object``: that can
  only add fields, never drop one.
- **How its cost grows with the object** (:attr:`Shape.comprehensions`, :attr:`Shape.depth`,
  :attr:`Shape.literal_items`): the comprehension macros (``all``, ``exists``, ``exists_one``,
  ``map``, ``filter``), how deeply they nest, and a bound on the size of any list or map
  literal. CEL has no loops, recursion or variables beyond these, so without a comprehension
  an evaluation does a bounded number of operations, each linear in the size of its operands.

The analysis errs on the side of reading more: an unknown token is an error (the measure is
refused at compile time), never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

__all__ = [
    "COMPREHENSION_MACROS",
    "Projection",
    "Shape",
    "ShapeError",
    "Step",
    "analyse",
    "deeper_than",
    "largest_collection",
    "merge",
    "project",
]

COMPREHENSION_MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
"""The macros of CEL's standard environment that iterate (``has`` does not)."""

VARIABLE: Final = "object"

_OPENING: Final = frozenset("([{")
_CLOSING: Final = frozenset(")]}")

Step: TypeAlias = "str | int"
"""One step down an object: a map key (``.name`` or ``["name"]``) or a list index (``[0]``)."""

Projection: TypeAlias = "Mapping[Step, Projection] | None"
"""The part of an object an expression reads: ``None`` is the whole value; a mapping keeps only
those steps (map keys, list indexes), each projected in turn. Built once per measure and never
changed."""

# CEL's tokens (cel-spec's lexer), in the order they must be tried: raw and byte prefixes
# before identifiers, triple quotes before single ones, two-character operators before one.
# Raw strings end at their first closing quote (no escapes); others skip backslash escapes.
_TOKEN: Final = re.compile(
    r"""
    (?P<space>[\s]+|//[^\n]*)
  | (?P<string>
        (?:[rR][bB]?|[bB][rR])(?:'''.*?'''|\"\"\".*?\"\"\"|'[^'\n\r]*'|"[^"\n\r]*")
      | [bB]?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
               |'(?:\\.|[^'\\\n\r])*'|"(?:\\.|[^"\\\n\r])*")
    )
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?[uU]?
               |\.[0-9]+(?:[eE][+-]?[0-9]+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<quoted>`[^`]*`)
  | (?P<punct>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE | re.DOTALL,
)


# A string literal whose value is its text between the quotes (no prefix, no escapes).
_PLAIN_STRING: Final = re.compile(r"'[^'\\\n]*'|\"[^\"\\\n]*\"")
_PLAIN_INDEX: Final = re.compile(r"[0-9]+")


class ShapeError(ValueError):
    """The expression's text holds something the analysis does not know (a bug, or CEL syntax
    newer than this module); the measure must be refused rather than guessed at."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What one or more expressions read and how their cost grows (see module docstring)."""

    projection: Projection
    """The fields of ``object`` read; ``None`` when the whole object is."""
    comprehensions: int
    """How many comprehension macros the text holds."""
    depth: int
    """How deeply they nest: 0 without any, 1 for ``l.map(x, ...)``, 2 for one inside another."""
    literal_items: int
    """No list or map literal in the text has more items than this (commas + 1)."""


def _tokens(source: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(source):
        match = _TOKEN.match(source, position)
        if match is None or match.end() == position:
            raise ShapeError(f"unexpected character {source[position]!r} at offset {position}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append((kind, match.group()))
        position = match.end()
    return tokens


def analyse(source: str) -> Shape:
    """The :class:`Shape` of one expression. Raises :class:`ShapeError`."""
    tokens = _tokens(source)
    paths: list[tuple[Step, ...]] = []
    comprehensions = 0
    depth = 0
    open_macros = 0
    # One entry per open bracket: does it open a comprehension macro's arguments?
    brackets: list[bool] = []
    commas = 0
    for index, (kind, text) in enumerate(tokens):
        if kind == "ident" and text == VARIABLE:
            paths.append(_path_from(tokens, index))
        elif kind == "punct":
            if text in _OPENING:
                is_macro = (
                    text == "("
                    and index >= 2
                    and tokens[index - 1][0] == "ident"
                    and tokens[index - 1][1] in COMPREHENSION_MACROS
                    and tokens[index - 2] == ("punct", ".")
                )
                if is_macro:
                    comprehensions += 1
                    open_macros += 1
                    depth = max(depth, open_macros)
                brackets.append(is_macro)
            elif text in _CLOSING:
                if not brackets:
                    raise ShapeError(f"unbalanced {text!r}")
                if brackets.pop():
                    open_macros -= 1
            elif text == ",":
                commas += 1
    if brackets:
        raise ShapeError("unbalanced brackets")
    return Shape(
        projection=_projection(paths),
        comprehensions=comprehensions,
        depth=depth,
        literal_items=commas + 1,
    )


def _step(tokens: list[tuple[str, str]], position: int) -> tuple[Step, int] | None:
    """The step the tokens at ``position`` take (and where the next one starts), or None when
    they do anything else: a call, an operator, an index that is not a literal, the end."""
    if position + 1 >= len(tokens):
        return None
    kind, text = tokens[position + 1]
    if tokens[position] == ("punct", "."):
        if kind != "ident":
            return None
        # `.name(` is a method call or a macro on the value so far, not a field.
        if position + 2 < len(tokens) and tokens[position + 2] == ("punct", "("):
            return None
        return text, position + 2
    if tokens[position] == ("punct", "[") and position + 2 < len(tokens):
        if tokens[position + 2] != ("punct", "]"):
            return None
        if kind == "string" and _PLAIN_STRING.fullmatch(text):
            return text[1:-1], position + 3
        if kind == "number" and _PLAIN_INDEX.fullmatch(text):
            return int(text), position + 3
    return None


def _path_from(tokens: list[tuple[str, str]], index: int) -> tuple[Step, ...]:
    """The steps of the ``object.a["b"][0]`` chain that starts at ``tokens[index]``."""
    path: list[Step] = []
    position = index + 1
    while (step := _step(tokens, position)) is not None:
        path.append(step[0])
        position = step[1]
    return tuple(path)


def _projection(paths: list[tuple[Step, ...]]) -> Projection:
    if not paths:
        # The expression never reads the object (a constant): hand over nothing of it.
        return {}
    root: dict[Step, Any] | None = {}
    for path in paths:
        root = _insert(root, path)
    return _freeze(root)


def _insert(node: dict[Step, Any] | None, path: tuple[Step, ...]) -> dict[Step, Any] | None:
    if node is None or not path:
        return None  # whole: already, or from here on
    head, rest = path[0], path[1:]
    node[head] = _insert(node.get(head, {}), rest)
    return node


def _freeze(node: dict[Step, Any] | None) -> Projection:
    if node is None:
        return None
    return {key: _freeze(child) for key, child in node.items()}


def merge(first: Projection, second: Projection) -> Projection:
    """What two expressions read together."""
    if first is None or second is None:
        return None
    merged: dict[Step, Projection] = dict(first)
    for key, child in second.items():
        merged[key] = merge(merged[key], child) if key in merged else child
    return merged


def project(value: Any, projection: Projection) -> Any:
    """``value`` with only what ``projection`` reads. Shares the kept subtrees (never copies
    or changes them); only the containers on the way down to them are new.

    A map keeps the keys read (an index step never matches a JSON key, and the lookup fails
    in the projection exactly as in the full map). A list read only at literal indexes keeps
    its items up to the highest one, the others replaced by null: no step of the expression can
    reach them. Anything else is kept whole, so the expression sees it, or fails on it, exactly
    as in the full object.
    """
    if projection is None:
        return value
    kind = type(value)
    if kind is dict or (kind is not list and isinstance(value, Mapping)):
        narrowed = {}
        for key, child in projection.items():
            if key in value:
                item = value[key]
                # Most steps end a chain: keep the item without another call.
                narrowed[key] = item if child is None else project(item, child)
        return narrowed
    if kind is list:
        indexes = [key for key in projection if type(key) is int]
        if len(indexes) == len(projection):
            kept: list[Any] = [None] * min(len(value), max(indexes) + 1)
            for index in indexes:
                if index < len(kept):
                    kept[index] = project(value[index], projection[index])
            return kept
    return value


def largest_collection(value: Any) -> int:
    """The number of items of the largest list or dict anywhere in ``value`` (JSON: only
    dicts and lists hold items; the runtime refuses any other container anyway)."""
    largest = 0
    stack = [value] if type(value) is dict or type(value) is list else []
    while stack:
        item = stack.pop()
        largest = max(largest, len(item))
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append(child)
    return largest


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests dicts and lists more than ``limit`` levels deep (a scalar is 0,
    ``{"a": 1}`` is 1). Iterative, and stops at the first path past ``limit``."""
    stack = [(value, 1)] if type(value) is dict or type(value) is list else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
    return False
