"""A gateway stand-in for tests that need live devices without WebSockets.

It implements the wiring's ``GatewayService`` protocol with the kernel's own
in-memory adapters: a :class:`StaticPresence` the test fills by hand and a
:class:`RecordingPublisher` that keeps every ``notification.created``.
"""

from __future__ import annotations

from typing import Any

import trio

from bothy_notify.kernel.ephemeral import RecordingPublisher
from bothy_notify.kernel.presence import PresenceEntry, StaticPresence


class FakeGateway:
    """Presence set by the test; published events recorded."""

    def __init__(self) -> None:
        self.presence = StaticPresence()
        self.publisher = RecordingPublisher()

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started("127.0.0.1:0")
        await trio.sleep_forever()

    async def close_all(self, code: int) -> None:
        await trio.lowlevel.checkpoint()

    def presence_lost(self) -> None:
        """Nothing to publish again: this stand-in shares no presence."""

    def readiness(self) -> dict[str, bool]:
        return {}

    def live(self, user: str, device: str, platform: str = "macos", *, idle: bool = False) -> None:
        """Make ``device`` of ``user`` live (no focus)."""
        self.presence.set(user, PresenceEntry(device, platform, frozenset(), idle))

    def hints_for(self, user: str) -> list[dict[str, Any]]:
        """Payloads of the ``notification.created`` events published to ``user``."""
        return [e.payload for e in self.publisher.events if e.audience == user]


def gateway_factory(gateway: FakeGateway) -> Any:
    """A ``gateway_factory`` for :func:`tests.harness.start_node` that returns ``gateway``."""

    def factory(**_collaborators: Any) -> FakeGateway:
        return gateway

    return factory
