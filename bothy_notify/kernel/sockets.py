"""Listening sockets that several node processes share (``server.processes > 1``).

With ``SO_REUSEPORT`` every process of one ``bothy-notify run --processes N``
binds its own socket to the same ``host:port`` and the kernel spreads incoming
connections over the processes that listen. The parent binds first (without
listening, so it takes no connection) to resolve port 0 once and to keep the
port reserved while a child restarts; the children bind the resolved port.

A single process (``server.processes = 1``) never uses this module: it binds as
it always did, so a second daemon started by mistake on the same port still
fails with "address in use" instead of sharing it.

Only processes of the same user may share a port this way (Linux checks the
effective uid); a process of another user still gets "address in use".
"""

from __future__ import annotations

import socket

import trio


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    """The inverse of :func:`split_address`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_shared(address: str) -> socket.socket:
    """A TCP socket bound to ``address`` with ``SO_REUSEPORT``, not listening yet.

    The family is IPv6 when the host is an IPv6 literal, else IPv4 (a name such
    as ``localhost`` resolves to its IPv4 address, as Hypercorn binds it). An
    IPv6 socket serves IPv6 only, as Trio's listeners do.

    Raises:
        OSError: the address cannot be bound (in use by a socket without
            ``SO_REUSEPORT`` or of another user, or not an address of this host).
    """
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def bound_address(sock: socket.socket, host: str) -> str:
    """``host:port`` of a bound socket, keeping the host as configured."""
    return join_address(host, sock.getsockname()[1])


def open_shared_listener(address: str, *, backlog: int = 65_535) -> trio.SocketListener:
    """A Trio listener on ``address`` with ``SO_REUSEPORT`` (see :func:`bind_shared`).

    ``backlog`` is capped by the kernel (``net.core.somaxconn``), as for Trio's
    own listeners.
    """
    sock = bind_shared(address)
    try:
        sock.listen(backlog)
        sock.setblocking(False)
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    except BaseException:
        sock.close()
        raise


__all__ = [
    "bind_shared",
    "bound_address",
    "join_address",
    "open_shared_listener",
    "split_address",
]
