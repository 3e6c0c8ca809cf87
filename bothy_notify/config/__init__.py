"""Typed configuration: one TOML file, read with tomlkit, structured with cattrs,
with every key overridable by an environment variable.

The package, from the bottom up (``.importlinter`` holds this order):

- :mod:`~bothy_notify.config.values`: what a key's value can be (:class:`Secret`,
  durations), :class:`ConfigError`, and ``_meta``, a field's metadata;
- :mod:`~bothy_notify.config.keys`: the one table of keys, the frozen
  dataclasses of :class:`Config`;
- :mod:`~bothy_notify.config.env`: the ``BOTHY_NOTIFY__*`` overrides;
- :mod:`~bothy_notify.config.load`: the loader and its checks (:func:`load`,
  :func:`load_config`, :func:`load_config_text`, :func:`structure_config`);
- :mod:`~bothy_notify.config.schema`: ``schemas/config.schema.json`` and
  ``check-config --print``, derived from the keys;
- :mod:`~bothy_notify.config.live`: the running configuration behind one
  handle (:class:`LiveConfig`), and what a reload applies (:data:`RELOADABLE`,
  :func:`plan_reload`).

The public names of all but ``schema`` are importable from here
(``from bothy_notify.config import Config``), and so are the words of
:mod:`bothy_notify.vocabulary` the keys take as types (:class:`Level`,
:class:`Urgency`, :class:`BadgeMode`, ``BUILTIN_CATEGORIES``);
``notify/domain`` imports those from the vocabulary, never from here.

A key's field is everything about it: its type, default and ``_meta(doc, min=,
max=, source_rule=, path=, required=, key_pattern=, inherits=,
defaults_to_app_id=)`` are what the loader checks, what
``schemas/config.schema.json`` says (``make schemas``), what the override
variable accepts and what ``check-config --print`` shows.
``config/bothy-notify.example.toml`` documents each key for operators; tests
keep it, the schema file and the fields equal. Loading fails with
:class:`ConfigError` naming the key for an unknown key, a wrong type, a missing
required key or an out-of-range value. What a provider's values must look like
beyond that (a key id's length, a PEM, a URL, a host pattern) is checked by the
provider's own ``prepare`` in ``bothy_notify/push/`` (``check-config``, the
daemon's start): the configuration knows a provider's block as keys only.

Durations are strings with a unit (``"250ms"``, ``"2s"``, ``"5m"``, ``"1h"``,
``"30d"``). Secrets are :class:`Secret` values given as ``env:NAME`` (resolved
at load) or ``secret:NAME`` (resolved from the secret store at start, see
:func:`resolve_store_secrets`); their values never appear in a repr, a log
line or an error. Paths (``path=True``) are made absolute at load, relative to
the configuration file's directory (see :mod:`~bothy_notify.config.load`).
Overrides are described in :mod:`~bothy_notify.config.env`; :func:`load` also
returns where each value came from (:class:`Loaded`).

Adding a key (the lead's and everyone's recipe):

1. Add the field to its section's dataclass in ``config/keys.py`` with a default
   and ``metadata=_meta("one-line description", min=..., max=...)``;
   ``source_rule=`` for a :class:`Secret` (``"ref"``: env:/secret: only,
   ``"ref_or_literal"``, ``"env_or_literal"``), ``path=True`` for a file or
   directory, ``required=True`` for a key that must be given (a provider's
   credentials). A new section or provider block is a new frozen dataclass and
   a field of type ``XConfig`` (or ``XConfig | None`` for an optional block,
   which exists exactly when given); a table of named entries is
   ``Mapping[str, XConfig]`` with ``default_factory=dict`` (``key_pattern=`` for
   the form of its keys; ``inherits=True`` for a block's ``apps``, each laid
   over the block). A check of a provider's values beyond type, range and
   presence goes in that provider's ``prepare``, not here.
2. ``make schemas`` (writes ``schemas/config.schema.json``).
3. Document it in ``config/bothy-notify.example.toml`` with its default (a
   test names a key missing there).
4. A key is applied at the next start, and a reload names it in its
   ``restart_needed``. To make it reloadable, add it to :data:`RELOADABLE`
   (``config/live.py``) and have every component that reads it read it through
   the node's :class:`LiveConfig` at use (or be told by ``Daemon.reload``), and
   say so in ``docs/operations.md`` ("Reload").
Its environment variable, its ``--print`` line and its checks come with it.

Porting a key added the old way (a field plus a hand-written schema entry, or a
field of the former ``config.py``): keep the field, now in ``config/keys.py``,
move what only the schema said into its ``_meta``: the schema's
``description`` into ``doc`` when it says more, ``minimum``/``maximum`` (or
``x-minimum-seconds``/``x-maximum-seconds`` of a duration) into ``min``/``max``,
``x-secret`` with a ``pattern`` of ``^(env|secret):`` into
``source_rule="ref"``, ``x-path`` into ``path=True``; an ``enum`` is the field's
enum type, ``default`` the field's default (``show_default=False`` is now
``required=True``). A check a port added to ``config.py``'s ``_check`` goes to
``load._check`` when it relates keys, to the provider's ``prepare`` when it is a
provider's. Then take the generated schema (``make schemas``, or ``git checkout
--theirs`` then ``make schemas`` after a merge conflict) and read ``git diff
schemas/config.schema.json``: only the port's own changes should show.
"""

from __future__ import annotations

from bothy_notify.config.env import ENV_PREFIX, FILE, env_name
from bothy_notify.config.keys import (
    PUBLIC_PUSH_SERVICES,
    ApnsConfig,
    ApnsSettings,
    ApnsStyle,
    AppBlock,
    AuthConfig,
    AuthKey,
    ClusterConfig,
    ClusterMode,
    Config,
    DatabaseConfig,
    FakeProviderConfig,
    FcmConfig,
    FcmSettings,
    JobsConfig,
    JwtAlgorithm,
    KindConfig,
    LimitsConfig,
    LogConfig,
    LogFormat,
    LogLevel,
    MatrixGatewayConfig,
    MatrixRelayConfig,
    NotifyConfig,
    PushConfig,
    Role,
    ServerConfig,
    SyncConfig,
    WebhookConfig,
    WebPushConfig,
    WebPushSettings,
    iter_keys,
    provider_apps,
)
from bothy_notify.config.live import RELOADABLE, LiveConfig, ReloadPlan, plan_reload
from bothy_notify.config.load import (
    Loaded,
    changed_keys,
    default_data_dir,
    load,
    load_config,
    load_config_text,
    parse_listen,
    resolve_store_secrets,
    store_secret_names,
    structure_config,
)
from bothy_notify.config.values import (
    DURATION_PATTERN,
    ConfigError,
    Secret,
    format_duration,
    parse_duration,
    table_item,
    without_none,
)
from bothy_notify.vocabulary import (
    BUILTIN_CATEGORIES,
    DEFAULT_URGENCY,
    BadgeMode,
    Level,
    Urgency,
)

__all__ = [
    "BUILTIN_CATEGORIES",
    "DEFAULT_URGENCY",
    "DURATION_PATTERN",
    "ENV_PREFIX",
    "FILE",
    "PUBLIC_PUSH_SERVICES",
    "RELOADABLE",
    "ApnsConfig",
    "ApnsSettings",
    "ApnsStyle",
    "AppBlock",
    "AuthConfig",
    "AuthKey",
    "BadgeMode",
    "ClusterConfig",
    "ClusterMode",
    "Config",
    "ConfigError",
    "DatabaseConfig",
    "FakeProviderConfig",
    "FcmConfig",
    "FcmSettings",
    "JobsConfig",
    "JwtAlgorithm",
    "KindConfig",
    "Level",
    "LimitsConfig",
    "LiveConfig",
    "Loaded",
    "LogConfig",
    "LogFormat",
    "LogLevel",
    "MatrixGatewayConfig",
    "MatrixRelayConfig",
    "NotifyConfig",
    "PushConfig",
    "ReloadPlan",
    "Role",
    "Secret",
    "ServerConfig",
    "SyncConfig",
    "Urgency",
    "WebPushConfig",
    "WebPushSettings",
    "WebhookConfig",
    "changed_keys",
    "default_data_dir",
    "env_name",
    "format_duration",
    "iter_keys",
    "load",
    "load_config",
    "load_config_text",
    "parse_duration",
    "parse_listen",
    "plan_reload",
    "provider_apps",
    "resolve_store_secrets",
    "store_secret_names",
    "structure_config",
    "table_item",
    "without_none",
]
