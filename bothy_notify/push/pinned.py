"""An httpcore network backend that connects to one checked address, whatever the URL says.

The webhook provider resolves a host, checks every address, and then must
connect to the address it checked: resolving again at connect time would let
a DNS answer that changed in between (rebinding) pick the target. The request
keeps its URL, so TLS verification, SNI and ``Host`` still name the URL's
host; only the TCP connection is pinned. Through an egress proxy the proxy is
asked to ``CONNECT`` to the checked address, not to the name.

Errors are httpcore's (``ConnectError``, ``ProxyError``...), as from any backend.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Iterable
from urllib.parse import unquote

import httpcore
import httpx
import trio

from bothy_notify.push.resolver import IPAddress
from bothy_notify.push.streams import CancelSafeBackend

_MAX_PROXY_ANSWER = 16_384
"""Longest CONNECT answer head read from a proxy."""


class PinnedBackend(CancelSafeBackend):
    """Connect every request to ``address`` (directly, or through ``proxy`` with CONNECT),
    over cancel-safe streams."""

    def __init__(
        self,
        address: IPAddress,
        *,
        proxy: httpx.URL | None = None,
        proxy_ssl: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__()
        self._address = address
        self._proxy = proxy
        self._proxy_ssl = proxy_ssl

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface; we bound by scope
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if self._proxy is None:
            return await super().connect_tcp(
                str(self._address), port, timeout, local_address, socket_options
            )
        proxy = self._proxy
        proxy_port = proxy.port or (443 if proxy.scheme == "https" else 80)
        stream = await super().connect_tcp(
            proxy.host, proxy_port, timeout, local_address, socket_options
        )
        try:
            if proxy.scheme == "https":
                stream = await stream.start_tls(
                    self._proxy_ssl or ssl.create_default_context(), proxy.host, timeout
                )
            await self._tunnel(stream, port)
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise
        return stream

    async def _tunnel(self, stream: httpcore.AsyncNetworkStream, port: int) -> None:
        address = self._address
        target = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        assert self._proxy is not None
        if self._proxy.username:
            user = unquote(self._proxy.username)
            password = unquote(self._proxy.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            lines.append(f"Proxy-Authorization: Basic {token}")
        await stream.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await stream.read(4096)
            if not chunk or len(head) > _MAX_PROXY_ANSWER:
                raise httpcore.ProxyError("the proxy closed or sent no CONNECT answer")
            head += chunk
        status_line = head.split(b"\r\n", 1)[0].split()
        if len(status_line) < 2 or not status_line[1].startswith(b"2"):
            raise httpcore.ProxyError("the proxy refused the CONNECT")
