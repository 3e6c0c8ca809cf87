"""The token lifecycle of SPEC section 10 through the real runner and push_send job."""

from __future__ import annotations

from collections import defaultdict, deque
from datetime import datetime, timedelta
from typing import Any

import pytest
import trio

from bothy_notify.kernel.clock import FakeClock
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
    """Alex (registration ``token``) and Pat (``pat-tok``) follow t1; Sam writes there.

    Pat's phone delivers unless scripted otherwise, so the provider works for others.
    """
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="pat", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="pat", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
        ev("thread.followed", user_id="pat", thread_id="t1", level="all"),
    )
    await node.register("pat", "pats-phone", "pat-tok")
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
    """Let every waiting retry of a send run (backoff: seconds for a few attempts)."""
    for _ in range(6):
        await node.advance(20)


async def send_and_finish(node: Node, seq: int) -> None:
    """Append message ``seq`` and let its sends run every attempt."""
    await node.append(message(seq))
    await node.settle()
    await retry_all(node)


def lifecycle_config(**push: Any) -> Any:
    return make_config(push={"max_attempts": 3, "strike_interval": "1h", **push})


def counted(node: Node, metric: str, **labels: str) -> float:
    value = node.daemon.metrics.registry.get_sample_value(metric, labels)
    return value or 0.0


async def test_a_send_whose_attempts_all_fail_counts_one_strike_not_one_per_attempt(
    launch: Launch,
) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config())
    reg = await setup(node)
    provider.script("tok", *[Outcome.transient("http_503")] * 3)
    await send_and_finish(node, 1)
    assert provider.count("tok") == 3
    assert await registration_row(node, reg) == (1, False, "http_503", False)


async def test_a_send_that_succeeds_on_a_retry_counts_no_strike(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config())
    reg = await setup(node)
    provider.script("tok", Outcome.transient("http_503"), Outcome.transient("http_503"))
    await send_and_finish(node, 1)
    assert provider.count("tok") == 3
    failure_count, invalidated, _error, seen = await registration_row(node, reg)
    assert (failure_count, invalidated, seen) == (0, False, True)


async def test_delivered_sets_last_seen_and_resets_strikes(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config())
    reg = await setup(node)
    provider.script("tok", *[Outcome.transient("http_503")] * 3)
    await send_and_finish(node, 1)
    assert (await registration_row(node, reg))[0] == 1
    await send_and_finish(node, 2)
    failure_count, invalidated, _error, seen = await registration_row(node, reg)
    assert (failure_count, invalidated, seen) == (0, False, True)


async def test_max_strikes_failed_sends_a_strike_interval_apart_invalidate(
    launch: Launch,
) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config())
    reg = await setup(node)
    provider.script("tok", *[Outcome.transient("http_503")] * 9)
    for seq in (1, 2):
        await send_and_finish(node, seq)
        assert await registration_row(node, reg) == (seq, False, "http_503", False)
        await node.advance(3600)
    await send_and_finish(node, 3)
    assert await registration_row(node, reg) == (3, True, "http_503", False)
    assert counted(node, "bothy_registrations_total", action="invalidated") == 1
    assert counted(node, "bothy_registrations_invalidated_total", cause="strikes") == 1

    await send_and_finish(node, 4)
    assert provider.count("tok") == 9  # no more sends to an invalidated registration
    assert node.skipped("no_registration") == 1


async def test_failed_sends_within_one_strike_interval_count_one_strike(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config())
    reg = await setup(node)
    provider.script("tok", *[Outcome.transient("http_503")] * 12)
    for seq in range(1, 5):
        await send_and_finish(node, seq)
        await node.advance(600)
    assert provider.count("tok") == 12
    assert await registration_row(node, reg) == (1, False, "http_503", False)


async def test_a_failed_send_counts_no_strike_while_the_provider_delivers_to_nobody_else(
    launch: Launch,
) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config(max_strikes=1))
    reg = await setup(node)
    for seq in (1, 2, 3):
        provider.script("tok", *[Outcome.transient("http_503")] * 3)
        provider.script("pat-tok", *[Outcome.transient("http_503")] * 3)
        await send_and_finish(node, seq)
        await node.advance(3600)
    assert provider.count("tok") == 9
    assert await registration_row(node, reg) == (0, False, "http_503", False)


async def test_only_deliveries_to_other_registrations_let_a_failure_count(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config(max_strikes=1))
    reg = await setup(node)
    await send_and_finish(node, 1)  # both delivered: the provider's latest delivery is ours too
    await node.advance(60)
    provider.script("tok", *[Outcome.transient("http_503")] * 3)
    provider.script("pat-tok", *[Outcome.transient("http_503")] * 3)
    await send_and_finish(node, 2)
    assert await registration_row(node, reg) == (0, False, "http_503", True)


async def test_our_own_failure_never_counts_a_strike_while_others_deliver(
    launch: Launch,
) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config(max_strikes=1))
    reg = await setup(node)
    for seq in (1, 2, 3):
        provider.script("tok", *[Outcome.transient("token_unavailable", ours=True)] * 3)
        await send_and_finish(node, seq)
        await node.advance(3600)
    assert provider.count("tok") == 9
    assert await registration_row(node, reg) == (0, False, "token_unavailable", False)


async def test_a_send_that_gives_up_counts_failed_in_push_sends(launch: Launch) -> None:
    provider = ScriptedProvider()
    node = await launch(providers={"fake": provider}, config=lifecycle_config())
    await setup(node)
    provider.script("tok", *[Outcome.transient("http_503")] * 3)
    await send_and_finish(node, 1)
    sends = "bothy_push_sends_total"
    assert counted(node, sends, provider="fake", outcome="transient", app="default") == 2
    assert counted(node, sends, provider="fake", outcome="failed", app="default") == 1
    assert counted(node, sends, provider="fake", outcome="delivered", app="default") == 1  # Pat's
    (job,) = [j for j in await node.jobs("notify.push_send") if j["state"] == "failed"]
    assert job["attempt"] == 3


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
    actions = {
        action: counted(node, "bothy_registrations_total", action=action)
        for action in ("registered", "invalidated", "restored")
    }
    assert actions == {"registered": 2, "invalidated": 1, "restored": 1}
    assert counted(node, "bothy_registrations_invalidated_total", cause="dead") == 1


async def test_a_registration_not_renewed_within_the_ttl_is_invalidated(launch: Launch) -> None:
    node = await launch(config=make_config(push={"registration_ttl": "30d"}))
    reg = await setup(node)
    node.clock.advance(timedelta(days=29))
    assert node.daemon.housekeeper is not None
    assert (await node.daemon.housekeeper.sweep_now()).registrations_expired == 0
    await node.register("alex", "phone", "tok")  # the app launched again (Pat's did not)
    node.clock.advance(timedelta(days=29))
    assert (await node.daemon.housekeeper.sweep_now()).registrations_expired == 1
    node.clock.advance(timedelta(days=2))
    assert (await node.daemon.housekeeper.sweep_now()).registrations_expired == 1
    row = await registration_row(node, reg)
    assert row[1:3] == (True, "not_renewed")
    assert counted(node, "bothy_registrations_total", action="expired") == 2


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
    assert counted(node, "bothy_registrations_total", action="deleted") == 1


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


class OutageProvider:
    """The fake provider in an outage: every send answers 503 (transient) until ``ends``
    on the fake clock, and is delivered otherwise."""

    name = "fake"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.ends: datetime | None = None
        self.failed = 0
        self.delivered = 0

    async def send(self, target: Target, message: PushMessage) -> Outcome:
        await trio.lowlevel.checkpoint()
        if self.ends is not None and self.clock.now() < self.ends:
            self.failed += 1
            return Outcome.transient("http_503")
        self.delivered += 1
        return Outcome.delivered()

    async def aclose(self) -> None:
        return None


PEOPLE = 1000


async def many_people(node: Node) -> None:
    """``PEOPLE`` people, each with one phone registration, following t1."""
    people = [f"p{i:04d}" for i in range(PEOPLE)]
    now = node.clock.now()

    def seed(conn: Any) -> None:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bothy.users (user_id, kind, active) VALUES (%s, 'human', true)",
                [(p,) for p in people],
            )
            cur.executemany(
                "INSERT INTO bothy.members (scope_id, user_id) VALUES ('s1', %s)",
                [(p,) for p in people],
            )
            cur.executemany(
                "INSERT INTO bothy.follows (thread_id, user_id, level) VALUES ('t1', %s, 'all')",
                [(p,) for p in people],
            )
            cur.executemany(
                "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
                " created_at, renewed_at) VALUES (%s, %s, 'phone', 'fake', %s, %s, %s)",
                [(f"reg-{p}", p, f"tok-{p}", now, now) for p in people],
            )

    await node.append(ev("thread.upserted", thread_id="t1", space_id="s1"))
    await node.db.run(seed)


@pytest.mark.slow
async def test_a_ten_minute_provider_outage_invalidates_none_of_a_thousand_registrations(
    launch: Launch,
) -> None:
    clock = FakeClock()
    provider = OutageProvider(clock)
    node = await launch(
        providers={"fake": provider},
        clock=clock,
        config=make_config(
            push={"max_attempts": 2, "max_strikes": 3, "strike_interval": "1m"},
            jobs={"lease": "10m"},
        ),
    )
    await many_people(node)
    await send_and_finish(node, 1)
    assert provider.delivered == PEOPLE

    provider.ends = clock.now() + timedelta(minutes=10)
    for seq in range(2, 6):  # four failed sends each, more than a strike interval apart
        await node.advance(60)
        await node.append(message(seq))
        await node.settle()
        await node.advance(5)  # the second attempt
    assert provider.failed == 4 * 2 * PEOPLE
    assert clock.now() < provider.ends

    await node.advance(600)  # the provider is back
    await send_and_finish(node, 6)
    assert provider.delivered == 2 * PEOPLE
    rows = await node.sql(
        "SELECT count(*) FILTER (WHERE invalidated_at IS NOT NULL), max(failure_count)"
        " FROM bothy.push_registrations"
    )
    assert rows == [(0, 0)]
    assert counted(node, "bothy_registrations_total", action="invalidated") == 0
    assert (
        counted(node, "bothy_push_sends_total", provider="fake", outcome="failed", app="default")
        == 4 * PEOPLE
    )
