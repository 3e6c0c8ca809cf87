"""``bothy-notify events dead-letters`` and ``events retry``: see what the round set
aside, and replay it once fixed, decided with today's facts."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bothy_notify import commands
from bothy_notify.cli import main
from bothy_notify.kernel.metrics import Metrics
from tests.harness import make_config
from tests.runner.test_poison import (
    FUTURE_TYPE,
    POISON_MEMBER,
    consume_all,
    message,
    new_round,
    prepare,
)

SETUP: list[tuple[str, dict[str, Any]]] = [
    ("user.upserted", {"user_id": "alex", "kind": "human", "active": True}),
    ("member.added", {"user_id": "alex", "scope_id": "s1"}),
    ("thread.upserted", {"thread_id": "t1", "space_id": "s1"}),
    ("thread.followed", {"user_id": "alex", "thread_id": "t1", "level": "all"}),
]
POISON_FOLLOWED_MESSAGE = message("poison-thread", 1)


@pytest.fixture
def bothy_logger() -> Iterator[None]:
    """``main`` sets up the ``bothy`` logger for a command line; put it back after."""
    logger = logging.getLogger("bothy")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


async def set_aside(url: str, events: list[tuple[str, dict[str, Any]]]) -> None:
    prepare(url, events)
    await consume_all(new_round(url, Metrics()), url)


def fix_the_triggers(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("DROP TRIGGER refuse_poison ON bothy.members")
        conn.execute("DROP TRIGGER refuse_poison ON bothy.threads")


def dead_letter_seqs(url: str) -> list[tuple[int, str, int]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1], r[2])
            for r in conn.execute("SELECT seq, type, retries FROM bothy.dead_letters ORDER BY seq")
        ]


def run(fn: Any, *args: Any) -> tuple[int, str]:
    out = io.StringIO()
    code = fn(*args, out)
    return code, out.getvalue()


async def test_dead_letters_says_none_when_nothing_was_set_aside(database_url: str) -> None:
    await set_aside(database_url, SETUP)
    code, printed = run(commands.dead_letters_command, make_config(database={"url": database_url}))
    assert code == 0
    assert printed == "no dead letters: the round applied and decided every event\n"


async def test_dead_letters_lists_seq_type_error_and_when_as_a_table(
    database_url: str, tmp_path: Path, bothy_logger: None
) -> None:
    await set_aside(database_url, [*SETUP, (FUTURE_TYPE, {"x": 1}), POISON_MEMBER])
    config = tmp_path / "node.toml"
    config.write_text(f'[database]\nurl = "{database_url}"\n[log]\nlevel = "error"\n')
    out = io.StringIO()
    assert main(["events", "dead-letters", "--config", str(config)], stdout=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["SEQ", "TYPE", "ERROR", "WHEN", "RETRIES", "WHERE"]
    first, second = lines[1].split(), lines[2].split()
    assert first[1:3] == [FUTURE_TYPE, "UnknownEventType"]
    assert second[1:3] == ["member.added", "StoreError(RaiseException)"]
    assert second[4] == "0" and second[5].startswith("bothy_notify/store/projections.py:")
    assert [int(first[0]), int(second[0])] == [s for s, _t, _r in dead_letter_seqs(database_url)]
    assert lines[3].startswith("2 dead letter(s); replay them once fixed")
    assert "poison-scope" not in out.getvalue()


async def test_retry_replays_what_was_fixed_and_keeps_what_still_fails(
    database_url: str,
) -> None:
    await set_aside(database_url, [*SETUP, (FUTURE_TYPE, {"x": 1}), POISON_MEMBER])
    fix_the_triggers(database_url)
    (unknown_seq, _, _), (member_seq, _, _) = dead_letter_seqs(database_url)
    code, printed = run(commands.retry_command, make_config(database={"url": database_url}), None)
    assert code == 1
    lines = printed.splitlines()
    assert lines[0].startswith("replaying 2 dead letter(s) in log order")
    assert lines[1].startswith(f"seq {unknown_seq} ({FUTURE_TYPE}): failed again: UnknownEventType")
    assert lines[2] == f"seq {member_seq} (member.added): replayed; 0 hint(s), 0 job(s), 0 skip(s)"
    assert lines[3] == "1 of 2 replayed"
    assert dead_letter_seqs(database_url) == [(unknown_seq, FUTURE_TYPE, 1)]
    with psycopg.connect(database_url) as conn:
        members = conn.execute(
            "SELECT count(*) FROM bothy.members WHERE scope_id = 'poison-scope'"
        ).fetchone()
    assert members == (1,)


async def test_a_replay_is_decided_with_todays_facts(database_url: str) -> None:
    follow = ("thread.followed", {"user_id": "alex", "thread_id": "poison-thread", "level": "all"})
    member = ("member.added", {"user_id": "alex", "scope_id": "poison-thread"})
    await set_aside(database_url, [*SETUP, follow, member, POISON_FOLLOWED_MESSAGE])
    [(seq, _, _)] = dead_letter_seqs(database_url)
    config = make_config(database={"url": database_url})

    # Fixed; meanwhile alex read the thread past that message.
    fix_the_triggers(database_url)
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "SELECT bothy.append_event('thread.read',"
            ' \'{"user_id": "alex", "thread_id": "poison-thread", "seq": 1}\'::jsonb)'
        )
    await consume_all(new_round(database_url, Metrics()), database_url)
    code, printed = run(commands.retry_command, config, [seq])
    assert code == 0
    assert f"seq {seq} (message.created): replayed; 0 hint(s), 0 job(s), 1 skip(s)" in printed
    assert dead_letter_seqs(database_url) == []


async def test_a_replayed_message_gets_its_push(database_url: str) -> None:
    follow = ("thread.followed", {"user_id": "alex", "thread_id": "poison-thread", "level": "all"})
    member = ("member.added", {"user_id": "alex", "scope_id": "poison-thread"})
    await set_aside(database_url, [*SETUP, follow, member, POISON_FOLLOWED_MESSAGE])
    [(seq, _, _)] = dead_letter_seqs(database_url)
    fix_the_triggers(database_url)
    code, printed = run(commands.retry_command, make_config(database={"url": database_url}), [seq])
    assert code == 0, printed
    assert f"seq {seq} (message.created): replayed; 1 hint(s), 1 job(s), 0 skip(s)" in printed
    with psycopg.connect(database_url) as conn:
        pushes = conn.execute(
            "SELECT args->>'message_id', args->>'registration_id' FROM bothy.jobs"
            " WHERE kind = 'notify.push_send'"
        ).fetchall()
    assert pushes == [("m1", "r-alex")]


async def test_retry_of_a_seq_that_is_not_a_dead_letter_says_so(database_url: str) -> None:
    await set_aside(database_url, SETUP)
    code, printed = run(commands.retry_command, make_config(database={"url": database_url}), [4242])
    assert code == 1
    assert printed.splitlines() == [
        "seq 4242: not a dead letter (never set aside, or replayed already)"
    ]


async def test_retry_with_nothing_set_aside_says_so(database_url: str) -> None:
    await set_aside(database_url, SETUP)
    code, printed = run(commands.retry_command, make_config(database={"url": database_url}), None)
    assert code == 0
    assert printed == "no dead letters: nothing to replay\n"


def test_retry_needs_seq_or_all(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["events", "retry"])
    assert exit_.value.code == 2
    assert "one of the arguments --seq --all is required" in capsys.readouterr().err
