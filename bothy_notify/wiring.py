"""Roles -> the nursery tree of one node.

:data:`ROLE_TABLE` states the two facts of each role: whether it serves
devices (the gateway and the full HTTP API) and whether it decides (the
consumer round, the job runner, housekeeping). :func:`role_spec` derives the
rest from them and ``cluster.mode``; nothing else in the code asks for the
role or the mode (the table is also in ``docs/architecture.md``):

=======  ======  =================  =============  =========  ==========  =========  =========
role     mode    HTTP API           round + jobs   presence   live rts    publisher  registry
=======  ======  =================  =============  =========  ==========  =========  =========
all      single  full + gateway     yes            the hub's  real        the hub    no
worker   single  operator only      yes            nobody     fail-closed none       no
api      single  full + gateway     no             -          -           -          no
all      multi   full + gateway     yes            shared     real        the hub    yes
worker   multi   operator only      yes            shared     real        none       yes
api      multi   full + gateway     gateway hints  -          -           the hub    yes
=======  ======  =================  =============  =========  ==========  =========  =========

"shared": the union of every live node's presence, read from the database
with the round's other facts; gateway nodes of a cluster publish theirs. "gateway
hints": an ``api`` node of a cluster runs the ``notify.gateway_send`` jobs
targeted at it (its own connections), nothing else.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, Literal, Protocol, TextIO

import orjson
import trio

from bothy_notify.api.app import build_app, serve_api
from bothy_notify.api.context import ApiContext
from bothy_notify.api.ops import readiness_checks
from bothy_notify.api.status import StatusSource, node_snapshot
from bothy_notify.auth import TokenVerifier
from bothy_notify.cluster import NodeRegistry
from bothy_notify.config import (
    ClusterMode,
    Config,
    ConfigError,
    LiveConfig,
    Role,
    plan_reload,
    resolve_store_secrets,
    store_secret_names,
)
from bothy_notify.housekeeping import Housekeeper
from bothy_notify.kernel import memtrim
from bothy_notify.kernel.clock import Clock, SystemClock
from bothy_notify.kernel.ephemeral import EphemeralPublisher
from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.instrument import Instrument
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import NoPresence, PresenceView
from bothy_notify.kernel.sdnotify import Notifier
from bothy_notify.kernel.supervise import Service, Supervised
from bothy_notify.logs import set_level
from bothy_notify.matrix import apps as matrix_apps
from bothy_notify.matrix.answers import AnsweringHandler, FirstAttempts
from bothy_notify.matrix.gateway import MatrixGateway
from bothy_notify.matrix.push import KIND as MATRIX_PUSH
from bothy_notify.matrix.push import MatrixPush
from bothy_notify.notify.catalogue import Catalogue
from bothy_notify.notify.facts import PresenceSource, SharedPresence
from bothy_notify.notify.jobs.flush import FlushHandler
from bothy_notify.notify.jobs.gateway_send import GatewaySendHandler, LocalGatewayHints
from bothy_notify.notify.jobs.push_clear import ReadClearPush
from bothy_notify.notify.jobs.push_removed import RemovedPush
from bothy_notify.notify.jobs.push_send import HintPush
from bothy_notify.notify.jobs.quiet_summary import QuietSummaryHandler, SummaryPush
from bothy_notify.notify.jobs.registration_push import RegistrationLifecycle
from bothy_notify.notify.kinds_dir import LiveCatalogue
from bothy_notify.notify.planner import RoundOutcome
from bothy_notify.notify.round import ConsumerRound
from bothy_notify.notify.routes import FailClosedRoutes, JobLiveRoutes, LiveRoutes
from bothy_notify.push import providers as provider_table
from bothy_notify.push.grouping import GROUPING_SECRET, ThreadGrouping
from bothy_notify.push.grouping import new_key as new_grouping_key
from bothy_notify.push.jobs import Lifecycle, PushJobHandler, PushKind
from bothy_notify.push.port import PushProvider
from bothy_notify.push.registry import Providers
from bothy_notify.runner import JobHandler, JobRunner
from bothy_notify.store import secrets as secret_store
from bothy_notify.store.db import (
    Database,
    DatabaseTimeouts,
    StoreError,
    StoreUnavailable,
    connect_dedicated,
)
from bothy_notify.store.embedded import EmbeddedPostgres
from bothy_notify.store.events import EventValidator
from bothy_notify.store.jobs import ClaimHere
from bothy_notify.store.migrate import migrate
from bothy_notify.topics.send import RecipientLifecycle, TopicPush

log = logging.getLogger("bothy.wiring")

GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the cyclic garbage collector's youngest
generation while the daemon runs (CPython's default is 700). Every collection of
an older generation walks every object that survived, and a node holding tens of
thousands of connections has millions: at the default, a reconnect storm spent
much of its time collecting (``docs/performance.md``, "heartbeat")."""

SWITCH_INTERVAL = 0.0005
"""Seconds a thread may hold the GIL while another waits for it (Python's default is
5 ms), set while a daemon runs. The round, the pools' worker threads and the event
loop take turns many times per hint; with 5 ms each turn could wait up to 5 ms for
the GIL, which showed in ``bench/gateway.py``'s hint latency (docs/performance.md,
"gateway")."""

READINESS_INTERVAL = 5.0
"""Seconds between two refreshes of ``bothy_readiness_check`` (a scrape every 15 s or
more sees a value at most this old), each with one database ping of its own."""

SEND_RESERVE = 1.0
"""Seconds before the end of ``server.drain_period`` from which no provider request
starts (a quarter of the period when that is shorter): the requests in flight
answer and their results are recorded inside the period, not cut off by it."""

API_POOL_WAIT = 5.0
"""Seconds an HTTP request or gateway query waits for a pooled connection before it is
answered 503 (``unavailable``): a client retries sooner than a request that hangs."""


@dataclass(frozen=True, slots=True)
class RoleFacts:
    """The two facts a role states; :func:`role_spec` derives everything else.

    Attributes:
        serves_devices: runs the gateway and the full HTTP API.
        decides: runs the consumer round, the job runner and housekeeping.
    """

    serves_devices: bool
    decides: bool


ROLE_TABLE: Mapping[Role, RoleFacts] = {
    Role.ALL: RoleFacts(serves_devices=True, decides=True),
    Role.WORKER: RoleFacts(serves_devices=False, decides=True),
    Role.API: RoleFacts(serves_devices=True, decides=False),
}


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What one node runs and which implementation each port gets.

    Attributes:
        http: the full API, or the operator endpoints only.
        gateway: runs the WebSocket gateway.
        round_and_runner: runs the consumer round, the job runner and housekeeping.
        presence: where decisions take presence from: this node's hub, the
            cluster's shared table, or nobody (``None``: it decides nothing).
        live_routes: gateway and delayed routes become jobs, or are refused.
        publisher: who publishes ``notify.gateway_send`` on this node.
        gateway_jobs: runs only the ``notify.gateway_send`` jobs targeted at it.
        registry: registers in ``bothy.nodes`` with heartbeats (a cluster).
        shares_presence: publishes its connections' presence (a cluster).
    """

    http: Literal["full", "operator"]
    gateway: bool
    round_and_runner: bool
    presence: Literal["hub", "shared", "nobody"] | None
    live_routes: Literal["jobs", "fail_closed"] | None
    publisher: Literal["hub"] | None
    gateway_jobs: bool = False
    registry: bool = False
    shares_presence: bool = False


def role_spec(role: Role, mode: ClusterMode) -> RoleSpec:
    """Derive a node's wiring from its role's facts and ``cluster.mode``.

    A single node's decisions see its own gateway (or nobody); a cluster's see
    every live node's shared presence, so every deciding node routes desktops
    for real, and every gateway node publishes and runs its own gateway hints.
    """
    facts = ROLE_TABLE[role]
    multi = mode is ClusterMode.MULTI
    presence: Literal["hub", "shared", "nobody"] | None = None
    if facts.decides:
        presence = "shared" if multi else "hub" if facts.serves_devices else "nobody"
    live_routes: Literal["jobs", "fail_closed"] | None = None
    if facts.decides:
        live_routes = "fail_closed" if presence == "nobody" else "jobs"
    return RoleSpec(
        http="full" if facts.serves_devices else "operator",
        gateway=facts.serves_devices,
        round_and_runner=facts.decides,
        presence=presence,
        live_routes=live_routes,
        publisher="hub" if facts.serves_devices and (facts.decides or multi) else None,
        gateway_jobs=multi and facts.serves_devices and not facts.decides,
        registry=multi,
        shares_presence=multi and facts.serves_devices,
    )


class GatewayService(Protocol):
    """What the wiring needs from the gateway package (implemented in :mod:`gateway`)."""

    presence: PresenceView
    publisher: EphemeralPublisher

    async def run(self, *, task_status: trio.TaskStatus[str] = ...) -> None: ...

    async def close_all(self, code: int) -> None: ...

    def presence_lost(self) -> None:
        """The node's shared presence rows are gone: publish them all again."""
        ...

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
        reuse_port: bind the HTTP API and the gateway with ``SO_REUSEPORT``: this
            node is one of the processes of ``server.processes`` sharing the ports
            (:mod:`bothy_notify.processes`).
        migrate: apply migrations at start (``False`` when the parent of
            ``server.processes`` applied them once for every process).
        notifier: systemd's readiness protocol: ``READY=1`` once the node serves,
            ``STOPPING=1`` when it drains (:mod:`bothy_notify.kernel.sdnotify`).
        instrument: told of the stages of a hint's path (benchmarks;
            :mod:`bothy_notify.kernel.instrument`); ``None`` costs nothing.

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
        providers: Mapping[str, PushProvider | Mapping[str, PushProvider]] | None = None,
        metrics: Metrics | None = None,
        stdout: TextIO | None = None,
        before_commit: Callable[[RoundOutcome], None] | None = None,
        gateway_factory: GatewayFactory | None = None,
        reuse_port: bool = False,
        migrate: bool = True,
        notifier: Notifier | None = None,
        instrument: Instrument | None = None,
    ) -> None:
        self.live = LiveConfig(config)
        """The running configuration: every component that reads a reloadable key
        reads it here at use (:mod:`bothy_notify.config.live`)."""
        self._instrument = instrument
        self._notifier = notifier or Notifier(None)
        self._reuse_port = reuse_port
        self._migrate = migrate
        self.spec = role_spec(config.server.role, config.cluster.mode)
        self.node_id = new_id()
        """This process's id in a cluster (a new UUIDv7 at every start)."""
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
        self.grouping: ThreadGrouping | None = None
        """The thread grouping values of this node's pushes (read at start)."""
        self.round: ConsumerRound | None = None
        self.runner: JobRunner | None = None
        self.gateway: GatewayService | None = None
        self.housekeeper: Housekeeper | None = None
        self.registry: NodeRegistry | None = None
        self.jobs_db: Database | None = None
        self.gateway_db: Database | None = None
        self.matrix_first: FirstAttempts | None = None
        """Where this node's runner reports the Matrix gateway's first results (``None``:
        no gateway, or no runner here)."""
        self.services: dict[str, Supervised] = {}
        """The supervised services of this node by name (``/readyz``)."""
        self._readiness: Callable[[], Mapping[str, bool]] | None = None
        self.status: StatusSource | None = None
        """What ``GET /v1/admin/status`` answers from (once the API is built)."""

    def __repr__(self) -> str:
        return f"Daemon(role={self.config.server.role.value!r})"

    @property
    def config(self) -> Config:
        """The configuration in use now (``self.live.current``)."""
        return self.live.current

    @property
    def catalogue(self) -> Catalogue:
        """The kind catalogue in use, as of its last refresh (no IO)."""
        return self.live_catalogue.current()

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (SIGINT/SIGTERM)."""
        self._shutdown.set()

    async def reload(self, config: Config) -> tuple[str, ...]:
        """Take in what a reload changes (SIGHUP; ``docs/operations.md``, "Reload"):
        the keys of :data:`~bothy_notify.config.live.RELOADABLE`: ``log.level``, and
        ``notify.kinds`` and ``notify.categories`` for the kind catalogue, the HTTP
        API (app hints, preferences, quiet hours' breakthrough, the OpenAPI
        document), the consumer round, the flush job and the admin replay at once;
        every file of ``notify.kinds_dir`` is read again now.

        ``config`` is the configuration loaded again (with this node's own
        overrides applied). Returns every other key that differs from the running
        configuration: they take effect at the next start.

        Raises:
            ConfigError: the new ``notify.kinds`` is invalid; nothing changed.
        """
        plan = plan_reload(self.live.current, config)
        # The catalogue first: it is the one part that can refuse the new values.
        await trio.to_thread.run_sync(self.live_catalogue.reconfigure, plan.config.notify)
        self.live.swap(plan.config)
        set_level(plan.config.log)
        log.info(
            "configuration reloaded",
            extra={
                "catalogue_version": self.catalogue.version,
                "applied": list(plan.applied),
                "restart_needed": list(plan.restart_needed),
            },
        )
        return plan.restart_needed

    async def run(
        self, *, task_status: trio.TaskStatus[NodeAddresses] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start every part of the role, then run until :meth:`request_shutdown`.

        Shutdown: stop claiming jobs, let running jobs finish within
        ``server.drain_period``, close gateway connections with 1001, stop
        serving HTTP, then cancel the rest. Jobs not finished are given back.

        While it runs, Python's thread switch interval is at most
        :data:`SWITCH_INTERVAL` and the garbage collector's youngest generation
        is collected every :data:`GC_YOUNG_THRESHOLD` allocations (the previous
        values are restored at the end).
        """
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL))
        collect = gc.get_threshold()
        gc.set_threshold(max(collect[0], GC_YOUNG_THRESHOLD), *collect[1:])
        try:
            await self._run(task_status)
        finally:
            sys.setswitchinterval(switch_interval)
            gc.set_threshold(*collect)

    async def _run(self, task_status: trio.TaskStatus[NodeAddresses]) -> None:
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
        try:
            prepared = await trio.to_thread.run_sync(
                prepare_database, url, self.config, self._migrate
            )
        except StoreError as exc:
            if not self.spec.registry:
                raise
            # A cluster node without its database would serve devices nobody else sees.
            raise StoreUnavailable(
                'cluster.mode = "multi": the database (database.url) cannot be reached;'
                " a node of a cluster does not start without it"
            ) from exc
        config = prepared.config
        self.grouping = ThreadGrouping(prepared.grouping_key)
        self.live.swap(config)  # secret: references resolved
        spec = self.spec
        # Two pools: API and gateway load must never starve delivery (the round has a
        # connection of its own). An HTTP request waits briefly for a connection.
        timeouts = database_timeouts(config)
        db = self.db = Database(
            url,
            pool_size=config.database.pool_size,
            name="api",
            wait=API_POOL_WAIT,
            timeouts=timeouts,
        )
        jobs_db: Database | None = None
        providers: Providers | None = None
        try:
            await db.open()
            if spec.round_and_runner or spec.gateway_jobs:
                # Its direct connection only completes jobs: a completion a server crash
                # loses runs the job again (at least once), so it need not wait for the
                # WAL flush (store.connection, "Commits").
                jobs_db = self.jobs_db = Database(
                    url,
                    pool_size=config.database.jobs_pool_size,
                    name="jobs",
                    timeouts=timeouts,
                    direct_asynchronous_commit=True,
                )
                await jobs_db.open()
            if spec.gateway and self._gateway_factory is not None:
                # The gateway's own pool: a flood of gateway ops never makes an HTTP
                # request wait for a connection.
                gateway_db = self.gateway_db = Database(
                    url,
                    pool_size=config.database.gateway_pool_size,
                    name="gateway",
                    wait=API_POOL_WAIT,
                    timeouts=timeouts,
                )
                await gateway_db.open()
            providers = self.providers = Providers(
                self._providers_override
                if self._providers_override is not None
                else provider_table.build(
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
                if self.gateway_db is not None:
                    await self.gateway_db.close()
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
            if spec.registry:
                # Joined before anything serves: a gateway publishes presence at once.
                self.registry = NodeRegistry(
                    db=db,
                    clock=self.clock,
                    config=config,
                    metrics=self.metrics,
                    node_id=self.node_id,
                    stats=lambda: orjson.dumps(self._snapshot(providers)),
                )
                await nursery.start(self.registry.run)
            if config.notify.kinds_dir:
                # Every node follows the kinds directory, asked or not: its log lines and
                # bothy_catalogue_invalid_files must be true on an idle node too.
                await nursery.start(self._supervised("catalogue", self.live_catalogue.watch).run)
            trim = memtrim.malloc_trim() if memtrim.wanted() else None
            if trim is not None:
                # The C allocator's free pages back to the system, on every role.
                trimming = partial(memtrim.trim_periodically, trim)
                await nursery.start(self._supervised("memory", trimming).run)
            presence: PresenceSource = NoPresence()
            publisher: EphemeralPublisher | None = None
            gateway_address: str | None = None
            if spec.gateway and self._gateway_factory is not None:
                self.gateway = self._gateway_factory(
                    config=config,
                    db=self.gateway_db or db,
                    clock=self.clock,
                    metrics=self.metrics,
                    verifier=TokenVerifier(config.auth),
                    database_url=url,
                    node_id=self.node_id if spec.shares_presence else None,
                    reuse_port=self._reuse_port,
                    instrument=self._instrument,
                )
                if self.registry is not None:
                    self.registry.on_rejoin = self.gateway.presence_lost
                with _listening("server.gateway_listen", config.server.gateway_listen):
                    gateway_address = await nursery.start(self.gateway.run)
                if spec.presence == "hub":
                    presence = self.gateway.presence
                if spec.publisher == "hub":
                    publisher = self.gateway.publisher
            if spec.presence == "shared":
                presence = SharedPresence(config.cluster.node_timeout)
            if spec.round_and_runner:
                assert jobs_db is not None
                live: LiveRoutes = (
                    JobLiveRoutes(push_max_attempts=config.push.max_attempts)
                    if spec.live_routes == "jobs" and not isinstance(presence, NoPresence)
                    else FailClosedRoutes()
                )
                if isinstance(live, FailClosedRoutes):
                    log.info(
                        "no presence on this node: hints go by push only",
                        extra={"role": config.server.role.value},
                    )
                await self._start_jobs(nursery, jobs_db, url, providers, presence, live, publisher)
            elif spec.gateway_jobs and publisher is not None:
                assert jobs_db is not None
                await self._start_gateway_jobs(nursery, jobs_db, url, publisher)
            context = self._api_context(db, providers)
            app = build_app(context, operator_only=spec.http == "operator")
            nursery.start_soon(self._report_readiness, context)

            async def serve_http(*, task_status: trio.TaskStatus[str]) -> None:
                try:
                    await serve_api(
                        app,
                        config.server.api_listen,
                        shutdown=api_shutdown,
                        header_timeout=config.server.header_timeout.total_seconds(),
                        drain_period=config.server.drain_period.total_seconds(),
                        reuse_port=self._reuse_port,
                        task_status=task_status,
                    )
                finally:
                    api_stopped.set()

            with _listening("server.api_listen", config.server.api_listen):
                api_address = await nursery.start(serve_http)
            log.info(
                "node started",
                extra={"role": config.server.role.value, "mode": config.cluster.mode.value}
                | ({"node_id": self.node_id} if spec.registry else {}),
            )
            task_status.started(NodeAddresses(api_address, gateway_address))
            self._notifier.ready(f"serving (role {config.server.role.value})")
            await self._shutdown.wait()
            await self._drain(config.server.drain_period, api_shutdown, api_stopped)
            nursery.cancel_scope.cancel()

    async def _report_readiness(self, context: ApiContext) -> None:
        """Keep ``bothy_readiness_check{check}`` equal to what ``/readyz`` answers."""
        gauge = self.metrics.readiness_check
        while True:
            for check, ok in (await readiness_checks(context, share=False)).items():
                gauge.labels(check).set(1 if ok else 0)
            await trio.sleep(READINESS_INTERVAL)

    def _supervised(self, name: str, service: Service) -> Supervised:
        supervised = self.services[name] = Supervised(name, service, metrics=self.metrics)
        return supervised

    async def _start_jobs(
        self,
        nursery: trio.Nursery,
        db: Database,
        url: str,
        providers: Providers,
        presence: PresenceSource,
        live: LiveRoutes,
        publisher: EphemeralPublisher | None,
    ) -> None:
        config, clock, metrics = self.config, self.clock, self.metrics
        catalogue = self.live_catalogue

        # Jobs fix their version when the hint is decided; this is only for jobs
        # queued by a release that did not.
        def version() -> str:
            return catalogue.current().version

        def category_of(kind: str) -> str:
            return catalogue.current().category_of(kind)

        gateway_send = GatewaySendHandler(
            db=db,
            clock=clock,
            config=config.push,
            metrics=metrics,
            publisher=publisher,
            catalogue_version=version,
        )
        # Every kind of push through one handler (push/jobs.py); those to registrations
        # share one lifecycle (strikes, invalidation, bothy_push_sends_total).
        registrations = RegistrationLifecycle(
            providers=providers, config=config.push, metrics=metrics
        )

        def push(kind: PushKind[Any, Any], lifecycle: Lifecycle[Any] = registrations) -> JobHandler:
            return PushJobHandler(
                kind, lifecycle, db=db, providers=providers, clock=clock, metrics=metrics
            )

        urgency_of = config.notify.urgency_of
        handlers: list[JobHandler] = [
            push(
                HintPush(
                    config=config.push,
                    metrics=metrics,
                    catalogue_version=version,
                    urgency_of=urgency_of,
                    category_of=category_of,
                    grouping=self.grouping,
                )
            ),
            push(ReadClearPush(config=config.push, urgency_of=urgency_of, grouping=self.grouping)),
            push(RemovedPush(config=config.push, urgency_of=urgency_of, grouping=self.grouping)),
            QuietSummaryHandler(db=db, clock=clock, config=config.push, metrics=metrics),
            push(SummaryPush(config=config.push, urgency_of=urgency_of)),
            gateway_send,
            FlushHandler(
                db=db,
                clock=clock,
                config=self.live,
                presence=presence,
                live=live,
                metrics=metrics,
                catalogue=catalogue,
            ),
            push(TopicPush(config=config.push), RecipientLifecycle(metrics=metrics)),
        ]
        if config.matrix_gateway is not None:
            # The gateway's answer waits for first results: the runner tells them here.
            self.matrix_first = FirstAttempts()
            handlers.append(
                AnsweringHandler(push(MatrixPush(config=config.push)), self.matrix_first)
            )
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
            node_id=self.node_id if self.spec.registry else None,
            instrument=self._instrument,
        )
        await nursery.start(self._supervised("runner", self.runner.run).run)
        # A node that holds the connections runs the gateway hints it decides at once
        # after the round's commit (no claim round trip; docs/architecture.md, "Jobs").
        local = (
            LocalGatewayHints(
                runner=self.runner,
                handler=gateway_send,
                db=db,
                clock=clock,
                lease=config.jobs.lease,
                node_id=self.node_id if self.spec.registry else None,
            )
            if publisher is not None
            else None
        )
        self.round = ConsumerRound(
            database_url=url,
            config=self.live,
            clock=clock,
            presence=presence,
            live=live,
            metrics=metrics,
            before_commit=self._before_commit,
            jobs_committed=self.runner.nudge,
            catalogue=catalogue,
            local=local,
            timeouts=db.timeouts,
            instrument=self._instrument,
        )
        await nursery.start(self._supervised("round", self.round.run).run)

    async def _start_gateway_jobs(
        self, nursery: trio.Nursery, db: Database, url: str, publisher: EphemeralPublisher
    ) -> None:
        """An ``api`` node of a cluster runs the gateway hints targeted at it."""
        config, catalogue = self.config, self.live_catalogue
        self.runner = JobRunner(
            db=db,
            database_url=url,
            clock=self.clock,
            handlers=[
                GatewaySendHandler(
                    db=db,
                    clock=self.clock,
                    config=config.push,
                    metrics=self.metrics,
                    publisher=publisher,
                    catalogue_version=lambda: catalogue.current().version,
                )
            ],
            config=config.jobs,
            poll_interval=config.notify.poll_interval,
            metrics=self.metrics,
            node_id=self.node_id,
            instrument=self._instrument,
        )
        await nursery.start(self._supervised("runner", self.runner.run).run)

    async def _drain(
        self, period: timedelta, api_shutdown: trio.Event, api_stopped: trio.Event
    ) -> None:
        """Everything in flight gets ``period`` to finish, all at once: the HTTP server
        stops accepting (new connections are refused) and answers the requests it
        has, the runner stops claiming and waits for its jobs, the gateway closes
        its connections with 1001."""
        log.info("shutting down", extra={"drain_seconds": period.total_seconds()})
        self._notifier.stopping("draining")
        seconds = period.total_seconds()
        if self.providers is not None:
            self.providers.stop_sending_at(
                trio.current_time() + seconds - min(SEND_RESERVE, seconds / 4)
            )
        with trio.move_on_after(seconds) as scope:
            api_shutdown.set()
            if self.runner is not None:
                self.runner.stop_claiming()
            if self.gateway is not None:
                await self.gateway.close_all(1001)
            if self.runner is not None:
                await self.runner.wait_idle()
            await api_stopped.wait()
        if scope.cancelled_caught:
            log.warning(
                "drain period over; results reported are recorded, unfinished jobs given back"
            )

    def _snapshot(self, providers: Providers) -> dict[str, Any]:
        """This node's aggregates for the status page (``GET /v1/admin/status``)."""
        readiness = self._readiness
        ready = readiness is not None and all(readiness().values())
        return node_snapshot(self.metrics, providers.recent, providers.statistics(), ready=ready)

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
            if self.registry is not None:
                checks["cluster"] = self.registry.healthy()
            return checks

        def cluster() -> Mapping[str, Any] | None:
            return self.registry.status() if self.registry is not None else None

        self._readiness = readiness
        config = self.config
        self.status = StatusSource(
            node_id=self.node_id,
            role=config.server.role.value,
            multi=config.cluster.mode is ClusterMode.MULTI,
            node_timeout=config.cluster.node_timeout,
            snapshot=lambda: self._snapshot(providers),
        )

        registration_check = provider_table.registration_check(providers)
        return ApiContext(
            db=db,
            verifier=TokenVerifier(self.config.auth),
            live_config=self.live,
            clock=self.clock,
            metrics=self.metrics,
            validator=EventValidator(),
            provider_names=providers.names,
            provider_apps=provider_table.configured_apps(providers),
            vapid_keys=provider_table.vapid_keys(providers),
            readiness=readiness,
            cluster=cluster,
            catalogue=self.live_catalogue,
            registration_check=registration_check,
            status=self.status,
            # Appends wake a round held here directly, not by NOTIFY (store.appender).
            local_round=self.round,
            matrix=self._matrix_gateway(db, providers, registration_check),
        )

    def _matrix_gateway(
        self, db: Database, providers: Providers, check: provider_table.RegistrationCheck
    ) -> MatrixGateway | None:
        """The Matrix push gateway when ``[matrix_gateway]`` is configured: its routes
        checked against the providers this node runs (a bad one stops the start), its
        jobs inserted claimed by this node's runner when it has room."""
        config = self.config
        if config.matrix_gateway is None:
            return None
        routes = matrix_apps.routes_of(
            config.matrix_gateway, provider_table.configured_apps(providers)
        )
        runner = self.runner if self.matrix_first is not None else None
        kinds = frozenset({MATRIX_PUSH})
        node_id = self.node_id if self.spec.registry else None

        def claim() -> ClaimHere | None:
            room = runner.room() if runner is not None else 0
            if room <= 0:
                return None
            return ClaimHere(kinds=kinds, node_id=node_id, lease=config.jobs.lease, room=room)

        return MatrixGateway(
            db=db,
            clock=self.clock,
            config=config.matrix_gateway,
            push=config.push,
            routes=routes,
            check=check,
            metrics=self.metrics,
            first=self.matrix_first,
            claim=claim if runner is not None else None,
            run_claimed=runner.run_claimed if runner is not None else None,
        )


@contextmanager
def _listening(key: str, listen: str) -> Iterator[None]:
    """Around starting a server: an address it cannot listen on (in use, not this
    host's, a port below 1024 without the right) stops the node with one line
    naming the key, instead of a crash record."""
    try:
        yield
    except* OSError as group:
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        reason = first.strerror if isinstance(first, OSError) and first.strerror else "refused"
        raise ConfigError(f"{key}: cannot listen on {listen} ({reason})") from None


def database_timeouts(config: Config) -> DatabaseTimeouts:
    """The bounds of every wait on the database, from ``[database]``."""
    keys = config.database
    return DatabaseTimeouts(
        connect=keys.connect_timeout.total_seconds(),
        tcp_user=keys.tcp_user_timeout.total_seconds(),
        statement=keys.statement_timeout.total_seconds(),
        response=keys.response_timeout.total_seconds(),
        listen_check=keys.listen_check_interval.total_seconds(),
        health_check=keys.health_check_timeout.total_seconds(),
    )


@dataclass(frozen=True, slots=True)
class PreparedDatabase:
    """What a node reads from its database before it serves: the configuration with
    its ``secret:`` references resolved, and the thread grouping key
    (:mod:`bothy_notify.push.grouping`). The repr shows neither."""

    config: Config
    grouping_key: str

    def __repr__(self) -> str:
        return "PreparedDatabase()"


def prepare_database(url: str, config: Config, apply_migrations: bool = True) -> PreparedDatabase:
    """Migrate (unless told not to), resolve ``secret:`` references and read the
    thread grouping key (made and stored the first time: ``secrets.ensure``).
    Blocking: runs in a worker thread.

    Raises:
        StoreError: the database cannot be reached or refused a statement.
        ConfigError: a ``secret:`` reference names no secret of the store.
    """
    # Connecting is bounded; migrations may legitimately run for minutes.
    conn = connect_dedicated(
        url, autocommit=False, timeouts=database_timeouts(config).unbounded_statements()
    )
    try:
        if apply_migrations:
            migrate(conn)
        with conn.transaction():
            key = secret_store.ensure(conn, GROUPING_SECRET, new_grouping_key)
            if store_secret_names(config):
                config = resolve_store_secrets(config, lambda name: secret_store.get(conn, name))
        return PreparedDatabase(config, key)
    finally:
        conn.close()


__all__ = [
    "ROLE_TABLE",
    "Daemon",
    "NodeAddresses",
    "PreparedDatabase",
    "RoleFacts",
    "RoleSpec",
    "database_timeouts",
    "prepare_database",
    "role_spec",
]
