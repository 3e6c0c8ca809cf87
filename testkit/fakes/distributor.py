"""A fake UnifiedPush distributor's push server (ntfy's shape) over TLS, enforcing what
UnifiedPush asks of an application server.

An Android app without Google's services registers with a distributor (ntfy,
NextPush, ...) through the UnifiedPush connector library (AND_3.0): the library
makes the Web Push keys (a P-256 key pair and a 16-byte auth secret, RFC 8291)
and the distributor gives an endpoint on its push server, here
``https://<host>:<port>/up<token>?up=1`` as ntfy makes them. The app sends
``{endpoint, keys}`` to its server, which pushes Web Push to the endpoint: the
push server (this fake) forwards the body to the distributor, which hands it to
the library, which decrypts it.

The rules (UnifiedPush's server specification and RFC 8030/8291), each one a
400-class answer listed in :attr:`FakeDistributor.violations` when broken:

- ``POST`` only to a known endpoint (404 otherwise; 410 once the app
  unregistered: :meth:`FakeDistributor.unregister`);
- a body of 1 to 4,096 bytes (413 beyond), ``Content-Encoding: aes128gcm``, and
  it decrypts with the app's keys;
- ``TTL`` (digits) and ``Urgency`` (RFC 8030's values) both sent;
- ``Authorization: vapid t=<JWT>, k=<key>`` verifying with the application
  server's key (AND_3.0 passes that key to the distributor, which may require it);
- no redirect is ever followed (a scripted 3xx must not be followed).

Answers: 201 with ``TTL: 0``, or what the test scripts per endpoint (a 429 with
``Retry-After``). ``GET`` on an endpoint answers ``{"unifiedpush":{"version":1}}``
(the server specification's check).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

import trio
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from testkit.fakes.asgi import serve_tls
from testkit.fakes.webpush import Browser, FakePushService, Push, PushAnswer

DISTRIBUTOR = "ntfy.bothy.test"
URGENCIES = ("very-low", "low", "normal", "high")


@dataclass
class FakeDistributor(FakePushService):
    """The fake push server of a distributor; the VAPID and decryption rules are the
    push service's (:class:`~testkit.fakes.webpush.FakePushService`)."""

    hosts: tuple[str, ...] = (DISTRIBUTOR,)
    gone: set[str] = field(default_factory=set)
    requests: dict[str, int] = field(default_factory=dict)
    """POSTs each endpoint received (by the app's name), answered or refused."""

    def register_app(self, name: str) -> Browser:
        """An app's registration through the connector library: its Web Push keys,
        and an ntfy-style endpoint of the distributor."""
        token = secrets.token_urlsafe(15)
        app = Browser(
            name,
            f"https://{DISTRIBUTOR}:{self.port}/up{token}?up=1",
            ec.generate_private_key(ec.SECP256R1()),
            os.urandom(16),
        )
        self.browsers[token] = app
        self._names[token] = name
        return app

    def unregister(self, app: Browser) -> None:
        """The user removed the app (or the distributor): its endpoint answers 410."""
        self.gone.add(self._token(app))

    def answer_app(self, app: Browser, *answers: PushAnswer) -> None:
        self.answer(self._token(app), *answers)

    def delivered_to(self, app: Browser) -> list[Push]:
        token = self._token(app)
        return [p for p in self.delivered() if p.sub_id == token]

    @staticmethod
    def _token(app: Browser) -> str:
        return app.endpoint.rsplit("/up", 1)[1].split("?", 1)[0]

    def __post_init__(self) -> None:
        self._names: dict[str, str] = {}

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        app = Starlette(
            routes=[
                Route("/up{token}", self._up_push, methods=["POST"]),
                Route("/up{token}", self._up_discovery, methods=["GET"]),
            ]
        )
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(serve_tls, app, self.ca, *self.hosts)
            task_status.started(self.port)

    async def _up_discovery(self, request: Request) -> Response:
        if request.path_params["token"] not in self.browsers:
            return Response(status_code=404)
        return JSONResponse({"unifiedpush": {"version": 1}})

    async def _up_push(self, request: Request) -> Response:
        token = request.path_params["token"]
        name = self._names.get(token, "?")
        self.requests[name] = self.requests.get(name, 0) + 1
        if request.query_params.get("up") != "1":
            return Response(status_code=404)
        if token in self.gone:
            self.count += 1
            changed, self.changed = self.changed, trio.Event()
            changed.set()
            return Response(status_code=410)
        headers = {k.lower(): v for k, v in request.headers.items()}
        if "ttl" not in headers or "urgency" not in headers:
            self.violations.append("TTL or Urgency not sent")
            return Response(status_code=400)
        if headers["urgency"] not in URGENCIES:
            self.violations.append("Urgency not one of RFC 8030's")
            return Response(status_code=400)
        raw = await request.body()
        if not raw:
            self.violations.append("an empty body")
            return Response(status_code=400)
        request.scope["path_params"] = {"sub_id": token}
        answer = await self._push(request)
        if answer.status_code == 201:
            answer.headers["ttl"] = "0"
        return answer
