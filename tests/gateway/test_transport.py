"""The WebSocket transport over wsproto, without the rest of the gateway.

A server from :func:`serve_websockets` on 127.0.0.1 port 0 echoes each text
message; a wsproto client speaks to it over a real socket. The transport has
no task of its own, so what a library's reader task did (answer pings, answer
the peer's close, reassemble fragments) happens in the task that waits in
``receive``; these tests pin that.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Ping,
    Pong,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import FrameProtocol

from gateway.errors import TransportClosed
from gateway.limits import PendingConnections
from gateway.transport import Transport, WriteStream, serve_websockets
from tests.gateway.client import wait_until

PATH = "/v1/gateway"


class Echo:
    """The server's handler: echoes text messages, records how receive ended."""

    def __init__(self) -> None:
        self.peer_codes: list[int | None] = []

    async def __call__(self, transport: Transport, nursery: trio.Nursery) -> None:
        try:
            while True:
                message = await transport.receive()
                await transport.send(message if isinstance(message, str) else "bytes")
        except TransportClosed as exc:
            self.peer_codes.append(exc.code)


class Client:
    """A wsproto client over one TCP connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)

    @classmethod
    async def connect(cls, address: str) -> Client:
        host, _, port = address.rpartition(":")
        client = cls(await trio.open_tcp_stream(host, int(port)))
        await client.send(Request(host=host, target=PATH))
        assert isinstance(await client.next_event(), AcceptConnection)
        return client

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stream.aclose()

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next_event(self) -> Event:
        while True:
            for event in self.ws.events():
                return event
            data = await self.stream.receive_some(65536)
            self.ws.receive_data(data or None)


@pytest.fixture
async def echo_server(nursery: trio.Nursery) -> AsyncIterator[tuple[str, Echo]]:
    echo = Echo()
    address = await nursery.start(
        lambda task_status: serve_websockets(
            "127.0.0.1:0",
            echo,
            path=PATH,
            max_frame_bytes=1000,
            handshake_timeout=10,
            pending=PendingConnections(10),
            task_status=task_status,
        )
    )
    yield address, echo


async def test_a_websocket_ping_is_answered_with_a_pong_of_its_payload(
    echo_server: tuple[str, Echo],
) -> None:
    async with await Client.connect(echo_server[0]) as client:
        await client.send(Ping(payload=b"beat"))

        assert await client.next_event() == Pong(payload=b"beat")
        await client.send(TextMessage(data="still open"))
        assert await client.next_event() == TextMessage(data="still open")


async def test_a_fragmented_message_with_a_ping_between_arrives_whole(
    echo_server: tuple[str, Echo],
) -> None:
    async with await Client.connect(echo_server[0]) as client:
        await client.send(TextMessage(data="caf\u00e9 ", message_finished=False))
        await client.send(Ping(payload=b"p"))
        await client.send(TextMessage(data="ol\u00e9", message_finished=True))

        assert await client.next_event() == Pong(payload=b"p")
        assert await client.next_event() == TextMessage(data="caf\u00e9 ol\u00e9")


async def test_the_peer_close_is_answered_and_ends_receive_with_its_code(
    echo_server: tuple[str, Echo],
) -> None:
    address, echo = echo_server
    async with await Client.connect(address) as client:
        await client.send(CloseConnection(code=1000, reason="bye"))

        answer = await client.next_event()
        assert isinstance(answer, CloseConnection) and answer.code == 1000
        assert await client.stream.receive_some(65536) == b""  # the server closed the socket
        assert echo.peer_codes == [1000]


async def test_a_connection_that_ends_without_a_close_frame_has_no_peer_code(
    echo_server: tuple[str, Echo],
) -> None:
    address, echo = echo_server
    async with await Client.connect(address) as client:
        await client.stream.aclose()

        await wait_until(lambda: bool(echo.peer_codes))
        assert echo.peer_codes == [None]


async def test_writers_sending_at_once_keep_every_frame_whole() -> None:
    """The session's pong or close may be sent while the writer is in the middle
    of a frame: each goes out whole, after the frame being written."""
    server_sock, client_sock = socket.socketpair()
    server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    server_sock.setblocking(False)
    writes = WriteStream(server_sock)
    reader = trio.SocketStream(trio.socket.from_stdlib_socket(client_sock))
    server = FrameProtocol(client=False, extensions=[])
    payloads = [bytes([65 + i]) * 50_000 for i in range(6)]

    async def write(mine: list[bytes]) -> None:
        for payload in mine:
            await writes.send_all(bytes(server.send_data(payload)))

    received: list[bytes] = []

    async def read() -> None:
        client = FrameProtocol(client=True, extensions=[])
        parts: list[bytes] = []
        while len(received) < len(payloads):
            client.receive_bytes(await reader.receive_some(65536))
            for frame in client.received_frames():
                parts.append(bytes(frame.payload))  # type: ignore[arg-type]
                if frame.message_finished:
                    received.append(b"".join(parts))
                    parts.clear()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        nursery.start_soon(write, payloads[:3])
        nursery.start_soon(write, payloads[3:])

    assert sorted(received) == payloads
    server_sock.close()
    await reader.aclose()
