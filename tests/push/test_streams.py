"""Provider streams stay sound when a send is cancelled mid-write or mid-handshake
(an in-memory inner stream; Trio's autojump clock stands in for waiting)."""

from __future__ import annotations

import ssl
from typing import Any

import httpcore
import trio

from bothy_notify.push.streams import CancelSafeStream


class SlowStream(httpcore.AsyncNetworkStream):
    """An in-memory stream whose writes and handshake wait for ``release``."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.release = trio.Event()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await trio.sleep_forever()
        raise AssertionError("never returns")  # pragma: no cover

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.release.wait()
        self.written += buffer

    async def aclose(self) -> None:
        self.closed = True

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await trio.sleep_forever()
        raise AssertionError("never returns")  # pragma: no cover

    def get_extra_info(self, info: str) -> Any:
        return None


async def test_a_started_write_finishes_although_its_sender_is_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    inner = SlowStream()
    stream = CancelSafeStream(inner)
    outcome: dict[str, bool] = {}

    async def sender() -> None:
        with trio.move_on_after(0.02) as scope:
            await stream.write(b"HEADERS+DATA")
        outcome["deadline_passed"] = scope.cancel_called
        outcome["written_when_returned"] = inner.written == b"HEADERS+DATA"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.sleep(0.1)  # the peer drains only well after the sender's deadline
        inner.release.set()

    assert outcome == {"deadline_passed": True, "written_when_returned": True}
    assert not inner.closed


async def test_a_write_that_cannot_finish_closes_the_stream(autojump_clock: trio.abc.Clock) -> None:
    inner = SlowStream()
    stream = CancelSafeStream(inner)
    try:
        await stream.write(b"frame")
    except httpcore.WriteTimeout:
        pass
    else:
        raise AssertionError("a write that never finishes must fail")
    assert inner.closed and inner.written == b""


async def test_a_cancelled_handshake_closes_the_socket(autojump_clock: trio.abc.Clock) -> None:
    inner = SlowStream()
    stream = CancelSafeStream(inner)
    with trio.move_on_after(0.01):
        await stream.start_tls(ssl.create_default_context(), "example.test")
    assert inner.closed
