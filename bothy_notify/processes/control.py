"""The control channel between the parent of ``server.processes`` and one node process.

Each child gets one end of a Unix socket pair, inherited as a file descriptor
whose number is in the environment variable :data:`SUPERVISED_ENV`. The
protocol is lines of ASCII:

==========  =========  ===============================================================
direction   line       meaning
==========  =========  ===============================================================
parent ->   ``{...}``  first line: the child's :class:`ChildSpec` as JSON (once)
child  ->   ``ready``  the node serves (its listeners are bound, its services started)
parent ->   ``drain``  shut down gracefully (as SIGTERM: within ``server.drain_period``)
parent ->   ``stop``   stop at once (as a second SIGTERM)
parent ->   ``reload`` load the configuration again and apply what a reload changes (SIGHUP)
(EOF)       -          the parent is gone: the child shuts down gracefully
==========  =========  ===============================================================

Signals are passed on as ``drain``/``stop`` lines rather than as signals, so a
child that also got the signal itself (a terminal's Ctrl-C reaches the whole
process group, systemd signals every process of the unit) is told to drain
twice, which is once, and never takes the two for "stop now".

The spec carries the database URL of the parent's embedded PostgreSQL; it
travels over this channel, never in the environment or on a command line,
and :class:`ChildSpec`'s repr leaves it out.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace

import trio

from bothy_notify.config import ClusterMode, Config, Role

SUPERVISED_ENV = "BOTHY_NOTIFY_SUPERVISED"
"""Set by the parent for each child: the file descriptor of its control channel."""

SPEC_TIMEOUT = 30.0
"""Seconds a child waits for its spec line; the parent sends it right after the spawn."""

READY, DRAIN, STOP, RELOAD = b"ready\n", b"drain\n", b"stop\n", b"reload\n"

_MAX_LINE = 64 * 1024
"""Longest line either side accepts (a spec is a few hundred bytes)."""


class ControlError(Exception):
    """The control channel broke or said something this version does not know."""


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """What the parent tells one node process.

    Attributes:
        ordinal: 1 to ``processes``; in every log line of the child.
        processes: how many node processes the parent runs.
        role: the node's ``server.role``.
        api_listen: the HTTP API's ``host:port``, resolved by the parent (shared).
        gateway_listen: the gateway's ``host:port``, resolved by the parent (shared).
        database_url: the parent's embedded PostgreSQL; ``None``: ``database.url``.
    """

    ordinal: int
    processes: int
    role: Role
    api_listen: str
    gateway_listen: str
    database_url: str | None = None

    def __repr__(self) -> str:
        return (
            f"ChildSpec(ordinal={self.ordinal}, processes={self.processes},"
            f" role={self.role.value!r})"
        )

    def to_line(self) -> bytes:
        """The spec as one JSON line."""
        return (
            json.dumps(
                {
                    "ordinal": self.ordinal,
                    "processes": self.processes,
                    "role": self.role.value,
                    "api_listen": self.api_listen,
                    "gateway_listen": self.gateway_listen,
                    "database_url": self.database_url,
                }
            ).encode()
            + b"\n"
        )

    @classmethod
    def from_line(cls, line: bytes) -> ChildSpec:
        """Parse :meth:`to_line`'s output; raises :class:`ControlError` otherwise."""
        try:
            data = json.loads(line)
            return cls(
                ordinal=int(data["ordinal"]),
                processes=int(data["processes"]),
                role=Role(data["role"]),
                api_listen=str(data["api_listen"]),
                gateway_listen=str(data["gateway_listen"]),
                database_url=None if data["database_url"] is None else str(data["database_url"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ControlError("the parent sent a spec this version cannot read") from exc

    def apply(self, config: Config) -> Config:
        """``config`` as this child runs it: a node of a cluster (``cluster.mode =
        "multi"``) of the spec's role, on the shared addresses, one process."""
        server = replace(
            config.server,
            role=self.role,
            api_listen=self.api_listen,
            gateway_listen=self.gateway_listen,
            processes=1,
        )
        cluster = replace(config.cluster, mode=ClusterMode.MULTI)
        return replace(config, server=server, cluster=cluster)


class ParentChannel:
    """The child's end of its control channel.

    Build it with :func:`supervised_child` before Trio starts; :meth:`ready` and
    :meth:`watch` run in Trio.
    """

    def __init__(self, sock: socket.socket, spec: ChildSpec) -> None:
        self.spec = spec
        sock.setblocking(False)
        self._sock = trio.socket.from_stdlib_socket(sock)

    def __repr__(self) -> str:
        return f"ParentChannel({self.spec!r})"

    async def ready(self) -> None:
        """Tell the parent this node serves. A parent already gone is not an error
        here: :meth:`watch` sees the end of the channel and drains."""
        with contextlib.suppress(OSError):
            await self._sock.send(READY)

    async def watch(
        self,
        *,
        drain: Callable[[], None],
        stop: Callable[[], None],
        reload: Callable[[], None] = lambda: None,
    ) -> None:
        """Act on the parent's lines until the channel ends: ``drain`` for ``drain``
        and for the end of the channel (the parent died), ``stop`` for ``stop``,
        ``reload`` for ``reload``.

        Returns after the end of the channel or after ``stop``. Raises
        :class:`ControlError` for a line it does not know.
        """
        buffer = b""
        while True:
            try:
                data = await self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                drain()
                return
            buffer += data
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                if line + b"\n" == DRAIN:
                    drain()
                elif line + b"\n" == STOP:
                    stop()
                    return
                elif line + b"\n" == RELOAD:
                    reload()
                else:
                    raise ControlError("the parent sent a line this version does not know")
            if len(buffer) > _MAX_LINE:
                raise ControlError("the parent sent a line that is too long")

    def close(self) -> None:
        self._sock.close()


def supervised_child() -> ParentChannel | None:
    """This process's control channel when a parent of ``server.processes`` started
    it (:data:`SUPERVISED_ENV` set), with the spec read from it; else ``None``.

    Blocking (call it before Trio starts). The variable is removed from the
    environment, so nothing this process starts takes itself for a child.

    Raises:
        ControlError: the variable is not a descriptor, or no spec came within
            :data:`SPEC_TIMEOUT`.
    """
    value = os.environ.pop(SUPERVISED_ENV, None)
    if value is None:
        return None
    try:
        sock = socket.socket(fileno=int(value))
    except (ValueError, OSError) as exc:
        raise ControlError(f"{SUPERVISED_ENV} is not an inherited control channel") from exc
    sock.settimeout(SPEC_TIMEOUT)
    line = b""
    try:
        # One byte at a time: nothing after the spec may be taken from the socket here.
        while not line.endswith(b"\n") and len(line) < _MAX_LINE:
            byte = sock.recv(1)
            if not byte:
                break
            line += byte
    except OSError as exc:
        sock.close()
        raise ControlError("no spec came from the parent") from exc
    if not line.endswith(b"\n"):
        sock.close()
        raise ControlError("no spec came from the parent")
    return ParentChannel(sock, ChildSpec.from_line(line))


__all__ = [
    "DRAIN",
    "READY",
    "RELOAD",
    "STOP",
    "SUPERVISED_ENV",
    "ChildSpec",
    "ControlError",
    "ParentChannel",
    "supervised_child",
]
