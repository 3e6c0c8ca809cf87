"""``[matrix_gateway] apps``: where each Matrix app id's pushkeys go.

Each entry maps a Matrix ``app_id`` (the pusher's) to ``provider[:app][@environment]``:

- ``provider`` is a provider of the table that takes Matrix pushkeys
  (:attr:`~bothy_notify.push.providers.ProviderEntry.pushkey`: ``apns``, ``fcm``,
  ``webpush``, ``fake``) and whose block is configured;
- ``app`` names one of that block's ``apps`` (required when it has apps, refused
  when it has none: the block is then its one app);
- ``environment`` is one of the provider's environments (APNs: ``sandbox`` or
  ``production``, the default); a provider without environments takes none.

:func:`routes` checks every entry against the push configuration and returns
them as :class:`AppRoute` values (``check-config``, ``push test``);
:func:`routes_of` against the providers a node runs (the daemon's start), so a
wrong entry stops the start with its key named
(``matrix_gateway.apps."im.example.ios": ...``), never a send.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bothy_notify.config import Config, ConfigError, MatrixGatewayConfig
from bothy_notify.push.providers import PROVIDERS


@dataclass(frozen=True, slots=True)
class AppRoute:
    """Where the pushkeys of one Matrix app id go.

    Attributes:
        matrix_app: the Matrix app id (a configured key: the metric's ``app`` label).
        provider: the provider.
        app_id: the provider's app (``None``: its block's one app).
        environment: the registration environment (``None``: the provider's default).
    """

    matrix_app: str
    provider: str
    app_id: str | None
    environment: str | None

    @property
    def owner(self) -> str:
        """The principal that owns this app's registrations: ``matrix-gateway/<app id>``.
        No person can have this id (a ``/`` is outside the app ID form), so the
        registrations are never a person's, never move to one, and never receive a
        person's hints."""
        return f"{OWNER_PREFIX}{self.matrix_app}"


OWNER_PREFIX = "matrix-gateway/"
"""The id of the principal owning a Matrix app's registrations, before the app id."""


def parse_route(matrix_app: str, value: str) -> AppRoute:
    """One entry as written (``provider[:app][@environment]``), unchecked."""
    spec, _, environment = value.partition("@")
    provider, _, app = spec.partition(":")
    return AppRoute(matrix_app, provider, app or None, environment or None)


def routes(config: Config) -> Mapping[str, AppRoute]:
    """Every entry of ``[matrix_gateway] apps``, checked against the provider blocks of
    ``[push]`` (``check-config``, ``push test``); empty when the gateway is not
    configured.

    Raises:
        ConfigError: listing every bad entry, each named by its key.
    """
    configured = {
        name: tuple(app for app, _key, _settings in e.apps(config.push) if app is not None)
        for name, e in PROVIDERS.items()
        if e.block(config.push) is not None
    }
    return routes_of(config.matrix_gateway, configured)


def routes_of(
    gateway: MatrixGatewayConfig | None, configured: Mapping[str, Sequence[str]]
) -> Mapping[str, AppRoute]:
    """:func:`routes` against the providers a node runs: ``configured`` maps each
    provider's name to its app ids (empty: its block's one app).

    Raises:
        ConfigError: listing every bad entry, each named by its key.
    """
    if gateway is None:
        return {}
    out: dict[str, AppRoute] = {}
    errors: list[str] = []
    for matrix_app, value in gateway.apps.items():
        route = parse_route(matrix_app, value)
        problem = _problem(route, configured)
        if problem is None:
            out[matrix_app] = route
        else:
            errors.append(f"matrix_gateway.apps.{json.dumps(matrix_app)}: {problem}")
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return out


def _problem(route: AppRoute, configured: Mapping[str, Sequence[str]]) -> str | None:
    entry = PROVIDERS.get(route.provider)
    if entry is None or entry.pushkey is None:
        takers = ", ".join(name for name, e in PROVIDERS.items() if e.pushkey is not None)
        return f"expected provider[:app][@environment] with a provider of {takers}"
    apps = configured.get(route.provider)
    if apps is None:
        return f"[push.{route.provider}] is not configured"
    if apps and route.app_id is None:
        return f"name one of [push.{route.provider}.apps] as {route.provider}:<app>"
    if route.app_id is not None and route.app_id not in apps:
        if not apps:
            return f"[push.{route.provider}] has no apps: give the provider alone"
        return f"{route.provider} has no app of that name in [push.{route.provider}.apps]"
    if route.environment is not None and route.environment not in entry.environments:
        if not entry.environments:
            return f"{route.provider} takes no @environment"
        return f"the environment is one of {', '.join(entry.environments)}"
    return None
