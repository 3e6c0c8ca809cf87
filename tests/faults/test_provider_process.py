"""Provider outages and stalls against a real daemon process.

The daemon (``bothy-notify run``) speaks to a fake APNs over HTTP/2 and TLS
and to a webhook receiver, both served by the test; the fake provider records
the other channel's pushes.

- **Outage**: APNs answers 503 to everything while every push to 20 phones
  exhausts its attempts. With ``push.max_strikes = 1`` a single counted strike
  would invalidate: none may, since the provider delivered to nobody else
  (a provider-wide outage is never the device's fault). Once APNs answers
  again, every phone gets the next push.
- **Stall**: APNs holds every request. Each is bounded (10 s): the sends end as
  transient, while the fake provider's pushes for other people keep flowing
  meanwhile (a stalled provider holds only its own permits); nobody is
  invalidated, and APNs pushes flow again once it answers.
- **A webhook host that never answers** holds only webhook permits
  (``push.max_in_flight = 2`` of them, six webhooks waiting): fake pushes keep
  flowing at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from testkit.fakes.apns import Answer, FakeApns
from testkit.fakes.webhook import SIGNING_KEY, WebhookReceiver
from tests.faults.conftest import DaemonFactory
from tests.faults.world import (
    PushCount,
    World,
    append,
    closing_count,
    compare_pushes,
    register_phone,
    wait_finished,
    wait_settled,
)
from tests.harness import device_token
from tests.procs import DaemonProcess, read_fake_records

pytestmark = pytest.mark.slow

KEY_ID, TEAM_ID, TOPIC = "KEY123ABCD", "TEAM12345X", "com.example.chat"
APNS_PEOPLE = 20
IN_FLIGHT = 4
"""``push.max_in_flight`` of the stall test: the APNs permits a stall can hold."""


def apns_token(person: str) -> str:
    return (person.encode().hex() * 8)[:64]


@pytest.fixture
def ca(tmp_path: Path) -> tuple[trustme.CA, Path]:
    authority = trustme.CA()
    path = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(path))
    return authority, path


@pytest.fixture
async def fake_apns(
    nursery: trio.Nursery, ca: tuple[trustme.CA, Path]
) -> AsyncIterator[tuple[FakeApns, str]]:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    fake = FakeApns(
        ca=ca[0], public_key=key.public_key(), key_id=KEY_ID, team_id=TEAM_ID, topic=TOPIC
    )
    await nursery.start(fake.serve)
    yield fake, pem
    fake.resume()  # hand back anything still held, so the daemon's streams end


async def start_daemon(
    daemons: DaemonFactory, fake: FakeApns, pem: str, ca_file: Path, **sections: Any
) -> DaemonProcess:
    push: dict[str, Any] = {
        "max_attempts": 3,
        "max_strikes": 1,  # one counted strike would invalidate: none may be counted
        "apns": {
            "key": "env:BOTHY_TEST_APNS_KEY",
            "key_id": KEY_ID,
            "team_id": TEAM_ID,
            "bundle_id": TOPIC,
            "endpoint": fake.url,
            "ca_file": str(ca_file),
        },
        "webhook": {
            "allowed_domains": ["localhost"],
            "allow_private_addresses": True,
            "ca_file": str(ca_file),
        },
    }
    push.update(sections.pop("push", {}))
    return await daemons(
        "a",
        env={"BOTHY_TEST_APNS_KEY": pem},
        push=push,
        jobs={"lease": "30s"},
        notify={"coalesce_window": "0s"},
        **sections,
    )


async def register(http: httpx.AsyncClient, node: DaemonProcess, person: str, body: dict) -> None:
    answer = await http.post(
        f"{node.api_url}/v1/registrations",
        json=body,
        headers={"authorization": "Bearer " + device_token(person, f"dev-{person}", "ios")},
    )
    assert answer.status_code in (200, 201), answer.text


def invalidated(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM bothy.push_registrations WHERE invalidated_at IS NOT NULL"
        ).fetchone()
    assert row is not None
    return int(row[0])


def sends(metrics: str, provider: str, outcome: str) -> float:
    prefix = f'bothy_push_sends_total{{app="default",outcome="{outcome}",provider="{provider}"}}'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)
    )


async def apns_sends(http: httpx.AsyncClient, node: DaemonProcess, outcome: str) -> float:
    return sends((await http.get(f"{node.api_url}/metrics")).text, "apns", outcome)


def apns_requests_for(fake: FakeApns, message_id: str) -> set[str]:
    return {r.device_token for r in fake.requests if r.body.get("message_id") == message_id}


def delivered(fake: FakeApns, records: Path | None = None) -> list[tuple[str, str]]:
    """(message id, token) of every push APNs answered 200 to and, given its record
    file, every push the fake provider delivered."""
    pairs = [((r.body or {}).get("message_id", ""), r.device_token) for r in fake.delivered()]
    if records is not None:
        pairs += [
            (r["payload"].get("message_id", ""), r["token"])
            for r in read_fake_records(records)
            if r.get("outcome") == "delivered"
        ]
    return pairs


def pushes_recorded(
    expected: set[tuple[str, str]], fake: FakeApns, records: Path | None = None
) -> PushCount:
    """What the providers delivered against ``expected`` (message id, token) pairs."""
    return compare_pushes(delivered(fake, records), expected)


async def fake_pushes_keep_flowing(url: str, other: World, records: Path) -> None:
    """Five messages to people on the fake provider, each pushed within 5 s."""
    for n in range(5):
        await append(url, [other.message(n)])
        with trio.fail_after(5):
            while not any(
                r["payload"].get("message_id") == f"msg-{n}" for r in read_fake_records(records)
            ):
                await trio.sleep(0.02)


async def test_an_apns_outage_invalidates_nobody_and_pushes_resume(
    daemons: DaemonFactory,
    fault_db: str,
    fake_apns: tuple[FakeApns, str],
    ca: tuple[trustme.CA, Path],
) -> None:
    fake, pem = fake_apns
    node = await start_daemon(daemons, fake, pem, ca[1])
    pid = node.pid
    world = World(people=[f"person-{i}" for i in range(APNS_PEOPLE)], threads=["thread-0"])
    await append(fault_db, world.setup_events())
    async with httpx.AsyncClient(timeout=10) as http:
        for person in world.people:
            await register(http, node, person, {"provider": "apns", "token": apns_token(person)})
        await wait_settled(fault_db)
        fake.default = Answer(503, "ServiceUnavailable")
        await append(fault_db, [world.message(n) for n in range(5)])
        await wait_finished(fault_db, timeout=60)  # every send ran out of attempts
        metrics = (await http.get(f"{node.api_url}/metrics")).text
        assert sends(metrics, "apns", "failed") == APNS_PEOPLE * 5
        assert sends(metrics, "apns", "delivered") == 0
        assert await trio.to_thread.run_sync(invalidated, fault_db) == 0

        fake.default = Answer()
        await append(fault_db, [world.message(5)])
        await wait_finished(fault_db, timeout=60)
    assert apns_requests_for(fake, "msg-5") == {apns_token(p) for p in world.people}
    assert await trio.to_thread.run_sync(invalidated, fault_db) == 0
    # Only the push after the outage reached the phones, each once.
    expected = {("msg-5", apns_token(p)) for p in world.people}
    await closing_count(fault_db, node, pushes_recorded(expected, fake), pid=pid)


async def test_a_stalled_apns_is_bounded_and_holds_only_its_own_permits(
    daemons: DaemonFactory,
    fault_db: str,
    fake_apns: tuple[FakeApns, str],
    ca: tuple[trustme.CA, Path],
) -> None:
    fake, pem = fake_apns
    node = await start_daemon(daemons, fake, pem, ca[1], push={"max_in_flight": IN_FLIGHT})
    pid = node.pid
    apple = World(people=[f"apple-{i}" for i in range(8)], threads=["thread-a"])
    other = World(people=[f"other-{i}" for i in range(3)], threads=["thread-b"])
    await append(fault_db, apple.setup_events() + other.setup_events())
    records = node.config_file.parent / "pushes.jsonl"
    async with httpx.AsyncClient(timeout=10) as http:
        for person in apple.people:
            await register(http, node, person, {"provider": "apns", "token": apns_token(person)})
        for person in other.people:
            await register_phone(http, node.api, person)
        await wait_settled(fault_db)

        fake.stall()
        stalled_at = trio.current_time()
        await append(fault_db, [apple.message(100)])  # msg-100: apart from other's
        with trio.fail_after(10):
            while fake.count < IN_FLIGHT:  # every APNs permit is held by a stalled request
                await trio.sleep(0.05)
        # Meanwhile the other channel delivers at once, message after message.
        await fake_pushes_keep_flowing(fault_db, other, records)
        assert trio.current_time() - stalled_at < 10, "the fake pushes waited for APNs"

        # Every stalled request ends within its bound (10 s) as a transient attempt.
        with trio.fail_after(30):
            while await apns_sends(http, node, "transient") < IN_FLIGHT:
                await trio.sleep(0.2)
        fake.resume()
        await wait_finished(fault_db, timeout=60)
    assert apns_requests_for(fake, "msg-100") == {apns_token(p) for p in apple.people}
    assert await trio.to_thread.run_sync(invalidated, fault_db) == 0
    expected = {("msg-100", apns_token(p)) for p in apple.people} | {
        (f"msg-{n}", f"phone-token-{p}") for n in range(5) for p in other.people
    }
    # A request held past its bound and answered when the stall ends reaches the
    # phone as well as the retry: at most one per APNs permit.
    await closing_count(
        fault_db,
        node,
        pushes_recorded(expected, fake, records),
        pid=pid,
        duplicates_at_most=IN_FLIGHT,
    )


async def test_a_webhook_host_that_never_answers_holds_only_webhook_permits(
    daemons: DaemonFactory,
    fault_db: str,
    fake_apns: tuple[FakeApns, str],
    ca: tuple[trustme.CA, Path],
    nursery: trio.Nursery,
) -> None:
    fake, pem = fake_apns
    receiver = WebhookReceiver(ca[0], hosts=("localhost",))
    await nursery.start(receiver.serve)
    node = await start_daemon(daemons, fake, pem, ca[1], push={"max_in_flight": 2})
    pid = node.pid
    hooked = World(people=[f"server-{i}" for i in range(6)], threads=["thread-h"])
    other = World(people=[f"other-{i}" for i in range(3)], threads=["thread-b"])
    await append(fault_db, hooked.setup_events() + other.setup_events())
    records = node.config_file.parent / "pushes.jsonl"
    async with httpx.AsyncClient(timeout=10) as http:
        for person in hooked.people:
            path = f"/never-{person}"
            receiver.stall_paths.add(path)
            body = {
                "provider": "webhook",
                "token": receiver.url(path, host="localhost"),
                "signing_key": SIGNING_KEY,
            }
            await register(http, node, person, body)
        for person in other.people:
            await register_phone(http, node.api, person)
        await wait_settled(fault_db)

        started = trio.current_time()
        await append(fault_db, [hooked.message(100)])
        with trio.fail_after(10):
            while receiver.stalled < 2:  # both webhook permits are held
                await trio.sleep(0.05)
        await fake_pushes_keep_flowing(fault_db, other, records)
        assert trio.current_time() - started < 10, "fake pushes waited for the webhook host"
    assert len(read_fake_records(records)) == 5 * len(other.people)
    # Every other push arrived once; the silent host received nothing.
    expected = {(f"msg-{n}", f"phone-token-{p}") for n in range(5) for p in other.people}
    hooks = [(d.body.get("message_id", ""), d.path) for d in receiver.deliveries]
    pushes = compare_pushes([*hooks, *delivered(fake, records)], expected)
    await closing_count(fault_db, node, pushes, pid=pid)
