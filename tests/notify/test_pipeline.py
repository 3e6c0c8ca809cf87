"""End to end from ``POST /v1/events`` to the fake provider's record (role worker
semantics: nobody connected)."""

from __future__ import annotations

from pathlib import Path

from tests.harness import Launch, Node, device_token, ev, make_config
from tests.job_args import assert_ids_and_integers


async def world(node: Node) -> None:
    """Alex and Robin follow thread t1 in space s1; Sam writes; Robin has no access."""
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("user.upserted", user_id="robin", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1", channel_id="c1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="c1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
        ev("thread.followed", user_id="sam", thread_id="t1", level="all"),
        ev("thread.followed", user_id="robin", thread_id="t1", level="all"),
    )
    await node.register("alex", "alex-phone", "alex-token")
    await node.register("sam", "sam-phone", "sam-token")
    await node.register("robin", "robin-phone", "robin-token")


def message(seq: int, *, author: str = "sam", mentions: list[str] | None = None) -> dict:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id=author,
        mentions=mentions or [],
    )


def sends_to(node: Node, token: str) -> list[dict]:
    return [s.payload for s in node.fake.sends if s.token == token]


async def test_follower_phone_gets_one_content_free_push(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(message(1))
    await node.settle()

    (payload,) = sends_to(node, "alex-token")
    assert set(payload) == {
        "nid",
        "kind",
        "thread_id",
        "message_id",
        "count",
        "quiet",
        "mv",
        "badge",
        "urgency",
    }
    assert payload["kind"] == "message"
    assert (payload["badge"], payload["urgency"]) == (1, "normal")
    assert payload["thread_id"] == "t1" and payload["message_id"] == "m1"
    assert payload["count"] == 1 and payload["quiet"] is False
    assert sends_to(node, "sam-token") == []  # the author hears nothing


async def test_follower_without_access_gets_nothing(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(message(1))
    await node.settle()

    assert sends_to(node, "robin-token") == []
    assert node.skipped("no_access") == 1


async def test_follower_who_read_past_the_message_gets_nothing(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(ev("thread.read", user_id="alex", thread_id="t1", seq=3), message(2))
    await node.settle()

    assert sends_to(node, "alex-token") == []
    assert node.skipped("read") == 1


async def test_mention_reaches_a_person_whose_level_is_mentions(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(ev("thread.followed", user_id="alex", thread_id="t1", level="mentions"))
    await node.append(message(1), message(2, mentions=["alex"]))
    await node.settle()

    (payload,) = sends_to(node, "alex-token")
    assert payload["kind"] == "mention" and payload["message_id"] == "m2"


async def test_ten_messages_in_a_window_give_one_hint_and_one_flush_hint(launch: Launch) -> None:
    config = make_config(notify={"coalesce_window": "30s"})
    node = await launch(config=config)
    await world(node)
    await node.append(*[message(seq) for seq in range(1, 11)])
    await node.settle()
    assert [p["message_id"] for p in sends_to(node, "alex-token")] == ["m1"]

    await node.advance(30)

    first, flush = sends_to(node, "alex-token")
    assert flush["message_id"] == "m10" and flush["count"] == 10
    assert flush["nid"] != first["nid"]
    assert node.daemon.metrics.hints_coalesced._value.get() == 9 * 1  # alex folded nine
    assert len(sends_to(node, "robin-token")) == 0


async def test_flush_after_reading_sends_nothing(launch: Launch) -> None:
    config = make_config(notify={"coalesce_window": "30s"})
    node = await launch(config=config)
    await world(node)
    await node.append(*[message(seq) for seq in range(1, 4)])
    await node.settle()
    response = await node.request(
        "PUT",
        "/v1/threads/t1/read",
        json={"seq": 3},
        token=device_token("alex", "alex-phone"),
    )
    assert response.status_code == 200
    await node.advance(30)

    assert len(sends_to(node, "alex-token")) == 1


async def test_dead_token_is_tried_once_then_invalidated_and_never_again(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.register("alex", "alex-phone", "dead-alex")
    await node.append(message(1))
    await node.settle()
    assert len(sends_to(node, "dead-alex")) == 1

    listed = await node.request(
        "GET",
        "/v1/registrations",
        token=device_token("alex", "alex-phone"),
    )
    states = {r["state"] for r in listed.json()["registrations"]}
    assert "invalidated" in states

    await node.append(message(2))
    await node.settle()
    assert len(sends_to(node, "dead-alex")) == 1
    assert len(sends_to(node, "alex-token")) == 2


async def test_every_job_arg_is_an_id_or_an_integer(launch: Launch, tmp_path: Path) -> None:
    app = tmp_path / "acme" / "chat"
    app.mkdir(parents=True)
    (app / "kinds.toml").write_text('["invite"]\ncategory = "social"\n', encoding="utf-8")
    config = make_config(
        notify={"coalesce_window": "30s", "categories": ["social"], "kinds_dir": str(tmp_path)}
    )
    node = await launch(config=config)
    await world(node)
    await node.append(
        ev(
            "hint.requested",
            recipients=["alex"],
            category="social",
            kind="acme/chat:invite",
            target_id="sam",
        ),
        message(1, mentions=["alex"]),
        message(2),
        ev("access.expiring", user_id="alex", target_id="grant-7"),
        ev(
            "device.upserted",
            device_id="alex-laptop",
            user_id="alex",
            platform="macos",
            state="pending",
        ),
    )
    await node.settle()
    await node.advance(30)
    thread = message(2)["payload"]["thread_id"]
    await node.append(
        ev(
            "message.edited",
            thread_id=thread,
            message_id="m2",
            thread_seq=2,
            author_id="sam",
            mentions=["alex"],
            previous_mentions=[],
        ),
        ev(
            "message.deleted",
            thread_id=thread,
            message_id="m2",
            thread_seq=2,
            author_id="sam",
            mentions=["alex"],
            last_seq=1,
        ),
    )
    await node.settle()
    await node.advance(30)
    jobs = await node.jobs()
    assert {j["kind"] for j in jobs} >= {
        "notify.push_send",
        "notify.flush",
        "notify.push_removed",
    }
    assert {j["args"].get("kind") for j in jobs} >= {"acme/chat:invite", "message", "admin"}
    assert {j["args"].get("mv") for j in jobs if "nid" in j["args"]} == {
        node.daemon.catalogue.version
    }
    for job in jobs:
        assert_ids_and_integers(job["args"])
