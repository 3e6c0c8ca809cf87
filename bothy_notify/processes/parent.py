"""The parent of ``server.processes = N``: everything the N node processes share.

:func:`run_node_processes` is ``bothy-notify run`` when N > 1. In order:

1. **Ports.** ``server.api_listen`` (and ``server.gateway_listen`` for roles with
   a gateway) are bound with ``SO_REUSEPORT`` and not listened on
   (:mod:`bothy_notify.kernel.sockets`): port 0 is resolved here, once, and the
   ports stay reserved while a child restarts. Every child binds the same ones.
2. **Database.** With no ``database.url`` the embedded PostgreSQL is started
   here, once, and its URL handed to the children over their control channel.
   Migrations run here, once (the children skip them), and ``secret:``
   references are checked, so a missing secret stops the command before any
   child starts. A warning says when the server allows fewer connections than
   N processes may open.
3. **Metrics.** A temporary directory for prometheus_client's multiprocess
   mode, given to every child (``PROMETHEUS_MULTIPROC_DIR``), so ``/metrics``
   on the shared port answers for all of them; a dead child's live gauges are
   removed from it. Removed at the end.
4. **Children** (:class:`~bothy_notify.processes.supervisor.Supervisor`): N
   ``bothy-notify run`` processes, each a node of a cluster of the configured
   role. Once all are ready the parent prints its one line, ``bothy-notify
   running (role R, N processes): API http://..., gateway ws://.../v1/gateway``,
   and writes ``--ready-file`` (:mod:`bothy_notify.kernel.readyfile`; the
   children never write it).
5. **Signals.** The first SIGINT/SIGTERM drains every child (within
   ``server.drain_period``), a second stops them at once; then the embedded
   server stops and the parent exits (0 after a drain). SIGHUP is passed on
   as ``reload``: each child loads the configuration again
   (:meth:`bothy_notify.wiring.Daemon.reload`).
6. **systemd** (:mod:`bothy_notify.kernel.sdnotify`). The parent is the
   service's main process: it sends ``READY=1`` once every child is ready,
   ``STOPPING=1`` at the drain, ``RELOADING=1`` then ``READY=1`` around passing
   on a SIGHUP, and ``WATCHDOG=1`` from its own loop; the children never see
   ``$NOTIFY_SOCKET``.

The parent runs no node of its own and opens no database connection after the
start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import trio
from prometheus_client.multiprocess import mark_process_dead

from bothy_notify.config import ClusterMode, Config
from bothy_notify.kernel.metrics import MULTIPROCESS_DIR_ENV
from bothy_notify.kernel.readyfile import ReadyFile
from bothy_notify.kernel.sdnotify import Notifier
from bothy_notify.kernel.sockets import bind_shared, bound_address, split_address
from bothy_notify.processes.control import ChildSpec
from bothy_notify.processes.supervisor import Supervisor, child_command
from bothy_notify.store.db import connection_limit
from bothy_notify.store.embedded import EmbeddedPostgres
from bothy_notify.wiring import prepare_database, role_spec

log = logging.getLogger("bothy.processes")

DEDICATED_CONNECTIONS = 6
"""Connections of one node process outside its three pools: the round's, the runner's
and the gateway's ``LISTEN`` connections, each pool's Trio-thread connection
(``Database.direct``: the API's appends, the runner's completions), and one to
spare (a migration, a ping)."""
DRAIN_GRACE = 15.0
"""Seconds past ``server.drain_period`` a child may take to exit after ``drain``
(closing pools, giving jobs back, leaving the registry) before it is stopped."""


class ListenError(Exception):
    """A shared port cannot be bound; the message names the key and the address."""


@contextlib.contextmanager
def _reserved(key: str, address: str) -> Iterator[str]:
    """Bind ``address`` for the children (see the module docstring); yields the
    resolved ``host:port``."""
    try:
        sock = bind_shared(address)
    except OSError as exc:
        raise ListenError(
            f"server.{key}: cannot listen on {address} ({exc.strerror or type(exc).__name__})"
        ) from None
    try:
        yield bound_address(sock, split_address(address)[0])
    finally:
        sock.close()


def run_node_processes(
    config: Config,
    *,
    count: int,
    config_path: str | None,
    notifier: Notifier | None = None,
    ready: ReadyFile | None = None,
) -> int:
    """Run ``count`` node processes of ``config``'s role until signalled; the exit
    status for the command (see the module docstring). ``ready`` is written once
    every child serves; the caller removes it at the end.

    Raises:
        ConfigError: a ``secret:`` reference is missing (before any child starts).
        StoreError: the database cannot be reached (before any child starts).
        ListenError: a port cannot be bound.
    """
    gateway = role_spec(config.server.role, ClusterMode.MULTI).gateway
    with contextlib.ExitStack() as held:
        api = held.enter_context(_reserved("api_listen", config.server.api_listen))
        gateway_address = (
            held.enter_context(_reserved("gateway_listen", config.server.gateway_listen))
            if gateway
            else None
        )
        metrics_dir = tempfile.mkdtemp(prefix="bothy-notify-metrics-")
        held.callback(shutil.rmtree, metrics_dir, ignore_errors=True)
        parent = _Parent(
            config,
            count,
            config_path,
            api,
            gateway_address,
            metrics_dir,
            notifier or Notifier(None),
            ready or ReadyFile(None),
        )
        return trio.run(parent.run)


class _Parent:
    """One run of the parent, inside Trio (steps 2 to 5 of the module docstring)."""

    def __init__(
        self,
        config: Config,
        count: int,
        config_path: str | None,
        api: str,
        gateway: str | None,
        metrics_dir: str,
        notifier: Notifier,
        ready: ReadyFile,
    ) -> None:
        self.config = config
        self.count = count
        self.config_path = config_path
        self.api = api
        self.gateway = gateway
        self.metrics_dir = metrics_dir
        self.notifier = notifier
        self.ready = ready
        self.supervisor: Supervisor | None = None
        self.serving = False
        """Every child said ``ready`` once (systemd was told ``READY=1``)."""
        self.failed = False
        """``--ready-file`` could not be written: the children were drained."""

    def __repr__(self) -> str:
        return f"_Parent(count={self.count})"

    async def run(self) -> int:
        embedded: EmbeddedPostgres | None = None
        code = 0  # also when a signal came before the children were started
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._on_signals, signals, nursery.cancel_scope)
                nursery.start_soon(self.notifier.keep_watchdog)
                try:
                    url: str | None = None
                    if self.config.database.url is None:
                        embedded = EmbeddedPostgres(self.config.database.data_dir)
                        url = await trio.to_thread.run_sync(embedded.start)
                    code = await self._supervise(url)
                    if self.failed:
                        code = 1
                finally:
                    nursery.cancel_scope.cancel()
                    if embedded is not None:
                        with trio.CancelScope(shield=True):
                            await trio.to_thread.run_sync(embedded.stop)
        return code

    async def _supervise(self, embedded_url: str | None) -> int:
        config = self.config
        url = embedded_url if embedded_url is not None else _configured_url(config)
        await trio.to_thread.run_sync(prepare_database, url, config)
        await _check_connections(url, config, self.count)
        template = ChildSpec(
            ordinal=0,
            processes=self.count,
            role=config.server.role,
            api_listen=self.api,
            gateway_listen=self.gateway or config.server.gateway_listen,
            database_url=embedded_url,
        )
        self.supervisor = Supervisor(
            count=self.count,
            command=child_command(self.config_path),
            spec=lambda ordinal: replace(template, ordinal=ordinal),
            env={**os.environ, MULTIPROCESS_DIR_ENV: self.metrics_dir},
            drain_bound=config.server.drain_period.total_seconds() + DRAIN_GRACE,
            on_ready=self._running,
            on_exit=lambda pid: mark_process_dead(pid, self.metrics_dir),  # type: ignore[no-untyped-call]
        )
        return await self.supervisor.run()

    def _running(self) -> None:
        role = self.config.server.role
        try:
            self.ready.write(
                api=self.api, gateway=self.gateway, role=role.value, processes=self.count
            )
        except OSError as exc:
            # Whoever waits for the file would wait in vain: stop, and say why.
            print(
                f"bothy-notify: --ready-file cannot be written ({exc.strerror}); stopping",
                file=sys.stderr,
                flush=True,
            )
            self.failed = True
            assert self.supervisor is not None
            self.supervisor.drain()
            return
        print(
            f"bothy-notify running (role {role}, {self.count} processes): API http://{self.api}"
            + (f", gateway ws://{self.gateway}/v1/gateway" if self.gateway else ""),
            file=sys.stderr,
            flush=True,
        )
        log.info("node processes running", extra={"role": role.value, "processes": self.count})
        self.serving = True
        self.notifier.ready(self._status())

    def _status(self) -> str:
        return f"serving (role {self.config.server.role.value}, {self.count} processes)"

    async def _on_signals(self, signals: AsyncIterator[int], startup: trio.CancelScope) -> None:
        """First signal: drain; second: stop. Before the children exist there is
        nothing to drain: the start is cancelled. SIGHUP: the children reload."""
        seen = 0
        async for signum in signals:
            supervisor = self.supervisor
            if signum == signal.SIGHUP:
                if supervisor is not None and self.serving:
                    self.notifier.reloading("reloading")
                    supervisor.reload()
                    self.notifier.ready(self._status())
                elif supervisor is not None:
                    supervisor.reload()
                continue
            seen += 1
            if supervisor is None:
                print("bothy-notify: shutting down", file=sys.stderr, flush=True)
                startup.cancel()
                return
            if seen == 1:
                print("bothy-notify: shutting down", file=sys.stderr, flush=True)
                self.notifier.stopping("draining")
                supervisor.drain()
            else:
                print("bothy-notify: stopping now", file=sys.stderr, flush=True)
                supervisor.stop()


def _configured_url(config: Config) -> str:
    assert config.database.url is not None
    return config.database.url.reveal()


async def _check_connections(url: str, config: Config, count: int) -> None:
    """Warn when the server allows fewer connections than ``count`` processes may open."""
    database = config.database
    pools = database.pool_size + database.jobs_pool_size + database.gateway_pool_size
    per_process = pools + DEDICATED_CONNECTIONS
    limit = await trio.to_thread.run_sync(connection_limit, url)
    if count * per_process > limit:
        log.warning(
            "the database allows fewer connections than the node processes may open;"
            " raise max_connections or lower database.pool_size, jobs_pool_size and"
            " gateway_pool_size",
            extra={"processes": count, "needed": count * per_process, "max_connections": limit},
        )


__all__ = ["ListenError", "run_node_processes"]
