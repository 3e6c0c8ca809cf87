"""A webhook receiver over TLS that verifies signatures with the ``standardwebhooks``
package (a third party's reading of the scheme, not ours) and answers as scripted
per path."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import trio
import trustme
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from testkit.fakes.asgi import serve_tls

HOST = "hooks.bothy.test"
SIGNING_KEY = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


@dataclass
class Delivery:
    """One request the receiver got."""

    path: str
    host: str
    headers: dict[str, str]
    body: Any
    verified: bool


@dataclass
class WebhookReceiver:
    """Answers ``status`` per path in order (default 200); ``stall`` paths never answer."""

    ca: trustme.CA
    secret: str = SIGNING_KEY
    deliveries: list[Delivery] = field(default_factory=list)
    script: dict[str, list[int]] = field(default_factory=dict)
    stall_paths: set[str] = field(default_factory=set)
    stalled: int = 0
    port: int = 0
    changed: trio.Event = field(default_factory=trio.Event)
    hosts: tuple[str, ...] = (HOST, "other.bothy.test")
    """Names (or IP addresses) its certificate is issued for."""

    def url(self, path: str = "/hook", host: str = HOST) -> str:
        return f"https://{host}:{self.port}{path}"

    def answer(self, path: str, *statuses: int) -> None:
        self.script.setdefault(path, []).extend(statuses)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        app = Starlette(routes=[Route("/{path:path}", self._hook, methods=["POST", "GET"])])
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(serve_tls, app, self.ca, *self.hosts)
            task_status.started(self.port)

    async def _hook(self, request: Request) -> Response:
        raw = await request.body()
        path = request.url.path
        if path in self.stall_paths:
            self.stalled += 1
            self._changed()
            await trio.sleep_forever()
        headers = dict(request.headers)
        try:
            body = Webhook(self.secret).verify(raw, headers)
            verified = True
        except WebhookVerificationError:
            body, verified = None, False
        self.deliveries.append(Delivery(path, headers.get("host", ""), headers, body, verified))
        self._changed()
        queue = self.script.get(path)
        status = queue.pop(0) if queue else 200
        extra = {"location": self.url("/elsewhere")} if 300 <= status <= 399 else {}
        return Response(b"", status, headers=extra)

    def _changed(self) -> None:
        changed, self.changed = self.changed, trio.Event()
        changed.set()
