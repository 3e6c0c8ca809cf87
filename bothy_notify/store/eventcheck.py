"""An event schema compiled into Python closures: the payload check of the HTTP path.

:func:`compile_node` turns a :class:`~bothy_notify.store.eventschema.Node`
into one function per node that returns ``None`` for a valid value, or the
first :class:`Refusal` in the order :mod:`bothy_notify.store.eventschema`
fixes. A valid payload costs a few ``isinstance`` tests, dictionary lookups and
compiled regular expressions; a path is built only for a refusal, while the
stack unwinds. Nothing here reads the schema at check time, and a new event
type needs only its file in ``schemas/events``.

``bothy.append_event`` checks the same tree in SQL
(:mod:`bothy_notify.store.eventsql`); ``tests/store/test_event_checks.py``
proves the two and ``jsonschema`` agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from bothy_notify.store.eventschema import (
    EXPECTED,
    NAMEABLE_MEMBER,
    Node,
    Problem,
    decoded_bytes,
    python_pattern,
    read,
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The first problem of a value: where (keys and indexes from the checked value)
    and what."""

    path: tuple[str | int, ...]
    problem: Problem

    def under(self, step: str | int) -> Refusal:
        """This refusal seen from the container whose member ``step`` it is."""
        return Refusal((step, *self.path), self.problem)

    def field(self, root: str = "payload") -> str:
        """The field as error messages name it: ``payload.mentions[3]``."""
        return root + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in self.path)


Check = Callable[[object], Refusal | None]
"""``None`` when the value passes, else its first :class:`Refusal`."""

_NAMEABLE: Final = re.compile(NAMEABLE_MEMBER)
_REFUSED: Final = {problem: Refusal((), problem) for problem in Problem}
"""One refusal per problem at the checked value itself (they are immutable)."""


def compile_schema(schema: Mapping[str, Any]) -> Check:
    """The check of one event schema (see :func:`bothy_notify.store.eventschema.read`
    for what raises)."""
    return compile_node(read(schema))


def compile_node(node: Node) -> Check:
    """The closure that checks values against ``node``."""
    kind = node.type
    if kind == "object":
        return _object(node)
    if kind == "array":
        return _array(node)
    if kind == "string" or (kind is None and node.enum is not None):
        return _string(node)
    if kind in ("integer", "number"):
        return _number(node)
    if kind == "boolean":
        return _instance(bool, _REFUSED[Problem.EXPECTED_BOOLEAN])
    if kind == "null":
        return _null
    return _anything


def _anything(v: object) -> Refusal | None:
    return None


def _null(v: object) -> Refusal | None:
    return None if v is None else _REFUSED[Problem.EXPECTED_NULL]


def _instance(kind: type, refusal: Refusal) -> Check:
    def check(v: object) -> Refusal | None:
        return None if isinstance(v, kind) else refusal

    return check


def _object(node: Node) -> Check:
    required = node.required
    allowed = frozenset(name for name, _ in node.properties)
    closed = node.closed
    # In the schema's order; a required member is known to be present.
    subs = tuple(
        (name, compile_node(sub), name in required) for name, sub in node.properties if sub.judges
    )
    not_object = _REFUSED[Problem.EXPECTED_OBJECT]

    def check(v: object) -> Refusal | None:
        if not isinstance(v, dict):
            return not_object
        for name in required:
            if name not in v:
                return Refusal((name,), Problem.REQUIRED)
        if closed and not allowed.issuperset(v):
            return _unknown(v, allowed)
        for name, sub, present in subs:
            if present or name in v:
                refusal = sub(v[name])
                if refusal is not None:
                    return refusal.under(name)
        return None

    return check


def _unknown(v: dict[Any, Any], allowed: frozenset[str]) -> Refusal:
    nameable = [k for k in v if k not in allowed and isinstance(k, str) and _NAMEABLE.search(k)]
    if nameable:
        return Refusal((min(nameable),), Problem.UNKNOWN_FIELD)
    return _REFUSED[Problem.UNKNOWN_FIELD]


def _array(node: Node) -> Check:
    low, high = node.min_items, node.max_items
    item = compile_node(node.items) if node.items is not None and node.items.judges else None
    not_array = _REFUSED[Problem.EXPECTED_ARRAY]
    too_few, too_many = _REFUSED[Problem.TOO_FEW_ITEMS], _REFUSED[Problem.TOO_MANY_ITEMS]

    def check(v: object) -> Refusal | None:
        if not isinstance(v, list):
            return not_array
        if low is not None and len(v) < low:
            return too_few
        if high is not None and len(v) > high:
            return too_many
        if item is not None:
            for i, x in enumerate(v):
                refusal = item(x)
                if refusal is not None:
                    return refusal.under(i)
        return None

    return check


def _string(node: Node) -> Check:
    """Strings: each keyword present becomes one step, in the fixed order."""
    steps: list[tuple[Callable[[str], bool], Refusal]] = []
    if node.enum is not None:
        steps.append((frozenset(node.enum).__contains__, _REFUSED[Problem.NOT_ALLOWED]))
    if node.min_length is not None:
        low = node.min_length
        steps.append((lambda s: len(s) >= low, _REFUSED[Problem.TOO_SHORT]))
    if node.max_length is not None:
        high = node.max_length
        steps.append((lambda s: len(s) <= high, _REFUSED[Problem.TOO_LONG]))
    if node.pattern is not None:
        search = re.compile(python_pattern(node.pattern)).search
        steps.append((lambda s: search(s) is not None, _REFUSED[Problem.WRONG_FORM]))
    if node.max_decoded_bytes is not None:
        most = node.max_decoded_bytes
        steps.append((lambda s: decoded_bytes(s) <= most, _REFUSED[Problem.TOO_LONG]))
    # A value of another type: the type's problem, or for an enum without a type, the
    # enum's (JSON Schema's enum compares with every JSON value).
    not_string = _REFUSED[EXPECTED["string"] if node.type == "string" else Problem.NOT_ALLOWED]
    if len(steps) == 1 and node.pattern is not None:  # the common case: an ID
        search = re.compile(python_pattern(node.pattern)).search
        wrong_form = _REFUSED[Problem.WRONG_FORM]

        def pattern(v: object) -> Refusal | None:
            if not isinstance(v, str):
                return not_string
            return None if search(v) is not None else wrong_form

        return pattern
    if len(steps) == 1:  # an enum
        (passes, refusal), *_ = steps

        def one(v: object) -> Refusal | None:
            if not isinstance(v, str):
                return not_string
            return None if passes(v) else refusal

        return one
    frozen = tuple(steps)

    def many(v: object) -> Refusal | None:
        if not isinstance(v, str):
            return not_string
        for passes, refusal in frozen:
            if not passes(v):
                return refusal
        return None

    return many


def _number(node: Node) -> Check:
    integer = node.type == "integer"
    low, high = node.minimum, node.maximum
    wrong_type = _REFUSED[EXPECTED["integer" if integer else "number"]]
    too_small, too_large = _REFUSED[Problem.TOO_SMALL], _REFUSED[Problem.TOO_LARGE]

    def check(v: object) -> Refusal | None:
        # bool is an int to Python and no number to JSON; a float counts as an integer
        # when its fractional part is zero (JSON Schema: 8487.0 is 8487).
        if isinstance(v, float):
            if integer and not v.is_integer():
                return wrong_type
        elif not isinstance(v, int) or isinstance(v, bool):
            return wrong_type
        if low is not None and v < low:
            return too_small
        if high is not None and v > high:
            return too_large
        return None

    return check


__all__ = ["Check", "Refusal", "compile_node", "compile_schema"]
