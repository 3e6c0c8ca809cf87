"""A WebSocket client straight over wsproto that reads only when told to.

With a small receive buffer and no reading, the server's writes to it stall
within a few kilobytes: what the write-timeout and catch-up tests need.
"""

from __future__ import annotations

import json
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Event, Request, TextMessage


class RawClient:
    """One connection; :meth:`frames` reads (and parses) until a condition holds."""

    def __init__(self, stream: trio.SocketStream, ws: WSConnection) -> None:
        self.stream = stream
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self._partial: list[str] = []

    @classmethod
    async def connect(cls, address: str, *, receive_buffer: int = 4096) -> RawClient:
        host, _, port = address.rpartition(":")
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, receive_buffer)
        await sock.connect((host, int(port)))
        client = cls(trio.SocketStream(sock), WSConnection(ConnectionType.CLIENT))
        await client._send(Request(host=host, target="/v1/gateway"))
        while not any(isinstance(e, AcceptConnection) for e in await client._events()):
            pass
        return client

    async def send(self, frame: dict[str, Any]) -> None:
        await self._send(TextMessage(data=json.dumps(frame)))

    async def wait_hello(self) -> dict[str, Any] | None:
        """The ``hello`` frame (it may have come with the upgrade's answer), or
        ``None`` when the server closed first."""
        for frame in self.frames:
            if frame.get("op") == "hello":
                return frame
        return await self.read_until(lambda f: f.get("op") == "hello")

    async def read_until(self, predicate: Any) -> dict[str, Any] | None:
        """Read frames until one matches ``predicate`` (returned) or the server closes.

        Only frames received from now on are matched.
        """
        seen = len(self.frames)
        while True:
            for frame in self.frames[seen:]:
                if predicate(frame):
                    return frame
            seen = len(self.frames)
            if self.close_code is not None:
                return None
            await self._events()

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def _send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def _events(self) -> list[Event]:
        data = await self.stream.receive_some(65536)
        self.ws.receive_data(data or None)
        events = list(self.ws.events())
        for event in events:
            if isinstance(event, TextMessage):
                self._partial.append(event.data)
                if event.message_finished:
                    self.frames.append(json.loads("".join(self._partial)))
                    self._partial.clear()
            elif isinstance(event, CloseConnection):
                self.close_code, self.close_reason = event.code, event.reason
        if not data and self.close_code is None:
            self.close_code = 1006
        return events
