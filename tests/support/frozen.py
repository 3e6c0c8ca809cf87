"""A TCP proxy on 127.0.0.1 in front of the test's PostgreSQL that can freeze.

A frozen server (its processes stopped with SIGSTOP, a hung host, a network
split) looks to a client like this proxy frozen: the kernel still accepts
connections and takes the bytes sent, and nothing ever comes back. Frozen, the
proxy forwards nothing either way and opens nothing upstream for a new
connection, while keeping every socket open; thawed, it carries on where it
stopped. Several proxies in front of one server make a multi-host URL whose
hosts can fail one at a time (:func:`through`).
"""

from __future__ import annotations

import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

CHUNK = 65_536


class FreezableProxy:
    """Forwards TCP connections on ``127.0.0.1:port`` to the server of ``url``.

    Args:
        url: the server's URL (the embedded server: a Unix socket directory as
            its host).

    Attributes:
        port: the listening port, once :meth:`run` started.
        connections: connections accepted so far.
        frozen: nothing is forwarded while true.
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
        self.frozen = False
        self._thawed = trio.Event()
        self._thawed.set()

    def __repr__(self) -> str:
        return f"FreezableProxy(port={self.port}, frozen={self.frozen})"

    def freeze(self) -> None:
        """Stop forwarding: every connection, open or new, hears nothing more."""
        self.frozen = True
        self._thawed = trio.Event()

    def thaw(self) -> None:
        """Forward again."""
        self.frozen = False
        self._thawed.set()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(port)`` once listening."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._carry, listeners)

    async def _until_thawed(self) -> None:
        while self.frozen:
            await self._thawed.wait()

    async def _receive(self, source: trio.SocketStream) -> bytes:
        await self._until_thawed()
        return await source.receive_some(CHUNK)

    async def _carry(self, client: trio.SocketStream) -> None:
        self.connections += 1
        async with client:
            await self._until_thawed()
            try:
                upstream = await trio.open_unix_socket(self._socket_path)
            except OSError:
                return  # the server is gone: the client sees the connection end
            async with upstream, trio.open_nursery() as nursery:

                async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
                    try:
                        while data := await self._receive(source):
                            # Read just before a freeze: held until the thaw, like a
                            # stopped server process that had not sent it yet.
                            await self._until_thawed()
                            await sink.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # the other side went away: so does this connection
                    nursery.cancel_scope.cancel()

                nursery.start_soon(pump, client, upstream)
                nursery.start_soon(pump, upstream, client)


async def start_proxies(nursery: trio.Nursery, url: str, count: int) -> list[FreezableProxy]:
    """``count`` proxies in front of the server of ``url``, running in ``nursery``."""
    proxies = [FreezableProxy(url) for _ in range(count)]
    for proxy in proxies:
        await nursery.start(proxy.run)
    return proxies


def through(url: str, *proxies: FreezableProxy, **params: str) -> str:
    """``url`` reached through ``proxies`` in order: a multi-host URL when more than
    one (libpq tries the hosts in turn); ``params`` are more connection parameters."""
    return make_conninfo(
        url,
        host=",".join("127.0.0.1" for _ in proxies),
        port=",".join(str(p.port) for p in proxies),
        **params,
    )
