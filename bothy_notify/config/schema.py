"""What the key table says about itself: the JSON schema and ``check-config --print``.

The fields of :mod:`bothy_notify.config.keys` (their types, defaults and
``_meta``) are the one table of configuration keys. Derived here:

- :func:`config_schema`: ``schemas/config.schema.json``, written by ``make
  schemas`` (``python -m bothy_notify.config.schema schemas/config.schema.json``);
  a test keeps the file equal to what this returns.
- :func:`render_effective`: the text of ``bothy-notify check-config --print``,
  the effective configuration as TOML with each value's source (file,
  environment variable, default) and every secret redacted.

The environment variable of each key (``BOTHY_NOTIFY__SECTION__KEY``) is
derived in :func:`bothy_notify.config.env.env_name`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import tomlkit

from bothy_notify.config.keys import Config
from bothy_notify.config.load import Loaded
from bothy_notify.config.values import (
    DURATION_PATTERN,
    Secret,
    format_duration,
    table_item,
    without_none,
)

SCHEMA_ID = "https://bothy.example.com/schemas/config.schema.json"
SCHEMA_DESCRIPTION = (
    "Every key of the TOML configuration (config/bothy-notify.example.toml documents"
    " each one). Durations are strings with a unit; secrets are env:NAME or"
    " secret:NAME; keys marked x-path are files or directories, relative to the"
    " configuration file's directory unless absolute."
)
REF_PATTERN = "^(env|secret):.+$"
"""What a secret with ``source_rule="ref"`` must look like in the file."""


class SchemaError(Exception):
    """A definition has a type the schema generator does not know (a programming error)."""


# ---------------------------------------------------------------- the JSON schema


def config_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of the configuration file, from the definitions."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Bothy Notify configuration",
        "description": SCHEMA_DESCRIPTION,
        **_object(Config),
    }


def schema_text() -> str:
    """:func:`config_schema` as the file holds it (two-space indents, a final newline)."""
    return json.dumps(config_schema(), indent=2) + "\n"


def _object(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        properties[f.name] = _property(f, hints[f.name], f"{cls.__name__}.{f.name}")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    node: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        node["required"] = required
    any_of = getattr(cls, "SCHEMA_REQUIRED_ANY_OF", ())
    if any_of:
        node["anyOf"] = [{"required": list(keys)} for keys in any_of]
    return node


def _property(f: dataclasses.Field[Any], t: Any, where: str) -> dict[str, Any]:
    meta = f.metadata
    node: dict[str, Any] = {"description": meta.get("doc", "")}
    node.update(_type_node(t, meta, where))
    default = _default_of(f)
    if default is not dataclasses.MISSING and not meta.get("required"):
        node["default"] = default
    return node


def _type_node(t: Any, meta: Mapping[str, Any], where: str) -> dict[str, Any]:
    t = without_none(t)
    low, high = meta.get("min"), meta.get("max")
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return _object(t)
    origin = get_origin(t)
    if origin is tuple:
        return {"type": "array", "items": _item_node(get_args(t)[0], where)}
    if origin is Mapping:
        table: dict[str, Any] = {"type": "object"}
        if meta.get("key_pattern"):
            table["propertyNames"] = {"pattern": meta["key_pattern"]}
        table["additionalProperties"] = _item_node(get_args(t)[1], where)
        return table
    node: dict[str, Any]
    if t is Secret:
        node = {"type": "string", "x-secret": True}
        if meta.get("secret") == "ref":
            node["pattern"] = REF_PATTERN
        return node
    if t is timedelta:
        node = {"type": "string", "pattern": DURATION_PATTERN}
        if low is not None:
            node["x-minimum-seconds"] = low
        if high is not None:
            node["x-maximum-seconds"] = high
        return node
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return {"type": "string", "enum": [m.value for m in t]}
    if t is bool:
        return {"type": "boolean"}
    if t in (int, float):
        node = {"type": "integer" if t is int else "number"}
        if low is not None:
            node["minimum"] = low
        if high is not None:
            node["maximum"] = high
        return node
    if t is str:
        node = {"type": "string"}
        if meta.get("path"):
            node["x-path"] = True
        return node
    raise SchemaError(f"{where}: no schema for the type {t!r}; teach config.schema._type_node")


def _item_node(t: Any, where: str) -> dict[str, Any]:
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return _object(t)
    return _type_node(t, {}, where)


def _default_of(f: dataclasses.Field[Any]) -> Any:
    """The field's default as JSON, or ``MISSING`` (none, ``None``, or a section)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    if value is None or dataclasses.is_dataclass(value):
        return dataclasses.MISSING
    return _plain(value)


def _plain(value: Any) -> Any:
    """A configuration value as TOML/JSON data: durations as text, enums as values."""
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


# ---------------------------------------------------------------- check-config --print

REDACTED = "(redacted)"
"""What ``--print`` shows for a secret given inline (its value is never printed)."""


def render_effective(loaded: Loaded) -> str:
    """The effective configuration as TOML, each value with its source in a comment.

    Sources: ``file`` (the configuration file), ``environment NAME`` (an override
    variable), ``default``. A secret shows its reference (``env:NAME``,
    ``secret:NAME``) or :data:`REDACTED`, never its value. Paths are shown
    absolute, as the daemon uses them.
    """
    lines: list[str] = []
    for table, rows in _tables(loaded.config, loaded):
        if lines:
            lines.append("")
        lines.append(table)
        width = max((len(text) for text, _ in rows), default=0)
        lines.extend(
            f"{text.ljust(width)}  # {source}" if source else text for text, source in rows
        )
    return "\n".join(lines) + "\n"


def _tables(config: Config, loaded: Loaded) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is None:  # an optional section ([matrix_gateway]) that is not given
            yield f"# [{f.name}]: not configured", []
        else:
            yield from _table(value, f.name, f.name, loaded)


def _table(
    obj: Any, header: str, path: str, loaded: Loaded, *, array: bool = False
) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    rows: list[tuple[str, str]] = []
    nested: list[tuple[Any, str, str, bool]] = []
    absent: list[str] = []
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key_path = f"{path}.{f.name}"
        inner = without_none(hints[f.name])
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            if value is None:
                absent.append(f"{header}.{f.name}")
            else:
                nested.append((value, f"{header}.{f.name}", key_path, False))
        elif table_item(inner) is not None:
            if isinstance(value, tuple):
                for i, item in enumerate(value):
                    nested.append((item, f"{header}.{f.name}", f"{key_path}[{i}]", True))
                if not value:
                    rows.append((f"{f.name} = []", loaded.source_of(key_path)))
            else:
                for k, item in value.items():
                    quoted = json.dumps(str(k))
                    nested.append((item, f"{header}.{f.name}.{quoted}", f"{key_path}.{k}", False))
                if not value:
                    rows.append((f"{f.name} = {{}}", loaded.source_of(key_path)))
        elif value is None:
            rows.append((f"# {f.name}: not set", loaded.source_of(key_path)))
        else:
            rows.append((f"{f.name} = {_shown(value)}", loaded.source_of(key_path)))
    title = f"[[{header}]]" if array else f"[{header}]"
    yield title, rows + [(f"# [{name}]: not configured", "") for name in absent]
    for item, sub_header, sub_path, is_array in nested:
        yield from _table(item, sub_header, sub_path, loaded, array=is_array)


def _shown(value: Any) -> str:
    """``value`` as a TOML value; a secret as its reference or :data:`REDACTED`."""
    if isinstance(value, Secret):
        shown = REDACTED if value.source == "literal" else value.source
        return tomlkit.item(shown).as_string()
    if isinstance(value, tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, Mapping):  # a table of plain values (notify.urgency): inline
        table = tomlkit.inline_table()
        table.update(_plain(value))
        return str(table.as_string())
    if isinstance(value, str):
        # A URL's user information may be a credential (a proxy's password).
        value = _USERINFO_RE.sub(rf"\1{REDACTED}@", value)
    return str(tomlkit.item(_plain(value)).as_string())


_USERINFO_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@]*@")


# ---------------------------------------------------------------- make schemas


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bothy_notify.config.schema [FILE]``: write the schema to FILE
    (standard output without one)."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = schema_text()
    if not args:
        sys.stdout.write(text)
        return 0
    Path(args[0]).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
