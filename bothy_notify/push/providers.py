"""The providers in one table: everything the rest of the daemon asks about one.

Each entry (:class:`ProviderEntry`) names a provider and says, by pointing into
its module, how its block is checked and built (per app), how a registration's
token or subscription is read and checked, what its rejections mean (the
token lifecycle's hints), whether its tokens move between people, and how a
topic-mode recipient gives it. The registration API, the OpenAPI enumerations,
``push test``, ``check-config``, topic-mode channels and the daemon's wiring all
read this table, so a new provider is its own module, one entry here, and its
tests (``docs/architecture.md``, "Adding a provider").

- :func:`check`: every app of every block, without connecting anywhere
  (``check-config``); errors name the app and key, ``secret:`` references not
  resolved yet are listed rather than checked.
- :func:`build`: the same checks, once, then one provider per app (its own
  provider token cache, connections and permits in
  :class:`~.registry.Providers`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TextIO

from bothy_notify.config import ConfigError, PushConfig, provider_apps
from bothy_notify.kernel.clock import Clock, SystemClock
from bothy_notify.push import apns, fake, fcm, matrix, webhook, webpush
from bothy_notify.push.port import (
    PushProvider,
    Refusal,
    Registrant,
    RegistrationChecker,
    TopicDelivery,
    Unresolved,
    plain_registrant,
    plain_topic_delivery,
)
from bothy_notify.push.registry import DEFAULT_APP, Providers
from bothy_notify.push.resolver import Resolver


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What building a provider may need besides its block."""

    clock: Clock
    dev: bool = False
    stdout: TextIO | None = None
    resolver: Resolver | None = None
    max_age: timedelta = timedelta(hours=1)


PushkeyRegistrant = Callable[[str, Mapping[str, Any] | None, str | None], Registrant | Refusal]
"""``(pushkey, data, environment)`` of a Matrix pusher -> what its registration stores."""


def _token_pushkey(
    pushkey: str, _data: Mapping[str, Any] | None, _env: str | None
) -> Registrant | Refusal:
    """A pushkey that is the device token itself (FCM, the fake provider)."""
    return plain_registrant({"token": pushkey})


@dataclass(frozen=True)
class ProviderEntry:
    """One provider of the table.

    Attributes:
        name: the registration's ``provider`` and the block's name (``[push.<name>]``).
        title: how messages name it.
        token_max: the longest token a registration may give (422 beyond).
        fields: the registration fields it takes beside ``provider``, ``app_id`` and
            ``environment``.
        registrant: reads and checks those fields (pure; a :class:`~.port.Refusal`
            names the bad field).
        prepare: checks one app's settings (``(settings, key)``), raising
            :class:`ConfigError` naming ``key`` or :class:`~.port.Unresolved`.
        build: the provider of one prepared app.
        has_apps: the block takes ``apps``.
        hints: what to check, by rejection reason; ``rejection_hint`` for the rest;
            ``mismatch_hint`` what ``push test`` says about a mismatch.
        explained: rejection reasons the provider logs itself.
        per_person: a token is scoped to its person (a webhook URL: each person
            registering it gets a registration of their own).
        moves: a token another person registered moves to the caller (a device
            changed hands); when false it is refused (409).
        topic_delivery: how a topic-mode recipient gives this channel (``None``:
            not a topic-mode channel); ``topic_refusal`` its later checks.
        pushkey: how a Matrix pusher gives this provider (``(pushkey, data,
            environment)``, the Matrix gateway's devices, SPEC section 14c);
            ``None``: a ``[matrix_gateway] apps`` entry may not name it.
        environments: the registration environments it knows; empty: it has none.
    """

    name: str
    title: str
    token_max: int
    fields: frozenset[str]
    registrant: Callable[[Mapping[str, Any]], Registrant | Refusal]
    prepare: Callable[[Any, str], Any]
    build: Callable[[Any, BuildContext], PushProvider]
    has_apps: bool = False
    hints: Mapping[str, str] = field(default_factory=dict)
    rejection_hint: str = ""
    mismatch_hint: str = ""
    explained: frozenset[str] = frozenset()
    per_person: bool = False
    moves: bool = True
    topic_delivery: Callable[[Mapping[str, Any]], TopicDelivery | None] | None = None
    topic_refusal: (
        Callable[
            [TopicDelivery, Callable[[str], Awaitable[tuple[str, str] | None]] | None],
            Awaitable[str | None],
        ]
        | None
    ) = None
    pushkey: PushkeyRegistrant | None = None
    environments: tuple[str, ...] = ()

    def block(self, push: PushConfig) -> Any | None:
        """Its configuration block, or ``None`` when it is not configured."""
        return getattr(push, self.name, None)

    def apps(self, push: PushConfig) -> list[tuple[str | None, str, Any]]:
        """(app id or ``None``, key, settings) of every app of its block (none when it
        is not configured)."""
        block = self.block(push)
        if block is None:
            return []
        if not self.has_apps:
            return [(None, f"push.{self.name}", block)]
        return [(a.app_id, a.key, a.settings) for a in provider_apps(self.name, block)]


_TOKEN = frozenset({"token"})

PROVIDERS: Mapping[str, ProviderEntry] = {
    e.name: e
    for e in (
        ProviderEntry(
            name="apns",
            title="APNs",
            token_max=apns.TOKEN_MAX,
            fields=_TOKEN,
            registrant=apns.registrant,
            prepare=apns.prepare,
            build=lambda setup, ctx: apns.build(setup, ctx.clock),
            has_apps=True,
            hints=apns.HINTS,
            rejection_hint=apns.REJECTION_HINT,
            mismatch_hint=apns.MISMATCH_HINT,
            topic_delivery=apns.topic_delivery,
            pushkey=apns.pushkey_registrant,
            environments=apns.ENVIRONMENTS,
        ),
        ProviderEntry(
            name="fcm",
            title="FCM",
            token_max=4096,
            fields=_TOKEN,
            registrant=plain_registrant,
            prepare=fcm.prepare,
            build=lambda setup, ctx: fcm.build(setup, ctx.clock),
            has_apps=True,
            hints=fcm.HINTS,
            rejection_hint=fcm.REJECTION_HINT,
            mismatch_hint=fcm.MISMATCH_HINT,
            topic_delivery=plain_topic_delivery,
            pushkey=_token_pushkey,
        ),
        ProviderEntry(
            name="webhook",
            title="webhook",
            token_max=webhook.TOKEN_MAX,
            fields=frozenset({"token", "signing_key"}),
            registrant=webhook.registrant,
            prepare=webhook.prepare,
            build=lambda settings, ctx: webhook.build(settings, ctx.clock, ctx.resolver),
            hints=webhook.HINTS,
            rejection_hint=webhook.REJECTION_HINT,
            explained=webhook.EXPLAINED,
            per_person=True,
            topic_delivery=webhook.topic_delivery,
            topic_refusal=webhook.topic_refusal,
        ),
        ProviderEntry(
            name="webpush",
            title="Web Push",
            token_max=webpush.TOKEN_MAX,
            fields=frozenset({"subscription"}),
            registrant=webpush.registrant,
            prepare=webpush.prepare,
            build=lambda setup, ctx: webpush.build(
                setup, ctx.clock, ttl=ctx.max_age, resolver=ctx.resolver
            ),
            has_apps=True,
            hints=webpush.HINTS,
            rejection_hint=webpush.REJECTION_HINT,
            explained=webpush.EXPLAINED,
            moves=False,
            pushkey=webpush.pushkey_registrant,
        ),
        ProviderEntry(
            name="matrix",
            title="Matrix gateway",
            token_max=matrix.TOKEN_MAX,
            fields=frozenset({"token", "gateway"}),
            registrant=matrix.registrant,
            prepare=matrix.prepare,
            build=lambda settings, ctx: matrix.build(settings, ctx.clock, ctx.resolver),
            hints=matrix.HINTS,
            rejection_hint=matrix.REJECTION_HINT,
            explained=matrix.EXPLAINED,
        ),
        ProviderEntry(
            name="fake",
            title="fake",
            token_max=fake.TOKEN_MAX,
            fields=_TOKEN,
            registrant=plain_registrant,
            prepare=fake.prepare,
            build=lambda settings, ctx: fake.build(settings, dev=ctx.dev, stdout=ctx.stdout),
            topic_delivery=plain_topic_delivery,
            pushkey=_token_pushkey,
        ),
    )
}
"""Every provider, in the order the OpenAPI document lists them."""

PROVIDER_NAMES: tuple[str, ...] = tuple(PROVIDERS)
REGISTRATION_FIELDS: frozenset[str] = frozenset().union(*(e.fields for e in PROVIDERS.values()))
"""Every provider-specific registration field (a field no provider takes is unknown)."""


def entry(name: str) -> ProviderEntry:
    """The entry of ``name``; a name outside the table (a provider a test injects)
    gets a plain-token entry of its own."""
    found = PROVIDERS.get(name)
    if found is not None:
        return found
    return ProviderEntry(
        name=name,
        title=name,
        token_max=4096,
        fields=_TOKEN,
        registrant=plain_registrant,
        prepare=fake.prepare,
        build=lambda settings, ctx: fake.build(settings, dev=ctx.dev, stdout=ctx.stdout),
    )


def topic_channels() -> tuple[str, ...]:
    """The providers a topic-mode recipient may choose as its channel."""
    return tuple(name for name, e in PROVIDERS.items() if e.topic_delivery is not None)


def configured(push: PushConfig) -> list[str]:
    """The names of the providers whose block is present."""
    return [name for name, e in PROVIDERS.items() if e.block(push) is not None]


def check(push: PushConfig) -> list[str]:
    """Check every app of every configured block without connecting anywhere.

    Raises :class:`ConfigError` listing every bad key (each named with its app:
    ``push.apns.apps.beta.key_id``), never a value. Returns the keys whose
    ``secret:`` reference is not resolved yet (``check-config`` has no database),
    so the caller can say they were not checked.
    """
    errors: list[str] = []
    skipped: list[str] = []
    for e in PROVIDERS.values():
        for _app, key, settings in e.apps(push):
            try:
                e.prepare(settings, key)
            except Unresolved as exc:
                skipped.append(exc.key)
            except ConfigError as exc:
                errors.append(str(exc))
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return skipped


def build(
    push: PushConfig,
    *,
    dev: bool,
    stdout: TextIO | None = None,
    clock: Clock | None = None,
    resolver: Resolver | None = None,
) -> dict[str, PushProvider | dict[str, PushProvider]]:
    """One provider per app of every configured block (``secret:`` references already
    resolved): a block without ``apps`` gives one provider, a block with apps a map
    of app id -> provider. Every block is checked before any client is made; raises
    :class:`ConfigError` naming the app and key."""
    ctx = BuildContext(
        clock=clock or SystemClock(),
        dev=dev,
        stdout=stdout,
        resolver=resolver,
        max_age=push.max_age,
    )
    prepared: list[tuple[ProviderEntry, str | None, Any]] = []
    errors: list[str] = []
    for e in PROVIDERS.values():
        for app, key, settings in e.apps(push):
            try:
                prepared.append((e, app, e.prepare(settings, key)))
            except Unresolved as exc:
                errors.append(f"{exc.key}: the secret was not resolved")
            except ConfigError as exc:
                errors.append(str(exc))
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    out: dict[str, PushProvider | dict[str, PushProvider]] = {}
    for e, app, setup in prepared:
        provider = e.build(setup, ctx)
        if app is None:
            out[e.name] = provider
        else:
            apps = out.setdefault(e.name, {})
            assert isinstance(apps, dict)
            apps[app] = provider
    return out


RegistrationCheck = Callable[..., Awaitable[tuple[str, str] | None]]
"""``(provider, app_id, token, secret=None) -> (field, problem) | None``: the API's
registration hook (``secret``: what the registration stores beside its token)."""


def registration_check(providers: Providers) -> RegistrationCheck:
    """The API hook that lets a provider vet a token at registration (a webhook's URL
    policy, a Web Push endpoint's allowed hosts), through the app's own provider."""

    async def check_token(
        provider: str, app_id: str | None, token: str, secret: str | None = None
    ) -> tuple[str, str] | None:
        found = providers.find(provider, app_id)
        if found is None:
            return None
        if isinstance(found, RegistrationChecker):
            return await found.check_registration(token, secret)
        return None

    return check_token


def configured_apps(providers: Providers) -> dict[str, tuple[str, ...]]:
    """Provider name -> its configured app ids (empty: one default app): what the
    API's OpenAPI document and registrations enumerate."""
    return {name: providers.apps(name) for name in sorted(providers.names)}


def vapid_keys(providers: Providers) -> dict[str, str]:
    """Web Push's VAPID public keys by app id (``""``: the one default app)."""
    out: dict[str, str] = {}
    for name, app, provider in providers.every():
        key = getattr(provider, "public_key", None)
        if name == "webpush" and isinstance(key, str):
            out["" if app == DEFAULT_APP and not providers.apps(name) else app] = key
    return out
