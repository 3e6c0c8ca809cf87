"""The loader: TOML text to a checked :class:`~bothy_notify.config.keys.Config`.

One path for a file, a text and a dict (:func:`load`, :func:`load_config`,
:func:`load_config_text`, :func:`structure_config`):

1. parse the TOML (tomlkit) into plain data;
2. apply the ``BOTHY_NOTIFY__*`` variables over it
   (:func:`~bothy_notify.config.env.apply_env`), noting where each value came
   from;
3. lay each entry of an ``inherits`` table (a provider block's ``apps``) over
   the keys of its block;
4. structure it with cattrs, strictly (no extra key, no coercion): each key's
   type is its field's;
5. check what the key table says of each key (``min``/``max``, ``required``,
   ``key_pattern``, the secret policy) and the rules between keys (an auth key's
   algorithm, the categories, the cluster's timing, listen addresses);
6. make every ``path`` key absolute and turn ``database.url = ""`` into the
   embedded server.

Every error names its key (or the variable that set it), never a value, and
all of them are reported at once in one :class:`ConfigError`. A provider's
settings are checked beyond that by the provider's own ``prepare``
(``check-config``, the daemon's start, ``push test``).

Paths (fields marked ``path=True``: ``database.data_dir``, ``notify.kinds_dir``,
``push.fake.record_file``, every ``ca_file``) are made absolute at load: a
relative one is relative to the directory of the configuration file, never to
the working directory (``~`` is expanded). An empty ``database.data_dir`` is the
per-user data directory (:func:`default_data_dir`). ``database.url = ""`` is
the same as no ``url``: the embedded server. The rest of the code therefore sees
absolute paths and ``database.url is None`` exactly when the server is embedded.

Secrets given as ``env:NAME`` are resolved at load, ``secret:NAME`` from the
secret store at start (:func:`resolve_store_secrets`).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import cattrs
import tomlkit
from cattrs.errors import IterableValidationError, IterableValidationNote
from tomlkit.exceptions import ParseError

from bothy_notify.config.env import FILE, FromEnv, apply_env, env_name, leaves
from bothy_notify.config.keys import Config, JwtAlgorithm
from bothy_notify.config.values import (
    ConfigError,
    Secret,
    format_duration,
    is_dataclass_type,
    parse_duration,
    table_item,
    without_none,
)
from bothy_notify.vocabulary import BUILTIN_CATEGORIES, CATEGORY_PATTERN

# ---------------------------------------------------------------- structuring


def _strict(kind: type, label: str) -> Callable[[Any, type], Any]:
    def hook(value: Any, _t: type) -> Any:
        if type(value) is not kind and not (kind is float and type(value) is int):
            raise TypeError(f"expected {label}")
        return value

    return hook


def _origin(t: Any) -> Any:
    return get_origin(t)


def _make_converter(env: Mapping[str, str]) -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(int, _strict(int, "an integer"))
    conv.register_structure_hook(float, _strict(float, "a number"))
    conv.register_structure_hook(bool, _strict(bool, "true or false"))
    conv.register_structure_hook(str, _strict(str, "a string"))

    def duration(value: Any, _t: type) -> timedelta:
        if not isinstance(value, str):
            raise TypeError('expected a duration string with a unit, like "2s"')
        return parse_duration(value)

    conv.register_structure_hook(timedelta, duration)

    def secret(value: Any, _t: type) -> Secret:
        if isinstance(value, FromEnv):  # the override variable is the reference
            return Secret(f"env:{value.name}", value.value)
        if not isinstance(value, str):
            raise TypeError("expected a string (env:NAME, secret:NAME)")
        if value.startswith("env:"):
            name = value[4:]
            if not name:
                raise ValueError("env: needs a variable name")
            if name not in env:
                raise ValueError(f"environment variable {name} is not set")
            return Secret(value, env[name])
        if value.startswith("secret:"):
            if not value[7:]:
                raise ValueError("secret: needs a name")
            return Secret(value, None)
        return Secret("literal", value)

    conv.register_structure_hook(Secret, secret)

    def enum_hook(value: Any, t: type[enum.Enum]) -> enum.Enum:
        allowed = ", ".join(str(m.value) for m in t)
        try:
            return t(value)
        except ValueError:
            raise ValueError(f"expected one of: {allowed}") from None

    # Every enum of a field (by class: StrEnum before str in the method order), so a
    # new key's enum needs no line here.
    for enum_base in (enum.StrEnum, enum.Enum):
        conv.register_structure_hook(enum_base, enum_hook)

    def tuple_hook(value: Any, t: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise TypeError("expected an array")
        item_type: Any = get_args(t)[0]
        return tuple(conv.structure(list(value), list[item_type]))

    conv.register_structure_hook_func(
        lambda t: _origin(t) is tuple and len(get_args(t)) == 2 and get_args(t)[1] is ...,
        tuple_hook,
    )

    def mapping_hook(value: Any, t: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError("expected a table")
        _k, v_type = get_args(t)
        out: dict[str, Any] = {}
        errors: list[Exception] = []
        for k, v in value.items():
            try:
                out[str(k)] = conv.structure(v, v_type)
            except Exception as exc:  # each value's error keeps its key in the path
                note = IterableValidationNote(f"Structuring mapping value @ key {k!r}", k, v_type)
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]
                errors.append(exc)
        if errors:
            raise IterableValidationError("While structuring a table", errors, t)
        return out

    conv.register_structure_hook_func(lambda t: _origin(t) is Mapping, mapping_hook)
    return conv


def _format_cattrs_error(exc: BaseException) -> list[str]:
    messages: list[str] = []

    def fmt(err: BaseException, _t: Any) -> str:
        if isinstance(err, cattrs.ForbiddenExtraKeysError):
            return "unknown key(s): " + ", ".join(sorted(err.extra_fields))
        if isinstance(err, KeyError):
            return "required key is missing"
        return str(err) or type(err).__name__

    for line in cattrs.transform_error(exc, format_exception=fmt):
        message, _, path = line.rpartition(" @ ")
        key = path.removeprefix("$").lstrip(".")
        key = re.sub(r"\[(\d+)\]", r"[\1]", key)
        key = re.sub(r"\['([^']*)'\]", r".\1", key)  # a table's key: push.apns.apps.beta
        if message.startswith("unknown key(s): "):
            names = message.removeprefix("unknown key(s): ").split(", ")
            for name in names:
                messages.append(f"{key + '.' if key else ''}{name}: unknown key")
        else:
            messages.append(f"{key or '(top level)'}: {message}")
    return messages


def _walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    """Yield (key path, field, value) for every field of nested config dataclasses."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        yield path, f, value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _walk(value, path + ".")
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    yield from _walk(item, f"{path}[{i}].")
        elif isinstance(value, Mapping):
            for k, item in value.items():
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    yield from _walk(item, f"{path}.{k}.")


def _tables(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (key prefix, table) for ``obj`` and every table nested in it: sections,
    blocks, entries of arrays of tables and of tables of named entries."""
    yield prefix, obj
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _tables(value, path + ".")
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    yield from _tables(item, f"{path}[{i}].")
        elif isinstance(value, Mapping):
            for k, item in value.items():
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    yield from _tables(item, f"{path}.{k}.")


def _check_table(table: Any, prefix: str) -> list[str]:
    """What the key table says of one table's keys: ``required`` keys are given
    (by each entry of its ``inherits`` table instead, when that has entries) and
    the keys of a table follow its ``key_pattern``."""
    errors: list[str] = []
    fields = dataclasses.fields(table)
    carried = any(f.metadata.get("inherits") and getattr(table, f.name) for f in fields)
    for f in fields:
        value = getattr(table, f.name)
        missing = value is None or value == "" or (isinstance(value, Mapping) and not value)
        if f.metadata.get("required") and not carried and missing:
            errors.append(f"{prefix}{f.name}: required key is missing")
        pattern = f.metadata.get("key_pattern")
        if (
            pattern
            and isinstance(value, Mapping)
            and not all(re.fullmatch(pattern, str(k)) for k in value)
        ):
            errors.append(f"{prefix}{f.name}: each key must match {pattern}")
    return errors


def _check(config: Config) -> list[str]:
    errors: list[str] = []
    for path, f, value in _walk(config):
        low, high = f.metadata.get("min"), f.metadata.get("max")
        number: float | None = None
        if isinstance(value, timedelta):
            number = value.total_seconds()
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = value
        if number is not None:
            if low is not None and number < low:
                errors.append(f"{path}: must be at least {_bound(value, low)}")
            if high is not None and number > high:
                errors.append(f"{path}: must be at most {_bound(value, high)}")
        policy = f.metadata.get("secret", "")
        if isinstance(value, Secret):
            if policy == "ref" and value.source == "literal":
                errors.append(f"{path}: give the value as env:NAME or secret:NAME, not inline")
            if policy == "env_or_literal" and value.store_name is not None:
                errors.append(f"{path}: secret: cannot be used here (the store needs it); use env:")
    for prefix, table in _tables(config):
        errors += _check_table(table, prefix)
    for i, key in enumerate(config.auth.keys):
        if key.algorithm not in config.auth.algorithms:
            errors.append(f"auth.keys[{i}].algorithm: not in auth.algorithms")
        if (
            key.algorithm is JwtAlgorithm.HS256
            and key.key.source == "literal"
            and not config.server.dev
        ):
            errors.append(
                f"auth.keys[{i}].key: an HS256 secret must be env:NAME or secret:NAME "
                "outside dev mode"
            )
    for name in config.notify.categories:
        if name in BUILTIN_CATEGORIES or not re.fullmatch(CATEGORY_PATTERN, name):
            errors.append(f"notify.categories: {name!r} is built in or not a lowercase name")
    if config.cluster.node_timeout < 2 * config.server.heartbeat:
        # One late heartbeat must not make a node look gone.
        errors.append("cluster.node_timeout: must be at least twice server.heartbeat")
    if config.matrix_gateway is not None and config.jobs.retention < config.push.max_age:
        # A homeserver's retry of a notification is recognised by its job, kept this long.
        errors.append(
            "jobs.retention: must be at least push.max_age while [matrix_gateway] is configured"
        )
    for address_key in ("api_listen", "gateway_listen"):
        if parse_listen(getattr(config.server, address_key)) is None:
            errors.append(f"server.{address_key}: expected host:port")
    return errors


def _inherited(raw: Any, cls: type) -> Any:
    """``raw`` (the plain data of the table ``cls``) with each entry of an
    ``inherits`` table laid over the keys of the table that holds it (a key marked
    ``defaults_to_app_id`` defaulting to the entry's own key), so that every entry
    is structured and checked as a whole block, its errors named under its own
    key (``push.apns.apps.beta.key_id``)."""
    if not isinstance(raw, Mapping):
        return raw
    out = dict(raw)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = raw.get(f.name)
        t = without_none(hints[f.name])
        if f.metadata.get("inherits") and isinstance(value, Mapping):
            base = {k: v for k, v in raw.items() if k != f.name}
            item = table_item(t)
            own_key = [
                g.name for g in dataclasses.fields(item) if g.metadata.get("defaults_to_app_id")
            ]
            entries: dict[str, Any] = {}
            for entry_key, table in value.items():
                if isinstance(table, Mapping):
                    entry = {**base, **table}
                    for name in own_key:
                        entry.setdefault(name, str(entry_key))
                    entries[str(entry_key)] = entry
                else:
                    entries[str(entry_key)] = table  # structuring names the wrong type
            out[f.name] = entries
        elif is_dataclass_type(t) and isinstance(value, Mapping):
            out[f.name] = _inherited(value, t)
    return out


def _bound(value: object, limit: float) -> str:
    if isinstance(value, timedelta):
        return format_duration(timedelta(seconds=limit))
    return str(int(limit)) if float(limit).is_integer() else str(limit)


def parse_listen(text: str) -> tuple[str, int] | None:
    """Split ``host:port`` (IPv6 in brackets); ``None`` when malformed."""
    match = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d{1,5})", text)
    if match is None or int(match.group(2)) > 65_535:
        return None
    return match.group(1), int(match.group(2))


def load_config_text(
    text: str, *, env: Mapping[str, str] | None = None, base_dir: str | Path | None = None
) -> Config:
    """Parse and check a TOML text; raise :class:`ConfigError` naming each bad key.

    ``base_dir`` is the directory relative paths start at (the configuration
    file's); without it a relative path is refused. The ``BOTHY_NOTIFY__*``
    variables of ``env`` (default: the process's environment) override the text.
    """
    return _configure(_parse(text), os.environ if env is None else env, base_dir)[0]


def _parse(text: str) -> dict[str, Any]:
    try:
        raw: dict[str, Any] = tomlkit.parse(text).unwrap()
    except ParseError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    return raw


def structure_config(
    raw: Mapping[str, Any], *, env: Mapping[str, str], base_dir: str | Path | None = None
) -> Config:
    """Structure a plain dict into :class:`Config`, with the ``BOTHY_NOTIFY__*``
    variables of ``env`` applied over it, check ranges and policies, and make
    every path absolute (relative ones start at ``base_dir``; without it a
    relative path is refused, since the working directory is never a base)."""
    return _configure(raw, env, base_dir)[0]


def _configure(
    raw: Mapping[str, Any], env: Mapping[str, str], base_dir: str | Path | None
) -> tuple[Config, dict[str, str]]:
    """:func:`structure_config` that also returns where each value came from
    (:attr:`Loaded.origins`)."""
    merged = copy.deepcopy(dict(raw))
    origins = dict.fromkeys(leaves(merged, ""), FILE)
    env_errors = apply_env(merged, env, origins)
    if env_errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(env_errors))
    conv = _make_converter(env)
    try:
        config = conv.structure(dict(_inherited(merged, Config)), Config)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            errors = _format_cattrs_error(exc)
        else:
            errors = [str(exc)]
        raise ConfigError(_invalid(errors, origins)) from None
    errors = _check(config)
    config, database_errors = _embedded_when_empty(config)
    errors += database_errors
    config = _absolute_paths(config, None if base_dir is None else Path(base_dir), errors)
    if errors:
        raise ConfigError(_invalid(errors, origins))
    return config, origins


def _invalid(errors: list[str], origins: Mapping[str, str]) -> str:
    """The error message; a key whose value came from an override variable is
    named by the variable (and the key)."""
    lines = []
    for error in errors:
        key, sep, message = error.partition(": ")
        origin = origins.get(key)
        if sep and origin is not None and origin != FILE:
            lines.append(f"{origin} ({key}): {message}")
        elif message == "required key is missing" and _set_from_env(
            key.rpartition(".")[0], origins
        ):
            lines.append(f"{error} (the table came from the environment: set {env_name(key)})")
        else:
            lines.append(error)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _set_from_env(table: str, origins: Mapping[str, str]) -> bool:
    """Whether an override variable set anything in ``table``."""
    return any(
        origin != FILE and key.startswith((table + ".", table + "["))
        for key, origin in origins.items()
    )


def load_config(path: str | Path | None, *, env: Mapping[str, str] | None = None) -> Config:
    """Load the TOML file at ``path`` (``None``: all defaults), with the
    ``BOTHY_NOTIFY__*`` variables of ``env`` (default: the process's environment)
    applied over it.

    Relative paths in the file start at the file's own directory.
    """
    return load(path, env=env).config


def load(path: str | Path | None, *, env: Mapping[str, str] | None = None) -> Loaded:
    """:func:`load_config`, with where each value came from (``check-config --print``)."""
    environ = os.environ if env is None else env
    if path is None:
        config, origins = _configure({}, environ, None)
        return Loaded(config, None, origins)
    file = Path(path).expanduser().absolute()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file: {exc.strerror}") from None
    config, origins = _configure(_parse(text), environ, file.parent)
    return Loaded(config, file, origins)


@dataclass(frozen=True)
class Loaded:
    """A loaded configuration and where each of its values came from.

    Attributes:
        config: the configuration.
        file: the configuration file, absolute (``None``: none, all defaults).
        origins: by key path (``server.role``, ``auth.keys[0].kid``,
            ``notify.kinds.CODE.category``), every value that is not a default:
            :data:`FILE`, or the name of the variable that set it.
    """

    config: Config
    file: Path | None
    origins: Mapping[str, str]

    def source_of(self, key: str) -> str:
        """``file``, ``environment NAME`` or ``default``: where ``key``'s value came from."""
        origin = self.origins.get(key)
        if origin is None:
            return "default"
        return FILE if origin == FILE else f"environment {origin}"


def default_data_dir() -> str:
    """The embedded server's data directory when ``database.data_dir`` is empty.

    ``postgres`` in the per-user data directory of ``bothy-notify``
    (platformdirs): ``$XDG_DATA_HOME/bothy-notify/postgres``, by default
    ``~/.local/share/bothy-notify/postgres`` on Linux, and
    ``~/Library/Application Support/bothy-notify/postgres`` on macOS.
    """
    import platformdirs  # only here: only an embedded server needs it

    return str(platformdirs.user_data_path("bothy-notify", appauthor=False) / "postgres")


def _embedded_when_empty(config: Config) -> tuple[Config, list[str]]:
    """``database.url = ""`` means the embedded server, exactly like no ``url``.

    An ``env:NAME`` that names an empty variable is refused rather than taken as
    "embedded": a deployment whose database variable went missing must not start
    on a fresh, empty embedded database.
    """
    url = config.database.url
    if url is None or url.store_name is not None or url.reveal() != "":
        return config, []
    if url.source != "literal":
        return config, [
            f"database.url: {url.source} is empty; "
            'write url = "" (or leave it out) for the embedded server'
        ]
    return dataclasses.replace(config, database=dataclasses.replace(config.database, url=None)), []


def _absolute_paths(config: Config, base_dir: Path | None, errors: list[str]) -> Config:
    """``config`` with every ``path`` field absolute (see the module docstring)."""

    def absolute(path: str, value: str) -> str:
        candidate = Path(value).expanduser()
        if candidate.is_absolute():
            return os.path.normpath(candidate)
        if base_dir is None:
            errors.append(
                f"{path}: a relative path needs a configuration file to start from;"
                " give an absolute path"
            )
            return value
        return os.path.normpath(base_dir.absolute() / candidate)

    def walk(obj: Any, prefix: str) -> Any:
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            path = f"{prefix}{f.name}"
            if f.metadata.get("path") and isinstance(value, str) and value:
                changes[f.name] = absolute(path, value)
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                changes[f.name] = walk(value, path + ".")
            elif isinstance(value, tuple) and any(dataclasses.is_dataclass(v) for v in value):
                changes[f.name] = tuple(walk(v, f"{path}[{i}].") for i, v in enumerate(value))
            elif isinstance(value, Mapping) and any(
                dataclasses.is_dataclass(v) for v in value.values()
            ):
                changes[f.name] = {k: walk(v, f"{path}.{k}.") for k, v in value.items()}
        return dataclasses.replace(obj, **changes) if changes else obj

    resolved = walk(config, "")
    if not resolved.database.data_dir:
        resolved = dataclasses.replace(
            resolved, database=dataclasses.replace(resolved.database, data_dir=default_data_dir())
        )
    assert isinstance(resolved, Config)
    return resolved


def resolve_store_secrets(config: Config, lookup: Callable[[str], str | None]) -> Config:
    """Return ``config`` with every ``secret:NAME`` resolved through ``lookup``.

    Raises :class:`ConfigError` naming the key (and the secret's name, never a
    value) when the store has no such secret.
    """
    errors: list[str] = []

    def resolve(obj: Any, prefix: str) -> Any:
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            path = f"{prefix}{f.name}"
            if isinstance(value, Secret) and value.store_name is not None and not value.is_resolved:
                found = lookup(value.store_name)
                if found is None:
                    errors.append(f"{path}: secret {value.store_name!r} is not in the secret store")
                else:
                    changes[f.name] = Secret(value.source, found)
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                changes[f.name] = resolve(value, path + ".")
            elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
                changes[f.name] = tuple(
                    resolve(item, f"{path}[{i}].") for i, item in enumerate(value)
                )
            elif isinstance(value, Mapping) and any(
                dataclasses.is_dataclass(v) for v in value.values()
            ):
                changes[f.name] = {k: resolve(v, f"{path}.{k}.") for k, v in value.items()}
        return dataclasses.replace(obj, **changes) if changes else obj

    resolved = resolve(config, "")
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    assert isinstance(resolved, Config)
    return resolved


def changed_keys(old: Config, new: Config) -> list[str]:
    """Key paths whose values differ between ``old`` and ``new``, in key order;
    a secret compares by its reference (``env:NAME``, ``secret:NAME``), never
    its value, so a resolved and an unresolved reference are the same."""
    before, after = _flat(old, ""), _flat(new, "")
    return [k for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]


def _flat(obj: Any, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value, path = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_flat(value, path + "."))
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                out.update(_flat(item, f"{path}[{i}]."))
        elif isinstance(value, Mapping) and any(
            dataclasses.is_dataclass(v) for v in value.values()
        ):
            for k, item in value.items():
                out.update(_flat(item, f"{path}.{k}."))
        else:
            out[path] = value.source if isinstance(value, Secret) else value
    return out


def store_secret_names(config: Config) -> list[str]:
    """Names of every ``secret:NAME`` reference in ``config``."""
    return [
        value.store_name
        for _path, _f, value in _walk(config)
        if isinstance(value, Secret) and value.store_name is not None
    ]
