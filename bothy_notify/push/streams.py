"""Network streams and backend for httpx connections that stay sound when a send is
cancelled.

Every provider send is bounded by a cancel scope (SPEC section 10: 10 s). The
webhook provider sends through httpx (``push/pinned.py`` wraps its connections
in :class:`CancelSafeStream`); APNs and FCM no longer do (``push/http2.py``),
but the lessons below are why their transport is built the way it is.
httpcore is not written for cancellation on a shared HTTP/2 connection:

- it takes the bytes to send out of the h2 state machine and then awaits the
  socket write; a cancellation before the write completes drops bytes that h2
  believes were sent (an HPACK-encoded header block among them), so the peer's
  header table no longer matches ours and every later request on the
  connection is garbled (seen here as "duplicate pseudo-header" at the fake);
- a cancellation during the TLS handshake leaves the socket open.

:class:`CancelSafeStream` finishes a write it has started even when the
caller is cancelled (bounded by :data:`WRITE_BOUND`; past that the stream is
closed, which httpcore sees as a broken connection), and closes the socket of
a handshake that is cancelled. Cancellation then only lands where httpcore can
take it: waiting for a lock, a stream slot or the answer.
:class:`CancelSafeBackend` is httpcore's Trio backend with every connection so
wrapped: the webhook provider's pinned backend (``push/pinned.py``) is one, and
``bench/http2_clients.py`` measures httpx over it.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import trio

WRITE_BOUND = 10.0
"""Seconds a started write may take before the connection is given up."""


class CancelSafeStream(httpcore.AsyncNetworkStream):
    """Wraps a stream so that a started write is never cut off by a cancellation."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    def __repr__(self) -> str:
        return "CancelSafeStream()"

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 - httpcore's interface
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 - httpcore's interface
        if not buffer:  # httpcore flushes after every read, mostly with nothing to send
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(WRITE_BOUND) as bound:
                await self._inner.write(buffer, timeout)
            if bound.cancelled_caught:
                await self._inner.aclose()
                raise httpcore.WriteTimeout("the write did not finish in time")

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
    ) -> httpcore.AsyncNetworkStream:
        try:
            return CancelSafeStream(
                await self._inner.start_tls(ssl_context, server_hostname, timeout)
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._inner.aclose()
            raise

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class CancelSafeBackend(httpcore.AsyncNetworkBackend):
    """httpcore's Trio backend whose TCP connections are each a :class:`CancelSafeStream`
    (so their TLS streams are too); no Unix sockets."""

    def __init__(self) -> None:
        self._inner = httpcore.TrioBackend()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface; we bound by scope
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return CancelSafeStream(
            await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("no Unix sockets here")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
