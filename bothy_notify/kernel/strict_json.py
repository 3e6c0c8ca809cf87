"""Strict JSON for what clients send: one parser for HTTP bodies and gateway frames.

Python's :func:`json.loads` lets through what other readers refuse or read
differently: ``NaN`` and ``Infinity`` (not JSON), numbers beyond a double
(``1e999`` becomes infinity), and a member named twice (one reader keeps the
first, another the last, so a checked value may not be the used one). Nesting
too deep to parse raises :class:`RecursionError`. :func:`loads` refuses all of
them with :class:`ValueError`, so callers answer one error for one problem
class and never echo the input.
"""

from __future__ import annotations

import json
import math
from typing import Any


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
            parse_float=_finite_float,
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


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number beyond a double")
    return value
