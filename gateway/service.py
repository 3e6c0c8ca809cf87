"""The gateway as a service of the daemon: ``build_gateway`` and :class:`Gateway`.

The daemon (``bothy_notify.wiring``) calls :func:`build_gateway` with its
collaborators, starts :meth:`Gateway.run` in its nursery (which answers with
the bound ``host:port``), hands :attr:`Gateway.presence` to the consumer round
and :attr:`Gateway.publisher` to ``notify.gateway_send``, and calls
:meth:`Gateway.close_all` with 1001 when it shuts down.

Tasks: one listener (accepting WebSocket connections on
``ws://{server.gateway_listen}/v1/gateway``), one revocation listener, and per
connection the library's reader, the session and its writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import trio

from bothy_notify.auth import TokenVerifier
from bothy_notify.config import Config
from bothy_notify.kernel.ephemeral import EphemeralPublisher
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import PresenceView
from bothy_notify.kernel.supervise import Supervised
from bothy_notify.store.db import Database
from gateway.hub import Hub
from gateway.presence import HubPresence
from gateway.protocol import SHUTDOWN, Close
from gateway.publisher import HubPublisher
from gateway.revocations import RevocationListener
from gateway.session import QueueWriter, SessionContext, SessionSettings, serve_session
from gateway.transport import serve_websockets

PATH = "/v1/gateway"
"""The one path the gateway serves (SPEC section 8)."""


class Gateway:
    """The WebSocket gateway of one node (satisfies ``bothy_notify.wiring.GatewayService``).

    Args:
        config: the daemon's configuration (``server.gateway_listen``, ``sync.*``).
        db: the pool (device rows, unread snapshot, focus and read ops, admission).
        metrics: the registry.
        verifier: verifies identify tokens exactly as the HTTP API does.
        database_url: for the dedicated revocation ``LISTEN`` connection.

    Attributes:
        hub: the connections of this node.
        presence: the presence view over the hub (for the consumer round).
        publisher: the ephemeral publisher over the hub (for ``notify.gateway_send``).
    """

    def __init__(
        self,
        *,
        config: Config,
        db: Database,
        metrics: Metrics,
        verifier: TokenVerifier,
        database_url: str,
    ) -> None:
        sync = config.sync
        self._listen = config.server.gateway_listen
        self._max_frame_bytes = sync.max_frame_bytes
        self._handshake_timeout = sync.identify_timeout.total_seconds()
        self.hub = Hub(metrics=metrics, outbound_queue_max=sync.outbound_queue_max)
        self.presence: PresenceView = HubPresence(self.hub)
        self.publisher: EphemeralPublisher = HubPublisher(hub=self.hub, db=db)
        self._context = SessionContext(
            hub=self.hub,
            db=db,
            verifier=verifier,
            settings=SessionSettings(
                heartbeat_ms=round(sync.heartbeat.total_seconds() * 1000),
                identify_timeout=sync.identify_timeout.total_seconds(),
                write_timeout=sync.write_timeout.total_seconds(),
                max_focused_threads=sync.max_focused_threads,
            ),
            writer=QueueWriter(
                hub=self.hub,
                write_timeout=sync.write_timeout.total_seconds(),
                delivery=metrics.delivery_seconds.labels("gateway"),
            ),
        )
        self._revocations = RevocationListener(
            database_url=database_url, hub=self.hub, retry_interval=config.notify.poll_interval
        )
        # Restarted with backoff should it ever fail, without taking the gateway down.
        self._revocations_service = Supervised(
            "revocations", self._revocations.run, metrics=metrics
        )

    def __repr__(self) -> str:
        return f"Gateway({self.hub!r})"

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen for revocations, then accept connections until cancelled.

        ``task_status.started`` receives the bound ``host:port`` once both are
        in effect. Cancellation cancels every connection (use
        :meth:`close_all` first for a graceful close).
        """
        async with trio.open_nursery() as nursery:
            await nursery.start(self._revocations_service.run)
            address: str = await nursery.start(
                partial(
                    serve_websockets,
                    self._listen,
                    partial(serve_session, ctx=self._context),
                    path=PATH,
                    max_frame_bytes=self._max_frame_bytes,
                    handshake_timeout=self._handshake_timeout,
                )
            )
            task_status.started(address)

    def readiness(self) -> Mapping[str, bool]:
        """``/readyz`` checks of the gateway: its revocation listener is up."""
        return {"revocations": self._revocations_service.up}

    async def close_all(self, code: int) -> None:
        """Close every connection with ``code`` (1001 at shutdown) and refuse new ones.

        Returns once every connection has ended; bound it with a cancel scope
        (the daemon uses ``server.drain_period``).
        """
        self.hub.close_all(SHUTDOWN if code == SHUTDOWN.code else Close(code, "closed"))
        await self.hub.wait_empty()


def build_gateway(
    *,
    config: Config,
    db: Database,
    clock: Any,
    metrics: Metrics,
    verifier: TokenVerifier,
    database_url: str,
) -> Gateway:
    """The daemon's gateway factory (``bothy_notify.wiring.GatewayFactory``).

    ``clock`` is part of the factory's contract and not needed here: the
    gateway's timers bound network waits with Trio cancel scopes, and delivery
    latency is measured against the event's append time on the wall clock.
    """
    del clock
    return Gateway(
        config=config, db=db, metrics=metrics, verifier=verifier, database_url=database_url
    )
