"""The gateway as a service of the daemon: ``build_gateway`` and :class:`Gateway`.

The daemon (``bothy_notify.wiring``) calls :func:`build_gateway` with its
collaborators, starts :meth:`Gateway.run` in its nursery (which answers with
the bound ``host:port``), hands :attr:`Gateway.presence` to the consumer round
and :attr:`Gateway.publisher` to ``notify.gateway_send``, and calls
:meth:`Gateway.close_all` with 1001 when it shuts down.

Tasks: one listener (accepting WebSocket connections on
``ws://{server.gateway_listen}/v1/gateway``), one revocation listener (revoked
devices and deactivated people), one expiry watch (tokens past ``exp``), one
timeout watch (identify and heartbeat timeouts), in a cluster
(``cluster.mode = "multi"``, a ``node_id`` given) the shared presence
publisher, and per connection the session (which also reads the socket) and,
while frames wait for a socket that is full, its writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import trio

from bothy_notify.auth import TokenVerifier
from bothy_notify.config import Config, PushConfig
from bothy_notify.kernel.clock import Clock, SystemClock
from bothy_notify.kernel.ephemeral import EphemeralPublisher
from bothy_notify.kernel.instrument import Instrument
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import PresenceView
from bothy_notify.kernel.supervise import Supervised
from bothy_notify.store import marks
from bothy_notify.store.db import Database
from bothy_notify.store.marks import Clearing
from gateway.closes import SHUTDOWN, Close, CloseCode
from gateway.expiry import ExpiryWatch
from gateway.hub import Hub
from gateway.identifies import IdentifyBatches
from gateway.limits import Cooldowns, PendingConnections
from gateway.presence import HubPresence
from gateway.publisher import HubPublisher
from gateway.reads import ReadListener
from gateway.revocations import RevocationListener
from gateway.session import QueueWriter, SessionContext, SessionSettings, serve_session
from gateway.shared_presence import SharedPresencePublisher
from gateway.timeouts import Timeouts
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
        node_id: this node's id in a cluster: its presence is shared through
            the database (``None``: a single node, nothing is shared).
        clock: the injected clock; tokens expire on it, and it stamps the shared
            presence rows of a cluster.
        reuse_port: bind ``server.gateway_listen`` with ``SO_REUSEPORT``: one of
            the node processes of ``server.processes`` sharing the port.
        instrument: told of published and written frames
            (:mod:`bothy_notify.kernel.instrument`).

    Attributes:
        hub: the connections of this node.
        presence: the presence view over the hub (for the consumer round).
        publisher: the ephemeral publisher over the hub (for ``notify.gateway_send``).
        shared: the shared presence publisher (a cluster), else ``None``.
    """

    def __init__(
        self,
        *,
        config: Config,
        db: Database,
        metrics: Metrics,
        verifier: TokenVerifier,
        database_url: str,
        node_id: str | None = None,
        clock: Clock | None = None,
        reuse_port: bool = False,
        instrument: Instrument | None = None,
    ) -> None:
        sync = config.sync
        self._listen = config.server.gateway_listen
        self._reuse_port = reuse_port
        self._max_frame_bytes = sync.max_frame_bytes
        self._handshake_timeout = sync.identify_timeout.total_seconds()
        self.hub = Hub(
            metrics=metrics,
            outbound_queue_max=sync.outbound_queue_max,
            max_connections_per_person=sync.max_connections_per_person,
        )
        self._pending = PendingConnections(sync.max_unidentified_connections)
        # Connections dropped during the upgrade count as closed with 4008; after
        # hello the hub's close counts them.
        self._dropped = metrics.gateway_closed.labels(str(int(CloseCode.OVER_LIMIT))).inc
        self._expiry = ExpiryWatch(
            hub=self.hub, clock=clock or SystemClock(), leeway=verifier.leeway
        )
        self.presence: PresenceView = HubPresence(self.hub)
        self.publisher: EphemeralPublisher = HubPublisher(
            hub=self.hub, db=db, instrument=instrument
        )
        self.shared: SharedPresencePublisher | None = None
        if node_id is not None:
            self.shared = SharedPresencePublisher(
                hub=self.hub,
                db=db,
                node_id=node_id,
                clock=clock or SystemClock(),
                metrics=metrics,
                wait_limit=config.cluster.node_timeout.total_seconds(),
            )
        settings = SessionSettings(
            heartbeat_ms=round(sync.heartbeat.total_seconds() * 1000),
            identify_timeout=sync.identify_timeout.total_seconds(),
            write_timeout=sync.write_timeout.total_seconds(),
            max_focused_threads=sync.max_focused_threads,
            ops_per_second=sync.ops_per_second,
            ops_burst=sync.ops_burst,
        )
        self._settings = settings
        self._timeouts = Timeouts(
            hub=self.hub,
            identify_timeout=settings.identify_timeout,
            heartbeat_timeout=settings.heartbeat_timeout,
        )
        self._identifies = IdentifyBatches(db)
        self._context = SessionContext(
            hub=self.hub,
            db=db,
            verifier=verifier,
            settings=settings,
            writer=QueueWriter(
                hub=self.hub,
                write_timeout=sync.write_timeout.total_seconds(),
                delivery=metrics.delivery_seconds.labels("gateway"),
                instrument=instrument,
            ),
            expiry=self._expiry,
            timeouts=self._timeouts,
            identifies=self._identifies,
            cooldowns=Cooldowns(),
            rate_limited=metrics.gateway_rate_limited.inc,
            presence_published=self.shared.wait_published if self.shared else None,
            clearing=partial(_clearing, config.push, clock or SystemClock()),
        )
        self._revocations = RevocationListener(
            database_url=database_url,
            hub=self.hub,
            retry_interval=config.notify.poll_interval,
            node_id=node_id,
            timeouts=db.timeouts,
        )
        self._reads = ReadListener(
            database_url=database_url,
            hub=self.hub,
            db=db,
            publisher=self.publisher,
            clock=clock or SystemClock(),
            badge=config.push.badge,
            retry_interval=config.notify.poll_interval,
        )
        # Each long-running task of the gateway is restarted with backoff should it ever
        # fail, without taking the gateway (or the node) down; /readyz reports each.
        self._services = [
            Supervised("revocations", self._revocations.run, metrics=metrics),
            Supervised("reads", self._reads.run, metrics=metrics),
            Supervised("expiry", self._expiry.run, metrics=metrics),
            Supervised("timeouts", self._timeouts.run, metrics=metrics),
            Supervised("identify", self._identifies.run, metrics=metrics),
        ]
        if self.shared is not None:
            self._services.append(Supervised("presence", self.shared.run, metrics=metrics))

    def __repr__(self) -> str:
        return f"Gateway({self.hub!r})"

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen for revocations, watch token expiry (and, in a cluster, publish
        presence), then accept connections until cancelled.

        ``task_status.started`` receives the bound ``host:port`` once all are
        in effect. Cancellation cancels every connection (use
        :meth:`close_all` first for a graceful close).
        """
        async with trio.open_nursery() as nursery:
            for service in self._services:
                await nursery.start(service.run)
            address: str = await nursery.start(
                partial(
                    serve_websockets,
                    self._listen,
                    partial(serve_session, ctx=self._context),
                    path=PATH,
                    max_frame_bytes=self._max_frame_bytes,
                    handshake_timeout=self._handshake_timeout,
                    pending=self._pending,
                    ops_per_second=self._settings.ops_per_second,
                    ops_burst=self._settings.ops_burst,
                    on_dropped=self._dropped,
                    reuse_port=self._reuse_port,
                )
            )
            task_status.started(address)

    def readiness(self) -> Mapping[str, bool]:
        """``/readyz`` checks of the gateway: each of its services is up; the
        revocation and read listeners are connected; (in a cluster) the presence
        publisher's last write succeeded."""
        checks = {service.name: service.up for service in self._services}
        checks["revocations"] &= self._revocations.listener.connected
        checks["reads"] &= self._reads.listener.connected
        if self.shared is not None:
            checks["presence"] &= self.shared.healthy
        return checks

    async def close_all(self, code: int) -> None:
        """Close every connection with ``code`` (1001 at shutdown) and refuse new ones.

        Returns once every connection has ended; bound it with a cancel scope
        (the daemon uses ``server.drain_period``).
        """
        self.hub.close_all(SHUTDOWN if code == SHUTDOWN.code else Close(code, "closed"))
        await self.hub.wait_empty()

    def presence_lost(self) -> None:
        """This node's shared presence rows are gone (the registry found its row
        missing): publish every connection's presence again. No-op on a single node."""
        if self.shared is not None:
            self.shared.publish_all()


def build_gateway(
    *,
    config: Config,
    db: Database,
    clock: Any,
    metrics: Metrics,
    verifier: TokenVerifier,
    database_url: str,
    node_id: str | None = None,
    reuse_port: bool = False,
    instrument: Instrument | None = None,
) -> Gateway:
    """The daemon's gateway factory (``bothy_notify.wiring.GatewayFactory``).

    ``clock`` times token expiry and stamps the shared presence rows of a
    cluster (``node_id`` given); the gateway's other timers bound network
    waits with Trio cancel scopes, and delivery latency is measured against
    the event's append time on the wall clock.
    """
    return Gateway(
        config=config,
        db=db,
        metrics=metrics,
        verifier=verifier,
        database_url=database_url,
        node_id=node_id,
        clock=clock,
        reuse_port=reuse_port,
        instrument=instrument,
    )


def _clearing(config: PushConfig, clock: Clock) -> Clearing | None:
    """How a ``read`` op queues its clears, now."""
    return marks.clearing_of(config, clock.now())
