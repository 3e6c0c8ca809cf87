"""A TCP proxy on 127.0.0.1 in front of the test's PostgreSQL that cuts connections
at a chosen message.

A primary that dies or is demoted in the middle of a statement breaks the
connection of whoever was waiting for the answer: the statement may have been
committed (the server had it) or not (it never arrived). :class:`CuttingProxy`
forwards every connection to the server, and while a :class:`Cut` is armed it
watches the client's messages: at the first that matches, it closes both sides,
either before forwarding that message (nothing happened) or after the server
answered it (it happened, and the client never heard). The server stays up: the
client's next connection reaches the same server, as a connection after a
failover reaches the new primary.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

CHUNK = 65_536


@dataclass(slots=True)
class Cut:
    """Cut the connection at the client's message of type ``kind`` (one byte, the
    PostgreSQL protocol's: ``Q`` a simple query, ``B`` a bind) that contains
    ``marker``; ``after_answer``: forward it and wait for the server's answer first.
    ``times``: how many connections to cut (``None``: every one, until disarmed)."""

    kind: bytes
    marker: bytes
    after_answer: bool
    times: int | None = 1

    def matches(self, data: bytes) -> bool:
        return data[:1] == self.kind and self.marker in data


class CuttingProxy:
    """Forwards TCP connections on ``127.0.0.1:port`` to the server of ``url`` (the
    embedded server, on a Unix socket).

    Attributes:
        port: the listening port, once :meth:`run` started.
        connections: connections accepted so far.
        cuts: connections cut so far.
        armed: the cut to make, or ``None``.
    """

    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        host = str(params.get("host") or "")
        port = str(params.get("port") or "5432")
        if not host.startswith("/"):
            raise ValueError("the proxy forwards to a server on a Unix socket")
        self._socket_path = f"{host}/.s.PGSQL.{port}"
        self.port = 0
        self.connections = 0
        self.cuts = 0
        self.armed: Cut | None = None

    def __repr__(self) -> str:
        return f"CuttingProxy(port={self.port}, cuts={self.cuts})"

    def url(self, url: str) -> str:
        """``url`` reached through this proxy."""
        return make_conninfo(url, host="127.0.0.1", port=str(self.port))

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(port)`` once listening."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._carry, listeners)

    def _take(self, data: bytes) -> Cut | None:
        cut = self.armed
        if cut is None or not cut.matches(data):
            return None
        if cut.times is not None:
            cut.times -= 1
            if cut.times <= 0:
                self.armed = None
        self.cuts += 1
        return cut

    async def _carry(self, client: trio.SocketStream) -> None:
        self.connections += 1
        async with client:
            try:
                upstream = await trio.open_unix_socket(self._socket_path)
            except OSError:
                return
            async with upstream, trio.open_nursery() as nursery:
                answered: list[Cut] = []  # a cut waiting for the answer it drops

                async def requests() -> None:
                    try:
                        while data := await client.receive_some(CHUNK):
                            cut = self._take(data)
                            if cut is None:
                                await upstream.send_all(data)
                            elif cut.after_answer:
                                answered.append(cut)
                                await upstream.send_all(data)
                                return  # answers() cuts once the server answered
                            else:
                                break
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    nursery.cancel_scope.cancel()

                async def answers() -> None:
                    try:
                        while data := await upstream.receive_some(CHUNK):
                            if answered:
                                break  # the server did it; the client never hears
                            await client.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(requests)
                nursery.start_soon(answers)
