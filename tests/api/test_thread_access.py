"""Read positions and follow levels only for threads the person can read: any other
thread is 404 with one constant answer (existence never leaks) and nothing is stored."""

from __future__ import annotations

from typing import Any

from tests.harness import Launch, Node, device_token, ev

ALEX = device_token("alex", "alex-phone")
NOT_FOUND = {"error": {"code": "not_found", "message": "no such thread"}}

THREAD_CALLS: list[tuple[str, str, Any]] = [
    ("PUT", "read", {"seq": 3}),
    ("GET", "follow", None),
    ("PUT", "follow", {"level": "all"}),
]


async def world(node: Node) -> None:
    """t1 in space s1 (alex is a member); t2 in space s2 (alex is not)."""
    await node.append(
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("thread.upserted", thread_id="t2", space_id="s2"),
        ev("member.added", user_id="alex", scope_id="s1"),
    )
    await node.settle()


async def stored_rows(node: Node) -> list[tuple[Any, ...]]:
    return await node.sql(
        "SELECT 'read', thread_id FROM bothy.read_states"
        " UNION ALL SELECT 'follow', thread_id FROM bothy.follows"
    )


async def test_a_thread_that_does_not_exist_is_404_and_nothing_is_stored(launch: Launch) -> None:
    node = await launch()
    await world(node)
    for method, what, body in THREAD_CALLS:
        response = await node.request(method, f"/v1/threads/nowhere/{what}", json=body, token=ALEX)
        assert (response.status_code, response.json()) == (404, NOT_FOUND), (method, what)
    assert await stored_rows(node) == []


async def test_a_thread_the_person_cannot_read_gets_the_same_404(launch: Launch) -> None:
    node = await launch()
    await world(node)
    for method, what, body in THREAD_CALLS:
        response = await node.request(method, f"/v1/threads/t2/{what}", json=body, token=ALEX)
        assert (response.status_code, response.json()) == (404, NOT_FOUND), (method, what)
    assert await stored_rows(node) == []


async def test_a_readable_thread_is_answered_and_stored(launch: Launch) -> None:
    node = await launch()
    await world(node)
    for method, what, body in THREAD_CALLS:
        response = await node.request(method, f"/v1/threads/t1/{what}", json=body, token=ALEX)
        assert response.status_code == 200, (method, what)
    assert sorted(await stored_rows(node)) == [("follow", "t1"), ("read", "t1")]


async def test_losing_access_turns_the_answer_into_404(launch: Launch) -> None:
    node = await launch()
    await world(node)
    ok = await node.request("PUT", "/v1/threads/t1/read", json={"seq": 2}, token=ALEX)
    assert ok.status_code == 200

    await node.append(ev("member.removed", user_id="alex", scope_id="s1"))
    await node.settle()

    gone = await node.request("PUT", "/v1/threads/t1/read", json={"seq": 9}, token=ALEX)
    assert (gone.status_code, gone.json()) == (404, NOT_FOUND)
    assert await node.sql("SELECT last_read_seq FROM bothy.read_states") == [(2,)]
