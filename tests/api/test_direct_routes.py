"""Routes served without Starlette's middleware and router (``api.app.DIRECT_ROUTES``:
the Matrix notify route) answer as every route does: the handler's answer, the API's
500 for an unexpected error (logged without request data), and any other method of
their path still goes through the router (405 listing the allowed ones)."""

from __future__ import annotations

import httpx
import pytest
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bothy_notify.api.app import DIRECT_ROUTES, serve_api
from bothy_notify.api.context import ApiContext, read_json
from bothy_notify.api.matrix import NOTIFY_PATH
from tests.support.offline import offline_app

SECRET = "do-not-echo-this-pushkey"


async def echo(ctx: ApiContext, request: Request) -> Response:
    return JSONResponse({"got": await read_json(request, ctx.config.server.max_body_bytes)})


async def echo_get(ctx: ApiContext, request: Request) -> Response:
    return JSONResponse({"get": True})


async def broken(ctx: ApiContext, request: Request) -> Response:
    raise RuntimeError(SECRET)


async def test_direct_routes_answer_as_through_the_router(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = offline_app(
        extra_routes=[
            ("/t/echo", echo, ["POST"]),
            ("/t/echo", echo_get, ["GET"]),
            ("/t/broken", broken, ["POST"]),
        ],
        direct=DIRECT_ROUTES | {("/t/echo", "POST"), ("/t/broken", "POST")},
    )
    shutdown = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(
                lambda task_status: serve_api(
                    app, "127.0.0.1:0", shutdown=shutdown, drain_period=1.0, task_status=task_status
                )
            )
            async with httpx.AsyncClient(base_url=f"http://{address}") as client:
                answer = await client.post("/t/echo", json={"a": [1, 2]})
                assert answer.status_code == 200 and answer.json() == {"got": {"a": [1, 2]}}
                answer = await client.get("/t/echo")
                assert answer.status_code == 200 and answer.json() == {"get": True}
                bad = await client.post("/t/echo", content=b"{not json")
                assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_json"

                failed = await client.post("/t/broken", json={"pushkey": SECRET})
                assert failed.status_code == 500
                assert failed.json() == {
                    "error": {"code": "internal", "message": "an internal error occurred"}
                }
                assert SECRET not in failed.text and SECRET not in caplog.text
                assert "unexpected error in a request" in caplog.text

                # The Matrix route itself: served directly (no [matrix_gateway] here: the
                # Matrix API's 404), and another method of its path is the router's 405.
                matrix = await client.post(NOTIFY_PATH, json={"notification": {"devices": []}})
                assert matrix.status_code == 404
                assert matrix.json()["errcode"] == "M_UNRECOGNIZED"
                wrong = await client.get(NOTIFY_PATH)
                assert wrong.status_code == 405
                assert wrong.json()["error"]["code"] == "method_not_allowed"
                assert wrong.headers["allow"] == "POST"
            shutdown.set()
