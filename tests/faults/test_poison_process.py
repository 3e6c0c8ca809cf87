"""A poison event in the middle of 1,000 good ones: 999 decided, 1 dead-lettered,
no restart.

The poison event has a type that a newer node's migration added (its check is
in ``bothy.checked_event``, so the outbox accepts it) and that the running code
does not know. The daemon, a real ``bothy-notify run`` process, must decide the
other 999 events exactly (every phone push recorded once), set the poison one
aside where ``bothy-notify events dead-letters`` shows it, count it in
``bothy_events_dead_lettered_total``, and keep running in the same process.
``bothy-notify events retry`` then keeps it (the running code still does not
know its type), and replays a second one once its payload is fixed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from tests.faults.conftest import DaemonFactory
from tests.faults.world import (
    World,
    append,
    closing_count,
    count_pushes,
    register_phone,
    wait_finished,
    wait_settled,
)
from tests.support.event_types import add_event_type

pytestmark = pytest.mark.slow

GOOD = 999
POISON_AT = 500


def add_future_type(url: str) -> None:
    """What a newer node's migration would do: a new event type the outbox accepts."""
    with psycopg.connect(url) as conn:
        add_event_type(conn, "future.thing", {"type": "object"})


def events_command(config_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``bothy-notify events ...``, as an operator runs it."""
    command = [sys.executable, "-m", "bothy_notify.cli", "events", *args]
    return subprocess.run(
        [*command, "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
        check=False,
    )


def dead_letters(config_file: Path) -> str:
    """``bothy-notify events dead-letters``; its table."""
    done = events_command(config_file, "dead-letters")
    assert done.returncode == 0, done.stderr
    return done.stdout


def insert_around_validation(url: str, event_type: str, payload: str) -> int:
    """A row written straight into ``bothy.events``, past ``bothy.append_event``'s
    schema check (a producer bug, a hand-made fix gone wrong); its seq."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "INSERT INTO bothy.events (type, payload) VALUES (%s, %s::jsonb) RETURNING seq",
            (event_type, payload),
        ).fetchone()
        conn.execute("NOTIFY bothy_events")
    assert row is not None
    return int(row[0])


def fix_payload(url: str, seq: int, payload: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE bothy.events SET payload = %s::jsonb WHERE seq = %s", (payload, seq))


def dead_lettered_total(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("bothy_events_dead_lettered_total{")
    )


async def test_a_poison_event_among_a_thousand_is_set_aside_and_the_rest_decided(
    daemons: DaemonFactory, fault_db: str
) -> None:
    world = World(people=[f"person-{i}" for i in range(3)], threads=["thread-0", "thread-1"])
    node = await daemons("a", notify={"coalesce_window": "0s", "batch_size": 200})
    await append(fault_db, world.setup_events())
    tokens = set()
    async with httpx.AsyncClient(timeout=10) as http:
        for person in world.people:
            await register_phone(http, node.api, person)
            tokens.add(f"phone-token-{person}")
        await wait_settled(fault_db)
        pid = node.pid
        await trio.to_thread.run_sync(add_future_type, fault_db)

        events = [world.message(n) for n in range(POISON_AT)]
        events.append(("future.thing", {"note": "a field this release never heard of"}))
        events += [world.message(n) for n in range(POISON_AT, GOOD)]
        for start in range(0, len(events), 100):  # ten producer transactions
            await append(fault_db, events[start : start + 100])
        appended, behind, busy = await wait_settled(fault_db, timeout=180)

        metrics = (await http.get(f"{node.api_url}/metrics")).text
        ready = await http.get(f"{node.api_url}/readyz")
    assert behind == 0 and busy == 0
    assert node.pid == pid and node.alive() and node.starts == 1, "the daemon restarted"
    assert ready.status_code == 200, ready.text
    assert dead_lettered_total(metrics) == 1
    listed = dead_letters(node.config_file)
    assert "future.thing" in listed and "1 dead letter(s)" in listed, listed

    expected = {(m, t) for m in world.sent for t in tokens}
    pushes = count_pushes(node.config_file.parent / "pushes.jsonl", expected)
    print(f"events={appended} good={GOOD}")
    assert len(world.sent) == GOOD
    await closing_count(fault_db, node, pushes, pid=pid, dead_letters=1)

    # The operator retries: the unknown type fails again and is kept.
    again = events_command(node.config_file, "retry", "--all")
    assert again.returncode == 1, again.stdout + again.stderr
    assert "failed again: UnknownEventType" in again.stdout, again.stdout

    # A message whose payload cannot be applied, fixed by hand, then replayed.
    broken = world.message(GOOD)
    seq = await trio.to_thread.run_sync(
        insert_around_validation, fault_db, broken[0], json.dumps({**broken[1], "thread_seq": "x"})
    )
    await wait_settled(fault_db)
    assert "2 dead letter(s)" in dead_letters(node.config_file)
    await trio.to_thread.run_sync(fix_payload, fault_db, seq, json.dumps(broken[1]))
    replayed = events_command(node.config_file, "retry", "--seq", str(seq))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert f"seq {seq} (message.created): replayed" in replayed.stdout, replayed.stdout
    await wait_finished(fault_db)

    expected = {(m, t) for m in world.sent for t in tokens}
    pushes = count_pushes(node.config_file.parent / "pushes.jsonl", expected)
    await closing_count(fault_db, node, pushes, pid=pid, dead_letters=1)
