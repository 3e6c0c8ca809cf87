"""Strict JSON for what clients send: one parser for HTTP bodies and gateway frames.

Python's :func:`json.loads` lets through what other readers refuse or read
differently: ``NaN`` and ``Infinity`` (not JSON), numbers beyond a double
(``1e999`` becomes infinity), and a member named twice (one reader keeps the
first, another the last, so a checked value may not be the used one). Nesting
too deep to parse raises :class:`RecursionError`. :func:`loads` refuses all of
them with :class:`ValueError`, so callers answer one error for one problem
class and never echo the input.

Numbers: JSON has one number type, and JSON Schema counts a number whose
fractional part is zero as an integer (``8487.0`` is the integer 8487). So
:func:`loads` reads such a number as a Python ``int``: every check that asks
for an integer (``type(x) is int``, a schema's ``"type": "integer"``) accepts
it, and what is stored or echoed is the integer (``8487``, never ``8487.0``).
A number with a fractional part (``8487.5``) stays a ``float``, which no
integer check accepts. The integer is exact for any number written with a zero
fraction (``9007199254740993.0`` is 9007199254740993); a fraction finer than a
double resolves (``1.0000000000000001``) is read as a double reads it.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

_EXACT_BELOW = 2**53
"""Below this magnitude a double holds every integer, so a double that is integral
is the integer the text wrote."""


def loads(text: str | bytes | bytearray) -> Any:
    """``text`` as strict JSON.

    Raises:
        ValueError: not strict JSON (also for invalid UTF-8 in bytes, and
            nesting too deep to parse).
    """
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_members,
            parse_constant=_refuse_constant,
            parse_float=_number,
        )
    except RecursionError:
        raise ValueError("nesting too deep") from None


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise ValueError("a member is named twice")
    return members


def _refuse_constant(name: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


def _number(text: str) -> float | int:
    """A JSON number with a fraction or an exponent: an ``int`` when it is integral."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number beyond a double")
    if not value.is_integer():
        return value
    if abs(value) < _EXACT_BELOW:
        return int(value)
    exact = Decimal(text)
    return int(exact) if exact == exact.to_integral_value() else int(value)
