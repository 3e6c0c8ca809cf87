"""Topic mode through a real ``bothy-notify run`` process, the way an app meets it:
JSON over HTTP with standard base64, the providers the configuration names (the
protocol fakes of tests/push), and nothing identifying in the process's log."""

from __future__ import annotations

import base64
import hmac
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from testkit.fakes.apns import Answer, FakeApns
from testkit.fakes.fcm import FakeFcm
from testkit.fakes.webhook import WebhookReceiver
from tests.harness import device_token, producer_token
from tests.procs import DaemonProcess, write_config

pytestmark = pytest.mark.slow

KEY_ID, TEAM_ID, BUNDLE = "KEY123ABCD", "TEAM12345X", "com.example.chat"
SIGNING_KEY = os.urandom(32)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class App:
    """A client written from the issue's text: ids, secrets and topics as base64."""

    def __init__(self, http: httpx.AsyncClient, api: str) -> None:
        self.http, self.api = http, api
        self.device = device_token("someone", "phone")

    async def call(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            f"{self.api}/v1/recipients/{path}",
            json=body,
            headers={"authorization": f"Bearer {self.device}"},
        )

    async def append(self, *payloads: dict[str, Any]) -> list[int]:
        response = await self.http.post(
            f"{self.api}/v1/events",
            json={"events": [{"type": "envelope.published", "payload": p} for p in payloads]},
            headers={"authorization": f"Bearer {producer_token()}"},
        )
        assert response.status_code == 200, response.text
        seqs: list[int] = response.json()["seqs"]
        return seqs


def envelope(topic: bytes, key: bytes | None = None) -> dict[str, Any]:
    data = os.urandom(100)
    out = {"topic": b64(topic), "kind": "application", "should_push": True, "data": b64(data)}
    if key is not None:
        out["sender_hmac"] = b64(hmac.digest(key, data, "sha256"))
    return out


async def until(done: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    with trio.fail_after(30):
        while True:
            result = done()
            if result if isinstance(result, bool) else await result:
                return
            await trio.sleep(0.05)
    raise AssertionError(what)  # pragma: no cover - fail_after raises first


async def test_register_subscribe_publish_and_push_through_a_running_daemon(
    database_url: str, tmp_path: Path, nursery: trio.Nursery
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    apns_key = ec.generate_private_key(ec.SECP256R1())
    pem = apns_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    apns = FakeApns(
        ca=ca, public_key=apns_key.public_key(), key_id=KEY_ID, team_id=TEAM_ID, topic=BUNDLE
    )
    fcm = FakeFcm(ca=ca)
    hooks = WebhookReceiver(ca=ca, secret="whsec_" + b64(SIGNING_KEY), hosts=("localhost",))
    for fake in (apns, fcm, hooks):
        await nursery.start(fake.serve)
    config = write_config(
        tmp_path / "bothy.toml",
        database_url,
        log={"level": "debug"},
        push={
            "max_attempts": 2,
            "apns": {
                "key": "env:TOPIC_APNS_KEY",
                "key_id": KEY_ID,
                "team_id": TEAM_ID,
                "bundle_id": BUNDLE,
                "style": "alert",  # topic pushes are background whatever the style
                "endpoint": apns.url,
                "ca_file": str(ca_file),
            },
            "fcm": {
                "service_account": "env:TOPIC_FCM_ACCOUNT",
                "endpoint": fcm.url,
                "ca_file": str(ca_file),
            },
            "webhook": {
                "allowed_domains": ["localhost"],
                "allow_private_addresses": True,
                "ca_file": str(ca_file),
            },
        },
    )
    node = DaemonProcess(
        config_file=config,
        log_file=tmp_path / "daemon.log",
        env={"TOPIC_APNS_KEY": pem, "TOPIC_FCM_ACCOUNT": fcm.service_account()},
    )
    await node.start()
    secrets: list[str] = []
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            app = App(http, node.api_url)
            topic = b"\x00" + os.urandom(16)
            apns_token, fcm_token = os.urandom(32).hex(), "fcm-" + os.urandom(8).hex()
            hook_url = hooks.url("/topic", "localhost")
            people: dict[str, tuple[bytes, bytes, bytes]] = {}
            for channel, delivery in (
                ("apns", {"token": apns_token, "environment": "sandbox"}),
                ("fcm", {"token": fcm_token}),
                ("webhook", {"url": hook_url, "signing_key": b64(SIGNING_KEY)}),
            ):
                rid, secret, key = os.urandom(32), os.urandom(32), os.urandom(42)
                people[channel] = (rid, secret, key)
                secrets += [b64(rid), rid.hex(), b64(secret), b64(key)]
                identity = {"recipient_id": b64(rid), "recipient_secret": b64(secret)}
                registered = await app.call(
                    "register", {**identity, "channel": channel, **delivery}
                )
                assert registered.status_code == 200, registered.text
                assert set(registered.json()) == {"topic_count", "channel", "expires_at"}
                epoch = int(time.time()) // 2_592_000  # envelopes take the database's clock
                window = {"hmac_epoch_base": epoch - 1, "hmac_keys": [b64(key)] * 3}
                subscribed = await app.call(
                    "subscriptions", {**identity, "adds": [{"topic": b64(topic), **window}]}
                )
                assert subscribed.json()["topic_count"] == 1
            secrets += [b64(topic), topic.hex(), apns_token, fcm_token, hook_url]

            # The APNs recipient's own message and someone else's, in one batch.
            own, foreign = await app.append(
                envelope(topic, key=people["apns"][2]), envelope(topic, key=os.urandom(42))
            )
            await until(
                lambda: apns.count == 1 and len(fcm.requests) == 2 and len(hooks.deliveries) == 2,
                "one APNs push, two FCM pushes, two webhooks",
            )

            (request,) = apns.requests
            assert request.device_token == apns_token
            assert request.headers["apns-push-type"] == "background"
            assert request.headers["apns-priority"] == "5"
            assert request.headers["apns-collapse-id"] == b64(topic)
            assert request.body == {
                "aps": {"content-available": 1},
                "topic": b64(topic),
                "sequence_id": str(foreign),
            }
            sent = sorted(int(r.body["message"]["data"]["sequence_id"]) for r in fcm.requests)
            assert sent == [own, foreign]
            assert all("collapse_key" not in str(r.body) for r in fcm.requests)
            assert all(d.verified for d in hooks.deliveries)
            assert {d.body["recipient_id"] for d in hooks.deliveries} == {
                people["webhook"][0].hex()
            }
            assert apns.violations == [] and fcm.violations == []

            # A dead APNs token deletes its recipient: it is not registered any more.
            apns.answer(apns_token, Answer(410, "Unregistered"))
            await app.append(envelope(topic))
            rid, secret, _key = people["apns"]
            identity = {"recipient_id": b64(rid), "recipient_secret": b64(secret)}

            async def gone() -> bool:
                answer = await app.call("subscriptions", {**identity, "adds": []})
                return answer.status_code == 404

            await until(gone, "the dead recipient to be deleted")

            metrics = (await http.get(f"{node.api_url}/metrics")).text
            assert (
                'bothy_topic_deliveries_total{channel="apns",outcome="suppressed"} 1.0' in metrics
            )
            assert 'bothy_topic_recipients_total{action="dead"} 1.0' in metrics
            assert not [s for s in secrets if s in metrics]
    finally:
        await node.stop()
    log = node.log_file.read_text(encoding="utf-8")
    assert "bothy-notify running" in log
    assert not [s for s in secrets if s in log]
