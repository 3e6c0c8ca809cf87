"""The event schemas read once into checks: the one definition both checkers are built from.

``schemas/events/*.json`` are the only source of what a payload may be. This
module reads a schema into a tree of :class:`Node` values, refusing (with
:class:`UnsupportedSchema`) anything outside the subset below, and fixes the
order in which a payload's problems are found, so that every checker built
from the tree names the same first problem:

- :mod:`bothy_notify.store.eventcheck` compiles the tree into Python closures
  (the HTTP path, before any database work);
- :mod:`bothy_notify.store.eventsql` writes it as a PL/pgSQL function into a
  migration (``bothy.append_event``, the outbox path, where no Python runs).

``tests/store/test_event_checks.py`` holds both to ``jsonschema`` (with
ECMA-262 patterns) on payloads that hypothesis-jsonschema generates from the
same files, and to each other: the same verdict, the same field, the same
problem.

The subset (every keyword the files use; a schema with another keyword is
refused when it is read, so a new keyword is taught to both checkers and the
test at once):

- annotations, which do not judge: ``$schema``, ``$id``, ``$comment``,
  ``title``, ``description``, ``examples``, ``default``;
- ``type``: one of ``object``, ``array``, ``string``, ``integer``, ``number``,
  ``boolean``, ``null`` (an integer is any number whose fractional part is
  zero: ``8487.0`` is the integer 8487; ``true`` is no number);
- objects: ``properties``, ``required``, ``additionalProperties: false``;
  property names are ``[a-z][a-z0-9_]*`` (they appear in error messages);
- arrays: ``items`` (one schema), ``minItems``, ``maxItems``;
- strings: ``enum`` (strings only), ``minLength``, ``maxLength`` (code
  points), ``pattern`` (see :func:`check_pattern`), and ``maxDecodedBytes``:
  ours, the most bytes a standard base64 string decodes to;
- numbers: ``minimum``, ``maximum`` (integers, so a bound reads the same as a
  double and as a decimal).

A keyword that would only apply to another type than the node's ``type``
is refused too: it would never judge anything.

The order of the checks, at each node: ``type``; then for a string
``enum``, ``minLength``, ``maxLength``, ``pattern``, ``maxDecodedBytes``; for
a number ``minimum``, ``maximum``; for an array ``minItems``, ``maxItems``,
then the items in order; for an object every ``required`` name in the
schema's order, then unknown members, then the properties present in the
schema's order, each checked in full before the next. The first problem found
is the answer.

An unknown member is named only when its name has the form
:data:`NAMEABLE_MEMBER` (the smallest such name in code point order): a member
name is the producer's text and may be a value that must not be echoed; an
object with unknown members none of which may be named is the field itself.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

ANNOTATIONS: Final = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "examples", "default"}
)
"""Keywords that say nothing about validity."""

TYPES: Final = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})

PROPERTY_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""A property's name in a schema: it appears in error messages and in the SQL."""

NAMEABLE_MEMBER: Final = r"^[a-z_]{1,40}$"
"""An unknown member with a name of this form is named in the error (PostgreSQL and
Python read this pattern alike); any other name may be a value and is not echoed."""

MAX_REPEAT: Final = 255
"""The largest ``{n,m}`` bound PostgreSQL's regular expressions take (``RE_DUP_MAX``)."""

KEYWORDS: Final = {
    None: frozenset({"enum"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"enum", "minLength", "maxLength", "pattern", "maxDecodedBytes"}),
    "integer": frozenset({"minimum", "maximum"}),
    "number": frozenset({"minimum", "maximum"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
"""The keywords that judge a node of each ``type`` (``None``: no ``type``)."""


class UnsupportedSchema(ValueError):
    """A schema uses what the checkers do not implement; the message names where."""


class Problem(enum.Enum):
    """What is wrong with a field: the closed set of answers, worded as SPEC section 5's
    422 says them (never with the value)."""

    EXPECTED_OBJECT = "expected an object"
    EXPECTED_ARRAY = "expected an array"
    EXPECTED_STRING = "expected a string"
    EXPECTED_INTEGER = "expected an integer"
    EXPECTED_NUMBER = "expected a number"
    EXPECTED_BOOLEAN = "expected a boolean"
    EXPECTED_NULL = "expected null"
    NOT_ALLOWED = "not one of the allowed values"
    TOO_SHORT = "too short"
    TOO_LONG = "too long"
    WRONG_FORM = "does not have the required form"
    TOO_SMALL = "too small"
    TOO_LARGE = "too large"
    TOO_FEW_ITEMS = "too few items"
    TOO_MANY_ITEMS = "too many items"
    REQUIRED = "required"
    UNKNOWN_FIELD = "unknown field"


EXPECTED: Final = {
    "object": Problem.EXPECTED_OBJECT,
    "array": Problem.EXPECTED_ARRAY,
    "string": Problem.EXPECTED_STRING,
    "integer": Problem.EXPECTED_INTEGER,
    "number": Problem.EXPECTED_NUMBER,
    "boolean": Problem.EXPECTED_BOOLEAN,
    "null": Problem.EXPECTED_NULL,
}
"""The problem of a value of another type than the node's."""


@dataclass(frozen=True, slots=True)
class Node:
    """One schema, read: ``None`` where a keyword is absent."""

    type: str | None = None
    enum: tuple[str, ...] | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    max_decoded_bytes: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    items: Node | None = None
    required: tuple[str, ...] = ()
    properties: tuple[tuple[str, Node], ...] = ()
    closed: bool = False

    @property
    def judges(self) -> bool:
        """Whether some value fails this node (else a checker may skip it)."""
        return self != ANYTHING


ANYTHING: Final = Node()
"""The node that every value passes (a schema of annotations only)."""


def read(schema: Mapping[str, Any], where: str = "payload") -> Node:
    """``schema`` as a :class:`Node`.

    Raises:
        UnsupportedSchema: a keyword or value outside the subset; ``where`` (the
            field path of this schema) is in the message.
    """
    if not isinstance(schema, Mapping):
        raise UnsupportedSchema(f"{where}: a schema is an object")
    kind = schema.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in TYPES):
        raise UnsupportedSchema(f"{where}: type {kind!r} (one type name only)")
    allowed = KEYWORDS[kind] | ANNOTATIONS | {"type"}
    for keyword in schema:
        if keyword not in allowed:
            raise UnsupportedSchema(f"{where}: keyword {keyword!r} with type {kind!r}")
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise UnsupportedSchema(f"{where}: properties is an object")
    required = tuple(schema.get("required", ()))
    for name in (*properties, *required):
        if not isinstance(name, str) or not PROPERTY_NAME.fullmatch(name):
            raise UnsupportedSchema(f"{where}: property name {name!r}")
    if len(set(required)) != len(required):
        raise UnsupportedSchema(f"{where}: a required name twice")
    additional = schema.get("additionalProperties", True)
    if not isinstance(additional, bool):
        raise UnsupportedSchema(f"{where}: additionalProperties is true or false")
    values = schema.get("enum")
    if values is not None and (
        not isinstance(values, list)
        or not values
        or not all(isinstance(v, str) and "\x00" not in v for v in values)
    ):
        raise UnsupportedSchema(f"{where}: enum of strings only")
    pattern = schema.get("pattern")
    if pattern is not None:
        check_pattern(pattern, where)
    items = schema.get("items")
    return Node(
        type=kind,
        enum=tuple(values) if values is not None else None,
        min_length=_count(schema, "minLength", where),
        max_length=_count(schema, "maxLength", where),
        pattern=pattern,
        max_decoded_bytes=_count(schema, "maxDecodedBytes", where),
        minimum=_bound(schema, "minimum", where),
        maximum=_bound(schema, "maximum", where),
        min_items=_count(schema, "minItems", where),
        max_items=_count(schema, "maxItems", where),
        items=read(items, f"{where}[]") if items is not None else None,
        required=required,
        properties=tuple((name, read(sub, f"{where}.{name}")) for name, sub in properties.items()),
        closed=additional is False,
    )


def _count(schema: Mapping[str, Any], keyword: str, where: str) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise UnsupportedSchema(f"{where}: {keyword} is a count")
    return value


def _bound(schema: Mapping[str, Any], keyword: str, where: str) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if type(value) is not int:
        # A fractional bound reads differently as a double (Python) and as a decimal
        # (PostgreSQL): 0.1 is not 0.1 in binary.
        raise UnsupportedSchema(f"{where}: {keyword} is an integer")
    return value


# ---------------------------------------------------------------- patterns

_LITERAL_ESCAPES: Final = frozenset("\\^$.|?*+()[]{}/-")
"""What may follow a backslash: punctuation, read as itself alike everywhere."""
_QUANTIFIER: Final = re.compile(r"\{(\d+)(,(\d*))?\}")


def check_pattern(pattern: object, where: str = "pattern") -> str:
    """``pattern`` when it is in the regular-expression subset on which ECMA-262 (JSON
    Schema's dialect), PostgreSQL's ARE and Python's ``re`` (through
    :func:`python_pattern`) agree; else :class:`UnsupportedSchema`.

    The subset: literal characters, a backslash before punctuation, bracket classes
    of characters and ranges (optionally negated), groups ``(...)`` and
    ``(?:...)``, ``|``, the quantifiers ``* + ? {n} {n,} {n,m}`` (greedy, bounds up
    to :data:`MAX_REPEAT`), and the anchors ``^`` and ``$``. Left out because the
    three read them differently: ``.`` (which line ends it matches), ``\\d \\w \\s
    \\b`` (ASCII or Unicode), back references, look-around and flags.
    """
    if not isinstance(pattern, str) or "\x00" in pattern:
        raise UnsupportedSchema(f"{where}: a pattern is a string without NUL")
    i, depth, quantifiable = 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1] not in _LITERAL_ESCAPES:
                raise UnsupportedSchema(f"{where}: escape at {i} (punctuation only)")
            i, quantifiable = i + 2, True
        elif c == "[":
            i, quantifiable = _class_end(pattern, i + 1, where), True
        elif c == "(":
            if pattern.startswith("(?", i) and not pattern.startswith("(?:", i):
                raise UnsupportedSchema(f"{where}: group at {i} (only ( and (?:)")
            i, depth, quantifiable = (
                i + (3 if pattern.startswith("(?:", i) else 1),
                depth + 1,
                False,
            )
        elif c == ")":
            if depth == 0:
                raise UnsupportedSchema(f"{where}: unbalanced ) at {i}")
            i, depth, quantifiable = i + 1, depth - 1, True
        elif c in "*+?{":
            if not quantifiable:
                raise UnsupportedSchema(f"{where}: quantifier at {i} follows nothing")
            if c == "{":
                match = _QUANTIFIER.match(pattern, i)
                if match is None:
                    raise UnsupportedSchema(f"{where}: {{ at {i} (a bound {{n}}, {{n,}}, {{n,m}})")
                low, high = int(match[1]), match[3]
                if low > MAX_REPEAT or (high and (int(high) > MAX_REPEAT or int(high) < low)):
                    raise UnsupportedSchema(f"{where}: bound at {i} (at most {MAX_REPEAT})")
                i = match.end()
            else:
                i += 1
            if i < len(pattern) and pattern[i] in "*+?{":
                raise UnsupportedSchema(f"{where}: quantifier at {i} follows a quantifier")
            quantifiable = False
        elif c in "|^$":
            i, quantifiable = i + 1, False
        elif c in ".]}":
            raise UnsupportedSchema(f"{where}: {c} at {i} (escape it, or use a class)")
        else:
            i, quantifiable = i + 1, True
    if depth:
        raise UnsupportedSchema(f"{where}: unbalanced (")
    return pattern


def _class_end(pattern: str, i: int, where: str) -> int:
    """The index after the bracket class whose content starts at ``i``."""
    start = i
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        raise UnsupportedSchema(f"{where}: empty class at {start - 1}")
    while i < len(pattern):
        c = pattern[i]
        if c == "]":
            return i + 1
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1] not in _LITERAL_ESCAPES:
                raise UnsupportedSchema(f"{where}: escape at {i} (punctuation only)")
            i += 2
        elif c == "[":
            raise UnsupportedSchema(f"{where}: [ inside a class at {i} (escape it)")
        else:
            i += 1
    raise UnsupportedSchema(f"{where}: unclosed class at {start - 1}")


def python_pattern(pattern: str) -> str:
    """A pattern of :func:`check_pattern`'s subset, for Python's ``re.search``: ``$``
    becomes ``\\Z``, since Python's ``$`` also matches before a final newline and
    ECMA-262's (and PostgreSQL's) does not."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"  # check_pattern refuses an empty class: "]" closes
        elif c == "[":
            in_class = True
        elif c == "$":
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)


def decoded_bytes(text: str) -> int:
    """How many bytes standard base64 ``text`` (its form checked by the pattern)
    decodes to: three per four characters, less one per trailing ``=``."""
    return len(text) // 4 * 3 - (len(text) - len(text.rstrip("=")))


__all__ = [
    "ANYTHING",
    "EXPECTED",
    "NAMEABLE_MEMBER",
    "Node",
    "Problem",
    "UnsupportedSchema",
    "check_pattern",
    "decoded_bytes",
    "python_pattern",
    "read",
]
