"""The configured providers, each app with its own concurrency channel.

A provider is one app (a block without ``apps``) or several (``[push.<name>.apps.
<app_id>]``): a send goes to the app its registration's ``app_id`` names, and a
registration of a provider with apps whose ``app_id`` is none of them is
``rejected`` (``unknown_app``). Sends run at most ``push.max_in_flight`` at once
per app, so a stalled provider or app holds permits of its own channel only. A
send that outlives the safety bound is ``transient`` (each provider already
bounds every request to 10 s; the bound here catches a provider that would
not). A provider whose class sets ``bounds_every_send = True`` (APNs, FCM, Web
Push: libcurl's timer ends every request) goes without it: the extra cancel
scope per push was a measurable share of the CPU per push
(``docs/performance.md``).

A stop closes the door shortly before its drain period ends
(:meth:`Providers.stop_sending_at`): from then on :meth:`Providers.try_send`
starts no request, so the answers of the requests in flight are recorded
before the period is over instead of being cut off by it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta

import trio

from bothy_notify.push.port import Message, Outcome, PushProvider, Target
from bothy_notify.push.recent import RecentSends

SEND_BOUND = timedelta(seconds=30)
"""Longest a whole send may take: two 10 s requests (APNs token refresh) plus margin."""
DEFAULT_APP = "default"
"""The ``app`` label of a provider's one app when its block has no ``apps``."""


class UnknownProvider(Exception):
    """No provider of that name is configured."""


class _Channel:
    """One app of one provider: the provider object and its permits."""

    __slots__ = ("label", "limiter", "provider", "self_bounded")

    def __init__(self, provider: PushProvider, label: str, max_in_flight: int) -> None:
        self.provider = provider
        self.label = label
        self.limiter = trio.CapacityLimiter(max_in_flight)
        self.self_bounded = bool(getattr(provider, "bounds_every_send", False))


class Providers:
    """Routes a send to its provider's app through that app's limiter.

    Args:
        providers: provider name -> its provider object (one default app), or ->
            a map of app id -> provider object (its configured apps).
        max_in_flight: permits per app (``push.max_in_flight``).

    Every outcome is also counted in :attr:`recent` (the status page's sends of
    the last minutes), under the configured app id where the provider has apps
    (``None`` for a provider's one default app).
    """

    def __init__(
        self,
        providers: Mapping[str, PushProvider | Mapping[str, PushProvider]],
        *,
        max_in_flight: int,
    ) -> None:
        self._single: dict[str, _Channel] = {}
        self._apps: dict[str, dict[str, _Channel]] = {}
        self.recent = RecentSends()
        self._sending_until = math.inf
        for name, value in providers.items():
            if isinstance(value, Mapping):
                self._apps[name] = {
                    app: _Channel(p, app, max_in_flight) for app, p in value.items()
                }
            else:
                self._single[name] = _Channel(value, DEFAULT_APP, max_in_flight)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._single) | frozenset(self._apps)

    def apps(self, name: str) -> tuple[str, ...]:
        """The configured app ids of ``name`` (empty: one default app, or not configured)."""
        return tuple(self._apps.get(name, {}))

    def find(self, name: str, app_id: str | None = None) -> PushProvider | None:
        """The provider object a registration of ``name`` with ``app_id`` goes to."""
        channel = self._channel(name, app_id)
        return channel.provider if channel is not None else None

    def get(self, name: str, app_id: str | None = None) -> PushProvider:
        """Like :meth:`find`; a provider with apps and no ``app_id`` gives its first app.
        Raises :class:`UnknownProvider`."""
        apps = self._apps.get(name)
        if apps and app_id is None:
            return next(iter(apps.values())).provider
        found = self.find(name, app_id)
        if found is None:
            raise UnknownProvider(name)
        return found

    def every(self) -> list[tuple[str, str, PushProvider]]:
        """(provider, app label, provider object) of every channel."""
        out = [(name, c.label, c.provider) for name, c in self._single.items()]
        for name, apps in self._apps.items():
            out.extend((name, app, c.provider) for app, c in apps.items())
        return out

    def _channel(self, name: str, app_id: str | None) -> _Channel | None:
        single = self._single.get(name)
        if single is not None:
            return single
        apps = self._apps.get(name)
        if apps is None or app_id is None:
            return None
        return apps.get(app_id)

    def app_label(self, target: Target) -> str:
        """The ``app`` metric label of a send: a configured app id, ``default`` for a
        provider's one app, ``unknown`` otherwise (never a value from the request)."""
        channel = self._channel(target.provider, target.app_id)
        return channel.label if channel is not None else "unknown"

    def statistics(self) -> dict[str, int]:
        """Sends in flight per provider (all its apps)."""
        out = {name: int(c.limiter.borrowed_tokens) for name, c in self._single.items()}
        for name, apps in self._apps.items():
            out[name] = sum(int(c.limiter.borrowed_tokens) for c in apps.values())
        return out

    def app_statistics(self) -> dict[tuple[str, str], int]:
        """Sends in flight per (provider, app label)."""
        out = {(name, c.label): int(c.limiter.borrowed_tokens) for name, c in self._single.items()}
        for name, apps in self._apps.items():
            out.update({(name, app): int(c.limiter.borrowed_tokens) for app, c in apps.items()})
        return out

    def stop_sending_at(self, when: float) -> None:
        """From Trio time ``when`` on, :meth:`try_send` starts no request (it answers
        ``None``, as when no permit frees): a stop's last moments are left to
        recording what was sent. :meth:`send` is not affected."""
        self._sending_until = when

    async def send(self, target: Target, message: Message) -> Outcome:
        """Send through the target's provider; an unconfigured provider or app is
        ``rejected``. Waits for a permit of the app's channel as long as it takes.
        """
        outcome = await self._route(target, message, math.inf, gated=False)
        assert outcome is not None
        return outcome

    async def try_send(
        self, target: Target, message: Message, *, permit_wait: float
    ) -> Outcome | None:
        """Like :meth:`send`, but ``None`` when no permit frees within ``permit_wait`` s,
        or when sending has stopped (:meth:`stop_sending_at`).

        The job runner uses this so that jobs of a stalled provider go back to
        the queue instead of holding the runner's slots, which every provider shares.
        """
        return await self._route(target, message, permit_wait, gated=True)

    def _stopped(self, gated: bool) -> bool:
        return gated and trio.current_time() >= self._sending_until

    async def _route(
        self, target: Target, message: Message, permit_wait: float, *, gated: bool
    ) -> Outcome | None:
        if self._stopped(gated):
            return None
        app: str | None = None
        channel = self._single.get(target.provider)
        if channel is None:
            apps = self._apps.get(target.provider)
            if apps is None:
                return self._recorded(
                    target.provider, None, Outcome.rejected("provider_not_configured")
                )
            found = apps.get(target.app_id) if target.app_id is not None else None
            if found is None:
                return self._recorded(target.provider, None, Outcome.rejected("unknown_app"))
            channel, app = found, found.label
        outcome = await self._send_on(channel, target, message, permit_wait, gated)
        if outcome is not None:
            self.recent.record(target.provider, app, outcome.kind.value, outcome.reason)
        return outcome

    def _recorded(self, provider: str, app: str | None, outcome: Outcome) -> Outcome:
        self.recent.record(provider, app, outcome.kind.value, outcome.reason)
        return outcome

    async def _send_on(
        self, channel: _Channel, target: Target, message: Message, permit_wait: float, gated: bool
    ) -> Outcome | None:
        limiter = channel.limiter
        try:
            limiter.acquire_nowait()  # the common case: a permit is free, no deadline needed
        except trio.WouldBlock:
            with trio.move_on_after(permit_wait) as waiting:
                await limiter.acquire()
            if waiting.cancelled_caught:
                return None
            if self._stopped(gated):
                limiter.release()
                return None
        try:
            if channel.self_bounded:
                return await channel.provider.send(target, message)
            with trio.move_on_after(SEND_BOUND.total_seconds()):
                return await channel.provider.send(target, message)
            # The provider did not keep its own bound: nothing is known about the token.
            return Outcome.transient("timeout", ours=True)
        finally:
            limiter.release()

    async def aclose(self) -> None:
        for _name, _app, provider in self.every():
            await provider.aclose()

    def __repr__(self) -> str:
        return f"Providers({sorted(self.names)})"
