"""Roles -> the nursery tree of one node.

The role table (also in ``docs/architecture.md``) says which parts run and
which implementation each port gets; nothing else in the code asks for the
role:

========  ======================  ==================  ============  ===============  ===========
role      HTTP API                round + job runner  presence      live routes      publisher
========  ======================  ==================  ============  ===============  ===========
all       full + gateway          yes                 the hub's     real (jobs)      the hub
worker    operator endpoints      yes                 nobody        fail-closed      none
api       full + gateway          no                  -             -                -
========  ======================  ==================  ============  ===============  ===========
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Literal, Protocol, TextIO

import trio

from bothy_notify.api.app import build_app, serve_api
from bothy_notify.api.context import ApiContext
from bothy_notify.auth import TokenVerifier
from bothy_notify.config import Config, Role, resolve_store_secrets, store_secret_names
from bothy_notify.housekeeping import Housekeeper
from bothy_notify.kernel.clock import Clock, SystemClock
from bothy_notify.kernel.ephemeral import EphemeralPublisher
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import NoPresence, PresenceView
from bothy_notify.notify.catalogue import Catalogue
from bothy_notify.notify.jobs.flush import FlushHandler
from bothy_notify.notify.jobs.gateway_send import GatewaySendHandler
from bothy_notify.notify.jobs.push_send import PushSendHandler
from bothy_notify.notify.kinds_dir import LiveCatalogue
from bothy_notify.notify.planner import RoundOutcome
from bothy_notify.notify.round import ConsumerRound
from bothy_notify.notify.routes import FailClosedRoutes, JobLiveRoutes, LiveRoutes
from bothy_notify.push.factory import build_providers, registration_check
from bothy_notify.push.port import PushProvider
from bothy_notify.push.registry import Providers
from bothy_notify.runner import JobHandler, JobRunner
from bothy_notify.store import secrets as secret_store
from bothy_notify.store.db import Database, connect_dedicated
from bothy_notify.store.embedded import EmbeddedPostgres
from bothy_notify.store.events import EventValidator
from bothy_notify.store.migrate import migrate
from bothy_notify.topics.send import TopicPushHandler

log = logging.getLogger("bothy.wiring")


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What one role runs and which implementation each port gets."""

    http: Literal["full", "operator"]
    gateway: bool
    round_and_runner: bool
    presence: Literal["hub", "nobody"] | None
    live_routes: Literal["jobs", "fail_closed"] | None
    publisher: Literal["hub"] | None


ROLE_TABLE: Mapping[Role, RoleSpec] = {
    Role.ALL: RoleSpec("full", True, True, "hub", "jobs", "hub"),
    Role.WORKER: RoleSpec("operator", False, True, "nobody", "fail_closed", None),
    Role.API: RoleSpec("full", True, False, None, None, None),
}


class GatewayService(Protocol):
    """What the wiring needs from the gateway package (implemented in :mod:`gateway`)."""

    presence: PresenceView
    publisher: EphemeralPublisher

    async def run(self, *, task_status: trio.TaskStatus[str] = ...) -> None: ...

    async def close_all(self, code: int) -> None: ...


GatewayFactory = Callable[..., GatewayService]


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    """Where this node listens (``None`` for parts it does not run)."""

    api: str | None
    gateway: str | None


class Daemon:
    """One node of Bothy Notify, wired for its role.

    Args:
        config: the loaded configuration (``secret:`` references resolved at start).
        clock: the injected clock (tests pass a :class:`FakeClock`).
        database_url: overrides ``database.url`` (tests).
        providers: overrides the configured providers (tests, benchmarks).
        metrics: the registry (a new one by default).
        stdout: where dev-mode output goes.
        before_commit: test seam of the consumer round.

    Raises:
        ConfigError: ``notify.kinds`` is invalid or ``notify.kinds_dir`` is not a
            directory; the message names the key. (A bad file in the kinds
            directory does not stop the daemon: it is reported, see
            :mod:`bothy_notify.notify.kinds_dir`.)
    """

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        database_url: str | None = None,
        providers: Mapping[str, PushProvider] | None = None,
        metrics: Metrics | None = None,
        stdout: TextIO | None = None,
        before_commit: Callable[[RoundOutcome], None] | None = None,
        gateway_factory: GatewayFactory | None = None,
    ) -> None:
        self.config = config
        self.spec = ROLE_TABLE[config.server.role]
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.live_catalogue = LiveCatalogue(config.notify, metrics=self.metrics)
        self._database_url = database_url
        self._providers_override = providers
        self._stdout = stdout
        self._before_commit = before_commit
        self._gateway_factory = gateway_factory
        self._shutdown = trio.Event()
        self.db: Database | None = None
        self.providers: Providers | None = None
        self.round: ConsumerRound | None = None
        self.runner: JobRunner | None = None
        self.gateway: GatewayService | None = None
        self.housekeeper: Housekeeper | None = None
        self._round_running = False

    def __repr__(self) -> str:
        return f"Daemon(role={self.config.server.role.value!r})"

    @property
    def catalogue(self) -> Catalogue:
        """The kind catalogue in use, as of its last refresh (no IO)."""
        return self.live_catalogue.current()

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (SIGINT/SIGTERM)."""
        self._shutdown.set()

    async def run(
        self, *, task_status: trio.TaskStatus[NodeAddresses] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start every part of the role, then run until :meth:`request_shutdown`.

        Shutdown: stop claiming jobs, let running jobs finish within
        ``server.drain_period``, close gateway connections with 1001, stop
        serving HTTP, then cancel the rest. Jobs not finished are given back.
        """
        embedded: EmbeddedPostgres | None = None
        url = self._database_url
        if url is None and self.config.database.url is not None:
            url = self.config.database.url.reveal()
        if url is None:
            embedded = EmbeddedPostgres(self.config.database.data_dir)
            url = await trio.to_thread.run_sync(embedded.start)
        try:
            await self._serve(url, task_status)
        finally:
            if embedded is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(embedded.stop)

    async def _serve(self, url: str, task_status: trio.TaskStatus[NodeAddresses]) -> None:
        config = await trio.to_thread.run_sync(_prepare_database, url, self.config)
        self.config = config
        db = self.db = Database(url, pool_size=config.database.pool_size)
        await db.open()
        providers = self.providers = Providers(
            self._providers_override
            if self._providers_override is not None
            else build_providers(
                config.push, dev=config.server.dev, stdout=self._stdout, clock=self.clock
            ),
            max_in_flight=config.push.max_in_flight,
        )
        spec = self.spec
        api_shutdown = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                presence: PresenceView = NoPresence()
                publisher: EphemeralPublisher | None = None
                gateway_address: str | None = None
                if spec.gateway and self._gateway_factory is not None:
                    self.gateway = self._gateway_factory(
                        config=config,
                        db=db,
                        clock=self.clock,
                        metrics=self.metrics,
                        verifier=TokenVerifier(config.auth),
                        database_url=url,
                    )
                    gateway_address = await nursery.start(self.gateway.run)
                    if spec.presence == "hub":
                        presence = self.gateway.presence
                    if spec.publisher == "hub":
                        publisher = self.gateway.publisher
                if spec.round_and_runner:
                    live: LiveRoutes = (
                        JobLiveRoutes(push_max_attempts=config.push.max_attempts)
                        if spec.live_routes == "jobs" and publisher is not None
                        else FailClosedRoutes()
                    )
                    if isinstance(live, FailClosedRoutes):
                        log.info(
                            "no presence on this node: hints go by push only",
                            extra={"role": config.server.role.value},
                        )
                    await self._start_jobs(nursery, db, url, providers, presence, live, publisher)
                app = build_app(
                    self._api_context(db, providers),
                    operator_only=spec.http == "operator",
                )
                api_address = await nursery.start(
                    partial(
                        serve_api,
                        app,
                        config.server.api_listen,
                        shutdown=api_shutdown,
                        header_timeout=config.server.header_timeout.total_seconds(),
                    )
                )
                log.info("node started", extra={"role": config.server.role.value})
                task_status.started(NodeAddresses(api_address, gateway_address))
                await self._shutdown.wait()
                await self._drain(config.server.drain_period)
                api_shutdown.set()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await providers.aclose()
                await db.close()
            log.info("node stopped")

    async def _start_jobs(
        self,
        nursery: trio.Nursery,
        db: Database,
        url: str,
        providers: Providers,
        presence: PresenceView,
        live: LiveRoutes,
        publisher: EphemeralPublisher | None,
    ) -> None:
        config, clock, metrics = self.config, self.clock, self.metrics
        catalogue = self.live_catalogue

        # Jobs fix their version when the hint is decided; this is only for jobs
        # queued by a release that did not.
        def version() -> str:
            return catalogue.current().version

        handlers: list[JobHandler] = [
            PushSendHandler(
                db=db,
                providers=providers,
                clock=clock,
                config=config.push,
                metrics=metrics,
                catalogue_version=version,
            ),
            GatewaySendHandler(
                db=db,
                clock=clock,
                config=config.push,
                metrics=metrics,
                publisher=publisher,
                catalogue_version=version,
            ),
            FlushHandler(
                db=db,
                clock=clock,
                config=config,
                presence=presence,
                live=live,
                metrics=metrics,
                catalogue=catalogue,
            ),
            TopicPushHandler(
                db=db, providers=providers, clock=clock, config=config.push, metrics=metrics
            ),
        ]
        self.housekeeper = Housekeeper(db=db, clock=clock, config=config, metrics=metrics)
        await nursery.start(self.housekeeper.run)
        self.runner = JobRunner(
            db=db,
            database_url=url,
            clock=clock,
            handlers=handlers,
            config=config.jobs,
            poll_interval=config.notify.poll_interval,
            metrics=metrics,
        )
        await nursery.start(self.runner.run)
        self.round = ConsumerRound(
            database_url=url,
            config=config,
            clock=clock,
            presence=presence,
            live=live,
            metrics=metrics,
            before_commit=self._before_commit,
            jobs_committed=self.runner.nudge,
            catalogue=catalogue,
        )
        await nursery.start(self._run_round, self.round)

    async def _run_round(
        self, round_: ConsumerRound, *, task_status: trio.TaskStatus[None]
    ) -> None:
        self._round_running = True
        try:
            await round_.run(task_status=task_status)
        finally:
            self._round_running = False

    async def _drain(self, period: timedelta) -> None:
        log.info("shutting down", extra={"drain_seconds": period.total_seconds()})
        with trio.move_on_after(period.total_seconds()) as scope:
            if self.runner is not None:
                self.runner.stop_claiming()
            if self.gateway is not None:
                await self.gateway.close_all(1001)
            if self.runner is not None:
                await self.runner.wait_idle()
        if scope.cancelled_caught:
            log.warning("drain period over; unfinished jobs are given back")

    def _api_context(self, db: Database, providers: Providers) -> ApiContext:
        def readiness() -> dict[str, bool]:
            checks: dict[str, bool] = {}
            if self.spec.round_and_runner:
                checks["round"] = self._round_running
                checks["runner"] = bool(self.runner and self.runner.running)
            return checks

        return ApiContext(
            db=db,
            verifier=TokenVerifier(self.config.auth),
            config=self.config,
            clock=self.clock,
            metrics=self.metrics,
            validator=EventValidator(),
            provider_names=providers.names,
            readiness=readiness,
            catalogue=self.live_catalogue,
            registration_check=registration_check(providers),
        )


def _prepare_database(url: str, config: Config) -> Config:
    """Migrate and resolve ``secret:`` references (blocking; runs in a worker thread)."""
    conn = connect_dedicated(url, autocommit=False)
    try:
        migrate(conn)
        if store_secret_names(config):
            with conn.transaction():
                return resolve_store_secrets(config, lambda name: secret_store.get(conn, name))
        return config
    finally:
        conn.close()


__all__ = ["ROLE_TABLE", "Daemon", "NodeAddresses", "RoleSpec"]
