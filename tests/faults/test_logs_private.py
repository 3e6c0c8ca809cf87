"""A full scenario's log output names no person, device, thread, token, URL or secret.

Every ID, token, URL and secret of the scenario carries a marker; the daemon
logs at debug level (third-party loggers included) while it registers a phone
and a webhook, serves a desktop that focuses and reads, decides and sends
hints, answers hostile requests, dead-letters a poison event, is killed and
restarted; a second daemon crashes at start on a database URL with a password.
Then nothing any of them wrote may contain the marker or a secret.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from bothy_notify.auth import mint_token
from testkit.daemon import DaemonFailed
from testkit.fakes.webhook import SIGNING_KEY, WebhookReceiver
from tests.faults.conftest import DaemonFactory
from tests.faults.world import (
    append,
    closing_count,
    count_pushes,
    wait_finished,
    wait_settled,
)
from tests.gateway.client import GatewayClient, identify
from tests.harness import TEST_KEY, device_token, producer_token
from tests.procs import DaemonProcess, write_config

pytestmark = pytest.mark.slow

MARK = "Zq9X"
PERSON, OTHER, AUTHOR = f"person-{MARK}-1", f"person-{MARK}-2", f"author-{MARK}"
PHONE, DESK, HOOK = f"phone-{MARK}", f"desk-{MARK}", f"hook-{MARK}"
THREAD, SPACE = f"thread-{MARK}", f"space-{MARK}"
PHONE_TOKEN = f"token-{MARK}-0123456789"
DB_PASSWORD = f"pw-{MARK}-secret"

CRASH = f"""
import psycopg
from bothy_notify.config import structure_config
from bothy_notify.logs import setup_logging

setup_logging(structure_config({{"log": {{"level": "debug", "format": "json"}}}}, env={{}}).log)
try:
    psycopg.connect(
        "postgresql://user-{MARK}:{DB_PASSWORD}@127.0.0.1:9/db-{MARK}", connect_timeout=5
    )
except psycopg.Error as exc:
    raise RuntimeError("could not send {PHONE_TOKEN} for {PERSON}") from exc
"""
"""A process that crashes with an error quoting a token and a person, caused by a
driver error about a URL with a password, logging as the daemon does."""


async def test_a_full_scenario_logs_no_ids_tokens_urls_or_secrets(
    daemons: DaemonFactory, fault_db: str, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    receiver = WebhookReceiver(ca, hosts=("localhost",))
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        hook_url = receiver.url(f"/{HOOK}", host="localhost")
        node = await daemons(
            "a",
            log={"level": "debug", "format": "json"},
            jobs={"lease": "2s"},
            push={
                "webhook": {
                    "allowed_domains": ["localhost"],
                    "allow_private_addresses": True,
                    "ca_file": str(ca_file),
                }
            },
        )
        node.pin_ports()
        await append(
            fault_db,
            [
                ("user.upserted", {"user_id": p, "kind": "human", "active": True})
                for p in (PERSON, OTHER, AUTHOR)
            ]
            + [
                ("thread.upserted", {"thread_id": THREAD, "space_id": SPACE}),
                ("member.added", {"user_id": PERSON, "scope_id": SPACE}),
                ("thread.followed", {"user_id": PERSON, "thread_id": THREAD, "level": "all"}),
            ],
        )
        phone = {"authorization": "Bearer " + device_token(PERSON, PHONE, "ios")}
        async with httpx.AsyncClient(timeout=10) as http:
            api = node.api_url
            for body in (
                {"provider": "fake", "token": PHONE_TOKEN},
                {"provider": "webhook", "token": hook_url, "signing_key": SIGNING_KEY},
            ):
                answer = await http.post(f"{api}/v1/registrations", json=body, headers=phone)
                assert answer.status_code in (200, 201), answer.text

            async with trio.open_nursery() as clients:
                assert node.gateway is not None
                desk = await GatewayClient.connect(clients, node.gateway)
                await identify(desk, device_token(PERSON, DESK, "linux"))
                await desk.wait_op("catchup.complete")
                await desk.focus([THREAD, f"other-{THREAD}"], idle=True)
                for n in range(1, 4):
                    await append(
                        fault_db,
                        [
                            (
                                "message.created",
                                {
                                    "thread_id": THREAD,
                                    "message_id": f"message-{MARK}-{n}",
                                    "thread_seq": n,
                                    "author_id": AUTHOR,
                                    "mentions": [PERSON],
                                },
                            )
                        ],
                    )
                await desk.wait_for(lambda f: f.get("type") == "notification.created")
                # Every message decided and pushed before the read: a message the
                # round reaches after the read position passed it is skipped `read`.
                await wait_settled(fault_db)
                await desk.read(THREAD, 2)
                await wait_settled(fault_db)
                assert receiver.deliveries, "the webhook was never called"

                # Hostile and refused requests, each carrying marked values.
                other = {"authorization": "Bearer " + device_token(OTHER, f"d-{MARK}", "web")}
                requests: list[tuple[str, str, dict[str, str], object]] = [
                    (
                        "GET",
                        "/v1/registrations",
                        {"authorization": f"Bearer {MARK}.{MARK}.{MARK}"},
                        None,
                    ),
                    ("GET", "/v1/registrations", {"authorization": f"Basic {MARK}"}, None),
                    ("PUT", f"/v1/threads/{THREAD}/read", other, {"seq": 1}),
                    ("GET", f"/v1/threads/{THREAD}/follow", other, None),
                    ("DELETE", f"/v1/registrations/reg-{MARK}", other, None),
                    (
                        "POST",
                        "/v1/registrations",
                        other,
                        {
                            "provider": "webhook",
                            "token": f"http://{MARK}.example/x",
                            "signing_key": SIGNING_KEY,
                        },
                    ),
                    ("POST", "/v1/registrations", other, {"provider": f"p-{MARK}", "token": MARK}),
                    (
                        "POST",
                        "/v1/events",
                        {"authorization": f"Bearer {producer_token()}"},
                        {"events": [{"type": f"t-{MARK}", "payload": {}}]},
                    ),
                    (
                        "POST",
                        "/v1/events",
                        {
                            "authorization": "Bearer "
                            + mint_token(f"{TEST_KEY}-wrong-{MARK}", {"sub": MARK})
                        },
                        {"events": []},
                    ),
                ]
                for method, path, headers, payload in requests:
                    answer = await http.request(
                        method, f"{api}{path}", headers=headers, json=payload
                    )
                    assert answer.status_code < 500, (path, answer.text)
                    if answer.status_code >= 400:  # an error message never echoes a value
                        assert MARK not in answer.text, (path, answer.text)

                # A poison event: a type a newer node added, with marked values in it.
                await trio.to_thread.run_sync(_add_future_type, fault_db)
                await append(fault_db, [("future.thing", {"user_id": PERSON, "note": MARK})])
                await wait_settled(fault_db)
                clients.cancel_scope.cancel()

            await node.crash()
            await node.start()
            # Every job finished, not only none due: a push put back for later (its
            # lease lost under load, no free permit) is still to come.
            await wait_finished(fault_db)
        # Every event decided but the planted poison one, the phone's pushes recorded once.
        expected = {(f"message-{MARK}-{n}", PHONE_TOKEN) for n in range(1, 4)}
        pushes = count_pushes(node.config_file.parent / "pushes.jsonl", expected)
        await closing_count(fault_db, node, pushes, pid=node.pid, dead_letters=1)
        assert await node.stop() == 0
        nursery.cancel_scope.cancel()

    crashed = DaemonProcess(
        config_file=write_config(
            tmp_path / "crash.toml",
            f"postgresql://user-{MARK}:{DB_PASSWORD}@127.0.0.1:9/db-{MARK}",
        ),
        log_file=tmp_path / "crash.log",
    )
    with pytest.raises(DaemonFailed, match="exited with"):
        await crashed.start(timeout=60)
    assert "the database cannot be reached" in crashed.log_text()

    # A crash: an error that escapes everything, raised with marked values and chained
    # from a driver error, in a process logging through the daemon's own setup.
    crash_log = tmp_path / "traceback.log"
    done = await trio.run_process(
        [sys.executable, "-c", CRASH], capture_stdout=True, capture_stderr=True, check=False
    )
    crash_log.write_bytes(done.stdout + done.stderr)
    crash = crash_log.read_text(errors="replace")
    assert done.returncode == 1, crash
    assert '"logger": "bothy.crash"' in crash and '"RuntimeError"' in crash, crash
    assert '"traceback": [' in crash, crash

    secrets = (
        MARK,
        MARK.lower(),
        PHONE_TOKEN,
        SIGNING_KEY,
        SIGNING_KEY.removeprefix("whsec_"),
        base64.b64decode(SIGNING_KEY.removeprefix("whsec_")).decode(),
        TEST_KEY,
        DB_PASSWORD,
        hook_url,
    )
    for name, text in (
        (node.log_file.name, node.log_text()),
        (crashed.log_file.name, crashed.log_text()),
        (crash_log.name, crash),
    ):
        assert text.strip(), "nothing was logged"
        for secret in secrets:
            assert secret not in text, f"{name} holds a value it must not: {_around(text, secret)}"


def _add_future_type(url: str) -> None:
    import psycopg

    from tests.support.event_types import add_event_type

    with psycopg.connect(url) as conn:
        add_event_type(conn, "future.thing", {"type": "object"})


def _around(text: str, secret: str) -> str:
    at = text.find(secret)
    return text[max(0, at - 300) : at + 100]
