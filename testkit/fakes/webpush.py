"""A fake RFC 8030 push service over TLS (Hypercorn, a trustme certificate), checking
requests the way the browsers' push services do, and reading them as a browser would.

A test subscribes like a browser (:meth:`FakePushService.subscribe`): a P-256
key pair and a 16-byte auth secret are made here and only their public half and
the secret go to the daemon, inside ``PushSubscription.toJSON()``'s shape. Every
push must carry ``Authorization: vapid t=<JWT>, k=<key>`` whose ES256 JWT
verifies with ``k`` (the server's public key the test expects), with ``aud`` this
service's origin, an ``exp`` in the future and at most 24 h ahead, and a ``sub``
of ``mailto:`` or ``https:``; ``TTL``, ``Urgency``, ``Topic`` (at most 32
base64url characters) and ``Content-Encoding: aes128gcm``. The body is
**decrypted** with the subscription's private key and auth secret (RFC 8291), and
the JSON inside is recorded. Answers are scripted per subscription; a request
breaking a rule gets 400/401/403 as a push service would and is listed in
:attr:`FakePushService.violations`.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import http_ece
import jwt
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from testkit.fakes.asgi import serve_tls

HOST = "push.bothy.test"
_TOPIC = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class PushAnswer:
    """What the fake answers to one push: a status and headers, or nothing (stall)."""

    status: int = 201
    headers: tuple[tuple[str, str], ...] = ()
    stall: bool = False


@dataclass
class Browser:
    """One subscription as the browser holds it: its private key and auth secret."""

    sub_id: str
    endpoint: str
    private: ec.EllipticCurvePrivateKey
    auth: bytes

    def subscription(self, expiration: float | None = None) -> dict[str, Any]:
        """``PushSubscription.toJSON()`` of this subscription."""
        point = self.private.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return {
            "endpoint": self.endpoint,
            "expirationTime": expiration,
            "keys": {"p256dh": b64url(point), "auth": b64url(self.auth)},
        }


@dataclass
class Push:
    """One push as the fake read it."""

    sub_id: str
    host: str
    headers: dict[str, str]
    claims: dict[str, Any]
    payload: Any
    status: int | None = None


@dataclass
class FakePushService:
    """The fake. ``server_key`` is the VAPID public key (base64url) pushes must carry."""

    ca: trustme.CA
    server_key: str = ""
    hosts: tuple[str, ...] = (HOST, "localhost")
    browsers: dict[str, Browser] = field(default_factory=dict)
    pushes: list[Push] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    script: dict[str, list[PushAnswer]] = field(default_factory=dict)
    stalling: bool = False
    port: int = 0
    count: int = 0
    changed: trio.Event = field(default_factory=trio.Event)
    _resume: trio.Event = field(default_factory=trio.Event)

    def subscribe(self, sub_id: str, host: str = HOST) -> Browser:
        """A new subscription, made as a browser makes one."""
        browser = Browser(
            sub_id,
            f"https://{host}:{self.port}/push/{sub_id}",
            ec.generate_private_key(ec.SECP256R1()),
            os.urandom(16),
        )
        self.browsers[sub_id] = browser
        return browser

    def answer(self, sub_id: str, *answers: PushAnswer) -> None:
        self.script.setdefault(sub_id, []).extend(answers)

    def stall(self) -> None:
        self.stalling = True

    def resume(self) -> None:
        self.stalling = False
        self._resume.set()
        self._resume = trio.Event()

    def delivered(self) -> list[Push]:
        return [p for p in self.pushes if p.status is not None and 200 <= p.status < 300]

    async def wait_for(self, count: int) -> None:
        while self.count < count:
            await self.changed.wait()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        app = Starlette(routes=[Route("/push/{sub_id}", self._push, methods=["POST"])])
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(serve_tls, app, self.ca, *self.hosts)
            task_status.started(self.port)

    # ------------------------------------------------------------------ the rules

    async def _push(self, request: Request) -> Response:
        self.count += 1
        changed, self.changed = self.changed, trio.Event()
        changed.set()
        sub_id = request.path_params["sub_id"]
        raw = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        push = Push(sub_id, headers.get("host", ""), headers, {}, None)
        self.pushes.append(push)
        status = self._check(push, raw)
        if status is not None:
            push.status = status
            return Response(status_code=status)
        if self.stalling:
            await self._resume.wait()
        queue = self.script.get(sub_id)
        answer = queue.pop(0) if queue else PushAnswer()
        if answer.stall:
            await trio.sleep_forever()
        push.status = answer.status
        return Response(status_code=answer.status, headers=dict(answer.headers))

    def _violation(self, status: int, what: str) -> int:
        self.violations.append(what)
        return status

    def _check(self, push: Push, raw: bytes) -> int | None:
        browser = self.browsers.get(push.sub_id)
        if browser is None:
            return 404  # no such subscription (a test's unsubscribed browser)
        headers = push.headers
        match = re.fullmatch(
            r"vapid t=([^,\s]+),\s*k=([A-Za-z0-9_-]+)", headers.get("authorization", "")
        )
        if match is None:
            return self._violation(401, "no vapid authorization")
        token, key = match.groups()
        if self.server_key and key != self.server_key:
            return self._violation(403, "k is not the expected VAPID public key")
        try:
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(key))
            claims = jwt.decode(
                token,
                public,
                algorithms=["ES256"],
                audience=f"https://{push.host}",  # the origin the request went to
                options={"require": ["aud", "exp", "sub"]},
            )
        except (jwt.PyJWTError, ValueError) as exc:
            return self._violation(403, f"the VAPID JWT does not verify: {exc!r}")
        push.claims = claims
        exp = datetime.fromtimestamp(int(claims["exp"]), UTC)
        if exp > datetime.now(UTC) + timedelta(hours=24, minutes=1):
            return self._violation(403, "exp more than 24 h ahead")
        if not re.fullmatch(r"(mailto:\S+@\S+|https://\S+)", str(claims["sub"])):
            return self._violation(403, "sub is not mailto: or https:")
        if not headers.get("ttl", "").isdigit():
            return self._violation(400, "TTL missing or not a number")
        if headers.get("urgency", "normal") not in ("very-low", "low", "normal", "high"):
            return self._violation(400, "Urgency not one of RFC 8030's")
        topic = headers.get("topic")
        if topic is not None and not _TOPIC.fullmatch(topic):
            return self._violation(400, "Topic is not 1-32 base64url characters")
        if headers.get("content-encoding") != "aes128gcm":
            return self._violation(415, "Content-Encoding is not aes128gcm")
        if len(raw) > 4096:
            return self._violation(413, "body over 4096 bytes")
        try:
            clear = http_ece.decrypt(
                raw, private_key=browser.private, auth_secret=browser.auth, version="aes128gcm"
            )
            push.payload = json.loads(clear)
        except Exception as exc:  # the browser would drop a push it cannot read
            return self._violation(400, f"the body does not decrypt: {exc!r}")
        return None
