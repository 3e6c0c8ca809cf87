"""A raw HTTP/1.1 client over a socket: sends exactly the bytes given, byte by byte
when told to, and parses the answer with h11.

httpx refuses to send what these tests need to send (header values that are not
latin-1 text, two ``Authorization`` headers, control characters, a body that
trickles in forever).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import h11
import trio


@dataclass
class Answer:
    """What the server sent back: ``status`` is ``None`` when it closed without an answer."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    closed: bool

    def json(self) -> Any:
        return json.loads(self.body)


def request_bytes(
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
) -> bytes:
    """A request as bytes, headers exactly as given (plus Host and Content-Length)."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: test"]
    lines += [name + b": " + value for name, value in headers]
    if body or method in ("PUT", "POST"):
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def read_answer(stream: trio.SocketStream) -> Answer:
    """Read one answer, and then whether the server closed the connection."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "test")]))
    conn.send(h11.EndOfMessage())
    status: int | None = None
    headers: dict[str, str] = {}
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset by the server
                data = b""
            conn.receive_data(data)
            if not data and status is None:
                return Answer(None, {}, b"", True)
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            headers = {k.decode(): v.decode("latin-1") for k, v in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    closed = headers.get("connection", "").lower() == "close"
    if closed:
        try:
            closed = await stream.receive_some(65536) == b""
        except trio.BrokenResourceError:
            closed = True
    return Answer(status, headers, bytes(body), closed)


async def exchange(address: str, data: bytes) -> Answer:
    """Send ``data`` at once and read the answer."""
    host, _, port = address.rpartition(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(data)
        return await read_answer(stream)


async def trickle(address: str, data: bytes, *, pause: float, at_once: int = 0) -> Answer:
    """Send the first ``at_once`` bytes of ``data`` at once, then one byte per ``pause``
    seconds until the server answers or closes.

    The pause paces a hostile client; no assertion depends on it.
    """
    host, _, port = address.rpartition(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        answer: Answer | None = None

        async def send_slowly() -> None:
            await stream.send_all(data[:at_once])
            for i in range(at_once, len(data)):
                try:
                    await stream.send_all(data[i : i + 1])
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                await trio.sleep(pause)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_slowly)
            answer = await read_answer(stream)
            nursery.cancel_scope.cancel()
        return answer
