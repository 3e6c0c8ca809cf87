"""The token lifecycle of SPEC section 10 through the real runner and push_send job."""

from __future__ import annotations

from collections import defaultdict, deque
from datetime import timedelta

import trio

from bothy_notify.push.port import Outcome, PushMessage, Target
from tests.harness import Launch, Node, device_token, ev, make_config


class ScriptedProvider:
    """A provider whose answers per token follow a script (then ``delivered``)."""

    name = "fake"

    def __init__(self) -> None:
        self.scripts: dict[str, deque[Outcome]] = defaultdict(deque)
        self.calls: list[tuple[str, PushMessage]] = []

    def script(self, token: str, *outcomes: Outcome) -> None:
        self.scripts[token].extend(outcomes)

    async def send(self, target: Target, message: PushMessage) -> Outcome:
        self.calls.append((target.token, message))
        queue = self.scripts[target.token]
        return queue.popleft() if queue else Outcome.delivered()

    async def aclose(self) -> None:
        return None

    def count(self, token: str) -> int:
        return sum(1 for t, _ in self.calls if t == token)


async def setup(node: Node, token: str = "tok") -> str:
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    registration = await node.register("alex", "phone", token)
    return str(registration["id"])


def message(seq: int) -> dict:
    return ev(
        "message.created", thread_id="t1", message_id=f"m{seq}", thread_seq=seq, author_id="sam"
    )


async def registration_row(node: Node, reg_id: str) -> tuple:
    (row,) = await node.sql(
        "SELECT failure_count, invalidated_at IS NOT NULL, last_error, last_seen_at IS NOT NULL"
        " FROM bothy.push_registrations WHERE id = %s",
        (reg_id,),
    )
    return row


async def retry_all(node: Node) -> None:
    """Let every waiting retry run (the runner's backoff is at most minutes)."""
    for _ in range(6):
        await node.advance(600)


async def test_delivered_sets_last_seen_and_resets_strikes(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider})
    reg = await setup(node)
    provider.script("tok", Outcome.transient("http_503"), Outcome.transient("http_503"))
    await node.append(message(1))
    await node.settle()
    assert (await registration_row(node, reg))[0] == 1
    await retry_all(node)
    failure_count, invalidated, _error, seen = await registration_row(node, reg)
    assert (failure_count, invalidated, seen) == (0, False, True)
    assert provider.count("tok") == 3


async def test_three_transient_failures_in_a_row_invalidate(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider})
    reg = await setup(node)
    provider.script("tok", *[Outcome.transient("http_503")] * 3)
    await node.append(message(1))
    await node.settle()
    await retry_all(node)
    failure_count, invalidated, error, _seen = await registration_row(node, reg)
    assert (failure_count, invalidated, error) == (3, True, "http_503")
    assert provider.count("tok") == 3
    await node.append(message(2))
    await node.settle()
    assert provider.count("tok") == 3
    assert node.skipped("no_registration") == 1


async def test_a_delivery_in_between_resets_the_strike_count(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider})
    reg = await setup(node)
    provider.script(
        "tok",
        Outcome.transient("x"),
        Outcome.transient("x"),
        Outcome.delivered(),
        Outcome.transient("x"),
        Outcome.transient("x"),
    )
    await node.append(message(1))
    await node.settle()
    await retry_all(node)
    await node.append(message(2))
    await node.settle()
    await retry_all(node)
    failure_count, invalidated, _error, _seen = await registration_row(node, reg)
    assert (failure_count, invalidated) == (0, False)
    assert provider.count("tok") == 6


async def test_mismatch_and_rejected_keep_the_registration_without_strikes(
    launch: Launch,
) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider})
    reg = await setup(node)
    provider.script("tok", Outcome.mismatch("BadDeviceToken"), Outcome.rejected("PayloadTooLarge"))
    await node.append(message(1))
    await node.settle()
    assert await registration_row(node, reg) == (0, False, "BadDeviceToken", False)
    await node.append(message(2))
    await node.settle()
    assert await registration_row(node, reg) == (0, False, "PayloadTooLarge", False)
    await node.append(message(3))
    await node.settle()
    assert (await registration_row(node, reg))[3] is True
    assert provider.count("tok") == 3


async def test_dead_invalidates_and_registering_again_restores(launch: Launch) -> None:
    node = await launch()
    reg = await setup(node, "dead-phone")
    await node.append(message(1))
    await node.settle()
    assert (await registration_row(node, reg))[1] is True

    again = await node.register("alex", "phone", "dead-phone")
    assert again["id"] == reg and again["state"] == "active" and "last_error" not in again
    assert (await registration_row(node, reg))[:3] == (0, False, None)


async def test_a_registration_not_renewed_within_the_ttl_is_invalidated(launch: Launch) -> None:
    node = await launch(config=make_config(push={"registration_ttl": "30d"}))
    reg = await setup(node)
    node.clock.advance(timedelta(days=29))
    assert node.daemon.housekeeper is not None
    assert (await node.daemon.housekeeper.sweep_now()).registrations_expired == 0
    await node.register("alex", "phone", "tok")  # the app launched again
    node.clock.advance(timedelta(days=29))
    assert (await node.daemon.housekeeper.sweep_now()).registrations_expired == 0
    node.clock.advance(timedelta(days=2))
    assert (await node.daemon.housekeeper.sweep_now()).registrations_expired == 1
    row = await registration_row(node, reg)
    assert row[1:3] == (True, "not_renewed")


async def test_invalidated_registrations_are_deleted_after_the_retention(launch: Launch) -> None:
    node = await launch(config=make_config(push={"invalidated_retention": "7d"}))
    reg = await setup(node, "dead-phone")
    await node.append(message(1))
    await node.settle()
    assert node.daemon.housekeeper is not None
    node.clock.advance(timedelta(days=6))
    assert (await node.daemon.housekeeper.sweep_now()).registrations_deleted == 0
    node.clock.advance(timedelta(days=2))
    # the clock of the sweep is the fake clock; invalidated_at came from it too
    assert (await node.daemon.housekeeper.sweep_now()).registrations_deleted == 1
    assert await node.sql("SELECT id FROM bothy.push_registrations WHERE id = %s", (reg,)) == []


async def test_a_hint_older_than_max_age_is_not_sent(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=make_config(push={"max_age": "1h"}))
    await setup(node)
    provider.script("tok", Outcome.transient("x", retry_after=timedelta(hours=2)))
    await node.append(message(1))
    await node.settle()
    await node.advance(7200)
    assert provider.count("tok") == 1
    assert node.skipped("expired") == 1


async def test_a_token_handed_to_another_person_gets_no_push_of_the_former_owner(
    launch: Launch,
) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider})
    await setup(node)
    await node.append(ev("user.upserted", user_id="sam", kind="human", active=True))
    provider.script("tok", Outcome.transient("x"))
    await node.append(message(1))
    await node.settle()
    moved = await node.register("sam", "sams-phone", "tok")
    assert moved["state"] == "active"
    listed = await node.request("GET", "/v1/registrations", token=device_token("alex", "phone"))
    assert listed.json() == {"registrations": []}
    await retry_all(node)
    assert provider.count("tok") == 1
    assert node.skipped("no_registration") == 1


class StalledProvider:
    """Accepts sends and never answers (until the test ends)."""

    name = "stall"

    def __init__(self) -> None:
        self.started = 0

    async def send(self, target: Target, message: PushMessage) -> Outcome:
        self.started += 1
        await trio.sleep_forever()
        raise AssertionError("never answers")  # pragma: no cover

    async def aclose(self) -> None:
        return None


async def test_a_stalled_provider_gives_runner_slots_back_instead_of_holding_them(
    launch: Launch,
) -> None:
    fake, stalled = ScriptedProvider(), StalledProvider()
    node = await launch(
        providers={"fake": fake, "stall": stalled},
        config=make_config(jobs={"concurrency": 4}, push={"max_in_flight": 2}),
    )
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    for i in range(6):
        await node.register("alex", f"alex-{i}", f"stalled-{i}", provider="stall")
    await node.register("sam", "sams-phone", "sam-token")
    # Six sends to the stalled provider fill its two permits and the runner's slots...
    await node.append(message(1))
    with trio.fail_after(10):
        while stalled.started < 2:
            await trio.sleep(0.01)
    # ...yet a mention for Sam on the healthy provider still goes out.
    await node.append(
        ev(
            "message.created",
            thread_id="t1",
            message_id="m2",
            thread_seq=2,
            author_id="alex",
            mentions=["sam"],
        )
    )
    with trio.fail_after(10):
        while fake.count("sam-token") == 0:
            await trio.sleep(0.01)
    assert stalled.started == 2
    deferred = await node.sql(
        "SELECT count(*) FROM bothy.jobs WHERE state = 'available' AND attempt = 0"
        " AND args->>'user_id' = 'alex'"
    )
    assert deferred[0][0] >= 1
