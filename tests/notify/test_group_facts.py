"""A group's facts as the round reads them (``notify.facts``): each fact kind read for
all of a group's people in one statement, decoded into the decision's values."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from bothy_notify.config import Level
from bothy_notify.notify import facts
from bothy_notify.notify.domain.model import Device

NOW = datetime(2026, 12, 1, tzinfo=UTC)
QUIET = '{"time_zone": "UTC", "schedule": [], "snooze_until": null, "breakthrough": []}'

SEED = [
    "INSERT INTO bothy.users (user_id, kind, active) VALUES"
    " ('alex', 'human', true), ('sam', 'human', false), ('bot', 'agent', true),"
    " ('kim', 'human', true), ('lee', 'human', true)",
    """INSERT INTO bothy.preferences (user_id, categories) VALUES"""
    """ ('alex', '{"mentions": false, "messages": true, "security": false}'),"""
    """ ('kim', '{"messages": true}')""",
    f"INSERT INTO bothy.quiet_hours (user_id, doc, updated_at) VALUES ('kim', '{QUIET}', now())",
    "INSERT INTO bothy.threads (thread_id, space_id, channel_id) VALUES"
    " ('t1', 'space', 'chan'), ('t2', 'other', NULL)",
    "INSERT INTO bothy.members (scope_id, user_id) VALUES"
    " ('chan', 'alex'), ('space', 'alex'), ('t2', 'kim'), ('elsewhere', 'lee')",
    # alex: a phone with two registrations (one invalidated) and a laptop with one;
    # kim: a revoked tablet, and a registration for a device without a row (active).
    "INSERT INTO bothy.devices (user_id, device_id, platform, state) VALUES"
    " ('alex', 'phone', 'ios', 'active'), ('alex', 'laptop', 'macos', 'active'),"
    " ('kim', 'tablet', 'android', 'revoked')",
    "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
    " created_at, renewed_at, invalidated_at) VALUES"
    " ('r2', 'alex', 'phone', 'fake', 'a', now(), now(), NULL),"
    " ('r1', 'alex', 'phone', 'fake', 'b', now(), now(), NULL),"
    " ('r0', 'alex', 'phone', 'fake', 'c', now(), now(), now()),"
    " ('r3', 'alex', 'laptop', 'fake', 'd', now(), now(), NULL),"
    " ('r4', 'kim', 'tablet', 'fake', 'e', now(), now(), NULL),"
    " ('r5', 'kim', 'web-1', 'fake', 'f', now(), now(), NULL)",
    "INSERT INTO bothy.read_states (user_id, thread_id, last_read_seq) VALUES"
    " ('alex', 't1', 7), ('kim', 't1', 3), ('kim', 't2', 9)",
    "INSERT INTO bothy.follows (thread_id, user_id, level) VALUES"
    " ('t1', 'alex', 'all'), ('t1', 'kim', 'mentions'), ('t1', 'lee', 'none'),"
    " ('t1', 'sam', 'all'), ('t2', 'kim', 'mentions')",
]


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in SEED:
            conn.execute(statement)
        yield conn


def test_each_persons_facts_come_back_decoded(conn: psycopg.Connection[Any]) -> None:
    group = facts.load_group(
        conn,
        users=["alex", "sam", "bot", "kim", "lee", "nobody"],
        pairs={"t1": ["alex", "kim", "lee"], "t2": ["kim", "alex"]},
        follows=None,
        with_windows=False,
    )
    people = group.people
    assert set(people) == {"alex", "sam", "bot", "kim", "lee"}  # "nobody" has no row
    assert (people["alex"].human, people["alex"].active) == (True, True)
    assert people["alex"].categories_off == {"mentions", "security"}
    assert people["alex"].quiet_hours is None
    assert (people["sam"].human, people["sam"].active) == (True, False)
    assert people["bot"].human is False
    assert people["kim"].categories_off == frozenset()
    assert people["kim"].quiet_hours is not None
    assert people["lee"] == facts._person(True, True, None, None)

    # Active registrations of active devices (a device without a row counts as
    # active), by device, each device's registrations in order.
    assert group.devices == {
        "alex": (Device("laptop", "macos", ("r3",)), Device("phone", "ios", ("r1", "r2"))),
        "kim": (Device("web-1", "web", ("r5",)),),
    }
    assert {u: sorted(s) for u, s in group.member_of.items()} == {
        "alex": ["chan", "space"],
        "kim": ["t2"],
        "lee": ["elsewhere"],
    }
    infos = group.infos
    assert group.may_read("alex", infos["t1"]) and not group.may_read("alex", infos["t2"])
    assert group.may_read("kim", infos["t2"]) and not group.may_read("kim", infos["t1"])
    assert not group.may_read("lee", infos["t1"]) and not group.may_read("sam", infos["t1"])
    # Read positions of the pairs asked for only.
    assert group.reads == {"t1": {"alex": 7, "kim": 3}, "t2": {"kim": 9}}
    assert group.follows["t1"] == {
        "alex": Level.ALL,
        "kim": Level.MENTIONS,
        "lee": Level.NONE,
        "sam": Level.ALL,
    }


def test_a_group_without_threads_reads_people_only(conn: psycopg.Connection[Any]) -> None:
    group = facts.load_group(conn, users=["alex"], pairs={}, follows=None, with_windows=False)
    assert group.infos == {} and group.reads == {} and group.follows == {}
    assert group.people["alex"].categories_off == {"mentions", "security"}
    assert list(group.member_of) == ["alex"]
    assert sorted(group.member_of["alex"]) == ["chan", "space"]


def test_candidate_follows_are_the_all_followers_and_the_mentioned(
    conn: psycopg.Connection[Any],
) -> None:
    levels = facts.send_candidate_follows(conn, {"t1": ["lee", "kim", "nobody"], "t2": []})()
    assert levels == {
        "t1": {"alex": Level.ALL, "sam": Level.ALL, "lee": Level.NONE, "kim": Level.MENTIONS}
    }
    assert facts.send_candidate_follows(conn, {})() == {}
    # The same levels as the full read, for the people it returns.
    full = facts.follow_rows(conn, ["t1"])["t1"]
    assert all(full[u] is level for u, level in levels["t1"].items())
