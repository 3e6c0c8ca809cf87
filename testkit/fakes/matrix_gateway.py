"""A fake upstream Matrix push gateway (Sygnal's side of the Push Gateway API) over TLS.

It serves ``POST /_matrix/push/v1/notify`` as the spec has it: the body must be
JSON with a ``notification`` object whose ``devices`` is a non-empty list of
objects with ``app_id`` and ``pushkey`` (else 400 ``M_BAD_JSON``), and it answers
``{"rejected": [...]}`` with the pushkeys it was told are gone
(:meth:`FakeMatrixGateway.reject`), or what a test scripts (a status and headers).
Every request is recorded; a request breaking a rule is listed in
:attr:`FakeMatrixGateway.violations`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import trio
import trustme
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from testkit.fakes.asgi import serve_tls

GATEWAY_HOST = "push.vendor.test"
NOTIFY_PATH = "/_matrix/push/v1/notify"


@dataclass(frozen=True)
class GatewayAnswer:
    """A scripted answer: a status and headers (a 200's body is the rejected list)."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class FakeMatrixGateway:
    ca: trustme.CA
    hosts: tuple[str, ...] = (GATEWAY_HOST,)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)
    script: list[GatewayAnswer] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"https://{GATEWAY_HOST}:{self.port}{NOTIFY_PATH}"

    def reject(self, pushkey: str) -> None:
        """The upstream's provider declared ``pushkey`` gone: list it from now on."""
        self.gone.add(pushkey)

    def notifications(self) -> list[dict[str, Any]]:
        return [r["notification"] for r in self.requests]

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        app = Starlette(routes=[Route(NOTIFY_PATH, self._notify, methods=["POST"])])
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(serve_tls, app, self.ca, *self.hosts)
            task_status.started(self.port)

    async def _notify(self, request: Request) -> Response:
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        try:
            body = json.loads(await request.body())
            devices = body["notification"]["devices"]
            assert isinstance(devices, list) and devices
            for device in devices:
                assert isinstance(device["app_id"], str) and isinstance(device["pushkey"], str)
        except (ValueError, KeyError, TypeError, AssertionError):
            self.violations.append("not a notify request of the spec's shape")
            return JSONResponse({"errcode": "M_BAD_JSON", "error": "bad body"}, 400)
        self.requests.append(body)
        if self.script:
            answer = self.script.pop(0)
            if answer.status != 200:
                return Response(status_code=answer.status, headers=dict(answer.headers))
        rejected = [d["pushkey"] for d in devices if d["pushkey"] in self.gone]
        return JSONResponse({"rejected": rejected})
