"""A fake FCM: the OAuth2 token endpoint and ``messages:send``, over TLS (Hypercorn).

The token endpoint checks the service account's signed JWT assertion (RS256,
issuer, audience, scope) and issues access tokens. ``messages:send`` checks
the bearer token and the message the way FCM does (data-only, every data value
a string, Android priority HIGH or NORMAL, APNs priority 5 background, an
``apns-collapse-id`` of at most 64 bytes) and answers with
HTTP v1 error bodies whose details are typed (``FcmError``,
``google.rpc.QuotaFailure``). Answers are scripted per registration token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import jwt
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bothy_notify.kernel.clock import Clock
from bothy_notify.push.fcm import FcmProvider, ServiceAccountTokens, load_service_account
from bothy_notify.push.http2 import Http2Client
from testkit.fakes.asgi import serve_tls

PROJECT = "bothy-test"
CLIENT_EMAIL = "push@bothy-test.iam.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"


def error_body(
    code: int, status: str, *, fcm: str | None = None, quota: bool = False
) -> dict[str, Any]:
    """An FCM v1 error body with typed details."""
    details: list[dict[str, Any]] = []
    if fcm is not None:
        details.append({"@type": FCM_ERROR, "errorCode": fcm})
    if quota:
        details.append(
            {"@type": QUOTA_FAILURE, "violations": [{"subject": "project", "description": "q"}]}
        )
    return {"error": {"code": code, "message": "fake", "status": status, "details": details}}


@dataclass(frozen=True)
class FcmAnswer:
    """One scripted answer: status, body (a dict as JSON, bytes as is), headers."""

    status: int = 200
    body: dict[str, Any] | bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    stall: bool = False


@dataclass
class FcmRequest:
    """One ``messages:send`` as the fake saw it."""

    project: str
    authorization: str
    body: Any


@dataclass
class FakeFcm:
    """The fake FCM with its token endpoint. Serve with :meth:`serve`."""

    ca: trustme.CA
    key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    requests: list[FcmRequest] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    script: dict[str, list[FcmAnswer]] = field(default_factory=dict)
    token_answers: list[FcmAnswer] = field(default_factory=list)
    token_fetches: int = 0
    issued: list[str] = field(default_factory=list)
    expires_in: int = 3600
    port: int = 0
    projects: dict[str, tuple[str, rsa.RSAPrivateKey]] = field(default_factory=dict)
    """Further Firebase projects this fake serves (one per app): project -> (service
    account e-mail, key). Its own ``PROJECT`` is always served with ``key``."""
    token_projects: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _accounts(self) -> dict[str, tuple[str, rsa.RSAPrivateKey]]:
        return {PROJECT: (CLIENT_EMAIL, self.key), **self.projects}

    def service_account(self, token_uri: str | None = None, project: str = PROJECT) -> str:
        """The service-account JSON of ``project`` (its token_uri points here)."""
        email, key = self._accounts()[project]
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        return json.dumps(
            {
                "type": "service_account",
                "project_id": project,
                "private_key_id": "k1",
                "private_key": pem,
                "client_email": email,
                "client_id": "1",
                "token_uri": token_uri or f"{self.url}/token",
            }
        )

    def provider(self, ca_file: str, clock: Clock) -> FcmProvider:
        """An FCM provider sending here, its access tokens from this fake's endpoint."""
        account = load_service_account(self.service_account())
        client = Http2Client(ca_file=ca_file, name="fcm")
        return FcmProvider(
            project_id=account.project_id,
            tokens=ServiceAccountTokens(account, clock=clock, client=client),
            clock=clock,
            endpoint=self.url,
            ca_file=ca_file,
            client=client,
        )

    def answer(self, token: str, *answers: FcmAnswer) -> None:
        self.script.setdefault(token, []).extend(answers)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        app = Starlette(
            routes=[
                Route("/token", self._token, methods=["POST"]),
                Route("/v1/projects/{project}/messages:send", self._send, methods=["POST"]),
            ]
        )
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(serve_tls, app, self.ca, "127.0.0.1")
            task_status.started(self.port)

    async def _token(self, request: Request) -> Response:
        self.token_fetches += 1
        form = parse_qs((await request.body()).decode())
        if self.token_answers:
            scripted = self.token_answers.pop(0)
            if isinstance(scripted.body, bytes) or scripted.body is None:
                return Response(scripted.body or b"", scripted.status)
            return JSONResponse(scripted.body, scripted.status)
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            self.violations.append("token request without the JWT bearer grant")
            return JSONResponse({"error": "unsupported_grant_type"}, 400)
        try:
            issuer = jwt.decode(form["assertion"][0], options={"verify_signature": False})["iss"]
            project = next(p for p, (email, _k) in self._accounts().items() if email == issuer)
            claims = jwt.decode(
                form["assertion"][0],
                self._accounts()[project][1].public_key(),
                algorithms=["RS256"],
                # Addressed to Google's token endpoint whatever the token_uri (google-auth's
                # convention, kept by push.fcm).
                audience="https://oauth2.googleapis.com/token",
                issuer=issuer,
            )
        except (jwt.PyJWTError, KeyError, StopIteration) as exc:
            self.violations.append(f"token assertion does not verify: {exc!r}")
            return JSONResponse({"error": "invalid_grant"}, 400)
        if SCOPE not in str(claims.get("scope", "")).split():
            self.violations.append("token assertion lacks the firebase.messaging scope")
            return JSONResponse({"error": "invalid_scope"}, 400)
        token = f"ya29.fake-{len(self.issued) + 1}"
        self.issued.append(token)
        self.token_projects[token] = project
        return JSONResponse(
            {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"}
        )

    async def _send(self, request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append(FcmRequest(request.path_params["project"], auth, body))
        if not auth.startswith("Bearer ") or auth[7:] not in self.issued:
            return JSONResponse(error_body(401, "UNAUTHENTICATED"), 401)
        if self.token_projects.get(auth[7:], PROJECT) != request.path_params["project"]:
            # A service account may send for its own Firebase project only.
            self.violations.append("the access token is another project's than the URL's")
            return JSONResponse(error_body(403, "PERMISSION_DENIED"), 403)
        problem = self._check(body)
        if problem is not None:
            self.violations.append(problem)
            return JSONResponse(error_body(400, "INVALID_ARGUMENT", fcm="INVALID_ARGUMENT"), 400)
        queue = self.script.get(body["message"]["token"])
        scripted = queue.pop(0) if queue else FcmAnswer(200, {"name": "projects/x/messages/1"})
        if scripted.stall:
            await trio.sleep_forever()
        if isinstance(scripted.body, bytes) or scripted.body is None:
            content = scripted.body or b""
            return Response(content, scripted.status, headers=dict(scripted.headers))
        return JSONResponse(scripted.body, scripted.status, headers=dict(scripted.headers))

    @staticmethod
    def _check(body: Any) -> str | None:
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("token"), str):
            return "no message.token"
        if "notification" in message:
            return "not a data-only message"
        data = message.get("data")
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            return "data values must all be strings"
        if message.get("android", {}).get("priority") not in ("HIGH", "NORMAL"):
            return "android.priority is not HIGH or NORMAL"
        apns = message.get("apns", {})
        headers = dict(apns.get("headers") or {})
        collapse = headers.pop("apns-collapse-id", "")
        if headers != {"apns-priority": "5", "apns-push-type": "background"}:
            return "apns headers are not priority 5 background"
        if not isinstance(collapse, str) or len(collapse.encode()) > 64:
            return "apns-collapse-id is longer than 64 bytes"
        if apns.get("payload", {}).get("aps") != {"content-available": 1}:
            return "apns payload is not content-available"
        return None
