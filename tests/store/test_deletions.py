"""``store/deletions.py``: the ``NOTIFY`` of a deleted message's desktops stays under
PostgreSQL's payload limit however many people it names, and the gateway reads back
exactly what was sent (and nothing from a payload of another shape)."""

from __future__ import annotations

import json

import psycopg

from bothy_notify.store.deletions import (
    MESSAGE_REMOVED_CHANNEL,
    NOTIFY_PAYLOAD_MAX,
    ThreadPlace,
    tell_removed,
)
from gateway.reads import Removal, removal


def test_a_long_list_of_people_goes_in_several_notifications_under_the_limit(
    database_url: str,
) -> None:
    people = {f"{n:04d}-" + "p" * 123 for n in range(300)}  # IDs of 128 characters
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {MESSAGE_REMOVED_CHANNEL}")
        with psycopg.connect(database_url) as conn:
            sent = tell_removed(conn, "t1", "m1", ThreadPlace("s1", None), people)
            conn.commit()
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=sent)]

    assert sent == len(payloads) > 1
    assert all(len(p.encode()) <= NOTIFY_PAYLOAD_MAX for p in payloads)
    read = [removal(p) for p in payloads]
    assert all(
        r is not None and (r.thread_id, r.message_id, r.space_id) == ("t1", "m1", "s1")
        for r in read
    )
    named = [u for r in read if r is not None for u in r.user_ids]
    assert sorted(named) == sorted(people)


def test_nobody_to_tell_sends_nothing(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert tell_removed(conn, "t1", "m1", None, []) == 0


def test_the_gateway_reads_only_the_shape_the_round_sends() -> None:
    good = {"thread_id": "t1", "message_id": "m1", "user_ids": ["alex"]}
    assert removal(json.dumps(good)) == Removal("t1", "m1", None, None, ("alex",))
    for bad in (
        "not json",
        json.dumps(["t1"]),
        json.dumps({**good, "user_ids": "alex"}),
        json.dumps({**good, "user_ids": [7]}),
        json.dumps({**good, "space_id": 5}),
        json.dumps({"thread_id": "t1", "user_ids": []}),
    ):
        assert removal(bad) is None, bad
