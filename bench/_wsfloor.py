"""The floor of a gateway ping: a bare wsproto ping/pong server in its own process.

It speaks just enough of the gateway protocol for the benchmark's clients
(``hello``; ``identify`` answered by ``ready``, ``unread`` and
``catchup.complete`` without any check; ``ping`` answered by ``pong``), one
Trio task per connection, the same socket reads as the gateway (4,096 bytes)
and JSON decoding of every message: what any Trio server over wsproto pays
for a ping, with nothing of the product in it. CPU is read from ``/proc`` by
the benchmark.
"""

from __future__ import annotations

import json
import resource
from functools import partial
from multiprocessing.connection import Connection

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    Request,
    TextMessage,
)

PONG = '{"op":"pong"}'
CATCHUP = [
    '{"op":"ready","d":{}}',
    '{"op":"unread","d":{"threads":[]}}',
    '{"op":"catchup.complete"}',
]


def floor_process(pipe: Connection, heartbeat_ms: int) -> None:
    """Serve on 127.0.0.1 (a free port, sent through ``pipe``) until ``pipe`` says stop."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    trio.run(_main, pipe, heartbeat_ms)


async def _main(pipe: Connection, heartbeat_ms: int) -> None:
    hello = json.dumps({"op": "hello", "d": {"heartbeat_ms": heartbeat_ms}})
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, partial(_serve, hello=hello), 0, host="127.0.0.1")
        )
        pipe.send(listeners[0].socket.getsockname()[1])
        await trio.to_thread.run_sync(pipe.recv)
        nursery.cancel_scope.cancel()


async def _serve(stream: trio.SocketStream, hello: str) -> None:
    ws = WSConnection(ConnectionType.SERVER)
    try:
        while True:
            data = await stream.receive_some(4096)
            if not data:
                return
            ws.receive_data(data)
            out = bytearray()
            for event in ws.events():
                if isinstance(event, TextMessage):
                    op = json.loads(event.data).get("op")
                    if op == "ping":
                        out += ws.send(TextMessage(PONG))
                    elif op == "identify":
                        for text in CATCHUP:
                            out += ws.send(TextMessage(text))
                elif isinstance(event, Request):
                    out += ws.send(AcceptConnection())
                    out += ws.send(TextMessage(hello))
                elif isinstance(event, Ping):
                    out += ws.send(event.response())
                elif isinstance(event, CloseConnection):
                    out += ws.send(event.response())
                    await stream.send_all(out)
                    return
            if out:
                await stream.send_all(out)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await stream.aclose()
