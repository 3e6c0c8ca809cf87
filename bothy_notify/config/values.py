"""What a key's value can be, and what a key says about itself.

- :class:`ConfigError`: the configuration cannot be used (the one error of the
  package; its message names the key, never a secret).
- :class:`Secret`: a secret value with where it came from (``env:NAME``,
  ``secret:NAME``, ``literal``); its repr never shows the value.
- Durations: :func:`parse_duration`, :func:`format_duration` and
  :data:`DURATION_PATTERN` (``"250ms"``, ``"2s"``, ``"5m"``, ``"1h"``, ``"30d"``).
- :func:`_meta`: a field's metadata, the key table's columns beside the field's
  name, type and default.
- The type helpers the loader, the overrides and the schema share
  (:func:`table_item`, :func:`without_none`, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, get_args, get_origin


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key, never a secret."""


class Secret:
    """A secret value with where it came from; its repr never shows the value.

    ``source`` is ``env:NAME``, ``secret:NAME`` or ``literal``. A ``secret:``
    reference holds no value until :func:`resolve_store_secrets` runs.
    """

    __slots__ = ("_value", "source")

    def __init__(self, source: str, value: str | None) -> None:
        self.source = source
        self._value = value

    @property
    def is_resolved(self) -> bool:
        return self._value is not None

    @property
    def store_name(self) -> str | None:
        """The secret store name of a ``secret:NAME`` reference, else ``None``."""
        return self.source[len("secret:") :] if self.source.startswith("secret:") else None

    def reveal(self) -> str:
        """The value. Raises :class:`ConfigError` for an unresolved reference."""
        if self._value is None:
            raise ConfigError(f"secret {self.source} was not resolved")
        return self._value

    def __repr__(self) -> str:
        shown = self.source if self.source != "literal" else "literal"
        return f"Secret({shown}, ***)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Secret)
            and self.source == other.source
            and self._value == other._value
        )

    def __hash__(self) -> int:
        return hash(self.source)


# ---------------------------------------------------------------- durations

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)\s*$"
"""What :func:`parse_duration` accepts, as the JSON schema's ``pattern``."""
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def parse_duration(text: str) -> timedelta:
    """Parse ``"250ms"``, ``"2s"``, ``"5m"``, ``"1h"``, ``"30d"``; raise ValueError otherwise."""
    match = _DURATION_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError('expected a duration with a unit, like "250ms", "2s", "5m", "1h"')
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def format_duration(delta: timedelta) -> str:
    """The shortest exact unit form of ``delta`` (inverse of :func:`parse_duration`)."""
    ms = round(delta.total_seconds() * 1000)
    for unit, factor in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"


def _meta(
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    source_rule: str = "",
    path: bool = False,
    required: bool = False,
    key_pattern: str | None = None,
    inherits: bool = False,
    defaults_to_app_id: bool = False,
) -> dict[str, Any]:
    """Field metadata: a one-line description, numeric range, secret policy, path.

    - ``min``/``max``: the range of a number, or of a duration in seconds.
    - ``source_rule``: ``"ref"`` (env:/secret: only), ``"ref_or_literal"`` or
      ``"env_or_literal"``, for a :class:`Secret`.
    - ``path``: a file or directory (made absolute at load, relative to the
      configuration file; an empty value stays empty).
    - ``required``: the key must be given and not empty. In a block whose
      ``inherits`` table has entries (a provider block with ``apps``) it is
      required of each entry instead (given in the block or in the entry); the
      schema leaves its default out.
    - ``key_pattern``: the form of the keys of a table (``propertyNames`` in the
      schema, checked at load).
    - ``inherits``: a table of entries (``Mapping[str, X]``, ``X`` the holding
      block's base) each laid over the keys of the block that holds it at load, so
      an entry is checked, shown and used as a whole block.
    - ``defaults_to_app_id``: in such an entry, the key defaults to the entry's own
      key (its app id) when neither the entry nor the block gives it.
    """
    return {
        "doc": doc,
        "min": min,
        "max": max,
        "secret": source_rule,
        "path": path,
        "required": required,
        "key_pattern": key_pattern,
        "inherits": inherits,
        "defaults_to_app_id": defaults_to_app_id,
    }


def _d(text: str) -> timedelta:
    return parse_duration(text)


# ---------------------------------------------------------------- types of keys


@functools.cache
def fields_of(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The fields of the dataclass ``cls`` by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def is_dataclass_type(t: Any) -> bool:
    """Whether ``t`` is a dataclass (the class, not an instance)."""
    return isinstance(t, type) and dataclasses.is_dataclass(t)


def table_item(t: Any) -> Any:
    """The dataclass of an array of tables or of a table of named entries, else ``None``."""
    origin = get_origin(t)
    args = get_args(t)
    item = args[0] if origin is tuple else args[1] if origin is Mapping else None
    return item if is_dataclass_type(item) else None


def without_none(t: Any) -> Any:
    """``X`` of ``X | None``; any other type as it is."""
    args = [a for a in get_args(t) if a is not type(None)]
    return args[0] if len(args) == 1 and len(get_args(t)) == 2 else t


def dataclass_in(t: Any) -> type | None:
    """The dataclass ``t`` is or holds (``X | None``, ``tuple[X, ...]``, ``Mapping[str, X]``)."""
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return t
    for arg in get_args(t):
        found = dataclass_in(arg) if arg is not type(None) else None
        if found is not None:
            return found
    return None
