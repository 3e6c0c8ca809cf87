"""Build the configured providers: a provider exists exactly when its block does.

Credentials are checked here, at startup: a missing or malformed APNs key, key
id, team id or bundle id, or FCM service account, fails with a
:class:`~bothy_notify.config.ConfigError` naming the key, never its value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TextIO

from bothy_notify.config import PushConfig
from bothy_notify.kernel.clock import Clock, SystemClock
from bothy_notify.push.apns import ApnsProvider, load_credentials
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.fcm import FcmProvider, load_service_account
from bothy_notify.push.port import PushProvider, RegistrationChecker
from bothy_notify.push.registry import Providers, UnknownProvider
from bothy_notify.push.resolver import Resolver
from bothy_notify.push.transport import check_https_url, ssl_context
from bothy_notify.push.webhook import WebhookProvider, check_proxy_url

RegistrationCheck = Callable[[str, str], Awaitable[tuple[str, str] | None]]
"""``(provider, token) -> (field, problem) | None``: the API's registration hook."""


def check_providers(config: PushConfig) -> list[str]:
    """Check every configured provider block without connecting anywhere.

    Raises :class:`~bothy_notify.config.ConfigError` naming the first bad key
    (never its value). A credential given as ``secret:NAME`` that is not
    resolved yet (``check-config`` has no database) is skipped; the keys
    skipped are returned so the caller can say so.
    """
    skipped: list[str] = []
    if config.apns is not None:
        if config.apns.key.is_resolved:
            load_credentials(config.apns)
        else:
            skipped.append("push.apns.key")
        if config.apns.endpoint:
            check_https_url(config.apns.endpoint, key="push.apns.endpoint")
        ssl_context(config.apns.ca_file, key="push.apns.ca_file")
    if config.fcm is not None:
        if config.fcm.service_account.is_resolved:
            load_service_account(config.fcm.service_account.reveal())
        else:
            skipped.append("push.fcm.service_account")
        if config.fcm.endpoint:
            check_https_url(config.fcm.endpoint, key="push.fcm.endpoint")
        ssl_context(config.fcm.ca_file, key="push.fcm.ca_file")
    if config.webhook is not None:
        check_proxy_url(config.webhook.endpoint)
        ssl_context(config.webhook.ca_file, key="push.webhook.ca_file")
    return skipped


def build_providers(
    config: PushConfig,
    *,
    dev: bool,
    stdout: TextIO | None = None,
    clock: Clock | None = None,
    resolver: Resolver | None = None,
) -> dict[str, PushProvider]:
    """One provider per configured block.

    Args:
        config: ``push.*`` with ``secret:`` references already resolved.
        dev: development mode (the fake provider prints its sends).
        stdout: where the fake provider prints.
        clock: the injected clock (provider token ages, webhook timestamps).
        resolver: webhook name resolution (the system's by default).

    Raises :class:`ConfigError` naming the key when a block cannot be used.
    """
    check_providers(config)  # every block is checked before any client is made
    clock = clock or SystemClock()
    providers: dict[str, PushProvider] = {}
    if config.fake is not None:
        providers["fake"] = FakeProvider(
            record_file=config.fake.record_file, echo=dev, stream=stdout
        )
    if config.apns is not None:
        providers["apns"] = ApnsProvider.from_config(config.apns, clock=clock)
    if config.fcm is not None:
        providers["fcm"] = FcmProvider.from_config(config.fcm, clock=clock)
    if config.webhook is not None:
        providers["webhook"] = WebhookProvider.from_config(
            config.webhook, clock=clock, resolver=resolver
        )
    return providers


def registration_check(providers: Providers) -> RegistrationCheck:
    """The API hook that lets a provider vet a token at registration (webhook URLs)."""

    async def check(provider: str, token: str) -> tuple[str, str] | None:
        try:
            found = providers.get(provider)
        except UnknownProvider:
            return None
        if isinstance(found, RegistrationChecker):
            return await found.check_registration(token)
        return None

    return check
