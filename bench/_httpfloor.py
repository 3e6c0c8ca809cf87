"""The floor of an HTTP POST: Hypercorn's Trio worker serving a trivial JSON handler.

Each benchmark of an HTTP endpoint measures this beside the daemon, in the same
run and with the same client, to say how much of a request's CPU the libraries
cost before any of the product's work:

- :func:`bare_app`: a raw ASGI app (no framework) that reads the body, parses it
  as JSON and answers a small JSON object (``bench/public_path.py``);
- :func:`starlette_app`: a Starlette app of one ``POST`` route whose handler
  reads the body, parses it and answers with a ``JSONResponse``: what any
  Hypercorn + Starlette service pays per request (``bench/matrix.py``, and
  ``bench/public_path.py`` through :func:`starlette_http_process`).

Both are served in a process of their own by :func:`bare_http_process`,
configured as the daemon's API server is (``bothy_notify.api.app.serve_api``);
the benchmark reads that process's CPU from ``/proc``.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any

import trio

BARE_ANSWER = b'{"seqs":[1]}'


async def bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A trivial ASGI app: reads a JSON POST, answers :data:`BARE_ANSWER`."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    json.loads(body)
    answer = BARE_ANSWER
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(answer)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": answer})


def starlette_app(path: str, answer: Any) -> Any:
    """A Starlette app of one ``POST path`` route: parses the JSON body, answers
    ``answer`` (a JSON value) with status 200."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def endpoint(request: Request) -> JSONResponse:
        json.loads(await request.body())
        return JSONResponse(answer)

    return Starlette(routes=[Route(path, endpoint, methods=["POST"])])


def bare_http_process(
    pipe: Connection, app: str = "bare", path: str = "/", answer: Any = None
) -> None:
    """Serve on 127.0.0.1 (a free port; ``host:port`` sent through ``pipe``) until
    killed: :func:`bare_app` (``app="bare"``) or :func:`starlette_app` (``"starlette"``,
    with ``path`` and ``answer``)."""
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.trio import serve

    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_max_requests = 1_000_000
    served: Any = bare_app if app == "bare" else starlette_app(path, answer)

    async def serve_app(*, task_status: trio.TaskStatus[list[str]]) -> None:
        await serve(served, config, task_status=task_status)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve_app)
            pipe.send(binds[0].removeprefix("http://"))

    trio.run(main)


def starlette_http_process(pipe: Connection) -> None:
    """The floor of the daemon's API for ``bench/public_path.py``: :func:`starlette_app`
    on ``POST /v1/events`` answering ``{"seqs": [1]}``, as a handler of the daemon's API
    does around its work."""
    bare_http_process(pipe, "starlette", "/v1/events", {"seqs": [1]})
