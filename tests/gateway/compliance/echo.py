"""An echo server built on the gateway's own WebSocket code, for conformance runs.

:func:`gateway.transport.serve_websockets` accepts the connections, the
gateway's :class:`~gateway.transport.WebSocketTransport` and
:class:`~gateway.frames.FrameFilter` read them, and :func:`echo` sends every
message back as it came (text as text, binary as binary), as the Autobahn
testsuite expects of a server under test (Hypercorn's ``compliance/`` folder
does the same for its own protocol code). The ends are the gateway's: a
message over the limit closes with 1009, broken framing with 1002, text that is
not UTF-8 with 1007, each through :meth:`~gateway.transport.WebSocketTransport.close`
as the gateway's session closes.

Run alone (for ``wstest -m fuzzingclient``)::

    .venv/bin/python -m tests.gateway.compliance.echo --listen 127.0.0.1:9001

It prints the bound address on its first line and serves until interrupted.
"""

from __future__ import annotations

import argparse
import sys

import trio

from gateway.closes import FRAME_TOO_LARGE, FRAMING_BROKEN, INVALID_TEXT, CloseCode
from gateway.errors import FrameTooLarge, FramingError, TransportClosed
from gateway.frames import OP_BINARY, frame
from gateway.limits import PendingConnections
from gateway.transport import Transport, WebSocketTransport, serve_websockets

PATH = "/"
"""The path served (the testsuite's URL names it)."""

MAX_MESSAGE_BYTES = 1 << 20
"""``sync.max_frame_bytes`` of the harness: room for every message of Autobahn's
sections 1 to 7 (the largest is 65,536 bytes)."""

CLOSE_TIMEOUT = 5.0
"""Seconds a close may take (the gateway's is ``sync.write_timeout``)."""


async def echo(transport: Transport, nursery: trio.Nursery) -> None:
    """Send each message back until the connection ends; close as the gateway does."""
    assert isinstance(transport, WebSocketTransport)
    try:
        while True:
            message = await transport.receive()
            if isinstance(message, str):
                await transport.send(message)
            else:  # the gateway never sends binary: its write path, with a binary frame
                await transport._send(frame(OP_BINARY, message))
    except TransportClosed:
        return  # the peer's close was answered (or the connection broke)
    except FrameTooLarge:
        close = FRAME_TOO_LARGE
    except FramingError as exc:
        close = INVALID_TEXT if exc.code == CloseCode.INVALID_TEXT else FRAMING_BROKEN
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
        await transport.close(close.code, close.reason)


async def serve_echo(
    listen: str,
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve :func:`echo` on ``listen`` until cancelled; ``task_status.started``
    receives the bound ``host:port``."""
    await serve_websockets(
        listen,
        echo,
        path=PATH,
        max_frame_bytes=max_message_bytes,
        handshake_timeout=10.0,
        pending=PendingConnections(1000),
        task_status=task_status,
    )


async def _main(listen: str) -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(
            lambda task_status: serve_echo(listen, task_status=task_status)
        )
        print(address, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port (port 0: any free)")
    args = parser.parse_args()
    try:
        trio.run(_main, args.listen)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
