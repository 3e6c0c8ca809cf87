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
from bothy_notify.kernel.supervise import Service, Supervised
from bothy_notify.notify.catalogue import Catalogue, load_catalogue
from bothy_notify.notify.jobs.flush import FlushHandler
from bothy_notify.notify.jobs.gateway_send import GatewaySendHandler
from bothy_notify.notify.jobs.push_send import PushSendHandler
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

log = logging.getLogger("bothy.wiring")

API_POOL_WAIT = 5.0
"""Seconds an HTTP request or gateway query waits for a pooled connection before it is
answered 503 (``unavailable``): a client retries sooner than a request that hangs."""


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

    def readiness(self) -> Mapping[str, bool]:
        """The gateway's own checks for ``/readyz`` (false while a part is down)."""
        ...


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
        ConfigError: the kind catalogue (``notify.kinds``, ``notify.kinds_dir``)
            is invalid; the message names the key.
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
        self.catalogue: Catalogue = load_catalogue(config.notify)
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
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
        self.jobs_db: Database | None = None
        self.services: dict[str, Supervised] = {}
        """The supervised services of this node by name (``/readyz``)."""

    def __repr__(self) -> str:
        return f"Daemon(role={self.config.server.role.value!r})"

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
        spec = self.spec
        # Two pools: API and gateway load must never starve delivery (the round has a
        # connection of its own). An HTTP request waits briefly for a connection.
        db = self.db = Database(
            url, pool_size=config.database.pool_size, name="api", wait=API_POOL_WAIT
        )
        jobs_db: Database | None = None
        providers: Providers | None = None
        try:
            await db.open()
            if spec.round_and_runner:
                jobs_db = self.jobs_db = Database(
                    url, pool_size=config.database.jobs_pool_size, name="jobs"
                )
                await jobs_db.open()
            providers = self.providers = Providers(
                self._providers_override
                if self._providers_override is not None
                else build_providers(
                    config.push, dev=config.server.dev, stdout=self._stdout, clock=self.clock
                ),
                max_in_flight=config.push.max_in_flight,
            )
            await self._serve_parts(url, db, jobs_db, providers, task_status)
        finally:
            with trio.CancelScope(shield=True):
                if providers is not None:
                    await providers.aclose()
                if jobs_db is not None:
                    await jobs_db.close()
                await db.close()
            log.info("node stopped")

    async def _serve_parts(
        self,
        url: str,
        db: Database,
        jobs_db: Database | None,
        providers: Providers,
        task_status: trio.TaskStatus[NodeAddresses],
    ) -> None:
        config, spec = self.config, self.spec
        api_shutdown = trio.Event()
        api_stopped = trio.Event()
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
                assert jobs_db is not None
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
                await self._start_jobs(nursery, jobs_db, url, providers, presence, live, publisher)
            app = build_app(
                self._api_context(db, providers),
                operator_only=spec.http == "operator",
            )

            async def serve_http(*, task_status: trio.TaskStatus[str]) -> None:
                try:
                    await serve_api(
                        app,
                        config.server.api_listen,
                        shutdown=api_shutdown,
                        drain_period=config.server.drain_period.total_seconds(),
                        task_status=task_status,
                    )
                finally:
                    api_stopped.set()

            api_address = await nursery.start(serve_http)
            log.info("node started", extra={"role": config.server.role.value})
            task_status.started(NodeAddresses(api_address, gateway_address))
            await self._shutdown.wait()
            await self._drain(config.server.drain_period, api_shutdown, api_stopped)
            nursery.cancel_scope.cancel()

    def _supervised(self, name: str, service: Service) -> Supervised:
        supervised = self.services[name] = Supervised(name, service, metrics=self.metrics)
        return supervised

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
        version = self.catalogue.version
        handlers: list[JobHandler] = [
            PushSendHandler(
                db=db,
                providers=providers,
                clock=clock,
                config=config.push,
                metrics=metrics,
                catalogue_version=lambda: version,
            ),
            GatewaySendHandler(
                db=db,
                clock=clock,
                config=config.push,
                metrics=metrics,
                publisher=publisher,
                catalogue_version=lambda: version,
            ),
            FlushHandler(
                db=db, clock=clock, config=config, presence=presence, live=live, metrics=metrics
            ),
        ]
        self.housekeeper = Housekeeper(db=db, clock=clock, config=config, metrics=metrics)
        await nursery.start(self._supervised("housekeeper", self.housekeeper.run).run)
        self.runner = JobRunner(
            db=db,
            database_url=url,
            clock=clock,
            handlers=handlers,
            config=config.jobs,
            poll_interval=config.notify.poll_interval,
            metrics=metrics,
        )
        await nursery.start(self._supervised("runner", self.runner.run).run)
        self.round = ConsumerRound(
            database_url=url,
            config=config,
            clock=clock,
            presence=presence,
            live=live,
            metrics=metrics,
            before_commit=self._before_commit,
            jobs_committed=self.runner.nudge,
        )
        await nursery.start(self._supervised("round", self.round.run).run)

    async def _drain(
        self, period: timedelta, api_shutdown: trio.Event, api_stopped: trio.Event
    ) -> None:
        """Everything in flight gets ``period`` to finish, all at once: the HTTP server
        stops accepting (new connections are refused) and answers the requests it
        has, the runner stops claiming and waits for its jobs, the gateway closes
        its connections with 1001."""
        log.info("shutting down", extra={"drain_seconds": period.total_seconds()})
        with trio.move_on_after(period.total_seconds()) as scope:
            api_shutdown.set()
            if self.runner is not None:
                self.runner.stop_claiming()
            if self.gateway is not None:
                await self.gateway.close_all(1001)
            if self.runner is not None:
                await self.runner.wait_idle()
            await api_stopped.wait()
        if scope.cancelled_caught:
            log.warning("drain period over; unfinished jobs are given back")

    def _api_context(self, db: Database, providers: Providers) -> ApiContext:
        def readiness() -> dict[str, bool]:
            # Each service's check is false while it is down: restarting after a
            # failure (its supervisor), or without its database connection.
            checks: dict[str, bool] = {}
            services = self.services
            if self.round is not None:
                checks["round"] = services["round"].up and self.round.connected
            if self.runner is not None:
                checks["runner"] = services["runner"].up and self.runner.healthy
            if "housekeeper" in services:
                checks["housekeeper"] = services["housekeeper"].up
            if self.gateway is not None:
                checks.update(self.gateway.readiness())
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
            catalogue=self.catalogue,
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
