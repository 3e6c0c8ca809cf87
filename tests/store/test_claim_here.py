"""``JobWriter.claim_here``: keyed jobs inserted already claimed by this node.

The round of a node with a gateway writes its gateway hints this way and runs
them after its commit. They are claimed exactly as a runner's claim would
claim them (running, attempt 1, the next claim number, a lease), so a node
that dies before running them loses nothing: the lease runs out and they run
again under a new claim.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Database, connect_dedicated
from bothy_notify.store.jobs import ClaimHere, JobSpec, JobWriter

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=60)
KIND = "notify.gateway_send"
NODE = "0190f0b8-0000-7000-8000-000000000001"
OTHER = "0190f0b8-0000-7000-8000-000000000002"


def spec(key: str, *, kind: str = KIND, node: str | None = None, at: datetime = NOW) -> JobSpec:
    return JobSpec(kind, {"nid": key, "user_id": "alex"}, at, 3, unique_key=key, node_id=node)


def write(url: str, specs: list[JobSpec], claim: ClaimHere | None) -> tuple[int, list[Any]]:
    conn = connect_dedicated(url)
    try:
        with conn.transaction():
            writer = JobWriter(conn, NOW)
            writer.claim_here(claim)
            writer.extend(specs)
            inserted = writer.finish()
        return inserted, writer.claimed
    finally:
        conn.close()


def rows(url: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return {
            r[0]: tuple(r[1:])
            for r in conn.execute(
                "SELECT unique_key, id, state, attempt, claim, lease_until FROM bothy.jobs"
            )
        }


def here(room: int = 100, node: str | None = None) -> ClaimHere:
    return ClaimHere(kinds=frozenset({KIND}), node_id=node, lease=LEASE, room=room)


def test_selected_jobs_are_inserted_claimed_with_a_lease(database_url: str) -> None:
    inserted, claimed = write(
        database_url,
        [spec("a"), spec("b", kind="notify.flush"), spec("c", at=NOW + timedelta(seconds=1))],
        here(),
    )
    table = rows(database_url)
    assert inserted == 3
    assert table["a"][1:] == ("running", 1, 1, NOW + LEASE)
    assert table["b"][1:] == ("available", 0, 0, None)  # another kind
    assert table["c"][1:] == ("available", 0, 0, None)  # not due yet
    (job,) = claimed
    assert (job.id, job.kind, job.attempt, job.claim) == (table["a"][0], KIND, 1, 1)
    assert job.args == {"nid": "a", "user_id": "alex"} and job.created_at == NOW


def test_no_more_than_the_room_is_claimed(database_url: str) -> None:
    _, claimed = write(database_url, [spec(k) for k in "abcde"], here(room=2))
    assert len(claimed) == 2
    states = sorted(r[1] for r in rows(database_url).values())
    assert states == ["available"] * 3 + ["running"] * 2


def test_a_key_already_queued_is_neither_inserted_nor_claimed(database_url: str) -> None:
    write(database_url, [spec("a")], None)
    inserted, claimed = write(database_url, [spec("a"), spec("b")], here())
    assert inserted == 1
    assert [j.args["nid"] for j in claimed] == ["b"]
    assert rows(database_url)["a"][1:] == ("available", 0, 0, None)


def test_jobs_for_another_node_are_left_to_it(database_url: str) -> None:
    _, claimed = write(
        database_url, [spec("mine", node=NODE), spec("theirs", node=OTHER)], here(node=NODE)
    )
    assert [j.args["nid"] for j in claimed] == ["mine"]
    assert rows(database_url)["theirs"][1] == "available"


def test_without_a_claim_nothing_is_claimed(database_url: str) -> None:
    _, claimed = write(database_url, [spec("a")], None)
    assert claimed == []
    assert rows(database_url)["a"][1:] == ("available", 0, 0, None)


def test_runners_are_woken_only_for_jobs_not_claimed_here(database_url: str) -> None:
    listener = psycopg.connect(database_url, autocommit=True)
    try:
        listener.execute(f"LISTEN {queue.JOBS_CHANNEL}")
        write(database_url, [spec("a")], here())
        assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
        write(database_url, [spec("b"), spec("c", kind="notify.flush")], here())
        assert len(list(listener.notifies(timeout=5, stop_after=1))) == 1
    finally:
        listener.close()


def test_a_job_claimed_here_and_never_run_runs_again_after_its_lease(database_url: str) -> None:
    _, (job,) = write(database_url, [spec("a")], here())
    # The node died after the commit: nothing ran it, nothing recorded it.
    with psycopg.connect(database_url) as conn:
        assert queue.rescue_expired(conn, NOW + LEASE - timedelta(seconds=1)) == (0, 0)
        assert queue.rescue_expired(conn, NOW + LEASE + timedelta(seconds=1)) == (1, 0)
        (again,) = queue.claim(conn, NOW + LEASE + timedelta(seconds=1), 10, LEASE, [KIND])
        # The dead node's fence no longer holds; the new claim's does.
        assert queue.complete(conn, [job.fence], NOW) == set()
        assert (again.id, again.claim, again.attempt) == (job.id, 2, 2)
        assert queue.complete(conn, [again.fence], NOW) == {again.fence}


async def test_completing_on_the_trio_threads_connection_holds_the_same_fences(
    database_url: str,
) -> None:
    _, claimed = write(database_url, [spec("a"), spec("b")], here())
    a, b = sorted(claimed, key=lambda j: j.args["nid"])
    db = Database(database_url)
    await db.open()
    try:
        stale = (b.id, b.claim + 1)  # another claim's fence: must not hold
        held = await queue.complete_direct(db, [a.fence, stale], NOW)
        assert held == {a.fence}
        assert rows(database_url)["a"][1] == "completed"
        assert rows(database_url)["b"][1] == "running"
    finally:
        await db.close()
