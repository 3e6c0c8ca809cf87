"""Typed configuration: one TOML file, read with tomlkit, structured with cattrs.

Every key has a default (see ``config/bothy-notify.example.toml``, which
documents each one, and ``schemas/config.schema.json``, which describes each
one; a test keeps the three equal). Loading fails with :class:`ConfigError`
naming the key for an unknown key, a wrong type or an out-of-range value.

Durations are strings with a unit (``"250ms"``, ``"2s"``, ``"5m"``, ``"1h"``,
``"30d"``). Secrets are :class:`Secret` values given as ``env:NAME`` (resolved
at load) or ``secret:NAME`` (resolved from the secret store at start, see
:func:`resolve_store_secrets`); their values never appear in a repr, a log
line or an error.

Paths (fields marked ``path=True``: ``database.data_dir``, ``notify.kinds_dir``,
``push.fake.record_file``, every ``ca_file``) are made absolute at load: a
relative one is relative to the directory of the configuration file, never to
the working directory (``~`` is expanded). An empty ``database.data_dir`` is the
per-user data directory (:func:`default_data_dir`). ``database.url = ""`` is
the same as no ``url``: the embedded server. The rest of the code therefore sees
absolute paths and ``database.url is None`` exactly when the server is embedded.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import cattrs
import tomlkit
from tomlkit.exceptions import ParseError


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key, never a secret."""


class Role(enum.StrEnum):
    """Which parts of the daemon a node runs (``server.role``)."""

    ALL = "all"
    WORKER = "worker"
    API = "api"


class ClusterMode(enum.StrEnum):
    SINGLE = "single"
    MULTI = "multi"


class Level(enum.StrEnum):
    """How much of a thread a person hears about."""

    ALL = "all"
    MENTIONS = "mentions"
    NONE = "none"


class ApnsStyle(enum.StrEnum):
    BACKGROUND = "background"
    ALERT = "alert"


class LogFormat(enum.StrEnum):
    JSON = "json"
    TEXT = "text"


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class JwtAlgorithm(enum.StrEnum):
    HS256 = "HS256"
    RS256 = "RS256"
    ES256 = "ES256"


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
) -> dict[str, Any]:
    """Field metadata: a one-line description, numeric range, secret policy, path.

    ``source_rule`` is ``"ref"`` (env:/secret: only), ``"ref_or_literal"`` or ``"env_or_literal"``.
    ``path`` marks a file or directory (made absolute at load, relative to the
    configuration file; an empty value stays empty).
    """
    return {"doc": doc, "min": min, "max": max, "secret": source_rule, "path": path}


def _d(text: str) -> timedelta:
    return parse_duration(text)


@dataclass(frozen=True)
class ServerConfig:
    role: Role = field(default=Role.ALL, metadata=_meta("all, worker or api"))
    api_listen: str = field(default="127.0.0.1:8700", metadata=_meta("host:port of the HTTP API"))
    gateway_listen: str = field(
        default="127.0.0.1:8701", metadata=_meta("host:port of the WebSocket gateway")
    )
    drain_period: timedelta = field(
        default=_d("10s"), metadata=_meta("time for in-flight work at shutdown", min=0, max=600)
    )
    processes: int = field(
        default=1,
        metadata=_meta(
            "node processes `run` starts (more than 1: a cluster sharing the ports)",
            min=1,
            max=256,
        ),
    )
    dev: bool = field(default=False, metadata=_meta("development mode: dev-token, fake printing"))
    heartbeat: timedelta = field(
        default=_d("2s"),
        metadata=_meta("node heartbeat interval (cluster.mode multi)", min=0.05, max=60),
    )
    max_body_bytes: int = field(
        default=1_048_576, metadata=_meta("largest HTTP request body (413 above)", min=1024)
    )
    max_batch_events: int = field(
        default=1000, metadata=_meta("most events in one POST /v1/events (413 above)", min=1)
    )
    header_timeout: timedelta = field(
        default=_d("5s"),
        metadata=_meta("time to send a request's headers; idle keep-alive", min=0.05, max=300),
    )
    body_timeout: timedelta = field(
        default=_d("30s"),
        metadata=_meta("time to send a whole request body (408 past it)", min=0.05, max=3600),
    )
    idempotency_window: timedelta = field(
        default=_d("24h"),
        metadata=_meta(
            "how long POST /v1/events remembers an Idempotency-Key", min=60, max=30 * 86_400
        ),
    )


@dataclass(frozen=True)
class ClusterConfig:
    mode: ClusterMode = field(default=ClusterMode.SINGLE, metadata=_meta("single or multi"))
    node_timeout: timedelta = field(
        default=_d("10s"),
        metadata=_meta("a node without a heartbeat this long is gone", min=0.1, max=600),
    )


@dataclass(frozen=True)
class DatabaseConfig:
    url: Secret | None = field(
        default=None,
        metadata=_meta(
            "PostgreSQL URL; empty starts the embedded server", source_rule="env_or_literal"
        ),
    )
    data_dir: str = field(
        default="",
        metadata=_meta(
            "data directory of the embedded server; empty: the per-user data directory",
            path=True,
        ),
    )
    pool_size: int = field(
        default=10,
        metadata=_meta("connections (and worker threads) of the HTTP API", min=2, max=500),
    )
    jobs_pool_size: int = field(
        default=10,
        metadata=_meta(
            "connections (and worker threads) of the job runner and housekeeping", min=2, max=500
        ),
    )
    gateway_pool_size: int = field(
        default=4,
        metadata=_meta(
            "connections (and worker threads) of the gateway, apart from the API's",
            min=1,
            max=500,
        ),
    )


@dataclass(frozen=True)
class AuthKey:
    algorithm: JwtAlgorithm = field(metadata=_meta("HS256, RS256 or ES256"))
    key: Secret = field(
        metadata=_meta("HS256 shared secret or PEM public key", source_rule="ref_or_literal")
    )
    kid: str = field(default="", metadata=_meta("key id matched against the token's kid"))


@dataclass(frozen=True)
class AuthConfig:
    algorithms: tuple[JwtAlgorithm, ...] = field(
        default=(JwtAlgorithm.HS256, JwtAlgorithm.RS256, JwtAlgorithm.ES256),
        metadata=_meta("accepted JWT algorithms"),
    )
    keys: tuple[AuthKey, ...] = field(default=(), metadata=_meta("verification keys"))
    issuer: str = field(default="", metadata=_meta("required iss claim; empty: not checked"))
    audience: str = field(default="", metadata=_meta("required aud claim; empty: not checked"))
    leeway: timedelta = field(
        default=_d("30s"), metadata=_meta("clock skew allowed on exp and nbf", min=0, max=300)
    )


@dataclass(frozen=True)
class SyncConfig:
    outbound_queue_max: int = field(
        default=256, metadata=_meta("frames queued per connection", min=1, max=100_000)
    )
    max_focused_threads: int = field(
        default=100, metadata=_meta("thread ids in one focus op", min=1, max=10_000)
    )
    max_frame_bytes: int = field(
        default=65_536, metadata=_meta("largest client frame", min=256, max=16_777_216)
    )
    identify_timeout: timedelta = field(
        default=_d("10s"), metadata=_meta("time to identify after hello", min=0.05, max=300)
    )
    heartbeat: timedelta = field(
        default=_d("30s"), metadata=_meta("heartbeat interval told in hello", min=0.05, max=3600)
    )
    write_timeout: timedelta = field(
        default=_d("10s"), metadata=_meta("a stalled write closes with 4014", min=0.05, max=300)
    )
    max_unidentified_connections: int = field(
        default=1000,
        metadata=_meta("connections not yet identified per node (oldest closed 4008)", min=1),
    )
    max_connections_per_person: int = field(
        default=32,
        metadata=_meta("connections of one person per node (more closed 4008)", min=1),
    )
    ops_per_second: int = field(
        default=10,
        metadata=_meta(
            "client frames per second per connection, on average (more closed 4029)",
            min=1,
            max=100_000,
        ),
    )
    ops_burst: int = field(
        default=50,
        metadata=_meta("client frames a connection may send at once (more closed 4029)", min=1),
    )


@dataclass(frozen=True)
class KindConfig:
    category: str = field(metadata=_meta("the category the kind belongs to"))
    template: str = field(default="", metadata=_meta("display template, count placeholders only"))
    link: str = field(default="", metadata=_meta("deep-link template built from IDs"))


@dataclass(frozen=True)
class NotifyConfig:
    mobile_delay_when_desktop_active: timedelta = field(
        default=_d("2m"),
        metadata=_meta("push delay while a macos/windows device is live", min=0, max=86_400),
    )
    coalesce_window: timedelta = field(
        default=_d("30s"), metadata=_meta("coalescing window; 0s turns it off", min=0, max=86_400)
    )
    default_level: Level = field(
        default=Level.MENTIONS, metadata=_meta("follow level when none is stored")
    )
    poll_interval: timedelta = field(
        default=_d("1s"), metadata=_meta("round and runner poll fallback", min=0.01, max=3600)
    )
    batch_size: int = field(
        default=500, metadata=_meta("events per consumer round", min=1, max=100_000)
    )
    categories: tuple[str, ...] = field(default=(), metadata=_meta("app hint categories"))
    idempotency_window: timedelta = field(
        default=_d("24h"), metadata=_meta("dedupe window of app hints", min=0, max=30 * 86_400)
    )
    kinds: Mapping[str, KindConfig] = field(
        default_factory=dict, metadata=_meta("kind catalogue entries by kind code")
    )
    kinds_dir: str = field(
        default="", metadata=_meta("directory of kind catalogue TOML files", path=True)
    )


@dataclass(frozen=True)
class FakeProviderConfig:
    record_file: str = field(
        default="", metadata=_meta("JSON-lines record of every send", path=True)
    )


@dataclass(frozen=True)
class ApnsConfig:
    key: Secret = field(metadata=_meta("PKCS#8 PEM of the .p8 key", source_rule="ref"))
    key_id: str = field(metadata=_meta("the key's 10-character id"))
    team_id: str = field(metadata=_meta("the 10-character team id"))
    bundle_id: str = field(metadata=_meta("the app's bundle id (apns-topic)"))
    style: ApnsStyle = field(default=ApnsStyle.BACKGROUND, metadata=_meta("background or alert"))
    alert_title: str = field(default="New activity", metadata=_meta("generic alert title"))
    endpoint: str = field(default="", metadata=_meta("override of the APNs host URL"))
    ca_file: str = field(default="", metadata=_meta("CA bundle for the endpoint", path=True))


@dataclass(frozen=True)
class FcmConfig:
    service_account: Secret = field(metadata=_meta("service-account JSON", source_rule="ref"))
    endpoint: str = field(default="", metadata=_meta("override of the FCM base URL"))
    ca_file: str = field(
        default="", metadata=_meta("CA bundle for the endpoint and token URL", path=True)
    )


@dataclass(frozen=True)
class WebhookConfig:
    allowed_domains: tuple[str, ...] = field(
        default=(), metadata=_meta("hosts allowed (exact or *.suffix); empty: none")
    )
    allow_private_addresses: bool = field(
        default=False, metadata=_meta("allow private/loopback targets")
    )
    endpoint: str = field(default="", metadata=_meta("egress proxy URL for all webhooks"))
    ca_file: str = field(default="", metadata=_meta("CA bundle for webhook TLS", path=True))


@dataclass(frozen=True)
class PushConfig:
    max_age: timedelta = field(
        default=_d("1h"), metadata=_meta("a hint older than this is not sent", min=1, max=604_800)
    )
    max_attempts: int = field(default=5, metadata=_meta("attempts per send", min=1, max=100))
    max_strikes: int = field(
        default=3,
        metadata=_meta("strikes in a row (failed sends) that invalidate", min=1, max=100),
    )
    strike_interval: timedelta = field(
        default=_d("1h"),
        metadata=_meta(
            "at most one strike per registration per interval; strikes count only while"
            " the provider delivered to others within it",
            min=1,
            max=604_800,
        ),
    )
    max_registrations_per_person: int = field(
        default=20, metadata=_meta("registrations a person may hold", min=1, max=10_000)
    )
    max_in_flight: int = field(
        default=256, metadata=_meta("concurrent sends per provider", min=1, max=100_000)
    )
    invalidated_retention: timedelta = field(
        default=_d("30d"), metadata=_meta("keep invalidated registrations", min=0)
    )
    registration_ttl: timedelta = field(
        default=_d("30d"), metadata=_meta("invalidate a registration not renewed", min=60)
    )
    recipient_ttl: timedelta = field(
        default=_d("30d"),
        metadata=_meta("delete a topic-mode recipient not renewed", min=86_400),
    )
    apns: ApnsConfig | None = field(default=None, metadata=_meta("APNs provider block"))
    fcm: FcmConfig | None = field(default=None, metadata=_meta("FCM provider block"))
    webhook: WebhookConfig | None = field(default=None, metadata=_meta("webhook provider block"))
    fake: FakeProviderConfig | None = field(default=None, metadata=_meta("fake provider block"))


@dataclass(frozen=True)
class LimitsConfig:
    max_push_topics: int = field(
        default=100_000,
        metadata=_meta("topics one topic-mode recipient may subscribe", min=1, max=10_000_000),
    )


@dataclass(frozen=True)
class JobsConfig:
    concurrency: int = field(
        default=512, metadata=_meta("jobs running at once per node", min=1, max=100_000)
    )
    claim_batch: int = field(default=200, metadata=_meta("jobs claimed per query", min=1))
    lease: timedelta = field(
        default=_d("60s"), metadata=_meta("a claimed job runs again after this", min=1)
    )
    retention: timedelta = field(
        default=_d("24h"), metadata=_meta("keep finished jobs this long", min=0)
    )


@dataclass(frozen=True)
class LogConfig:
    level: LogLevel = field(default=LogLevel.INFO, metadata=_meta("debug, info, warning, error"))
    format: LogFormat = field(default=LogFormat.JSON, metadata=_meta("json or text"))


@dataclass(frozen=True)
class Config:
    """The whole configuration; every section has defaults."""

    server: ServerConfig = field(default_factory=ServerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    push: PushConfig = field(default_factory=PushConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    log: LogConfig = field(default_factory=LogConfig)


# ---------------------------------------------------------------- structuring

_T = TypeVar("_T")
_SECRET_POLICY: dict[str, str] = {}


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
    conv.register_structure_hook(bool, _strict(bool, "true or false"))
    conv.register_structure_hook(str, _strict(str, "a string"))

    def duration(value: Any, _t: type) -> timedelta:
        if not isinstance(value, str):
            raise TypeError('expected a duration string with a unit, like "2s"')
        return parse_duration(value)

    conv.register_structure_hook(timedelta, duration)

    def secret(value: Any, _t: type) -> Secret:
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

    for enum_type in (Role, ClusterMode, Level, ApnsStyle, LogFormat, LogLevel, JwtAlgorithm):
        conv.register_structure_hook(enum_type, enum_hook)

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
        return {str(k): conv.structure(v, v_type) for k, v in value.items()}

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


def _check(config: Config) -> list[str]:
    errors: list[str] = []
    for path, f, value in _walk(config):
        low, high = f.metadata.get("min"), f.metadata.get("max")
        number: float | None = None
        if isinstance(value, timedelta):
            number = value.total_seconds()
        elif isinstance(value, int) and not isinstance(value, bool):
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
        if name in BUILTIN_CATEGORIES or not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", name):
            errors.append(f"notify.categories: {name!r} is built in or not a lowercase name")
    if config.cluster.node_timeout < 2 * config.server.heartbeat:
        # One late heartbeat must not make a node look gone.
        errors.append("cluster.node_timeout: must be at least twice server.heartbeat")
    for address_key in ("api_listen", "gateway_listen"):
        if parse_listen(getattr(config.server, address_key)) is None:
            errors.append(f"server.{address_key}: expected host:port")
    if config.push.webhook is not None:
        for pattern in config.push.webhook.allowed_domains:
            if not _DOMAIN_PATTERN_RE.fullmatch(pattern.lower()):
                errors.append(
                    "push.webhook.allowed_domains: each entry is a host or *.suffix "
                    "with at least one label before it"
                )
                break
    return errors


_DOMAIN_PATTERN_RE = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$"
    r"|^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
)

BUILTIN_CATEGORIES = ("messages", "mentions", "security", "admin")
"""Categories of the built-in hint kinds; app categories come from ``notify.categories``."""


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
    file's); without it a relative path is refused.
    """
    try:
        raw = tomlkit.parse(text).unwrap()
    except ParseError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    return structure_config(raw, env=os.environ if env is None else env, base_dir=base_dir)


def structure_config(
    raw: Mapping[str, Any], *, env: Mapping[str, str], base_dir: str | Path | None = None
) -> Config:
    """Structure a plain dict into :class:`Config`, check ranges and policies, and
    make every path absolute (relative ones start at ``base_dir``; without it a
    relative path is refused, since the working directory is never a base)."""
    conv = _make_converter(env)
    try:
        config = conv.structure(dict(raw), Config)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            errors = _format_cattrs_error(exc)
        else:
            errors = [str(exc)]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors)) from None
    errors = _check(config)
    config, database_errors = _embedded_when_empty(config)
    errors += database_errors
    config = _absolute_paths(config, None if base_dir is None else Path(base_dir), errors)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return config


def load_config(path: str | Path | None, *, env: Mapping[str, str] | None = None) -> Config:
    """Load the TOML file at ``path`` (``None``: all defaults).

    Relative paths in the file start at the file's own directory.
    """
    if path is None:
        return structure_config({}, env=os.environ if env is None else env)
    file = Path(path).expanduser().absolute()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file: {exc.strerror}") from None
    return load_config_text(text, env=env, base_dir=file.parent)


def default_data_dir() -> str:
    """The embedded server's data directory when ``database.data_dir`` is empty.

    ``postgres`` in the per-user data directory of ``bothy-notify``
    (platformdirs): ``$XDG_DATA_HOME/bothy-notify/postgres``, by default
    ``~/.local/share/bothy-notify/postgres`` on Linux, and
    ``~/Library/Application Support/bothy-notify/postgres`` on macOS.
    """
    import platformdirs  # only here: the domain imports this module for its enums

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


def iter_keys(cls: type = Config, prefix: str = "") -> Iterator[str]:
    """Every documented key path of the configuration, e.g. ``push.apns.key_id``.

    Arrays of tables appear as ``auth.keys[].kid``; maps as ``notify.kinds.*.category``.
    """
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        t = hints[f.name]
        inner = _dataclass_in(t)
        if inner is not None:
            origin = get_origin(t)
            if origin is tuple:
                yield from iter_keys(inner, path + "[].")
            elif origin is Mapping:
                yield from iter_keys(inner, path + ".*.")
            else:
                yield from iter_keys(inner, path + ".")
        else:
            yield path


def _dataclass_in(t: Any) -> type | None:
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return t
    for arg in get_args(t):
        found = _dataclass_in(arg) if arg is not type(None) else None
        if found is not None:
            return found
    return None


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
        return dataclasses.replace(obj, **changes) if changes else obj

    resolved = resolve(config, "")
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    assert isinstance(resolved, Config)
    return resolved


def store_secret_names(config: Config) -> list[str]:
    """Names of every ``secret:NAME`` reference in ``config``."""
    return [
        value.store_name
        for _path, _f, value in _walk(config)
        if isinstance(value, Secret) and value.store_name is not None
    ]
