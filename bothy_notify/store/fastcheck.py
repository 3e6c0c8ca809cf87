"""A compiled yes/no check for the event schemas, in front of ``jsonschema``.

``jsonschema`` walks a schema for every payload and gathers every error (a cost
in ``bench/public_path.py``'s profile); almost every payload is valid, and a
valid one needs none of that. :func:`compile_check` turns a schema into nested
closures that answer only whether a payload is valid, with the keyword
semantics ``jsonschema`` gives them (``type`` asks the validator's own type
checker, so an integer is whatever it says; ``pattern`` is ``re.search``;
``minimum``/``maximum`` judge numbers only), plus our ``maxDecodedBytes``.
:class:`~bothy_notify.store.events.EventValidator` asks it first and runs
``jsonschema`` only for a payload it refuses, to name the field: the error
messages stay ``jsonschema``'s. A schema with a keyword this module does not
know is not compiled (``None``): its payloads go through ``jsonschema`` alone.
A test holds both to the same answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

Check = Callable[[object], bool]

ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "examples"})
"""Keywords that say nothing about validity."""


class TypeChecker(Protocol):
    """``jsonschema``'s ``TYPE_CHECKER`` of the validator class."""

    def is_type(self, instance: object, type: str) -> bool: ...


class _Unknown(Exception):
    """The schema uses a keyword this compiler does not handle."""


FAST_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
}
"""Types whose check is one ``isinstance`` (the JSON parser gives exactly these), used
when the type checker agrees on every value of :data:`_PROBES`."""
_PROBES: tuple[object, ...] = ({}, [], "", 1, 1.0, True, None)


def compile_check(schema: Mapping[str, Any], types: TypeChecker) -> Check | None:
    """A predicate equal to "``jsonschema`` finds no error" for a validator whose
    type checker is ``types``, or ``None`` when the schema uses a keyword not
    handled here."""
    try:
        return _compile(schema, types)
    except _Unknown:
        return None


def _compile(schema: Mapping[str, Any], types: TypeChecker) -> Check:
    checks: list[Check] = []
    for keyword, value in schema.items():
        if keyword in ANNOTATIONS:
            continue
        checks.append(_keyword(keyword, value, schema, types))
    if len(checks) == 1:
        return checks[0]

    def all_of(v: object) -> bool:
        return all(check(v) for check in checks)

    return all_of


def _keyword(keyword: str, value: Any, schema: Mapping[str, Any], types: TypeChecker) -> Check:
    if keyword == "type":
        names = value if isinstance(value, list) else [value]
        tests: list[Check] = []
        for name in names:
            fast = FAST_TYPES.get(name)
            if fast is not None and all(
                types.is_type(p, name) == isinstance(p, fast) for p in _PROBES
            ):
                tests.append(partial(_isinstance, kinds=fast))
            else:
                tests.append(partial(_is_type, types=types, name=name))
        return tests[0] if len(tests) == 1 else lambda v: any(t(v) for t in tests)
    if keyword == "properties":
        subs = {name: _compile(sub, types) for name, sub in value.items()}

        def properties(v: object) -> bool:
            if not isinstance(v, dict):
                return True
            return all(check(v[name]) for name, check in subs.items() if name in v)

        return properties
    if keyword == "additionalProperties":
        if value is not False or set(schema) & {"patternProperties"}:
            raise _Unknown
        allowed = frozenset(schema.get("properties", {}))
        return lambda v: not isinstance(v, dict) or all(k in allowed for k in v)
    if keyword == "required":
        wanted = tuple(value)
        return lambda v: not isinstance(v, dict) or all(n in v for n in wanted)
    if keyword == "items":
        item = _compile(value, types)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)
    if keyword == "pattern":
        search = re.compile(value).search
        return lambda v: not isinstance(v, str) or search(v) is not None
    if keyword in ("minLength", "maxLength", "minItems", "maxItems"):
        kind = str if keyword.endswith("Length") else list
        bound = int(value)
        if keyword.startswith("min"):
            return lambda v: not isinstance(v, kind) or len(v) >= bound
        return lambda v: not isinstance(v, kind) or len(v) <= bound
    if keyword in ("minimum", "maximum"):
        limit = value
        if keyword == "minimum":
            return lambda v: not types.is_type(v, "number") or not v < limit
        return lambda v: not types.is_type(v, "number") or not v > limit
    if keyword == "enum":
        if not all(isinstance(o, str) for o in value):
            raise _Unknown  # jsonschema's equality of other values is subtler
        options = frozenset(value)
        return lambda v: isinstance(v, str) and v in options
    if keyword == "maxDecodedBytes":
        return _max_decoded(int(value), schema.get("pattern"))
    raise _Unknown


def _isinstance(v: object, *, kinds: type | tuple[type, ...]) -> bool:
    return isinstance(v, kinds)


def _is_type(v: object, *, types: TypeChecker, name: str) -> bool:
    return types.is_type(v, name)


def _max_decoded(limit: int, pattern: str | None) -> Check:
    """``maxDecodedBytes`` as :func:`bothy_notify.store.events._max_decoded_bytes`
    reads it: judged only for strings of the form ``pattern`` allows."""
    search = re.compile(pattern).search if pattern is not None else None

    def check(v: object) -> bool:
        if not isinstance(v, str):
            return True
        if search is not None and search(v) is None:
            return True
        decoded = len(v) // 4 * 3 - (len(v) - len(v.rstrip("=")))
        return decoded <= limit

    return check
