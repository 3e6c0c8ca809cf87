"""Environment overrides: ``BOTHY_NOTIFY__<SECTION>__<KEY>`` sets a key over the file.

The variable is the key's path in capitals, joined by two underscores
(``BOTHY_NOTIFY__PUSH__APNS__KEY_ID``, see :func:`env_name`), typed by the
key's field: integers, ``true``/``false``, durations and enum values as in the
file, lists comma-separated or as a TOML array; a variable naming a table (a
section, a provider block, ``notify.kinds``) takes a TOML inline table merged
into the file's; one naming an array of tables takes a TOML inline array that
replaces the file's, and ``..._KEYS__<N>__<FIELD>`` sets one field of entry N
(N up to the number of entries: one past the last adds an entry). A secret
given as the variable's own value becomes ``env:<THAT VARIABLE>``. Errors name
the variable (and the key), never its value; a variable that names no key is
an error.

:func:`apply_env` works on the raw (TOML) data before it is structured, so the
loader checks an overridden value exactly as a value of the file, and notes
where each value came from (:data:`FILE` or the variable's name).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args, get_origin, get_type_hints

import tomlkit
from tomlkit.exceptions import ParseError

from bothy_notify.config.keys import Config
from bothy_notify.config.values import (
    Secret,
    fields_of,
    is_dataclass_type,
    table_item,
    without_none,
)

ENV_PREFIX = "BOTHY_NOTIFY__"
"""Variables that set a key: ``BOTHY_NOTIFY__<SECTION>__<KEY>`` (see the module docstring)."""
FILE = "file"
"""The origin of a value read from the configuration file (``Loaded.origins``)."""


def env_name(key: str) -> str:
    """The variable that sets ``key``: ``push.apns.key_id`` is
    ``BOTHY_NOTIFY__PUSH__APNS__KEY_ID``, ``auth.keys[0].kid`` is
    ``BOTHY_NOTIFY__AUTH__KEYS__0__KID`` (``auth.keys[].kid``: ``...__<N>__KID``)."""
    dotted = key.replace("[]", ".<N>").replace("[", ".").replace("]", "")
    return ENV_PREFIX + "__".join(part.upper() for part in dotted.split("."))


class _EnvError(Exception):
    """An override variable cannot be used; the message never holds its value."""


@dataclass(frozen=True, slots=True)
class FromEnv:
    """A secret given as the override variable's own value: it becomes ``env:NAME``."""

    name: str
    value: str = dataclasses.field(repr=False)


_Part = str | int
"""One step of a key path: a key, or an index into an array of tables."""


def apply_env(raw: dict[str, Any], env: Mapping[str, str], origins: dict[str, str]) -> list[str]:
    """Apply every ``BOTHY_NOTIFY__*`` variable of ``env`` to ``raw`` (in place) and
    note each value's origin; the errors, naming the variable.

    Whole tables go first, then deeper keys, array indexes in numeric order, so
    ``..._KEYS__0__...`` exists before ``..._KEYS__1__...`` is added.
    """
    errors: list[str] = []
    planned: list[tuple[list[_Part], Any, str, bool]] = []
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        try:
            parts, t = _resolve_env(name)
            planned.append((parts, _env_value(text, t, name), name, _replaces(t)))
        except _EnvError as exc:
            errors.append(f"{name}: {exc}")
    planned.sort(
        key=lambda p: (len(p[0]), [(0, x, "") if isinstance(x, int) else (1, 0, x) for x in p[0]])
    )
    for parts, value, name, replaces in planned:
        try:
            _put(raw, parts, value, replaces)
        except _EnvError as exc:
            errors.append(f"{name}: {exc}")
            continue
        key = _key_text(parts)
        # What this variable's value stands for now: the whole key when it replaces,
        # each of its entries when it is merged into a table.
        if not replaces and isinstance(value, dict):
            covered = [_key_text([*parts, k]) for k in value]
        else:
            covered = [key]
        for prefix in covered:
            for old in [
                k for k in origins if k == prefix or k.startswith((prefix + ".", prefix + "["))
            ]:
                del origins[old]
        for leaf in leaves(value, key):
            origins[leaf] = name
    return errors


def _resolve_env(name: str) -> tuple[list[_Part], Any]:
    """The key path a variable names and the type of its value."""
    t: Any = Config
    parts: list[_Part] = []
    segments = name[len(ENV_PREFIX) :].split("__")
    if not all(segments):
        raise _EnvError("expected BOTHY_NOTIFY__<SECTION>__<KEY> (keys joined by two underscores)")
    for segment in segments:
        here = _key_text(parts)
        if is_dataclass_type(t):
            f = fields_of(t).get(segment.lower())
            if f is None:
                shown = f"{here}.{segment.lower()}" if here else segment.lower()
                raise _EnvError(f"names no configuration key ({shown})")
            parts.append(f.name)
            t = without_none(get_type_hints(t)[f.name])
        elif table_item(t) is not None and get_origin(t) is tuple:
            if not segment.isdigit():
                raise _EnvError(
                    f"{here} is an array of tables: expected an index,"
                    f" as in {env_name(here)}__0__..."
                )
            parts.append(int(segment))
            t = table_item(t)
        elif get_origin(t) is Mapping:
            raise _EnvError(
                f"{here} is a table of named entries: give it whole, as a TOML inline table"
                f" in {env_name(here)}"
            )
        else:
            raise _EnvError(f"names no configuration key ({here} has no keys)")
    return parts, t


def _env_value(text: str, t: Any, name: str) -> Any:
    """The variable's text as the file would give it, typed by the key's type."""
    if is_dataclass_type(t) or get_origin(t) is Mapping or table_item(t) is not None:
        value = _inline_toml(text)
        if isinstance(value, list) != (get_origin(t) is tuple) or not isinstance(
            value, list | dict
        ):
            shape = "an array of tables ([{...}, ...])" if get_origin(t) is tuple else "a table"
            raise _EnvError(f"expected {shape} as a TOML inline value")
        return _secrets_from_env(value, t, name)
    if get_origin(t) is tuple:
        if text.lstrip().startswith("["):
            return _inline_toml(text)
        item: Any = get_args(t)[0]
        return (
            [_env_scalar(part.strip(), item, name) for part in text.split(",")]
            if text.strip()
            else []
        )
    return _env_scalar(text, t, name)


def _env_scalar(text: str, t: Any, name: str) -> Any:
    if t is bool:
        word = text.strip().lower()
        if word not in ("true", "false"):
            raise _EnvError("expected true or false")
        return word == "true"
    if t is int:
        if not re.fullmatch(r"[+-]?\d+(_\d+)*", text.strip()):
            raise _EnvError("expected an integer")
        return int(text.strip().replace("_", ""))
    if t is float:
        try:
            number = float(text.strip().replace("_", ""))
        except ValueError:
            raise _EnvError("expected a number") from None
        if not math.isfinite(number):
            raise _EnvError("expected a number")
        return number
    if t is Secret and not text.startswith(("env:", "secret:")):
        return FromEnv(name, text)
    return text  # strings, enums, durations: checked as in the file


def _inline_toml(text: str) -> Any:
    try:
        document = tomlkit.parse(f"value = {text}").unwrap()
    except ParseError:
        raise _EnvError("expected a TOML inline value ({...} or [...])") from None
    if list(document) != ["value"]:
        raise _EnvError("expected one TOML inline value ({...} or [...])")
    return document["value"]


def _secrets_from_env(value: Any, t: Any, name: str) -> Any:
    """Inside a whole table given in a variable, inline secrets count as that variable's."""
    t = without_none(t)
    item = table_item(t)
    if item is not None and isinstance(value, list):
        return [_secrets_from_env(v, item, name) for v in value]
    if item is not None and isinstance(value, dict):
        return {k: _secrets_from_env(v, item, name) for k, v in value.items()}
    if is_dataclass_type(t) and isinstance(value, dict):
        hints = get_type_hints(t)
        return {
            k: _secrets_from_env(v, hints[k], name) if k in hints else v for k, v in value.items()
        }
    if t is Secret and isinstance(value, str) and not value.startswith(("env:", "secret:")):
        return FromEnv(name, value)
    return value


def _put(raw: dict[str, Any], parts: list[_Part], value: Any, replaces: bool) -> None:
    node: Any = raw
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        want: type = list if not last and isinstance(parts[i + 1], int) else dict
        if isinstance(part, int):
            if part > len(node):
                raise _EnvError(
                    f"index {part} leaves a gap: {_key_text(parts[:i])} has {len(node)}"
                    f" entries, so the next index is {len(node)}"
                )
            if part == len(node):
                node.append({})
            if last and isinstance(value, dict) and isinstance(node[part], dict):
                node[part].update(value)
            elif last:
                node[part] = value
            node = node[part]
            continue
        if last:
            if not replaces and isinstance(value, dict) and isinstance(node.get(part), dict):
                node[part].update(value)
            else:
                node[part] = value
            return
        child = node.get(part)
        if child is None:
            child = node[part] = want()
        elif not isinstance(child, want):
            raise _EnvError(
                f"the file's {_key_text(parts[: i + 1])} is not a"
                f" {'array' if want is list else 'table'}"
            )
        node = child


def _replaces(t: Any) -> bool:
    """Whether a variable naming a key of type ``t`` replaces the file's value
    (scalars and arrays) rather than being merged into it (tables)."""
    return not (is_dataclass_type(t) or get_origin(t) is Mapping)


def _key_text(parts: list[_Part]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def leaves(value: Any, prefix: str) -> list[str]:
    """Key paths of every value in a raw (TOML) value: tables by key, arrays of
    tables by index; an empty table or array, and any other value, is one leaf."""
    if isinstance(value, dict) and value:
        out: list[str] = []
        for k, v in value.items():
            out += leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{prefix}[{i}]")]
    return [prefix] if prefix else []
