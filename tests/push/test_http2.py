"""The provider HTTP/2 client (libcurl's multi interface driven by Trio) against the
fake APNs and raw sockets: answers as values, one connection multiplexed, and
cancellation that resets a stream or gives up a half-made connection without
harming the rest (the lessons of ``push/streams.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
import trio
import trio.testing
import trustme

from bothy_notify.push.http2 import Http2Client, no_answer_reason
from bothy_notify.push.transport import NoAnswer, ProviderAnswer
from testkit.fakes.apns import Answer, FakeApns
from tests.push.conftest import KEY_ID, TEAM_ID, TOPIC, ApnsKey

TOKEN = "ab" * 32


@pytest.fixture
def lines(apns_key: ApnsKey) -> list[str]:
    """The header lines of a background push the fake accepts (a valid provider JWT)."""
    signed = jwt.encode(
        {"iss": TEAM_ID, "iat": int(time.time())},
        apns_key.private,
        algorithm="ES256",
        headers={"kid": KEY_ID},
    )
    return [
        f"authorization: bearer {signed}",
        f"apns-topic: {TOPIC}",
        "apns-push-type: background",
        "apns-priority: 5",
        "content-type: application/json",
    ]


async def post(client: Http2Client, fake: FakeApns, lines: list[str], token: str = TOKEN) -> object:
    """A background push to ``token``; the fake answers by its script."""
    return await client.request(
        f"{fake.url}/3/device/{token}", lines, b'{"aps":{"content-available":1}}'
    )


def test_an_answer_reads_its_headers_by_name_and_shows_only_its_status() -> None:
    answer = ProviderAnswer(
        503, (b"HTTP/2 503 \r\n", b"Retry-After: 120\r\n", b"apns-id: x\r\n", b"\r\n"), b"{}"
    )
    assert answer.header("retry-after") == "120"
    assert answer.header("APNS-ID") == "x"
    assert answer.header("missing") is None
    assert repr(answer) == "ProviderAnswer(status=503)"


def test_libcurl_errors_become_short_reasons() -> None:
    import pycurl

    assert no_answer_reason(pycurl.E_COULDNT_CONNECT) == "connect_error"
    assert no_answer_reason(pycurl.E_COULDNT_RESOLVE_HOST) == "dns_error"
    assert no_answer_reason(pycurl.E_PEER_FAILED_VERIFICATION) == "tls_error"
    assert no_answer_reason(pycurl.E_OPERATION_TIMEDOUT) == "timeout"
    assert no_answer_reason(pycurl.E_HTTP2) == "protocol_error"
    assert no_answer_reason(pycurl.E_RECV_ERROR) == "network_error"


async def test_a_5xx_is_an_answer_and_a_refused_connection_is_no_answer(
    fake_apns: FakeApns, ca_file: str, lines: list[str]
) -> None:
    fake_apns.answer(TOKEN, Answer(503, "ServiceUnavailable"))
    client = Http2Client(ca_file=ca_file)
    answered = await post(client, fake_apns, lines)
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        refused = await client.request(
            f"https://127.0.0.1:{sock.getsockname()[1]}/x", ["content-type: a/b"], b"{}"
        )
    await client.aclose()

    assert isinstance(answered, ProviderAnswer) and answered.status == 503
    assert b"ServiceUnavailable" in answered.body
    assert refused == NoAnswer("connect_error")


async def test_a_server_outside_the_trusted_ca_is_no_answer_tls_error(
    fake_apns: FakeApns, tmp_path: Path, lines: list[str]
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    client = Http2Client(ca_file=str(other))
    answer = await post(client, fake_apns, lines)
    await client.aclose()
    assert answer == NoAnswer("tls_error")
    assert fake_apns.count == 0


async def test_concurrent_requests_share_one_connection_and_each_gets_its_own_answer(
    fake_apns: FakeApns, ca_file: str, lines: list[str]
) -> None:
    tokens = [f"{i:064x}" for i in range(300)]
    for i, token in enumerate(tokens):
        fake_apns.answer(token, Answer(400 + i % 100, f"R{i}"))
    client = Http2Client(ca_file=ca_file)
    answers: dict[str, object] = {}

    async def one(token: str) -> None:
        answers[token] = await post(client, fake_apns, lines, token)

    async with trio.open_nursery() as nursery:
        for token in tokens:
            nursery.start_soon(one, token)
    await client.aclose()

    for i, token in enumerate(tokens):
        answer = answers[token]
        assert isinstance(answer, ProviderAnswer)
        assert (answer.status, json.loads(answer.body)["reason"]) == (400 + i % 100, f"R{i}")
    assert fake_apns.connections == 1


async def test_a_cancelled_request_resets_its_stream_and_the_connection_stays_usable(
    fake_apns: FakeApns, ca_file: str, lines: list[str]
) -> None:
    fake_apns.answer(TOKEN, Answer(stall=True))
    client = Http2Client(ca_file=ca_file)
    with trio.move_on_after(0.3) as scope:
        await post(client, fake_apns, lines)
    while fake_apns.resets < 1:
        await fake_apns.changed.wait()
    fake_apns.answer("cd" * 32, Answer(410, "Unregistered"))
    after = await post(client, fake_apns, lines, "cd" * 32)
    await client.aclose()

    assert scope.cancelled_caught
    assert isinstance(after, ProviderAnswer) and after.status == 410
    assert fake_apns.connections == 1
    assert fake_apns.protocol_errors == []


async def test_a_request_cancelled_during_the_handshake_closes_the_half_made_connection(
    ca_file: str,
) -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = Http2Client(ca_file=ca_file)
    with trio.move_on_after(0.3):
        # The server accepts TCP and never answers the TLS ClientHello.
        await client.request(
            f"https://127.0.0.1:{listener.getsockname()[1]}/x", ["content-type: a/b"], b"{}"
        )
    accepted, _ = await listener.accept()
    with accepted, listener:
        seen = b""
        while True:  # the ClientHello, then end of file once the client gives up
            chunk = await accepted.recv(65536)
            if not chunk:
                break
            seen += chunk
    await client.aclose()
    assert seen[:1] == b"\x16"  # a TLS handshake record was started, then abandoned


def driver_tasks(name: str) -> list[trio.lowlevel.Task]:
    """The client's driver task(s) among the run's system tasks."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    return [
        task
        for nursery in root.child_nurseries
        for task in nursery.child_tasks
        if task.name == f"bothy-push-{name}"
    ]


async def test_closing_stops_the_driver_and_refuses_new_requests(
    fake_apns: FakeApns, ca_file: str, lines: list[str]
) -> None:
    client = Http2Client(ca_file=ca_file, name="closing")
    await post(client, fake_apns, lines)
    assert len(driver_tasks("closing")) == 1
    await client.aclose()
    await trio.testing.wait_all_tasks_blocked()

    assert driver_tasks("closing") == []
    with pytest.raises(trio.ClosedResourceError):
        await post(client, fake_apns, lines)
