"""Live routes through the kernel ports, with in-memory presence and publisher (the
real gateway has its own end-to-end tests): gateway jobs, delayed pushes and their
release check."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import trio

from bothy_notify.kernel.clock import from_unix_micros
from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.kernel.results import Result
from bothy_notify.notify.jobs.gateway_send import GatewaySendHandler
from bothy_notify.runner import Done, JobResult
from bothy_notify.store import jobs as queue
from bothy_notify.store.jobs import Job
from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, device_token, ev, make_config
from tests.job_args import assert_ids_and_integers


async def start(launch: Launch, **notify: str) -> tuple[Node, FakeGateway]:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway), config=make_config(notify=notify))
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1", channel_id="c1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "phone", "phone-token")
    return node, gateway


def desktop(focus: tuple[str, ...] = (), idle: bool = False) -> PresenceEntry:
    return PresenceEntry("desk", "macos", frozenset(focus), idle)


def message(seq: int) -> dict:
    return ev(
        "message.created", thread_id="t1", message_id=f"m{seq}", thread_seq=seq, author_id="sam"
    )


async def test_active_desktop_gets_a_gateway_hint_and_the_phone_waits(launch: Launch) -> None:
    node, gateway = await start(launch, mobile_delay_when_desktop_active="2m")
    gateway.presence.set("alex", desktop(focus=("t2",)))
    await node.append(message(1))
    await node.settle()

    (event,) = gateway.publisher.events
    frame = event.to_frame()
    assert frame["audience"] == "alex"
    assert frame["resource"] == {"kind": "thread", "id": "t1"}
    assert frame["scope"] == {"thread_id": "t1", "space_id": "s1", "channel_id": "c1"}
    assert frame["payload"]["kind"] == "message" and frame["payload"]["count"] == 1
    assert "seq" not in frame and "permission_version" not in frame
    (push,) = await node.jobs("notify.push_send")
    assert push["args"]["release_seq"] == 1 and push["args"]["nid"] == frame["payload"]["nid"]
    assert push["scheduled_at"] == node.clock.now() + timedelta(minutes=2)
    assert from_unix_micros(push["args"]["due_at"]) == push["scheduled_at"]
    assert node.fake.sends == []

    await node.advance(120)
    (send,) = node.fake.sends
    assert send.payload["nid"] == frame["payload"]["nid"]


async def test_read_before_the_delay_sends_no_push(launch: Launch) -> None:
    node, gateway = await start(launch)
    gateway.presence.set("alex", desktop())
    await node.append(message(1))
    await node.settle()
    put = await node.request(
        "PUT", "/v1/threads/t1/read", json={"seq": 1}, token=device_token("alex", "desk", "macos")
    )
    assert put.status_code == 200
    await node.advance(120)
    assert node.fake.sends == []
    assert node.skipped("read") == 1


async def test_read_only_up_to_an_earlier_message_still_sends(launch: Launch) -> None:
    node, gateway = await start(launch)
    await node.append(message(1))
    await node.settle()
    gateway.presence.set("alex", desktop())
    await node.append(message(2))
    await node.settle()
    await node.request(
        "PUT", "/v1/threads/t1/read", json={"seq": 1}, token=device_token("alex", "desk", "macos")
    )
    await node.advance(120)
    hints = [s.payload for s in node.fake.sends if s.payload["kind"] != "read"]
    assert [p["message_id"] for p in hints] == ["m1", "m2"]  # beside m1's read push


async def test_focus_on_the_thread_gives_nothing_anywhere(launch: Launch) -> None:
    node, gateway = await start(launch)
    gateway.presence.set("alex", desktop(focus=("t1",)))
    await node.append(message(1))
    await node.settle()
    assert await node.jobs() == [] and gateway.publisher.events == []
    assert node.skipped("active_in_thread") == 1


async def test_access_removed_before_the_gateway_job_runs_publishes_nothing(
    launch: Launch,
) -> None:
    node, gateway = await start(launch, mobile_delay_when_desktop_active="0s")
    gateway.presence.set("alex", desktop())
    assert node.daemon.runner is not None
    node.daemon.runner.stop_claiming()  # this test runs the job by hand
    await node.append(message(1))
    with trio.fail_after(10):
        while not await node.jobs("notify.gateway_send"):
            await trio.sleep(0.01)
    await node.sql("DELETE FROM bothy.members")  # revoked between decision and publish

    handler = GatewaySendHandler(
        db=node.db,
        clock=node.clock,
        config=node.daemon.config.push,
        metrics=node.daemon.metrics,
        publisher=gateway.publisher,
    )
    jobs = await node.db.run(
        partial(
            queue.claim,
            now=node.clock.now(),
            limit=10,
            lease=timedelta(seconds=30),
            kinds=["notify.gateway_send"],
        )
    )
    results: list[JobResult] = []

    async def report(job: Job, result: JobResult) -> None:
        results.append(result)

    await handler.run_batch(jobs, report)
    assert results == [Done(Result.SKIPPED_NO_ACCESS)]
    assert gateway.publisher.events == []
    assert node.skipped("no_access") == 1


async def test_hints_without_a_thread_use_resource_user(launch: Launch) -> None:
    node, gateway = await start(launch)
    gateway.presence.set("alex", desktop())
    await node.append(ev("access.expiring", user_id="alex", target_id="grant-1"))
    await node.settle()
    (event,) = gateway.publisher.events
    frame = event.to_frame()
    assert frame["resource"] == {"kind": "user", "id": "alex"} and frame["scope"] == {}
    assert frame["payload"]["kind"] == "admin" and frame["payload"]["target_id"] == "grant-1"
    assert "thread_id" not in frame["payload"]
    (send,) = node.fake.sends  # an admin hint is never delayed
    assert send.payload["target_id"] == "grant-1"


async def test_gateway_job_args_are_ids_and_integers(launch: Launch) -> None:
    node, gateway = await start(launch, coalesce_window="30s")
    gateway.presence.set("alex", desktop())
    await node.append(message(1), message(2), ev("access.expiring", user_id="alex", target_id="g"))
    await node.settle()
    await node.advance(30)
    kinds = set()
    for job in await node.jobs():
        kinds.add(job["kind"])
        assert_ids_and_integers(job["args"])
    assert kinds == {"notify.push_send", "notify.gateway_send", "notify.flush"}
