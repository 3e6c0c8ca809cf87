"""Graceful shutdown: in-flight sends finish within the drain period; what cannot
finish is given back, never lost; what the provider answered is never sent again."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest
import trio

from bothy_notify.push.port import Message, Outcome, Target
from testkit.daemon import DaemonProcess
from tests.harness import Node, device_token, ev, make_config, start_node, wait_for
from tests.support.stall import RowLock, a_write_waits


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


class AnsweringProvider:
    """Holds each send until the test answers its token; counts the sends per token."""

    name = "fake"

    def __init__(self) -> None:
        self.answers: dict[str, trio.Event] = {}
        self.sent: dict[str, int] = {}

    def answer(self, token: str) -> None:
        self.answers.setdefault(token, trio.Event()).set()

    async def send(self, target: Target, message: Message) -> Outcome:
        await self.answers.setdefault(target.token, trio.Event()).wait()
        self.sent[target.token] = self.sent.get(target.token, 0) + 1
        return Outcome.delivered()

    async def aclose(self) -> None:
        return None


async def test_pushes_answered_before_the_drain_ends_are_not_sent_again(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30's reproduction, in process: the provider answers two pushes while the
    database stalls writes to ``bothy.jobs`` (a row lock), and the drain period
    runs out before either result is recorded: the first waits in its recording,
    the second behind it. Both are recorded once the database answers; neither
    job is given back, so a restarted node sends nothing again."""
    provider = AnsweringProvider()
    people = {"alex": "tok-alex", "sam": "tok-sam"}
    config = make_config(server={"drain_period": "200ms"})
    with caplog.at_level(logging.WARNING, logger="bothy.wiring"):
        async with RowLock(database_url) as stall, trio.open_nursery() as nursery:
            node = await start_node(
                nursery, database_url, providers={"fake": provider}, config=config
            )
            await node.append(
                ev("thread.upserted", thread_id="t1", space_id="s1"),
                *(ev("user.upserted", user_id=u, kind="human", active=True) for u in people),
                *(ev("member.added", user_id=u, scope_id="s1") for u in people),
                *(ev("thread.followed", user_id=u, thread_id="t1", level="all") for u in people),
            )
            for user, token in people.items():
                await node.register(user, "phone", token)
            await node.append(
                ev("message.created", thread_id="t1", message_id="m1", thread_seq=1, author_id="r")
            )

            async def both_claimed() -> bool:
                rows = await node.sql("SELECT count(*) FROM bothy.jobs WHERE state = 'running'")
                return rows[0][0] == 2

            await wait_for(both_claimed, what="both pushes claimed")
            (alex_job,) = await node.sql(
                "SELECT id FROM bothy.jobs WHERE args->>'user_id' = 'alex'"
            )
            await stall.take(alex_job[0])
            provider.answer("tok-alex")
            await wait_for(partial(a_write_waits, database_url), what="the first recording to wait")
            provider.answer("tok-sam")
            await wait_for(lambda: _true(provider.sent.get("tok-sam") == 1), what="sam's push")
            node.daemon.request_shutdown()

            async def drain_over() -> bool:
                return "drain period over" in caplog.text

            await wait_for(drain_over, what="the drain period to end")
            await stall.release()
    await node.http.aclose()
    assert provider.sent == {"tok-alex": 1, "tok-sam": 1}
    assert await _states_after(database_url) == [("completed", 1), ("completed", 1)]


async def _true(value: bool) -> bool:
    return value


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
