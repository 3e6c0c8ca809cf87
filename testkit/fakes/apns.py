"""A fake APNs: HTTP/2 over TLS (h2 on Trio), checking requests the way Apple does.

It verifies the provider JWT (ES256 signature with the team's public key,
``kid``, ``iss``, ``iat`` no older than an hour on its clock), the path, the
headers and the JSON body, answers with APNs statuses and ``reason`` bodies,
and records every request. Tests script answers per device token
(:meth:`FakeApns.answer`); a request that breaks a rule gets Apple's error and
is listed in :attr:`FakeApns.violations`.

Run as a program (``python -m testkit.fakes.apns``) it serves in its own
process for the benchmarks, printing its port once listening
(:class:`ApnsProcess` starts and controls it).
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import jwt
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key

ROOT = Path(__file__).resolve().parents[2]

_PATH = re.compile(r"^/3/device/([0-9a-fA-F]{64,200})$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
TOKEN_MAX_AGE = timedelta(hours=1)


@dataclass(frozen=True)
class Answer:
    """What the fake answers to one request: a status and reason, or nothing (stall)."""

    status: int = 200
    reason: str = ""
    stall: bool = False
    headers: tuple[tuple[str, str], ...] = ()


def apns_id(headers: dict[str, str]) -> str:
    """The ``apns-id`` APNs answers with: the request's own, or a new UUID when it sent none."""
    return headers.get("apns-id") or str(uuid.uuid4())


@dataclass
class ApnsRequest:
    """One request as the fake saw it."""

    authority: str
    path: str
    headers: dict[str, str]
    body: Any
    jwt_header: dict[str, Any] = field(default_factory=dict)
    jwt_claims: dict[str, Any] = field(default_factory=dict)
    authorization: str = ""
    status: int | None = None
    """The status the fake answered with (``None`` while held unanswered, or never)."""

    @property
    def device_token(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class FakeApns:
    """The fake server. ``clock`` is what it compares JWT ``iat`` against."""

    def __init__(
        self,
        *,
        ca: trustme.CA,
        public_key: ec.EllipticCurvePublicKey,
        key_id: str,
        team_id: str,
        topic: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        record: bool = True,
        apps: dict[str, tuple[ec.EllipticCurvePublicKey, str, str]] | None = None,
    ) -> None:
        self._public_key = public_key
        self._key_id = key_id
        self._team_id = team_id
        self._topic = topic
        # Topic -> (public key, kid, iss) of each app this fake serves (Apple checks that
        # the provider token's team may push to the topic).
        self._apps = dict(apps or {topic: (public_key, key_id, team_id)})
        self.stall_topics: set[str] = set()
        """Topics whose requests are held unanswered (one app's outage)."""
        self._clock = clock
        self._record = record
        self._server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1", "localhost").configure_cert(self._server_ctx)
        self._server_ctx.set_alpn_protocols(["h2"])
        self.requests: list[ApnsRequest] = []
        self.violations: list[str] = []
        self.protocol_errors: list[str] = []
        self.count = 0
        self.connections = 0
        self.resets = 0  # streams the client reset (RST_STREAM), e.g. a cancelled send
        self.script: dict[str, list[Answer]] = {}
        self.default = Answer()
        self.stalling = False
        self._resume = trio.Event()
        self._verified: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
        self.port = 0
        self.changed = trio.Event()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def other_url(self) -> str:
        """The same server under another host name (a second APNs host)."""
        return f"https://localhost:{self.port}"

    def answer(self, device_token: str, *answers: Answer) -> None:
        """Answer the next requests for ``device_token`` with ``answers``, in order."""
        self.script.setdefault(device_token, []).extend(answers)

    def stall(self) -> None:
        """From now on, hold every request unanswered until :meth:`resume`."""
        self.stalling = True

    def resume(self) -> None:
        """Answer every held request (200) and stop holding new ones."""
        self.stalling = False
        self._resume.set()
        self._resume = trio.Event()

    def delivered(self) -> list[ApnsRequest]:
        """The recorded requests answered 200: the pushes a device would have shown."""
        return [r for r in self.requests if r.status == 200]

    async def wait_for(self, count: int) -> None:
        """Wait until ``count`` requests arrived (use under a test deadline)."""
        while self.count < count:
            await self.changed.wait()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_ssl_over_tcp_listeners(
            0, self._server_ctx, host="127.0.0.1", https_compatible=True
        )
        transport = listeners[0].transport_listener
        assert isinstance(transport, trio.SocketListener)
        self.port = transport.socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._connection, listeners)
            task_status.started(self.port)

    # ------------------------------------------------------------------ HTTP/2

    async def _connection(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        self.connections += 1
        conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(1 << 24)
        lock = trio.Lock()
        heads: dict[int, dict[str, str]] = {}
        bodies: dict[int, bytearray] = {}
        # (stream, apns-id, request) of requests held unanswered
        held: list[tuple[int, str, ApnsRequest]] = []

        async def flush() -> None:
            data = conn.data_to_send()
            if data:
                async with lock:
                    await stream.send_all(data)

        async def release_held() -> None:
            while True:
                await self._resume.wait()
                await trio.lowlevel.checkpoint()
                for stream_id, held_id, request in held:
                    if stream_id in conn.streams:
                        self._respond(conn, stream_id, Answer(), held_id)
                        request.status = 200
                held.clear()
                await flush()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_held)
                await flush()
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    try:
                        events = conn.receive_data(data)
                    except h2.exceptions.ProtocolError as exc:
                        # As a real server would: refuse the connection, keep serving others.
                        self.protocol_errors.append(type(exc).__name__)
                        print(f"fake APNs: {exc!r}", file=sys.stderr, flush=True)
                        conn.close_connection(error_code=h2.errors.ErrorCodes.PROTOCOL_ERROR)
                        await flush()
                        break
                    for event in events:
                        if isinstance(event, h2.events.RequestReceived):
                            heads[event.stream_id] = dict(event.headers)  # type: ignore[arg-type]
                            bodies[event.stream_id] = bytearray()
                        elif isinstance(event, h2.events.DataReceived):
                            bodies.setdefault(event.stream_id, bytearray()).extend(event.data)
                            conn.acknowledge_received_data(
                                event.flow_controlled_length, event.stream_id
                            )
                        elif isinstance(event, h2.events.StreamEnded):
                            sid = event.stream_id
                            head = heads.pop(sid, {})
                            answer, request = self._handle(head, bytes(bodies.pop(sid, b"")))
                            if answer.stall:
                                held.append((sid, apns_id(head), request))
                            else:
                                self._respond(conn, sid, answer, apns_id(head))
                                request.status = answer.status
                        elif isinstance(event, h2.events.StreamReset):
                            self.resets += 1
                            changed, self.changed = self.changed, trio.Event()
                            changed.set()
                            heads.pop(event.stream_id, None)
                            bodies.pop(event.stream_id, None)
                        elif isinstance(event, h2.events.ConnectionTerminated):
                            nursery.cancel_scope.cancel()
                    await flush()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, h2.exceptions.ProtocolError):
            pass  # the client went away (also from inside the nursery, as a group)
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await stream.aclose()

    def _respond(
        self, conn: h2.connection.H2Connection, stream_id: int, answer: Answer, request_id: str
    ) -> None:
        # APNs echoes the request's apns-id (or the one it made up), never a fixed one.
        headers = [(":status", str(answer.status)), ("apns-id", request_id)]
        headers.extend(answer.headers)
        try:
            if answer.status == 200:
                conn.send_headers(stream_id, headers, end_stream=True)
                return
            payload: dict[str, Any] = {"reason": answer.reason}
            if answer.status == 410:
                payload["timestamp"] = int(self._clock().timestamp() * 1000)
            body = json.dumps(payload).encode()
            headers.append(("content-type", "application/json"))
            headers.append(("content-length", str(len(body))))
            conn.send_headers(stream_id, headers)
            conn.send_data(stream_id, body, end_stream=True)
        except h2.exceptions.StreamClosedError:
            pass

    # ------------------------------------------------------------------ APNs rules

    def _handle(self, headers: dict[str, str], raw: bytes) -> tuple[Answer, ApnsRequest]:
        self.count += 1
        changed, self.changed = self.changed, trio.Event()
        changed.set()
        path = headers.get(":path", "")
        request = ApnsRequest(
            authority=headers.get(":authority", ""),
            path=path,
            headers={k: v for k, v in headers.items() if not k.startswith(":")},
            body=None,
            authorization=headers.get("authorization", ""),
        )
        if self._record:
            self.requests.append(request)
        return self._answer(request, headers, raw), request

    def _answer(self, request: ApnsRequest, headers: dict[str, str], raw: bytes) -> Answer:
        problem = self._check(request, headers, raw)
        if problem is not None:
            return problem
        if self.stalling or request.headers.get("apns-topic") in self.stall_topics:
            return Answer(stall=True)
        queue = self.script.get(request.device_token)
        if queue:
            return queue.pop(0)
        return self.default

    def _violation(self, status: int, reason: str, what: str) -> Answer:
        self.violations.append(what)
        return Answer(status, reason)

    def _check(self, request: ApnsRequest, headers: dict[str, str], raw: bytes) -> Answer | None:
        if "apns-id" in headers and _UUID.fullmatch(headers["apns-id"]) is None:
            return self._violation(400, "BadMessageId", "apns-id is not a canonical UUID")
        if headers.get(":method") != "POST":
            return self._violation(405, "MethodNotAllowed", "method is not POST")
        if _PATH.fullmatch(request.path) is None:
            return self._violation(404, "BadPath", "path is not /3/device/<hex token>")
        auth = request.authorization
        if not auth.lower().startswith("bearer "):
            return self._violation(403, "MissingProviderToken", "no bearer provider token")
        token = auth.split(" ", 1)[1]
        topic = headers.get("apns-topic")
        if topic is None:
            return self._violation(400, "MissingTopic", "no apns-topic")
        app = self._apps.get(topic)
        if app is None:
            return Answer(400, "TopicDisallowed")
        verified = self._verify_jwt(token, *app)
        if isinstance(verified, Answer):
            return verified
        request.jwt_header, request.jwt_claims = verified
        issued = datetime.fromtimestamp(int(request.jwt_claims["iat"]), UTC)
        if self._clock() - issued > TOKEN_MAX_AGE:
            return Answer(403, "ExpiredProviderToken")
        push_type = headers.get("apns-push-type")
        if push_type not in ("alert", "background"):
            return self._violation(400, "InvalidPushType", "apns-push-type not alert/background")
        priority = headers.get("apns-priority")
        if (push_type, priority) not in (("background", "5"), ("alert", "10"), ("alert", "5")):
            return self._violation(400, "BadPriority", "priority does not fit the push type")
        collapse = headers.get("apns-collapse-id")
        if collapse is not None and len(collapse.encode()) > 64:
            return self._violation(400, "BadCollapseId", "apns-collapse-id over 64 bytes")
        if len(raw) > 4096:
            return self._violation(413, "PayloadTooLarge", "body over 4096 bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            return self._violation(400, "PayloadEmpty", "body is not JSON")
        request.body = body
        aps = body.get("aps") if isinstance(body, dict) else None
        if not isinstance(aps, dict):
            return self._violation(400, "PayloadEmpty", "no aps dictionary")
        if push_type == "background" and aps != {"content-available": 1}:
            return self._violation(
                400, "BadPayload", "background aps holds more than content-available"
            )
        if push_type == "alert" and not isinstance(aps.get("alert"), dict):
            return self._violation(400, "BadPayload", "alert push without an alert")
        return None

    def _verify_jwt(
        self, token: str, public_key: ec.EllipticCurvePublicKey, key_id: str, team_id: str
    ) -> tuple[dict[str, Any], dict[str, Any]] | Answer:
        cached = self._verified.get((token, key_id))
        if cached is not None:
            return cached
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(
                token,
                public_key,
                algorithms=["ES256"],
                options={"verify_iat": False, "require": ["iss", "iat"]},
            )
        except jwt.PyJWTError:
            return self._violation(403, "InvalidProviderToken", "JWT signature or form is wrong")
        if header.get("kid") != key_id or claims.get("iss") != team_id:
            return self._violation(403, "InvalidProviderToken", "JWT kid or iss is wrong")
        self._verified[(token, key_id)] = (header, claims)
        return header, claims


class ApnsProcess:
    """This fake in its own process (``python -m testkit.fakes.apns``), controlled
    through its stdin: a benchmark's fake APNs that checks what it is sent."""

    name = "python"

    def __init__(
        self,
        tmp: Path,
        key: ec.EllipticCurvePrivateKey,
        *,
        key_id: str,
        team_id: str,
        topic: str,
    ) -> None:
        public = tmp / "apns-public.pem"
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self.ca_file = str(tmp / "python-fake-ca.pem")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testkit.fakes.apns",
                "--public-key",
                str(public),
                "--key-id",
                key_id,
                "--team-id",
                team_id,
                "--topic",
                topic,
                "--ca-out",
                self.ca_file,
            ],
            cwd=ROOT,  # the repository: where ``testkit`` is found
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            raise RuntimeError("the fake APNs did not start")
        self.url = f"https://127.0.0.1:{line[1]}"

    def command(self, text: str) -> int:
        """Send ``stall``/``resume``/``count``; returns the requests the fake has seen."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline().split()[1])

    def stall(self) -> None:
        self.command("stall")

    def resume(self) -> None:
        self.command("resume")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    """Serve in this process: ``--public-key`` PEM file, ``--ca-out`` where to write the CA."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--public-key", required=True)
    parser.add_argument("--key-id", required=True)
    parser.add_argument("--team-id", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--ca-out", required=True)
    parser.add_argument("--stall-control", action="store_true")
    args = parser.parse_args()
    public_key = load_pem_public_key(Path(args.public_key).read_bytes())
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(args.ca_out)
    fake = FakeApns(
        ca=ca,
        public_key=public_key,
        key_id=args.key_id,
        team_id=args.team_id,
        topic=args.topic,
        record=False,
    )

    async def control() -> None:
        # Lines on stdin: "stall", "resume", "count".
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        buffer = b""
        while True:
            chunk = await stdin.receive_some(1024)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                command = line.decode().strip()
                if command == "stall":
                    fake.stall()
                elif command == "resume":
                    fake.resume()
                print(f"{command} {fake.count}", flush=True)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(fake.serve)
            print(f"PORT {port}", flush=True)
            await control()
            nursery.cancel_scope.cancel()

    trio.run(run)


if __name__ == "__main__":
    main()
