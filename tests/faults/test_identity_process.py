"""Identity, limits and token lifetime against a real ``bothy-notify run`` process.

The rest of issue 8's hostile list, tried as clients would try it, each with its
exact answer: two people whose tokens carry the same ``did``, one of them revoked;
a webhook URL registered by a second person; more registrations than
``push.max_registrations_per_person``; push tokens past their provider's cap
(3,000 characters for APNs, webhooks; 5,000 for FCM and the fake provider); a
huge header; read and follow of threads that are unreadable or do not exist;
``NaN`` and oversized frames; ``reauth`` with another person's token; a
connection past its token's ``exp`` (and one saved by ``reauth``); a deactivated
person; more connections of one person than ``sync.max_connections_per_person``.

Meanwhile a bystander and the person who shares the revoked ``did`` keep
working: at the end both get the next message on their desktop and by push, and
the revoked person gets nothing. The test ends with the fault tests' count.
"""

from __future__ import annotations

import base64
import json
import time
from contextlib import aclosing
from typing import Any

import httpx
import psycopg
import pytest
import trio

from bothy_notify.auth import mint_token
from testkit.ws import GatewayClient, client_frame
from tests.faults.conftest import DaemonFactory
from tests.faults.world import append, closing_count, count_pushes, wait_settled
from tests.harness import TEST_KEY, device_token
from tests.hostile.rawhttp import exchange, request_bytes
from tests.procs import DaemonProcess
from tests.support.providers import provider_blocks, provider_credentials

pytestmark = pytest.mark.slow

MAX_REGISTRATIONS = 3
MAX_CONNECTIONS = 3
MAX_FRAME = 4096
SIGNING_KEY = "whsec_" + base64.b64encode(b"k" * 32).decode()


async def start(daemons: DaemonFactory) -> DaemonProcess:
    return await daemons(
        "identity",
        env=provider_credentials(),
        auth={"leeway": "0s"},
        sync={"max_connections_per_person": MAX_CONNECTIONS, "max_frame_bytes": MAX_FRAME},
        notify={"mobile_delay_when_desktop_active": "0s"},
        push={
            "max_registrations_per_person": MAX_REGISTRATIONS,
            **provider_blocks(),
            "webhook": {"allowed_domains": ["localhost"], "allow_private_addresses": True},
        },
    )


class Api:
    """The HTTP API as one person's device calls it."""

    def __init__(self, http: httpx.AsyncClient, user: str, device: str, platform: str) -> None:
        self.http = http
        self.headers = {"authorization": "Bearer " + device_token(user, device, platform)}

    async def register(self, provider: str, token: str, **extra: str) -> httpx.Response:
        body = {"provider": provider, "token": token, **extra}
        return await self.http.post("/v1/registrations", json=body, headers=self.headers)

    async def registrations(self) -> httpx.Response:
        return await self.http.get("/v1/registrations", headers=self.headers)

    async def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return await self.http.request(method, path, json=body, headers=self.headers)


async def connect(gateway: str, token: str) -> GatewayClient:
    """A gateway connection that sent ``identify`` and read up to ``catchup.complete``
    (or the close, when the server refused it)."""
    client = await GatewayClient.open(gateway, receive_buffer=4096)
    with trio.fail_after(10):
        assert await client.wait_hello()
        await client.send_json({"op": "identify", "d": {"token": token}})
        await client.read_until(lambda f: f.get("op") == "catchup.complete")
    return client


async def closed(client: GatewayClient, timeout: float = 10) -> tuple[int | None, str | None]:
    """Read until the server closes; its code and reason."""
    with trio.fail_after(timeout):
        await client.read_until(lambda f: False)
    return client.close_code, client.close_reason


async def answers_ping(client: GatewayClient) -> bool:
    """The connection is open and served: a ping gets its pong."""
    await client.send_json({"op": "ping"})
    with trio.fail_after(10):
        return await client.read_until(lambda f: f.get("op") == "pong") is not None


async def close_after(gateway: str, token: str, frame: bytes) -> tuple[int | None, str | None]:
    """A live connection that sends ``frame`` (raw bytes); the server's close."""
    client = await connect(gateway, token)
    try:
        await client.stream.send_all(frame)
        return await closed(client)
    finally:
        await client.aclose()


class Opened:
    """Every gateway connection the test opens, closed at its end."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.clients: list[GatewayClient] = []

    async def connect(self, token: str) -> GatewayClient:
        client = await connect(self.gateway, token)
        self.clients.append(client)
        return client

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


def stored_for(url: str, threads: tuple[str, ...]) -> int:
    """Read positions and follow levels stored for ``threads``."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM bothy.read_states WHERE thread_id = ANY(%s))"
            " + (SELECT count(*) FROM bothy.follows WHERE thread_id = ANY(%s))",
            (list(threads), list(threads)),
        ).fetchone()
    assert row is not None
    return int(row[0])


def live_connections(metrics: str) -> float:
    prefix = 'bothy_gateway_connections{phase="live"}'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)
    )


def message_created(message_id: str, seq: int) -> tuple[str, dict[str, Any]]:
    return (
        "message.created",
        {
            "thread_id": "t1",
            "message_id": message_id,
            "thread_seq": seq,
            "author_id": "author",
            "mentions": [],
        },
    )


def person(user: str) -> tuple[str, dict[str, Any]]:
    return ("user.upserted", {"user_id": user, "kind": "human", "active": True})


async def test_identity_limits_and_token_lifetime_on_a_real_daemon(
    daemons: DaemonFactory, fault_db: str
) -> None:
    node = await start(daemons)
    pid = node.pid
    gateway = node.gateway
    assert gateway is not None
    people = ("bea", "cara", "dan", "eve", "fay", "gus", "hal", "ivy", "jon")
    await append(
        fault_db,
        [person(p) for p in people]
        + [
            ("thread.upserted", {"thread_id": "t1", "space_id": "s1"}),
            ("thread.upserted", {"thread_id": "t-private", "space_id": "s-private"}),
        ]
        + [("member.added", {"user_id": p, "scope_id": "s1"}) for p in ("bea", "cara", "dan")]
        + [
            ("thread.followed", {"user_id": p, "thread_id": "t1", "level": "all"})
            for p in ("bea", "cara", "dan")
        ],
    )
    async with (
        httpx.AsyncClient(base_url=node.api_url, timeout=10) as http,
        aclosing(Opened(gateway)) as opened,
    ):
        # The bystander: a linux desktop and a phone.
        bea_phone = Api(http, "bea", "bea-phone", "ios")
        assert (await bea_phone.register("fake", "bea-phone-token")).status_code == 201
        bea = await opened.connect(device_token("bea", "bea-desk", "linux"))

        # Two people, one device id: neither replaces the other (no 4017) ...
        cara = await opened.connect(device_token("cara", "shared", "linux"))
        dan = await opened.connect(device_token("dan", "shared", "linux"))
        assert await answers_ping(cara) and await answers_ping(dan)
        cara_api, dan_api = (
            Api(http, "cara", "shared", "linux"),
            Api(http, "dan", "shared", "linux"),
        )
        assert (await cara_api.register("fake", "cara-shared-token")).status_code == 201
        assert (await dan_api.register("fake", "dan-shared-token")).status_code == 201
        # ... and revoking Cara's device closes and invalidates hers only.
        await append(
            fault_db,
            [
                (
                    "device.upserted",
                    {
                        "device_id": "shared",
                        "user_id": "cara",
                        "platform": "linux",
                        "state": "revoked",
                    },
                )
            ],
        )
        assert await closed(cara) == (4010, "device revoked")
        assert await answers_ping(dan)
        assert (await cara_api.registrations()).json()["error"]["code"] == "device_revoked"
        assert [r["state"] for r in (await dan_api.registrations()).json()["registrations"]] == [
            "active"
        ]

        # A webhook URL registered by a second person is a registration of their own.
        hook = "https://localhost:9/hook"
        ivy_api, jon_api = (
            Api(http, "ivy", "ivy-srv", "linux"),
            Api(http, "jon", "jon-srv", "linux"),
        )
        first = await ivy_api.register("webhook", hook, signing_key=SIGNING_KEY)
        second = await jon_api.register("webhook", hook, signing_key=SIGNING_KEY)
        assert (first.status_code, second.status_code) == (201, 201)
        assert first.json()["id"] != second.json()["id"]
        assert [r["id"] for r in (await ivy_api.registrations()).json()["registrations"]] == [
            first.json()["id"]
        ]

        # At most MAX_REGISTRATIONS per person; the caller's own token again is never refused.
        eve_api = Api(http, "eve", "eve-phone", "ios")
        for n in range(MAX_REGISTRATIONS):
            assert (await eve_api.register("fake", f"eve-{n}")).status_code == 201
        over = await eve_api.register("fake", "eve-one-too-many")
        assert over.status_code == 409
        assert over.json()["error"]["code"] == "too_many_registrations"
        assert (await eve_api.register("fake", "eve-0")).status_code == 200

        # Tokens past their provider's cap are 422 naming the field; below it they work.
        fay_api = Api(http, "fay", "fay-phone", "android")
        for provider, token in (
            ("apns", "ab" * 1500),
            ("fcm", "f" * 5000),
            ("webhook", "https://localhost:9/" + "x" * 3000),
            ("fake", "z" * 5000),
        ):
            refused = await fay_api.register(provider, token)
            assert refused.status_code == 422, (provider, refused.text)
            assert refused.json()["error"]["message"].startswith("token: longer than"), provider
        assert (await fay_api.register("fcm", "f" * 3000)).status_code == 201
        assert (await fay_api.register("fake", "z" * 3000)).status_code == 201
        assert len((await fay_api.registrations()).json()["registrations"]) == 2

        # A huge header, before the app.
        huge = await exchange(
            node.api, request_bytes("GET", "/v1/preferences", [(b"X-Big", b"a" * 70_000)])
        )
        assert huge.status == 431

        # Read and follow of a thread Fay cannot read, or that does not exist: 404, nothing stored.
        for thread in ("t-private", "no-such-thread"):
            for method, path, body in (
                ("PUT", f"/v1/threads/{thread}/read", {"seq": 5}),
                ("GET", f"/v1/threads/{thread}/follow", None),
                ("PUT", f"/v1/threads/{thread}/follow", {"level": "all"}),
            ):
                answer = await fay_api.call(method, path, body)
                assert answer.status_code == 404, (method, path)
                assert answer.json()["error"] == {"code": "not_found", "message": "no such thread"}
        fay = await opened.connect(device_token("fay", "fay-desk", "linux"))
        await fay.send_json({"op": "read", "d": {"thread_id": "t-private", "seq": 5}})
        with trio.fail_after(10):
            ack = await fay.read_until(lambda f: f.get("op") == "read.ack")
        assert ack == {"op": "read.ack", "d": {"thread_id": "t-private", "last_read_seq": 0}}
        await fay.aclose()
        assert (
            await trio.to_thread.run_sync(stored_for, fault_db, ("t-private", "no-such-thread"))
            == 0
        )

        # Frames: NaN, one over sync.max_frame_bytes, reauth with another person's token.
        fay_token = device_token("fay", "fay-desk", "linux")
        nan = client_frame(b'{"op":"read","d":{"thread_id":"t1","seq":NaN}}')
        assert await close_after(gateway, fay_token, nan) == (4003, "malformed frame")
        big = client_frame(b'{"op":"ping","d":"' + b"a" * MAX_FRAME + b'"}')
        assert await close_after(gateway, fay_token, big) == (1009, "frame too large")
        others = json.dumps(
            {"op": "reauth", "d": {"token": device_token("bea", "fay-desk", "linux")}}
        )
        assert await close_after(gateway, fay_token, client_frame(others.encode())) == (
            4001,
            "authentication failed",
        )

        # A connection ends at its token's exp (leeway 0 here), unless reauth renewed it.
        soon = int(time.time()) + 2
        claims = {"sub": "fay", "did": "fay-desk", "plat": "linux", "kind": "user", "exp": soon}
        expiring = await opened.connect(mint_token(TEST_KEY, claims))
        renewed_claims = {**claims, "did": "fay-laptop", "exp": soon}
        renewed = await opened.connect(mint_token(TEST_KEY, renewed_claims))
        fresh = mint_token(TEST_KEY, {**renewed_claims, "exp": soon + 3600})
        await renewed.send_json({"op": "reauth", "d": {"token": fresh}})
        with trio.fail_after(10):
            reauth = await renewed.read_until(lambda f: f.get("op") == "reauth.ack")
        assert reauth == {"op": "reauth.ack", "d": {"exp": soon + 3600}}
        assert await closed(expiring) == (4001, "token expired")
        assert time.time() >= soon
        assert await answers_ping(renewed)
        await renewed.aclose()

        # A deactivated person: the live connection closes, HTTP and identify refuse.
        gus = await opened.connect(device_token("gus", "gus-desk", "linux"))
        await append(
            fault_db, [("user.upserted", {"user_id": "gus", "kind": "human", "active": False})]
        )
        assert await closed(gus) == (4010, "person deactivated")
        refused_http = await Api(http, "gus", "gus-desk", "linux").call("GET", "/v1/preferences")
        assert refused_http.status_code == 403
        assert refused_http.json()["error"]["code"] == "deactivated"
        again = await opened.connect(device_token("gus", "gus-desk", "linux"))
        assert (again.close_code, again.close_reason) == (4010, "person deactivated")

        # More connections of one person than the limit: the next device is refused.
        hal = [
            await opened.connect(device_token("hal", f"hal-{n}", "linux"))
            for n in range(MAX_CONNECTIONS + 1)
        ]
        assert (hal[-1].close_code, hal[-1].close_reason) == (
            4008,
            "too many connections for this person",
        )
        assert all([await answers_ping(c) for c in hal[:-1]])
        for client in hal:
            await client.aclose()

        # The bystander and Dan (who shares Cara's device id) still get the next message
        # on their desktops; then, with Dan's desktop gone, by push to his phone token on
        # that same device id. Cara, revoked, gets nothing.
        await append(fault_db, [message_created("m1", 1)])
        for desktop in (bea, dan):
            with trio.fail_after(15):
                hint = await desktop.read_until(lambda f: f.get("type") == "notification.created")
            assert hint is not None and hint["payload"]["message_id"] == "m1"
        await dan.aclose()
        with trio.fail_after(15):
            while (live := live_connections((await http.get("/metrics")).text)) != 1:
                assert live >= 1, live  # Bea's stays
                await trio.sleep(0.05)
        await append(fault_db, [message_created("m2", 2)])
        with trio.fail_after(15):
            hint = await bea.read_until(lambda f: f.get("type") == "notification.created")
        assert hint is not None and hint["payload"]["message_id"] == "m2"
        await wait_settled(fault_db)
        await bea.aclose()

    expected = {("m1", "bea-phone-token"), ("m2", "bea-phone-token"), ("m2", "dan-shared-token")}
    pushes = count_pushes(node.config_file.parent / "pushes.jsonl", expected)
    await closing_count(fault_db, node, pushes, pid=pid)
    assert await node.stop() == 0
    assert "Traceback" not in node.log_text()
