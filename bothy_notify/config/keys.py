"""The one table of configuration keys.

Every key is a field of the frozen dataclasses below: its name, its type (which
the loader checks), its default, and its ``_meta(doc, min=, max=,
source_rule=, path=, required=, key_pattern=, inherits=, defaults_to_app_id=)``
(:func:`~bothy_notify.config.values._meta`). The loader
(:mod:`~bothy_notify.config.load`), the environment overrides
(:mod:`~bothy_notify.config.env`), the JSON schema and ``check-config --print``
(:mod:`~bothy_notify.config.schema`) are derived from these fields and nothing
else; how to add a key is in the package's docstring (:mod:`bothy_notify.config`).

A provider's block is its keys here and nothing more: what its values must look
like beyond their type, range and presence (a key's length, a PEM, a URL, a
host pattern) is checked by the provider's own ``prepare``
(:mod:`bothy_notify.push.providers`).

The product's words the keys take as types (:class:`Level`, :class:`Urgency`,
:class:`BadgeMode`) live below the configuration, in
:mod:`bothy_notify.vocabulary`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Generic, TypeVar, get_origin, get_type_hints

from bothy_notify.config.values import Secret, _d, _meta, dataclass_in
from bothy_notify.kernel.ids import ID_PATTERN
from bothy_notify.vocabulary import DEFAULT_URGENCY, BadgeMode, Level, Urgency


class Role(enum.StrEnum):
    """Which parts of the daemon a node runs (``server.role``)."""

    ALL = "all"
    WORKER = "worker"
    API = "api"


class ClusterMode(enum.StrEnum):
    SINGLE = "single"
    MULTI = "multi"


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
    # Every wait on PostgreSQL is bounded by one of the keys below (a frozen server
    # accepts TCP and never answers); docs/operations.md, "High availability".
    connect_timeout: timedelta = field(
        default=_d("3s"),
        metadata=_meta(
            "time for one connection attempt to one host of the URL, whole seconds (libpq"
            " counts at least 2); past it the next host of a multi-host URL is tried",
            min=2,
            max=300,
        ),
    )
    tcp_user_timeout: timedelta = field(
        default=_d("10s"),
        metadata=_meta(
            "an established connection whose peer stops acknowledging (a network split,"
            " a frozen host) is dropped after this; TCP keepalives are derived from it;"
            " 0: the kernel's defaults",
            min=0,
            max=3600,
        ),
    )
    statement_timeout: timedelta = field(
        default=_d("5s"),
        metadata=_meta(
            "the server cancels a statement of the daemon's that runs longer (PostgreSQL's"
            " statement_timeout; the hourly sweep and migrations are exempt); 0: none",
            min=0,
            max=3600,
        ),
    )
    response_timeout: timedelta = field(
        default=_d("6s"),
        metadata=_meta(
            "longest wait for the server's answer to one request (a statement, a commit);"
            " past it the connection counts as lost (a frozen server). Longer than"
            " statement_timeout",
            min=0.1,
            max=3600,
        ),
    )
    listen_check_interval: timedelta = field(
        default=_d("5s"),
        metadata=_meta(
            "a LISTEN connection that received nothing this long checks that the server"
            " still answers (bounded by response_timeout)",
            min=0.1,
            max=3600,
        ),
    )
    health_check_timeout: timedelta = field(
        default=_d("2s"),
        metadata=_meta(
            "the /readyz database check's bound: the wait for a pooled connection, and"
            " again for the answer",
            min=0.1,
            max=60,
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
        default=_d("24h"),
        metadata=_meta(
            "dedupe window of app hints and of an edited message's mentions",
            min=0,
            max=30 * 86_400,
        ),
    )
    group_mention_limit: int = field(
        default=1000,
        metadata=_meta(
            "people a group mention (mention_groups all or here) may reach; a larger"
            " audience gets nothing extra",
            min=0,
            max=1_000_000,
        ),
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
            " mention high, read, removed and summary low, every other kind normal",
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


@dataclass(frozen=True)
class ApnsSettings:
    """The keys of ``[push.apns]``, and of each ``[push.apns.apps.<app_id>]`` (which
    overrides any of them; its ``bundle_id`` defaults to the app id)."""

    key: Secret | None = field(
        default=None,
        metadata=_meta(
            "PKCS#8 PEM of the .p8 key (required, in the block or in each app)",
            source_rule="ref",
            required=True,
        ),
    )
    key_id: str = field(
        default="", metadata=_meta("the key's 10-character id (required)", required=True)
    )
    team_id: str = field(
        default="", metadata=_meta("the 10-character team id (required)", required=True)
    )
    bundle_id: str = field(
        default="",
        metadata=_meta(
            "the app's bundle id, sent as apns-topic (required; an app's defaults to its app id)",
            required=True,
            defaults_to_app_id=True,
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
            key_pattern=ID_PATTERN,
            inherits=True,
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
            required=True,
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
            key_pattern=ID_PATTERN,
            inherits=True,
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
            required=True,
        ),
    )
    subject: str = field(
        default="",
        metadata=_meta(
            "the VAPID subject: mailto:address or an https:// URL (required)",
            required=True,
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
            key_pattern=ID_PATTERN,
            inherits=True,
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
class MatrixRelayConfig:
    """``[push.matrix]``: registrations that push through an upstream Matrix push
    gateway (a vendor's Sygnal), SPEC section 14c."""

    allowed_gateways: tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "hosts an upstream push gateway's notify URL may name (exact or *.suffix); empty: none"
        ),
    )
    allow_private_addresses: bool = field(
        default=False, metadata=_meta("allow private/loopback gateways (tests)")
    )
    ca_file: str = field(
        default="",
        metadata=_meta(
            "CA bundle (PEM) for the gateways' TLS, relative to the configuration file's"
            " directory; empty: the system's CAs",
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
    matrix: MatrixRelayConfig | None = field(
        default=None,
        metadata=_meta("relaying through an upstream Matrix push gateway (SPEC section 14c)"),
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
    already laid over the block's at load: ``inherits``), or the block itself as its one default
    app when it has no ``apps``."""
    if not block.apps:
        return [AppBlock(None, f"push.{name}", block)]
    return [
        AppBlock(app_id, f"push.{name}.apps.{app_id}", settings)
        for app_id, settings in block.apps.items()
    ]


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
class MatrixGatewayConfig:
    """``[matrix_gateway]``: serving the Matrix Push Gateway API
    (``POST /_matrix/push/v1/notify``), SPEC section 14c. Off unless given."""

    apps: Mapping[str, str] = field(
        default_factory=dict,
        metadata=_meta(
            "Matrix app_id -> where its pushkeys go: provider[:app][@environment]"
            ' ("apns", "apns:beta@sandbox", "fcm:example", "webpush"); a device of'
            " another app_id is rejected (required)",
            key_pattern=ID_PATTERN,
            required=True,
        ),
    )
    answer_within: timedelta = field(
        default=_d("2s"),
        metadata=_meta(
            "how long an answer waits for the first attempts of its pushes", min=0, max=30
        ),
    )
    max_devices: int = field(
        default=100, metadata=_meta("devices one notification may list", min=1, max=10_000)
    )
    requests_per_second: int = field(
        default=100,
        metadata=_meta("notify requests a second from one source address", min=1, max=1_000_000),
    )
    requests_burst: int = field(
        default=200,
        metadata=_meta(
            "notify requests from one source address at once, above the rate",
            min=1,
            max=1_000_000,
        ),
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
    matrix_gateway: MatrixGatewayConfig | None = field(
        default=None,
        metadata=_meta("the Matrix push gateway endpoint (SPEC section 14c); off unless given"),
    )


def iter_keys(cls: type = Config, prefix: str = "") -> Iterator[str]:
    """Every documented key path of the configuration, e.g. ``push.apns.key_id``.

    Arrays of tables appear as ``auth.keys[].kid``; maps as ``notify.kinds.*.category``.
    """
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        t = hints[f.name]
        inner = dataclass_in(t)
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
