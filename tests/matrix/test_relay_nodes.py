"""Relaying through an upstream gateway: a Bothy node's ``matrix`` registration pushes
through a second Bothy node serving the Matrix gateway (real sockets, TLS in front
of it, as a vendor would run it), which pushes to the fake APNs."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import trio
import trustme
from psycopg.conninfo import make_conninfo

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.matrix import MatrixRelayProvider
from bothy_notify.push.resolver import FakeResolver
from testkit.fakes.apns import Answer, FakeApns
from tests.conftest import TEMPLATE
from tests.harness import Launch, Node, device_token, make_config, start_node
from tests.push.conftest import ApnsKey
from tests.push.test_delivery import apns, message, people

VENDOR = "push.vendor.test"
APP = "im.vendor.ios"
PUSHKEY = "ef" * 32


@pytest.fixture
def vendor_database_url(pg_url: str) -> Iterator[str]:
    """The vendor's node has a database of its own."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    try:
        yield make_conninfo(pg_url, dbname=name)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def _pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await sink.aclose()


async def tls_in_front(
    ca: trustme.CA, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """TLS for ``VENDOR`` on a port of its own, forwarding to 127.0.0.1:``port``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(VENDOR).configure_cert(context)

    async def handle(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, context, server_side=True)
        upstream = await trio.open_tcp_stream("127.0.0.1", port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, tls, upstream)
            nursery.start_soon(_pump, upstream, tls)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def test_a_relay_registration_pushes_through_another_nodes_gateway(
    launch: Launch,
    nursery: trio.Nursery,
    vendor_database_url: str,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca: trustme.CA,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    vendor = await start_node(
        nursery,
        vendor_database_url,
        config=make_config(matrix_gateway={"apps": {APP: "apns"}}),
        providers={"apns": apns(fake_apns, apns_key, ca_file, now_clock)},
        clock=now_clock,
    )
    assert vendor.addresses.api is not None
    proxy = await nursery.start(tls_in_front, ca, int(vendor.addresses.api.rsplit(":", 1)[1]))
    relay = MatrixRelayProvider(
        allowed_gateways=(VENDOR,),
        allow_private_addresses=True,
        clock=now_clock,
        resolver=FakeResolver({VENDOR: ["127.0.0.1"]}),
        ca_file=ca_file,
    )
    node = await launch(providers={"matrix": relay}, clock=now_clock)
    await people(node)
    gateway = f"https://{VENDOR}:{proxy}/_matrix/push/v1/notify"
    await register(node, gateway)

    await node.append(message(1))
    await node.settle()
    (push,) = fake_apns.requests
    assert push.device_token == PUSHKEY
    ((nid,),) = await node.sql(
        "SELECT args->>'nid' FROM bothy.jobs WHERE kind = 'notify.push_send'"
    )
    assert push.body["event_id"] == nid
    assert push.body["room_id"] == "t1"
    assert push.body["unread"] == 1  # the hint's badge: one unread thread
    assert "m1" not in str(push.body)

    # The vendor's APNs declares the token gone: the vendor's gateway rejects the
    # pushkey, and this node retires the registration.
    fake_apns.answer(PUSHKEY, Answer(410, "Unregistered"))
    await node.append(message(2))
    await node.settle()
    assert await node.sql(
        "SELECT invalidated_at IS NOT NULL, last_error FROM bothy.push_registrations"
    ) == [(True, "pushkey_rejected")]
    await node.append(message(3))
    await node.settle()
    assert len(fake_apns.requests) == 2


async def register(node: Node, gateway: str) -> None:
    answer = await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "matrix", "token": PUSHKEY, "gateway": gateway, "app_id": APP},
        token=device_token("alex", "alex-phone", "ios"),
    )
    assert answer.status_code == 201, answer.text
    assert VENDOR not in answer.text and PUSHKEY not in answer.text


async def test_a_relay_gateway_outside_the_allowed_hosts_is_refused_at_registration(
    launch: Launch, ca_file: str, now_clock: FakeClock
) -> None:
    relay = MatrixRelayProvider(
        allowed_gateways=("push.other.test",),
        clock=now_clock,
        resolver=FakeResolver({VENDOR: ["93.184.216.34"]}),
        ca_file=ca_file,
    )
    node = await launch(providers={"matrix": relay}, clock=now_clock)
    answer = await node.request(
        "POST",
        "/v1/registrations",
        json={
            "provider": "matrix",
            "token": PUSHKEY,
            "gateway": f"https://{VENDOR}/_matrix/push/v1/notify",
            "app_id": APP,
        },
        token=device_token("alex", "alex-phone", "ios"),
    )
    assert answer.status_code == 422
    assert answer.json()["error"]["message"] == (
        "gateway: the host is not in push.matrix.allowed_gateways"
    )
