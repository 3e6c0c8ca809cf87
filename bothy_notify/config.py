"""Typed configuration: one TOML file, read with tomlkit, structured with cattrs,
with every key overridable by an environment variable.

The fields below are the one table of keys: a field's type, default and
``_meta(doc, min=, max=, source_rule=, path=)`` are what the loader checks,
what ``schemas/config.schema.json`` says (generated from them by
:mod:`bothy_notify.config_schema`, ``make schemas``), what the override
variable accepts and what ``check-config --print`` shows.
``config/bothy-notify.example.toml`` documents each key for operators; tests
keep it, the schema file and the fields equal. Loading fails with
:class:`ConfigError` naming the key for an unknown key, a wrong type or an
out-of-range value.

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

Environment overrides. ``BOTHY_NOTIFY__<SECTION>__<KEY>`` (the key's path in
capitals, joined by two underscores: ``BOTHY_NOTIFY__PUSH__APNS__KEY_ID``, see
:func:`env_name`) sets a key over the file, typed by the field: integers,
``true``/``false``, durations and enum values as in the file, lists
comma-separated or as a TOML array; a variable naming a table (a section, a
provider block, ``notify.kinds``) takes a TOML inline table merged into the
file's; one naming an array of tables takes a TOML inline array that replaces
the file's, and ``..._KEYS__<N>__<FIELD>`` sets one field of entry N (N up to
the number of entries: one past the last adds an entry). A secret given as the
variable's own value becomes ``env:<THAT VARIABLE>``. Errors name the
variable (and the key), never its value; a variable that names no key is an
error. :func:`load` also returns where each value came from (:class:`Loaded`).

Adding a key (the lead's and everyone's recipe):

1. Add the field to its section's dataclass with a default and
   ``metadata=_meta("one-line description", min=..., max=...)``;
   ``source_rule=`` for a :class:`Secret` (``"ref"``: env:/secret: only,
   ``"ref_or_literal"``, ``"env_or_literal"``), ``path=True`` for a file or
   directory. A new section or provider block is a new frozen dataclass and a
   field of type ``XConfig`` (or ``XConfig | None`` for an optional block, which
   exists exactly when given); a table of named entries is
   ``Mapping[str, XConfig]`` with ``default_factory=dict``.
2. ``make schemas`` (writes ``schemas/config.schema.json``).
3. Document it in ``config/bothy-notify.example.toml`` with its default (a
   test names a key missing there).
Its environment variable, its ``--print`` line and its checks come with it.

Porting a key added the old way (a field plus a hand-written schema entry):
keep the field, move what only the schema said into its ``_meta``: the
schema's ``description`` into ``doc`` when it says more, ``minimum``/
``maximum`` (or ``x-minimum-seconds``/``x-maximum-seconds`` of a duration)
into ``min``/``max``, ``x-secret`` with a ``pattern`` of ``^(env|secret):``
into ``source_rule="ref"``, ``x-path`` into ``path=True``; an ``enum`` is the
field's enum type, ``default`` the field's default. Then take the generated
schema (``make schemas``, or ``git checkout --theirs`` then ``make schemas``
after a merge conflict) and read ``git diff schemas/config.schema.json``:
only the port's own changes should show.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, get_args, get_origin, get_type_hints

import cattrs
import tomlkit
from cattrs.errors import IterableValidationError, IterableValidationNote
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


class Urgency(enum.StrEnum):
    """How urgently a kind's push should reach the person (``[notify.urgency]``)."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


class BadgeMode(enum.StrEnum):
    """What a push's ``badge`` counts (``push.badge``)."""

    UNREAD_THREADS = "unread_threads"
    OFF = "off"


DEFAULT_URGENCY: Mapping[str, Urgency] = {
    "security": Urgency.HIGH,
    "mention": Urgency.HIGH,
    "read": Urgency.LOW,
    "summary": Urgency.LOW,
}
"""The urgency of a kind that ``[notify.urgency]`` does not name; any other kind is
``normal``."""


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
    show_default: bool = True,
    key_pattern: str | None = None,
) -> dict[str, Any]:
    """Field metadata: a one-line description, numeric range, secret policy, path.

    ``source_rule`` is ``"ref"`` (env:/secret: only), ``"ref_or_literal"`` or ``"env_or_literal"``.
    ``path`` marks a file or directory (made absolute at load, relative to the
    configuration file; an empty value stays empty). ``show_default = False``
    leaves the default out of the schema (a key that is required, but may be
    given in the block or in each of its apps). ``key_pattern`` is the form of
    the keys of a table (``propertyNames`` in the schema).
    """
    return {
        "doc": doc,
        "min": min,
        "max": max,
        "secret": source_rule,
        "path": path,
        "show_default": show_default,
        "key_pattern": key_pattern,
    }


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
        default=1000, metadata=_meta("most events in one POST /v1/events (422 above)", min=1)
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
            "PostgreSQL URL (a literal or env:NAME); empty or absent starts the embedded"
            " server; an env: variable that is set but empty is refused",
            source_rule="env_or_literal",
        ),
    )
    data_dir: str = field(
        default="",
        metadata=_meta(
            "data directory of the embedded server, relative to the configuration file's"
            " directory; empty: the per-user data directory ($XDG_DATA_HOME/bothy-notify/postgres,"
            " by default ~/.local/share/bothy-notify/postgres)",
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
        default="",
        metadata=_meta(
            "directory of kind catalogue TOML files, relative to the configuration file's"
            " directory; empty: none",
            path=True,
        ),
    )
    urgency: Mapping[str, Urgency] = field(
        default_factory=dict,
        metadata=_meta(
            "urgency (low, normal, high) by kind code, over the defaults: security and"
            " mention high, read and summary low, every other kind normal",
        ),
    )

    def urgency_of(self, kind: str) -> Urgency:
        """The urgency of ``kind``: ``[notify.urgency]``'s, else the default."""
        found = self.urgency.get(kind)
        if found is not None:
            return found
        return DEFAULT_URGENCY.get(kind, Urgency.NORMAL)


@dataclass(frozen=True)
class FakeProviderConfig:
    record_file: str = field(
        default="",
        metadata=_meta(
            "JSON-lines record of every send, relative to the configuration file's directory;"
            " empty: memory only",
            path=True,
        ),
    )
    keep: int = field(
        default=1000,
        metadata=_meta("most recent sends kept in memory (older ones only in record_file)", min=0),
    )


APP_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
"""The form of an app id (``[push.<provider>.apps.<app_id>]``): an ID of SPEC section 7,
``kernel.ids.ID_PATTERN`` (not imported: notify.domain imports this module and must not
reach the clock through kernel.ids; a test keeps the two equal)."""


@dataclass(frozen=True)
class ApnsSettings:
    """The keys of ``[push.apns]``, and of each ``[push.apns.apps.<app_id>]`` (which
    overrides any of them; its ``bundle_id`` defaults to the app id)."""

    key: Secret | None = field(
        default=None,
        metadata=_meta(
            "PKCS#8 PEM of the .p8 key (required, in the block or in each app)",
            source_rule="ref",
            show_default=False,
        ),
    )
    key_id: str = field(
        default="", metadata=_meta("the key's 10-character id (required)", show_default=False)
    )
    team_id: str = field(
        default="", metadata=_meta("the 10-character team id (required)", show_default=False)
    )
    bundle_id: str = field(
        default="",
        metadata=_meta(
            "the app's bundle id, sent as apns-topic (required; an app's defaults to its app id)",
            show_default=False,
        ),
    )
    style: ApnsStyle = field(default=ApnsStyle.BACKGROUND, metadata=_meta("background or alert"))
    alert_title: str = field(default="New activity", metadata=_meta("generic alert title"))
    title_loc_keys: bool = field(
        default=False,
        metadata=_meta(
            "alert style: aps.alert also carries title-loc-key BOTHY_<KIND> for the app's"
            " localised titles (off: iOS shows the key itself when the app lacks it)"
        ),
    )
    endpoint: str = field(default="", metadata=_meta("override of the APNs host URL"))
    ca_file: str = field(
        default="",
        metadata=_meta(
            "CA bundle (PEM) for the endpoint, relative to the configuration file's directory;"
            " empty: the system's CAs",
            path=True,
        ),
    )


@dataclass(frozen=True)
class ApnsConfig(ApnsSettings):
    SCHEMA_REQUIRED_ANY_OF: ClassVar[tuple[tuple[str, ...], ...]] = (
        ("key", "key_id", "team_id", "bundle_id"),
        ("apps",),
    )
    """The schema's ``anyOf``: the credentials in the block, or apps that carry them."""

    apps: Mapping[str, ApnsSettings] = field(
        default_factory=dict,
        metadata=_meta(
            "apps by app id (the registration's app_id): each overrides any key of the"
            " block; without apps the block is one default app",
            key_pattern=APP_ID_PATTERN,
        ),
    )


@dataclass(frozen=True)
class FcmSettings:
    """The keys of ``[push.fcm]``, and of each ``[push.fcm.apps.<app_id>]``."""

    service_account: Secret | None = field(
        default=None,
        metadata=_meta(
            "service-account JSON (required, in the block or in each app)",
            source_rule="ref",
            show_default=False,
        ),
    )
    endpoint: str = field(default="", metadata=_meta("override of the FCM base URL"))
    ca_file: str = field(
        default="",
        metadata=_meta(
            "CA bundle (PEM) for the endpoint and token URL, relative to the configuration"
            " file's directory; empty: the system's CAs",
            path=True,
        ),
    )


@dataclass(frozen=True)
class FcmConfig(FcmSettings):
    SCHEMA_REQUIRED_ANY_OF: ClassVar[tuple[tuple[str, ...], ...]] = (
        ("service_account",),
        ("apps",),
    )
    """The schema's ``anyOf``: the service account in the block, or apps that carry it."""

    apps: Mapping[str, FcmSettings] = field(
        default_factory=dict,
        metadata=_meta(
            "apps by app id (the registration's app_id): each overrides any key of the"
            " block; without apps the block is one default app",
            key_pattern=APP_ID_PATTERN,
        ),
    )


PUBLIC_PUSH_SERVICES = (
    "fcm.googleapis.com",
    "updates.push.services.mozilla.com",
    "*.push.services.mozilla.com",
    "web.push.apple.com",
    "*.notify.windows.com",
)
"""The push services of Chrome, Firefox, Safari and Edge: the default of
``push.webpush.allowed_endpoints``."""


@dataclass(frozen=True)
class WebPushSettings:
    """The keys of ``[push.webpush]``, and of each ``[push.webpush.apps.<app_id>]``."""

    vapid_private_key: Secret | None = field(
        default=None,
        metadata=_meta(
            "the VAPID private key, made by bothy-notify vapid generate (required, in the"
            " block or in each app)",
            source_rule="ref",
            show_default=False,
        ),
    )
    subject: str = field(
        default="",
        metadata=_meta(
            "the VAPID subject: mailto:address or an https:// URL (required)",
            show_default=False,
        ),
    )
    allowed_endpoints: tuple[str, ...] = field(
        default=PUBLIC_PUSH_SERVICES,
        metadata=_meta(
            "push service hosts a subscription's endpoint may name (exact or *.suffix);"
            " the default lists Chrome's, Firefox's, Safari's and Edge's"
        ),
    )
    allow_private_addresses: bool = field(
        default=False, metadata=_meta("allow private/loopback push services")
    )
    ca_file: str = field(
        default="",
        metadata=_meta(
            "CA bundle (PEM) for the push services' TLS, relative to the configuration file's"
            " directory; empty: the system's CAs",
            path=True,
        ),
    )


@dataclass(frozen=True)
class WebPushConfig(WebPushSettings):
    SCHEMA_REQUIRED_ANY_OF: ClassVar[tuple[tuple[str, ...], ...]] = (
        ("vapid_private_key", "subject"),
        ("apps",),
    )
    """The schema's ``anyOf``: the VAPID identity in the block, or apps that carry one."""

    apps: Mapping[str, WebPushSettings] = field(
        default_factory=dict,
        metadata=_meta(
            "apps by app id (the registration's app_id), several VAPID identities: each"
            " overrides any key of the block",
            key_pattern=APP_ID_PATTERN,
        ),
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
    ca_file: str = field(
        default="",
        metadata=_meta(
            "CA bundle (PEM) for webhook TLS, relative to the configuration file's directory;"
            " empty: the system's CAs",
            path=True,
        ),
    )


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
    badge: BadgeMode = field(
        default=BadgeMode.UNREAD_THREADS,
        metadata=_meta(
            "what a push's badge counts: unread_threads (the unread op's threads, at send"
            " time) or off (no badge)"
        ),
    )
    clear_on_read: bool = field(
        default=True,
        metadata=_meta(
            "a read moving forward sends a content-free read push to the person's other"
            " registrations that were pushed for the thread"
        ),
    )
    clear_delay: timedelta = field(
        default=_d("2s"),
        metadata=_meta(
            "wait after a read before its read push (a burst of reads sends one)",
            min=0,
            max=3_600,
        ),
    )
    apns: ApnsConfig | None = field(default=None, metadata=_meta("APNs provider block"))
    fcm: FcmConfig | None = field(default=None, metadata=_meta("FCM provider block"))
    webhook: WebhookConfig | None = field(default=None, metadata=_meta("webhook provider block"))
    webpush: WebPushConfig | None = field(
        default=None, metadata=_meta("Web Push provider block (RFC 8030, 8291, 8292)")
    )
    fake: FakeProviderConfig | None = field(default=None, metadata=_meta("fake provider block"))


_S = TypeVar("_S", ApnsSettings, FcmSettings, WebPushSettings)


@dataclass(frozen=True, slots=True)
class AppBlock(Generic[_S]):
    """One app of a provider block: its id (``None``: the block's one default app),
    the key its settings are named by in messages, and its effective settings."""

    app_id: str | None
    key: str
    settings: _S


def provider_apps(name: str, block: ApnsConfig | FcmConfig | WebPushConfig) -> list[AppBlock[Any]]:
    """The apps of ``[push.<name>]``: one per ``[push.<name>.apps.<app_id>]`` (its keys
    already merged over the block's at load), or the block itself as its one default
    app when it has no ``apps``."""
    if not block.apps:
        return [AppBlock(None, f"push.{name}", block)]
    return [
        AppBlock(app_id, f"push.{name}.apps.{app_id}", settings)
        for app_id, settings in block.apps.items()
    ]


APP_BLOCKS = ("apns", "fcm", "webpush")
"""The provider blocks that take ``apps``."""
_REQUIRED_APP_KEYS = {
    "apns": ("key", "key_id", "team_id", "bundle_id"),
    "fcm": ("service_account",),
    "webpush": ("vapid_private_key", "subject"),
}


def _merged_apps(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """``raw`` with each ``push.<block>.apps.<app_id>`` table laid over its block's own
    keys (an APNs app's ``bundle_id`` defaulting to its app id), so that every app is
    structured and checked as a whole block, its errors named under its own key."""
    push = raw.get("push")
    if not isinstance(push, Mapping):
        return raw
    merged_push = dict(push)
    for name in APP_BLOCKS:
        block = push.get(name)
        if not isinstance(block, Mapping) or not isinstance(block.get("apps"), Mapping):
            continue
        base = {k: v for k, v in block.items() if k != "apps"}
        apps: dict[str, Any] = {}
        for app_id, table in block["apps"].items():
            if isinstance(table, Mapping):
                app = {**base, **table}
                if name == "apns":
                    app.setdefault("bundle_id", str(app_id))
                apps[str(app_id)] = app
            else:
                apps[str(app_id)] = table  # structuring names the wrong type
        merged_push[name] = {**block, "apps": apps}
    return {**raw, "push": merged_push}


def _check_apps(push: PushConfig) -> list[str]:
    errors: list[str] = []
    for name in APP_BLOCKS:
        block = getattr(push, name)
        if block is None:
            continue
        for app_id in block.apps:
            if not _APP_ID_RE.fullmatch(app_id):
                errors.append(
                    f"push.{name}.apps: an app id is 1 to 128 letters, digits and . _ : -"
                )
                break
        for app in provider_apps(name, block):
            for key in _REQUIRED_APP_KEYS[name]:
                value = getattr(app.settings, key)
                if value is None or value == "":
                    errors.append(f"{app.key}.{key}: required key is missing")
    return errors


_APP_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


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
    conv.register_structure_hook(float, _strict(float, "a number"))
    conv.register_structure_hook(bool, _strict(bool, "true or false"))
    conv.register_structure_hook(str, _strict(str, "a string"))

    def duration(value: Any, _t: type) -> timedelta:
        if not isinstance(value, str):
            raise TypeError('expected a duration string with a unit, like "2s"')
        return parse_duration(value)

    conv.register_structure_hook(timedelta, duration)

    def secret(value: Any, _t: type) -> Secret:
        if isinstance(value, _FromEnv):  # the override variable is the reference
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
    errors += _check_apps(config.push)
    if config.push.webpush is not None:
        for app in provider_apps("webpush", config.push.webpush):
            for pattern in app.settings.allowed_endpoints:
                if not _DOMAIN_PATTERN_RE.fullmatch(pattern.lower()):
                    errors.append(
                        f"{app.key}.allowed_endpoints: each entry is a host or *.suffix "
                        "with at least one label before it"
                    )
                    break
            subject = app.settings.subject
            if subject and not _VAPID_SUBJECT_RE.fullmatch(subject):
                errors.append(f"{app.key}.subject: expected mailto:address or an https:// URL")
    return errors


_DOMAIN_PATTERN_RE = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$"
    r"|^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
)

_VAPID_SUBJECT_RE = re.compile(r"^(mailto:[^\s@]+@[^\s@]+|https://[^\s/?#]+(/[^\s]*)?)$")
"""RFC 8292's ``sub``: a ``mailto:`` address or an ``https:`` URL to reach the operator."""

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
    origins = dict.fromkeys(_leaves(merged, ""), FILE)
    env_errors = _apply_env(merged, env, origins)
    if env_errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(env_errors))
    conv = _make_converter(env)
    try:
        config = conv.structure(dict(_merged_apps(merged)), Config)
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


# ---------------------------------------------------------------- environment overrides

ENV_PREFIX = "BOTHY_NOTIFY__"
"""Variables that set a key: ``BOTHY_NOTIFY__<SECTION>__<KEY>`` (see the module docstring)."""
FILE = "file"
"""The origin of a value read from the configuration file (:attr:`Loaded.origins`)."""


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


def env_name(key: str) -> str:
    """The variable that sets ``key``: ``push.apns.key_id`` is
    ``BOTHY_NOTIFY__PUSH__APNS__KEY_ID``, ``auth.keys[0].kid`` is
    ``BOTHY_NOTIFY__AUTH__KEYS__0__KID`` (``auth.keys[].kid``: ``...__<N>__KID``)."""
    dotted = key.replace("[]", ".<N>").replace("[", ".").replace("]", "")
    return ENV_PREFIX + "__".join(part.upper() for part in dotted.split("."))


class _EnvError(Exception):
    """An override variable cannot be used; the message never holds its value."""


@dataclass(frozen=True, slots=True)
class _FromEnv:
    """A secret given as the override variable's own value: it becomes ``env:NAME``."""

    name: str
    value: str = dataclasses.field(repr=False)


_Part = str | int
"""One step of a key path: a key, or an index into an array of tables."""


def _apply_env(raw: dict[str, Any], env: Mapping[str, str], origins: dict[str, str]) -> list[str]:
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
        for leaf in _leaves(value, key):
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
        if _is_dataclass_type(t):
            f = _fields_of(t).get(segment.lower())
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
    if _is_dataclass_type(t) or get_origin(t) is Mapping or table_item(t) is not None:
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
        return _FromEnv(name, text)
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
    if _is_dataclass_type(t) and isinstance(value, dict):
        hints = get_type_hints(t)
        return {
            k: _secrets_from_env(v, hints[k], name) if k in hints else v for k, v in value.items()
        }
    if t is Secret and isinstance(value, str) and not value.startswith(("env:", "secret:")):
        return _FromEnv(name, value)
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
    return not (_is_dataclass_type(t) or get_origin(t) is Mapping)


def _key_text(parts: list[_Part]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _leaves(value: Any, prefix: str) -> list[str]:
    """Key paths of every value in a raw (TOML) value: tables by key, arrays of
    tables by index; an empty table or array, and any other value, is one leaf."""
    if isinstance(value, dict) and value:
        out: list[str] = []
        for k, v in value.items():
            out += _leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{prefix}[{i}]")]
    return [prefix] if prefix else []


@functools.cache
def _fields_of(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _is_dataclass_type(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


def table_item(t: Any) -> Any:
    """The dataclass of an array of tables or of a table of named entries, else ``None``."""
    origin = get_origin(t)
    args = get_args(t)
    item = args[0] if origin is tuple else args[1] if origin is Mapping else None
    return item if _is_dataclass_type(item) else None


def without_none(t: Any) -> Any:
    """``X`` of ``X | None``; any other type as it is."""
    args = [a for a in get_args(t) if a is not type(None)]
    return args[0] if len(args) == 1 and len(get_args(t)) == 2 else t


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
