"""The configured providers, each with its own concurrency channel.

Sends run at most ``push.max_in_flight`` at once per provider, so a stalled
provider holds permits of its own channel only. A send that outlives the
safety bound is ``transient`` (each provider already bounds every request to
10 s; the bound here catches a provider that would not). A provider whose
class sets ``bounds_every_send = True`` (APNs and FCM: libcurl's timer ends
every request) goes without it: the extra cancel scope per push was a
measurable share of the CPU per push (``docs/performance.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import timedelta

import trio

from bothy_notify.push.port import Message, Outcome, PushProvider, Target
from bothy_notify.push.recent import RecentSends

SEND_BOUND = timedelta(seconds=30)
"""Longest a whole send may take: two 10 s requests (APNs token refresh) plus margin."""


class UnknownProvider(Exception):
    """No provider of that name is configured."""


class Providers:
    """Routes a send to its provider through that provider's limiter.

    Every outcome is also counted in :attr:`recent` (the status page's sends of
    the last minutes); ``app_of`` names the configured app of a target, where
    its provider has one (``None`` otherwise).
    """

    def __init__(
        self,
        providers: Mapping[str, PushProvider],
        *,
        max_in_flight: int,
        app_of: Callable[[Target], str | None] | None = None,
    ) -> None:
        self._providers = dict(providers)
        self.recent = RecentSends()
        self._app_of = app_of
        self._limiters = {name: trio.CapacityLimiter(max_in_flight) for name in self._providers}
        self._self_bounded = frozenset(
            name for name, p in self._providers.items() if getattr(p, "bounds_every_send", False)
        )

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._providers)

    def get(self, name: str) -> PushProvider:
        try:
            return self._providers[name]
        except KeyError:
            raise UnknownProvider(name) from None

    def statistics(self) -> dict[str, int]:
        """Sends in flight per provider."""
        return {name: int(lim.borrowed_tokens) for name, lim in self._limiters.items()}

    async def send(self, target: Target, message: Message) -> Outcome:
        """Send through the target's provider; an unconfigured provider is ``rejected``.

        Waits for a permit of the provider's channel as long as it takes.
        """
        outcome = await self.try_send(target, message, permit_wait=math.inf)
        assert outcome is not None
        return outcome

    async def try_send(
        self, target: Target, message: Message, *, permit_wait: float
    ) -> Outcome | None:
        """Like :meth:`send`, but ``None`` when no permit frees within ``permit_wait`` s.

        The job runner uses this so that jobs of a stalled provider go back to
        the queue instead of holding the runner's slots, which every provider shares.
        """
        outcome = await self._try_send(target, message, permit_wait)
        if outcome is not None:
            app = self._app_of(target) if self._app_of is not None else None
            self.recent.record(target.provider, app, outcome.kind.value, outcome.reason)
        return outcome

    async def _try_send(
        self, target: Target, message: Message, permit_wait: float
    ) -> Outcome | None:
        provider = self._providers.get(target.provider)
        if provider is None:
            return Outcome.rejected("provider_not_configured")
        limiter = self._limiters[target.provider]
        try:
            limiter.acquire_nowait()  # the common case: a permit is free, no deadline needed
        except trio.WouldBlock:
            with trio.move_on_after(permit_wait) as waiting:
                await limiter.acquire()
            if waiting.cancelled_caught:
                return None
        try:
            if target.provider in self._self_bounded:
                return await provider.send(target, message)
            with trio.move_on_after(SEND_BOUND.total_seconds()):
                return await provider.send(target, message)
            # The provider did not keep its own bound: nothing is known about the token.
            return Outcome.transient("timeout", ours=True)
        finally:
            limiter.release()

    async def aclose(self) -> None:
        for provider in self._providers.values():
            await provider.aclose()

    def __repr__(self) -> str:
        return f"Providers({sorted(self._providers)})"
