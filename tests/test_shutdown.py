"""Graceful shutdown: in-flight sends finish within the drain period; what cannot
finish is given back, never lost."""

from __future__ import annotations

from pathlib import Path

import trio

from bothy_notify.push.port import Message, Outcome, Target
from testkit.daemon import DaemonProcess
from tests.harness import Node, device_token, ev, make_config, start_node, wait_for


class GatedProvider:
    """Holds every send until ``release`` is set."""

    name = "fake"

    def __init__(self) -> None:
        self.release = trio.Event()
        self.entered = trio.Event()
        self.finished = 0

    async def send(self, target: Target, message: Message) -> Outcome:
        self.entered.set()
        await self.release.wait()
        self.finished += 1
        return Outcome.delivered()

    async def aclose(self) -> None:
        return None


async def one_push(node: Node) -> None:
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "phone", "tok")
    await node.append(
        ev("message.created", thread_id="t1", message_id="m1", thread_seq=1, author_id="sam")
    )


async def test_an_in_flight_send_finishes_during_the_drain(database_url: str) -> None:
    provider = GatedProvider()
    async with trio.open_nursery() as nursery:
        node = await start_node(
            nursery,
            database_url,
            providers={"fake": provider},
            config=make_config(server={"drain_period": "5s"}),
        )
        await one_push(node)
        await provider.entered.wait()
        node.daemon.request_shutdown()
        await trio.sleep(0.1)
        provider.release.set()
    await node.http.aclose()
    assert provider.finished == 1
    states = await _states_after(database_url)
    assert states == [("completed", 1)]


async def test_a_send_that_outlives_the_drain_is_given_back(database_url: str) -> None:
    provider = GatedProvider()
    async with trio.open_nursery() as nursery:
        node = await start_node(
            nursery,
            database_url,
            providers={"fake": provider},
            config=make_config(server={"drain_period": "200ms"}),
        )
        await one_push(node)
        await provider.entered.wait()
        node.daemon.request_shutdown()
    await node.http.aclose()
    assert provider.finished == 0
    assert await _states_after(database_url) == [("available", 0)]


async def _states_after(url: str) -> list[tuple[str, int]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1]) for r in conn.execute("SELECT state, attempt FROM bothy.jobs ORDER BY id")
        ]


async def test_sigterm_stops_the_daemon_cleanly(database_url: str, tmp_path: Path) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text(
        '[server]\napi_listen = "127.0.0.1:0"\ngateway_listen = "127.0.0.1:0"\n'
        'drain_period = "2s"\n[database]\nurl = "env:BOTHY_TEST_DATABASE_URL"\n'
        '[push.fake]\n[log]\nformat = "json"\n'
    )
    daemon = DaemonProcess(
        config_file=config_file,
        log_file=tmp_path / "node.log",
        env={"BOTHY_TEST_DATABASE_URL": database_url},
    )
    await daemon.start(timeout=60)
    assert daemon.ready["pid"] == daemon.pid

    assert await daemon.stop(timeout=20) == 0
    log = daemon.log_text()
    assert "node stopped" in log
    assert "Traceback" not in log
    assert daemon.ready_file is not None and not daemon.ready_file.exists()


async def test_an_http_request_in_flight_at_shutdown_still_gets_its_answer(
    database_url: str,
) -> None:
    async with trio.open_nursery() as nursery:
        node = await start_node(
            nursery, database_url, config=make_config(server={"drain_period": "10s"})
        )
        host, port = node.addresses.api.rsplit(":", 1)  # type: ignore[union-attr]
        body = b'{"provider": "fake", "token": "tok-drain"}'
        head = (
            "POST /v1/registrations HTTP/1.1\r\n"
            f"host: {host}\r\n"
            f"authorization: Bearer {device_token('alex', 'phone')}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(head + body[:10])

        async def in_flight() -> bool:
            # The handler made the device row from the token, then waits for the body.
            return bool(await node.sql("SELECT 1 FROM bothy.devices WHERE device_id = 'phone'"))

        await wait_for(in_flight, what="the request to be in flight")
        node.daemon.request_shutdown()

        async def refused() -> bool:
            try:
                other = await trio.open_tcp_stream(host, int(port))
            except OSError:
                return True
            await other.aclose()
            return False

        await wait_for(refused, what="new connections to be refused")
        await stream.send_all(body[10:])
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
        await stream.aclose()
    await node.http.aclose()
    assert answer.startswith(b"HTTP/1.1 201 ")
    assert await _states_after(database_url) == []
